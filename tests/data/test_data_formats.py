"""Every input format and every kind of source prepares to the same canonical, tokenized result."""

import json

import datasets
import pandas as pd
import pytest

from components.data import formats
from components.data.prepare import PrepareOptions, prepare
from components.data.sources import resolve
from tests.helpers.data import write_jsonl

QA = [(f"What is {i} times 3?", f"It is {3 * i}.") for i in range(12)]


def as_messages(q, a):
    return {"messages": [{"role": "user", "content": q}, {"role": "assistant", "content": a}]}


def train_eval(path) -> dict:
    ds = datasets.load_from_disk(str(path))
    return {split: sorted(map(tuple, ds[split]["input_ids"])) for split in ds}


@pytest.mark.parametrize(
    "fmt, rows",
    [
        ("sharegpt", [{"conversations": [{"from": "human", "value": q}, {"from": "gpt", "value": a}]} for q, a in QA]),
        ("alpaca", [{"instruction": q, "input": "", "output": a} for q, a in QA]),
        ("prompt_completion", [{"prompt": q, "completion": a} for q, a in QA]),
    ],
)
def test_chat_formats_are_detected_and_match_messages(fmt, rows, tokenizer_dir, tmp_path):
    reference = prepare(
        str(write_jsonl(tmp_path / "m.jsonl", [as_messages(q, a) for q, a in QA])),
        tokenizer_dir,
        str(tmp_path / "ref"),
        PrepareOptions(64, 3, 0, packing=False),
    )
    stats = prepare(
        str(write_jsonl(tmp_path / "x.jsonl", rows)),
        tokenizer_dir,
        str(tmp_path / "out"),
        PrepareOptions(64, 3, 0, packing=False),
    )
    assert stats["formats"] == {str(tmp_path / "x.jsonl"): fmt} and reference["format"] == stats["format"] == "messages"
    assert train_eval(tmp_path / "out") == train_eval(tmp_path / "ref")


def test_alpaca_input_joins_the_instruction():
    row = formats.to_canonical("alpaca", {"instruction": "Translate.", "input": "안녕", "output": "Hello"})
    assert row["messages"][0] == {"role": "user", "content": "Translate.\n\n안녕"}


def test_column_mapping_renames_other_names(tokenizer_dir, tmp_path):
    rows = [{"question": q, "answer": a} for q, a in QA]
    src = write_jsonl(tmp_path / "qa.jsonl", rows)
    stats = prepare(
        str(src),
        tokenizer_dir,
        str(tmp_path / "o"),
        PrepareOptions(64, 3, 0, packing=False, columns={"prompt": "question", "completion": "answer"}),
    )
    assert stats["formats"] == {str(src): "prompt_completion"} and stats["rows_kept"] == 12


def test_text_rows_learn_every_token_and_end_with_eos(tokenizer_dir, tmp_path):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tokenizer_dir)
    src = write_jsonl(tmp_path / "t.jsonl", [{"text": f"Plain text number {i}."} for i in range(10)])
    stats = prepare(str(src), tokenizer_dir, str(tmp_path / "o"), PrepareOptions(64, 2, 0, packing=False))
    row = datasets.load_from_disk(str(tmp_path / "o"))["train"][0]
    assert stats["format"] == "text" and row["labels"] == row["input_ids"] and row["input_ids"][-1] == tok.eos_token_id


def test_preference_rows_are_kept_for_preference_tuning(tokenizer_dir, tmp_path):
    rows = [{"prompt": q, "chosen": a, "rejected": "I don't know."} for q, a in QA]
    stats = prepare(
        str(write_jsonl(tmp_path / "p.jsonl", rows)), tokenizer_dir, str(tmp_path / "o"), PrepareOptions(64, 3, 0)
    )
    ds = datasets.load_from_disk(str(tmp_path / "o"))
    assert stats["format"] == "preference" and not stats["packing"] and len(ds["eval"]) == 3
    assert ds["train"].column_names == ["prompt", "chosen", "rejected"]
    assert ds["train"][0]["rejected"] == [{"role": "assistant", "content": "I don't know."}]


def test_parquet_csv_json_arrow_folders_globs_and_pvc_read_the_same(tokenizer_dir, tmp_path):
    rows = [as_messages(q, a) for q, a in QA]
    ref = prepare(
        str(write_jsonl(tmp_path / "ref.jsonl", rows)), tokenizer_dir, str(tmp_path / "ref"), PrepareOptions(64, 3, 0)
    )
    folder = tmp_path / "mixed"
    folder.mkdir()
    pd.DataFrame(rows[:4]).to_parquet(folder / "a.parquet")
    pd.DataFrame({"messages": [json.dumps(r["messages"]) for r in rows[4:8]]}).to_csv(folder / "b.csv", index=False)
    (folder / "c.json").write_text(json.dumps(rows[8:]))
    datasets.Dataset.from_list(rows).save_to_disk(str(tmp_path / "saved"))
    for name, source, mounts in [
        ("folder", str(folder), {}),
        ("glob", str(folder / "*.*"), {}),
        ("saved", str(tmp_path / "saved"), {}),
        ("pvc", "pvc://data/mixed", {"data": str(tmp_path)}),
    ]:
        stats = prepare(source, tokenizer_dir, str(tmp_path / name), PrepareOptions(64, 3, 0, pvc_mounts=mounts))
        assert stats["rows_kept"] == 12, name
        assert train_eval(tmp_path / name) == train_eval(tmp_path / "ref"), name
    assert ref["rows_kept"] == 12


def test_several_sources_mix(tokenizer_dir, tmp_path):
    a = write_jsonl(tmp_path / "a.jsonl", [as_messages(q, a) for q, a in QA[:6]])
    b = write_jsonl(tmp_path / "b.jsonl", [{"instruction": q, "output": a} for q, a in QA[6:]])
    stats = prepare([str(a), str(b)], tokenizer_dir, str(tmp_path / "o"), PrepareOptions(64, 3, 0))
    assert stats["formats"] == {str(a): "messages", str(b): "alpaca"} and stats["rows_kept"] == 12


def test_hub_ids_carry_config_split_and_revision():
    assert resolve("org/name?config=ko&split=test&revision=abc123", {}) == {
        "hub": "org/name",
        "config": "ko",
        "split": "test",
        "revision": "abc123",
    }
    assert resolve("org/name", {})["split"] == "train"
    assert resolve("hf://datasets/org/name/train.jsonl", {}) == ["hf://datasets/org/name/train.jsonl"]
