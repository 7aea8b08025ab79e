"""The trainer's Prometheus endpoint (components/train/trainer/metrics.py), scraped over HTTP as Prometheus would."""

from __future__ import annotations

import logging
import math
import socket
import urllib.request
from types import SimpleNamespace

import pytest
from prometheus_client.parser import text_string_to_metric_families

from components.train.trainer import metrics as trainer_metrics
from components.train.trainer.metrics import METRIC_NAMES, MetricsCallback, TrainerMetrics

LABELS = {"run_id": "run-1", "stage": "sft", "job_name": "sft-run-1", "node_rank": "1"}


def scrape(url: str) -> dict:
    """``{metric name: (labels, value)}`` of one scrape."""
    text = urllib.request.urlopen(url, timeout=5).read().decode()
    return {s.name: (s.labels, s.value) for family in text_string_to_metric_families(text) for s in family.samples}


@pytest.fixture
def served():
    m = TrainerMetrics("sft", "run-1", "sft-run-1", "1")
    url = m.serve(0, addr="127.0.0.1")
    yield m, url
    m.close()


def state(step: int, max_steps: int = 100):
    return SimpleNamespace(global_step=step, max_steps=max_steps)


def test_every_series_is_served_with_the_runs_labels(served):
    m, url = served
    cb = MetricsCallback(m)
    cb.on_train_begin(None, state(0), None)
    for step in (1, 2):
        cb.on_step_end(None, state(step), None)
    cb.on_log(
        None,
        state(2),
        None,
        logs={"loss": 2.5, "learning_rate": 1e-5, "tokens_per_second_per_device": 812.5, "mfu": 0.31},
    )
    samples = scrape(url)
    assert set(METRIC_NAMES) <= set(samples)
    for name in METRIC_NAMES:
        assert samples[name][0] == LABELS, name
    assert samples["llm_train_step"][1] == 2
    assert samples["llm_train_max_steps"][1] == 100
    assert samples["llm_train_loss"][1] == 2.5
    assert samples["llm_train_loss_nan"][1] == 0
    assert samples["llm_train_learning_rate"][1] == 1e-5
    assert samples["llm_train_tokens_per_second_per_device"][1] == 812.5
    assert samples["llm_train_mfu"][1] == 0.31
    assert samples["llm_train_info"][1] == 1
    assert 0 < samples["llm_train_eta_seconds"][1] < 3600  # 98 steps at the rate of 2 steps in milliseconds
    assert samples["llm_train_last_checkpoint_timestamp_seconds"][1] == 0
    assert samples["llm_train_last_step_timestamp_seconds"][1] > 0


def test_a_nan_loss_raises_the_flag_and_a_checkpoint_resets_its_age(served):
    m, url = served
    cb = MetricsCallback(m)
    cb.on_train_begin(None, state(0), None)
    m.started -= 120  # training began two minutes ago
    assert scrape(url)["llm_train_seconds_since_checkpoint"][1] >= 120
    cb.on_log(None, state(3), None, logs={"loss": float("nan")})
    cb.on_save(None, state(3), None)
    samples = scrape(url)
    assert samples["llm_train_loss_nan"][1] == 1
    assert math.isnan(samples["llm_train_loss"][1])
    assert samples["llm_train_seconds_since_checkpoint"][1] < 5
    assert samples["llm_train_last_checkpoint_timestamp_seconds"][1] > 0


def test_a_taken_port_is_an_error_naming_the_setting():
    with socket.socket() as holder:
        holder.bind(("0.0.0.0", 0))
        holder.listen()
        port = holder.getsockname()[1]
        with pytest.raises(RuntimeError, match=rf"metrics_port {port}: .*Set metrics_port to a free port, or 0"):
            TrainerMetrics("sft").serve(port)


def test_a_local_runs_trainer_serves_on_a_free_port_when_the_setting_is_taken(caplog):
    # Local runs (components/train/launcher/local_torchrun.py sets any_port): the process that binds the port chooses
    # another.
    with socket.socket() as holder:
        holder.bind(("0.0.0.0", 0))
        holder.listen()
        port = holder.getsockname()[1]
        metrics = TrainerMetrics("sft")
        try:
            with caplog.at_level(logging.WARNING, logger="sft.metrics"):
                url = metrics.serve(port, any_port=True)
            served = metrics.server.server_port
            assert served != port and url == f"http://localhost:{served}/metrics"
            assert f"metrics_port {port} is taken on this machine" in caplog.text and str(served) in caplog.text
        finally:
            metrics.close()


@pytest.fixture
def fresh(monkeypatch):
    monkeypatch.setattr(trainer_metrics, "_current", None)
    for var in (
        "TRAINER_METRICS_PORT",
        "LOCAL_RANK",
        "GROUP_RANK",
        "PET_NODE_RANK",
        "TRAINER_RUN_ID",
        "TRAINER_JOB_NAME",
    ):
        monkeypatch.delenv(var, raising=False)
    yield monkeypatch
    if trainer_metrics._current is not None:
        trainer_metrics._current.close()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_serve_reads_the_pods_environment_and_only_local_rank_0_serves(fresh, caplog):
    port = free_port()
    fresh.setenv("TRAINER_METRICS_PORT", str(port))
    fresh.setenv("LOCAL_RANK", "1")
    assert trainer_metrics.serve(SimpleNamespace(stage="dpo")) is None
    fresh.setenv("LOCAL_RANK", "0")
    fresh.setenv("GROUP_RANK", "3")
    fresh.setenv("TRAINER_RUN_ID", "run-9")
    fresh.setenv("TRAINER_JOB_NAME", "dpo-run-9")
    with caplog.at_level("INFO", logger="sft.metrics"):
        m = trainer_metrics.serve(SimpleNamespace(stage="dpo"))
    assert m is not None and trainer_metrics.serve(SimpleNamespace(stage="dpo")) is m  # once per process
    assert f":{port}/metrics" in caplog.text  # the log names the endpoint
    labels, _ = scrape(f"http://127.0.0.1:{port}/metrics")["llm_train_info"]
    assert labels == {"run_id": "run-9", "stage": "dpo", "job_name": "dpo-run-9", "node_rank": "3"}


def test_no_port_no_server(fresh):
    assert trainer_metrics.serve(SimpleNamespace(stage="sft")) is None
    fresh.setenv("TRAINER_METRICS_PORT", "0")
    assert trainer_metrics.serve(SimpleNamespace(stage="sft")) is None


@pytest.mark.parametrize("bad", ["http", "-1", "70000"])
def test_a_bad_port_is_an_error_naming_the_setting(fresh, bad):
    fresh.setenv("TRAINER_METRICS_PORT", bad)
    with pytest.raises(ValueError, match="metrics_port"):
        trainer_metrics.serve(SimpleNamespace(stage="sft"))
