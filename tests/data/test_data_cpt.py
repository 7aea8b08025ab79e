"""A corpus for continued pretraining through the data step's entry point (components/data/run.py): long documents
cut into consecutive max_seq_length chunks (optionally overlapping, the repeated tokens unlabelled) instead of
dropped, and near-duplicate documents removed when near_dedup_threshold is set."""

import datasets
import pytest
from transformers import AutoTokenizer

from components.data.run import prepare_stage_dataset
from components.models.packing import IGNORE_INDEX, split_examples
from components.settings import Settings, defaults
from tests.helpers.data import write_jsonl

MAX_SEQ_LENGTH = 64
WORDS = "river stone bright answer garden window seven quiet table paper under morning 바다 하늘 사람 시간".split()


def document(seed: int, n_words: int) -> str:
    """A deterministic text of ``n_words`` words, different for each ``seed``."""
    return " ".join(f"{WORDS[(seed * 7 + i * i) % len(WORDS)]}{(seed * 31 + i) % 97}" for i in range(n_words))


def cpt_settings(tokenizer_dir, source, **over) -> Settings:
    return Settings.from_flat(
        {
            **defaults(),
            "stages": ["cpt", "sft"],
            "cpt_dataset_source": str(source),
            "model_name_or_path": tokenizer_dir,
            "max_seq_length": MAX_SEQ_LENGTH,
            "eval_size": 1.0,
            "num_proc": 1,
            **over,
        }
    )


def long_document(tokenizer_dir) -> tuple[str, list[int]]:
    """A text of about 3.5 x MAX_SEQ_LENGTH tokens (its EOS included), and those tokens."""
    tok = AutoTokenizer.from_pretrained(tokenizer_dir)
    n_words = 1
    while len(tok(document(1000, n_words), add_special_tokens=False)["input_ids"]) + 1 < 3.5 * MAX_SEQ_LENGTH:
        n_words += 1
    text = document(1000, n_words)
    return text, tok(text, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]


def prepared_examples(out_dir) -> list[tuple[list[int], list[int]]]:
    """Every (input_ids, labels) example of both splits of a prepared dataset, cut back out of its packed rows."""
    ds = datasets.load_from_disk(str(out_dir))
    return [ex for split in ("train", "eval") for row in ds[split] for ex in split_examples(row)]


@pytest.mark.parametrize("overlap, n_chunks", [(0, 4), (16, 5)])
def test_a_long_document_becomes_consecutive_chunks_and_every_token_is_learned_once(
    tmp_path, tokenizer_dir, overlap, n_chunks
):
    text, doc_ids = long_document(tokenizer_dir)
    assert 3.4 * MAX_SEQ_LENGTH <= len(doc_ids) <= 3.6 * MAX_SEQ_LENGTH
    # 4 chunks without overlap (3 x 64 + the rest); with 16 tokens of overlap each chunk brings 48 new ones: 5
    assert n_chunks == 1 + -(-(len(doc_ids) - MAX_SEQ_LENGTH) // (MAX_SEQ_LENGTH - overlap))
    source = write_jsonl(tmp_path / "corpus.jsonl", [{"text": document(i, 4)} for i in range(6)] + [{"text": text}])
    s = cpt_settings(tokenizer_dir, source, **({"cpt_chunk_overlap": overlap} if overlap else {}))  # 0: the default
    prepared = prepare_stage_dataset(s, stage="cpt", data_root=str(tmp_path / "data"), run_id="r")
    stats = prepared.stats
    assert (stats["chunked_documents"], stats["chunks"], stats["chunk_overlap"]) == (1, n_chunks, overlap)
    assert "over_length" not in stats["dropped"] and stats["rows_kept"] == 7
    assert stats["train"]["examples"] + stats["eval"]["examples"] == 6 + n_chunks
    assert "| of which cut into max_seq_length chunks" in prepared.report
    assert f"(-> {n_chunks} chunks)" in prepared.report

    # The document's chunks, found by where their tokens sit in it: each learns the tokens after the overlap.
    learned = [0] * len(doc_ids)
    found = 0
    for ids, labels in prepared_examples(tmp_path / "data" / "runs" / "r" / "dataset-cpt"):
        starts = [a for a in range(len(doc_ids) - len(ids) + 1) if doc_ids[a : a + len(ids)] == ids]
        if not starts:  # a short document, not a chunk of the long one
            continue
        found += 1
        (start,) = starts
        assert labels[:overlap] == ([IGNORE_INDEX] * overlap if start else ids[:overlap])  # the overlap is context
        for i, label in enumerate(labels):
            if label != IGNORE_INDEX:
                assert label == ids[i]
                learned[start + i] += 1
    assert found == n_chunks
    assert learned == [1] * len(doc_ids)  # every token of the document, each exactly once


def test_near_duplicate_documents_are_removed_when_asked_and_kept_otherwise(tmp_path, tokenizer_dir):
    docs = [document(i, 100) for i in range(8)]
    words = docs[3].split()
    words[50] = "changed"
    near = " ".join(words)  # one word of a hundred changed: 91 of 101 word 5-grams shared (Jaccard 0.90)
    source = write_jsonl(tmp_path / "corpus.jsonl", [{"text": d} for d in [*docs, near]])

    off = cpt_settings(tokenizer_dir, source, max_seq_length=1024)  # each document one example, whole
    kept = prepare_stage_dataset(off, stage="cpt", data_root=str(tmp_path / "off"), run_id="r").stats
    assert kept["rows_kept"] == 9 and "near_duplicate" not in kept["dropped"]

    s = cpt_settings(tokenizer_dir, source, max_seq_length=1024, near_dedup_threshold=0.8)
    prepared = prepare_stage_dataset(s, stage="cpt", data_root=str(tmp_path / "on"), run_id="r")
    assert prepared.stats["rows_kept"] == 8 and prepared.stats["dropped"]["near_duplicate"] == 1
    assert "| dropped: near_duplicate | 1 |" in prepared.report
    assert "| near-duplicate search (threshold 0.8) | 1 dropped in" in prepared.report
    tok = AutoTokenizer.from_pretrained(tokenizer_dir)
    texts = [tok.decode(ids) for ids, _ in prepared_examples(tmp_path / "on" / "runs" / "r" / "dataset-cpt")]
    assert not any("changed" in t for t in texts)  # the later copy went, the first stayed
    assert sum(docs[3] in " ".join(t.split()) for t in texts) == 1
