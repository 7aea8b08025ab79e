"""Sharded preparation (``data_shards``, components/data/shards.py): files dealt to shards, each shard read and
tokenized on its own (a pod in the pipeline), then joined; the result does not depend on the shard count."""

import json
import os
import shutil
import subprocess
import sys

import datasets
import pytest

from components.data.formats import DataError
from components.data.prepare import PrepareOptions, prepare
from components.data.shards import deal_files
from components.settings import Settings
from tests.helpers.data import conversation, write_jsonl
from tests.helpers.repo import ROOT, in_ci


def _rows(folder) -> dict:
    ds = datasets.load_from_disk(str(folder))
    return {split: [(tuple(r["input_ids"]), tuple(r["labels"])) for r in ds[split]] for split in ds}


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    """Five files of ten chats each (50), plus three English chats each from 0..11: 10 of those 15 repeat a chat
    (in its own file or another: exact duplicates across what different shards read), 5 are new (55 distinct)."""
    root = tmp_path_factory.mktemp("corpus")
    for f in range(5):
        rows = [conversation(10 * f + i, "ko" if i % 2 else "en") for i in range(10)]
        rows += [conversation(i, "en") for i in range(2 * f, 2 * f + 3)]  # chats 0..11 again, some twice
        write_jsonl(root / f"part-{f}.jsonl", rows)
    return root


def test_files_are_dealt_by_size_largest_first_to_the_lightest_shard():
    files, sizes = ["a", "b", "c", "d", "e"], [10, 50, 20, 40, 30]
    # b (50) to 0, d (40) to 1, e (30) to 1, c (20) to 0, a (10) to 0 (70 each: the lower index); in the files' order
    assert deal_files(files, sizes, 2) == [["a", "b", "c"], ["d", "e"]]
    assert deal_files(files, sizes, 1) == [files]
    assert deal_files(["a"], [5], 3) == [["a"], [], []]


def test_one_two_and_three_shards_give_the_same_rows_and_duplicates_across_shards_are_dropped(
    folder, tokenizer_dir, tmp_path
):
    outputs, stats = {}, {}
    for n in (1, 2, 3):
        stats[n] = prepare(
            str(folder), tokenizer_dir, str(tmp_path / f"out-{n}"), PrepareOptions(256, 0.1, 7, shards=n)
        )
        outputs[n] = _rows(tmp_path / f"out-{n}")
    assert outputs[1] == outputs[2] == outputs[3]
    one_pass = prepare(str(folder), tokenizer_dir, str(tmp_path / "one-pass"), PrepareOptions(256, 0.1, 7))
    # Every duplicate is dropped whatever read it: 65 rows read, 55 distinct chats.
    for n in (1, 2, 3):
        assert stats[n]["rows_in"] == one_pass["rows_in"] == 65 and stats[n]["rows_kept"] == 55, stats[n]
        assert stats[n]["dropped"]["duplicate"] == one_pass["dropped"]["duplicate"] == 10
        assert stats[n]["shards"] == n and len(stats[n]["shard_seconds"]) == n
        for split in ("train", "eval"):
            assert stats[n][split]["examples"] == one_pass[split]["examples"]
            assert stats[n][split]["tokens"] == one_pass[split]["tokens"]
    # The same examples as the one-pass build, split the same way: only their packing order differs.
    assert stats[2]["train"]["packing_efficiency"] >= 0.9


def test_a_complete_shard_is_reused_and_a_shard_pod_and_the_join_name_the_same_folders(
    folder, tokenizer_dir, tmp_path, caplog
):
    cache = tmp_path / "shards"
    done = [
        prepare(
            str(folder),
            tokenizer_dir,
            str(tmp_path / "x"),
            PrepareOptions(256, 0.1, 7, shards=3, shard_cache=str(cache), only_shard=i),
        )
        for i in range(3)
    ]
    assert sorted(d["folder"] for d in done) == sorted(str(p) for p in cache.iterdir())
    assert sum(d["documents"] for d in done) >= 55 and not (tmp_path / "x").exists()  # a shard writes no dataset
    caplog.set_level("INFO", logger="prepare_dataset")
    stats = prepare(
        str(folder), tokenizer_dir, str(tmp_path / "out"), PrepareOptions(256, 0.1, 7, shards=3, shard_cache=str(cache))
    )
    assert caplog.text.count("is complete: reusing it") == 3, caplog.text
    assert stats["rows_kept"] == 55
    with pytest.raises(DataError, match="shard 3: there are 3"):
        prepare(str(folder), tokenizer_dir, str(tmp_path / "x"), PrepareOptions(256, 0.1, 7, shards=3, only_shard=3))


def test_near_duplicates_across_shards_are_dropped_as_in_one_pass(tokenizer_dir, tmp_path):
    base = "the cluster scheduler places every training pod on a node with free accelerators and enough memory " * 3
    for f in range(3):
        rows = [{"text": f"{base} copy {f}"}, {"text": f"document {f} " + "unrelated words about cooking " * 8}]
        (tmp_path / "corpus").mkdir(exist_ok=True)
        write_jsonl(tmp_path / "corpus" / f"part-{f}.jsonl", rows)
    args = (str(tmp_path / "corpus"), tokenizer_dir)
    one_pass = prepare(*args, str(tmp_path / "a"), PrepareOptions(256, 1, 7, near_dedup_threshold=0.7))
    sharded = prepare(*args, str(tmp_path / "b"), PrepareOptions(256, 1, 7, near_dedup_threshold=0.7, shards=3))
    assert sharded["dropped"]["near_duplicate"] == one_pass["dropped"]["near_duplicate"] == 2
    assert sharded["rows_kept"] == one_pass["rows_kept"] == 4


def test_an_eval_source_is_read_beside_the_shards_and_loses_rows_that_repeat_training_rows(
    folder, tokenizer_dir, tmp_path
):
    write_jsonl(tmp_path / "eval.jsonl", [conversation(0, "en"), conversation(999, "en")])  # chat 0 is trained on
    stats = prepare(
        str(folder),
        tokenizer_dir,
        str(tmp_path / "o"),
        PrepareOptions(256, 0.1, 7, shards=2, eval_source=str(tmp_path / "eval.jsonl")),
    )
    assert stats["eval"]["examples"] == 1 and stats["train"]["examples"] == 55
    assert stats["eval_sources"] == [str(tmp_path / "eval.jsonl")]


def test_preference_data_in_shards_is_one_error_naming_data_shards(tokenizer_dir, tmp_path):
    pair = {"prompt": "2+2?", "chosen": "4", "rejected": "5"}
    (tmp_path / "p").mkdir()
    write_jsonl(tmp_path / "p" / "pairs.jsonl", [{**pair, "prompt": f"{i}+2?"} for i in range(10)])
    with pytest.raises(DataError, match="set data_shards=1"):
        prepare(str(tmp_path / "p"), tokenizer_dir, str(tmp_path / "o"), PrepareOptions(256, 0.1, 7, shards=2))


def test_the_data_step_shards_only_the_tokenized_stages_and_names_its_cpus():
    from components.data.run import sharded, stage_request
    from components.data.shards import available_cpus

    s = Settings.from_flat({"data_shards": 4, "num_proc": 0})
    assert [sharded(s, stage) for stage in ("sft", "cpt", "dpo", "rm", "grpo")] == [4, 4, 0, 0, 0]
    assert sharded(Settings.from_flat({"data_shards": 1}), "sft") == 0
    request = stage_request(s, "cpt", "/mnt/data")
    assert request["shards"] == 4 and request["over_length"] == "chunk" and request["filters"] is None
    assert 1 <= available_cpus() <= len(__import__("os").sched_getaffinity(0))


def test_the_shard_list_names_each_stage_and_shard_and_one_idle_item_without_shards():
    from components.data.component import list_data_shards

    listing = list_data_shards.python_func
    # validate_inputs' settings as a KFP struct hands them on: numbers as floats
    one = {"data_shards": 1.0, "stages": ["sft"]}
    assert listing(one) == [{"stage": "", "shard": 0, "settings": one}]
    two = {"data_shards": 2.0, "stages": ["cpt", "sft", "dpo"]}
    items = listing(two)
    assert items == [{"stage": s, "shard": i, "settings": two} for s in ("sft", "cpt") for i in (0, 1)]
    assert json.loads(json.dumps(items)) == items


def test_a_corpus_over_the_volumes_free_space_is_one_line_before_anything_is_read(tokenizer_dir, tmp_path):
    """The command (what the data step runs) on a 2 MB tmpfs of its own, in a mount namespace that ends with it."""
    if os.geteuid() != 0 or not shutil.which("unshare"):
        if in_ci():
            pytest.fail("CI runs as root with unshare: this test must run")
        pytest.skip("needs root and unshare for a tmpfs of its own")
    (tmp_path / "corpus").mkdir()
    write_jsonl(tmp_path / "corpus" / "chats.jsonl", [conversation(i, "en") for i in range(6000)])  # ~1 MB
    (tmp_path / "vol").mkdir()
    script = 'mount -t tmpfs -o size=2m tmpfs "$0" && exec "$@"'
    command = [sys.executable, "-m", "components.data.prepare", "--source", str(tmp_path / "corpus")]
    command += ["--tokenizer", tokenizer_dir, "--out", str(tmp_path / "vol" / "out")]
    unshare = ["unshare", "--mount", "--propagation", "private", "sh", "-c", script, str(tmp_path / "vol")]
    result = subprocess.run([*unshare, *command], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert result.returncode == 2, result.stderr[-3000:]
    (line,) = [x for x in result.stderr.splitlines() if x.startswith("error:")]
    assert (
        line.startswith("error: --source: 1 file(s) of about 1.") and "MB is free: grow the volume --out is on" in line
    )
    assert "Traceback" not in result.stderr and "tokenizing" not in result.stderr


@pytest.mark.parametrize("shards", [0, 2])
def test_a_parquet_corpus_without_the_text_column_is_one_error_naming_the_mapping(tokenizer_dir, tmp_path, shards):
    import pyarrow as pa
    import pyarrow.parquet as pq

    (tmp_path / "corpus").mkdir()
    for i in range(2):
        pq.write_table(
            pa.table({"body": [f"document {i}.{j}" for j in range(20)]}), tmp_path / "corpus" / f"{i}.parquet"
        )
    with pytest.raises(DataError, match=r"needs column\(s\) \['text'\] but found \['body'\].*--columns text=body"):
        prepare(
            str(tmp_path / "corpus"),
            tokenizer_dir,
            str(tmp_path / "o"),
            PrepareOptions(64, 0.1, 7, format="text", shards=shards),
        )
    assert not (tmp_path / "o").exists()  # nothing left behind as if complete
