"""The ``data:`` line of ``--plan`` (components/estimate/data_prep_time.py): the data step's wall time for the corpus at
the run's data_shards and data_cpu, the claim space it needs, and the shard count that would shorten it."""

import pytest

from components.estimate.data_prep_time import (
    JOIN_TOKENS_PER_S,
    TOKENIZE_TOKENS_PER_S_PER_CPU,
    cpus,
    data_prep_seconds,
    data_prep_text,
)
from components.settings import Settings
from pipelines import params as P
from tests.helpers.repo import run_cli


def test_shards_divide_the_tokenizing_and_the_join_stays_one_pass():
    one = data_prep_seconds(1e10, 1, 16)
    eight = data_prep_seconds(1e10, 8, 16)
    assert one["tokenize"] == pytest.approx(1e10 / (TOKENIZE_TOKENS_PER_S_PER_CPU * 16))
    assert eight["tokenize"] == pytest.approx(one["tokenize"] / 8)
    assert eight["join"] == one["join"] == pytest.approx(1e10 / JOIN_TOKENS_PER_S)
    assert data_prep_seconds(1e9, 1, 16, num_proc=4)["tokenize"] == pytest.approx(
        4 * data_prep_seconds(1e9, 1, 16)["tokenize"]
    )


def test_cpu_quantities_read_as_kubernetes_writes_them():
    assert (cpus("8"), cpus("500m"), cpus("1.5")) == (8.0, 0.5, 1.5)
    with pytest.raises(ValueError, match="data_cpu='eight'"):
        cpus("eight")


def test_a_long_preparation_names_the_shard_count_that_shortens_it():
    s = Settings.from_flat({**P.resolve("qwen3-30b-a3b-full"), "dataset_tokens_estimate": 10**10, "data_cpu": "16"})
    line = data_prep_text(s)
    assert line.startswith("  data:     10,000M tokens (dataset_tokens_estimate) on 1 pod(s) x 16 CPUs")
    assert "-p data_shards=" in line and "GB on the data claim (llm-data)" in line
    assert "prepared already" in data_prep_text(s, {"train": {"rows": 10}})
    short = Settings.from_flat({**P.resolve("qwen3-30b-a3b-full"), "dataset_tokens_estimate": 10**6})
    assert "-p data_shards=" not in data_prep_text(short)


def test_the_plan_shows_the_data_line():
    result = run_cli("pipelines.run", "--preset", "qwen3-30b-a3b-full", "--plan", "-p", "data_shards=4")
    assert result.returncode == 0, result.stderr
    assert "\n  data:     100M tokens (dataset_tokens_estimate) on 4 pod(s) x 8 CPUs" in result.stdout
