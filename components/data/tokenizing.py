"""Canonical rows in, training rows out: chat template, labels, over-length handling and packing.

Chat rows are rendered with the model's chat template and only assistant tokens are labelled (-100
elsewhere, so the model learns to answer, not to ask); ``text`` rows learn every token. Rows are tokenized
in batches with ``num_proc`` workers; examples longer than ``max_seq_length`` are dropped or truncated
(``OVER_LENGTH``), or, for text (the cpt stage: books, manuals), cut into consecutive chunks of ``max_seq_length``
tokens (``CHUNK``), and each split is packed into rows of exactly ``max_seq_length`` tokens
(:mod:`components.models.packing`) or kept one example per row.
"""

from __future__ import annotations

import hashlib
import logging
import os
from collections.abc import Callable
from pathlib import Path

import datasets
import numpy as np
import pyarrow as pa
from transformers import AutoTokenizer

from components.data import sources
from components.data.formats import DataError
from components.models.packing import IGNORE_INDEX, packed_batches

log = logging.getLogger("prepare_dataset")

# What happens to an example longer than max_seq_length: dropped (counted), or cut to fit (the over_length setting).
OVER_LENGTH = ("drop", "truncate")
# Or, for text rows, cut into consecutive chunks that each fit: what the cpt stage does (components/data/run.py).
CHUNK = "chunk"


def load_tokenizer(name_or_path: str, chat_template: str | None = None):
    """The tokenizer, with ``chat_template`` (a Jinja file path or the template text) overriding the model's."""
    tok = AutoTokenizer.from_pretrained(name_or_path)
    if chat_template:
        is_file = os.path.isfile(chat_template)
        tok.chat_template = Path(chat_template).read_text(encoding="utf-8") if is_file else chat_template
    return tok


def assistant_spans(text: str, messages: list[dict], end_token: str) -> list[tuple[int, int]]:
    """Character spans of ``text`` (the rendered conversation) that the model learns: each assistant turn.

    A span runs from the turn's content to the end-of-turn token after it (plus the newline the
    template writes after it), so the model learns to stop. Templates may rewrite history (Qwen3 drops
    ``<think>`` blocks from earlier turns), so the content is searched for in order rather than assumed
    at a fixed offset; for a turn whose thinking was dropped, the answer part after ``</think>`` is.
    """
    spans, cursor = [], 0
    for m in messages:
        if m["role"] != "assistant":
            continue
        content = m["content"]
        start = text.find(content, cursor)
        if start < 0:
            content = content.split("</think>")[-1].lstrip("\n")
            start = text.find(content, cursor)
        if start < 0:
            raise DataError(
                f"the chat template does not render an assistant turn verbatim ({content[:60]!r}); "
                "use a template that keeps assistant content (--chat-template)"
            )
        end = start + len(content)
        stop = text.find(end_token, end)
        end = len(text) if stop < 0 else stop + len(end_token)
        if text.startswith("\n", end):
            end += 1
        spans.append((start, end))
        cursor = end
    return spans


def tokenize_batch(
    batch: dict, tokenizer, kind: str, max_seq_length: int, truncate: bool, template_kwargs: dict
) -> dict:
    """``datasets.map`` function: render, tokenize with offsets, label; truncate when asked.

    Returns ``input_ids``, ``labels``, ``length`` (before truncation) and ``label_tokens`` (after).
    """
    if kind == "text":
        eos = [tokenizer.eos_token_id] if tokenizer.eos_token_id is not None else []
        encoded = tokenizer(batch["text"], add_special_tokens=False)["input_ids"]
        ids_list = [ids + eos for ids in encoded]
        labels_list = [list(ids) for ids in ids_list]
    else:
        texts = tokenizer.apply_chat_template(batch["messages"], tokenize=False, **template_kwargs)
        enc = tokenizer(texts, add_special_tokens=False)
        ids_list, labels_list = enc["input_ids"], []
        for i, (text, messages, ids) in enumerate(zip(texts, batch["messages"], ids_list, strict=True)):
            labels = [IGNORE_INDEX] * len(ids)
            for a, b in assistant_spans(text, messages, tokenizer.eos_token):
                # two lookups per turn in the tokenizer's own alignment, instead of a pass over every token
                start, end = _token_at(enc, i, a, text, len(ids)), _token_at(enc, i, b, text, len(ids))
                labels[start:end] = ids[start:end]
            labels_list.append(labels)
    out: dict[str, list] = {"input_ids": [], "labels": [], "length": [], "label_tokens": []}
    for ids, labels in zip(ids_list, labels_list, strict=True):
        out["length"].append(len(ids))
        if truncate and len(ids) > max_seq_length:
            ids, labels = ids[:max_seq_length], labels[:max_seq_length]
        out["input_ids"].append(ids)
        out["labels"].append(labels)
        out["label_tokens"].append(len(labels) - labels.count(IGNORE_INDEX))
    return out


def chunk_text_batch(batch: dict, indices: list[int], tokenizer, max_seq_length: int, overlap: int) -> dict:
    """``datasets.map`` function (``with_indices``) for text: each document tokenized with its EOS and cut into
    consecutive chunks of at most ``max_seq_length`` tokens, each after the first starting ``overlap`` tokens before
    the previous one's end (a document that fits is one chunk, as it is).

    The repeated tokens are context for the chunk's first new token, not targets: they are labelled -100, so every
    token of the document is a label exactly once (an epoch weighs each token once, and the loss counts each once).
    Returns ``input_ids``, ``labels``, ``length`` and ``label_tokens`` per chunk, as :func:`tokenize_batch` does per
    example, plus ``doc`` (the document's row: a document's chunks stay in its split) and ``chunk`` (0, 1, ...).
    """
    eos = [tokenizer.eos_token_id] if tokenizer.eos_token_id is not None else []
    encoded = tokenizer(batch["text"], add_special_tokens=False)["input_ids"]
    stride = max_seq_length - overlap
    out: dict[str, list] = {"input_ids": [], "labels": [], "length": [], "label_tokens": [], "doc": [], "chunk": []}
    for doc, ids in zip(indices, encoded, strict=True):
        ids = ids + eos
        n_chunks = 1 if len(ids) <= max_seq_length else 1 + -(-(len(ids) - max_seq_length) // stride)
        for i in range(n_chunks):
            start = i * stride
            chunk = ids[start : start + max_seq_length]
            context = overlap if i else 0
            out["input_ids"].append(chunk)
            out["labels"].append([IGNORE_INDEX] * context + chunk[context:])
            out["length"].append(len(chunk))
            out["label_tokens"].append(len(chunk) - context)
            out["doc"].append(doc)
            out["chunk"].append(i)
    return out


def _token_at(enc, row: int, char: int, text: str, n_tokens: int) -> int:
    """The first token that covers ``text[char:]`` (``n_tokens`` at the end of the text)."""
    while char < len(text):
        token = enc.char_to_token(row, char)
        if token is not None:
            return token
        char += 1
    return n_tokens


def template_overhead(tokenizer, kind: str, template_kwargs: dict) -> int:
    """Tokens every example costs before any content: the chat template's markup (or text's EOS)."""
    if kind == "text":
        return 1
    empty = [{"role": "user", "content": ""}, {"role": "assistant", "content": ""}]
    return len(
        tokenizer(tokenizer.apply_chat_template(empty, tokenize=False, **template_kwargs), add_special_tokens=False)[
            "input_ids"
        ]
    )


def check_tokenizer(tok, kind: str, max_seq_length: int, template_kwargs: dict) -> None:
    """Raise a :class:`DataError` before any tokenizing when ``tok`` cannot render ``kind`` rows into
    ``max_seq_length`` tokens: chat data without a chat template, or rows too short for the template's markup."""
    if kind == "messages" and not tok.chat_template:
        raise DataError(
            "the tokenizer has no chat template, which chat data needs; use the model's instruct "
            "tokenizer or pass --chat-template FILE"
        )
    overhead = template_overhead(tok, kind, template_kwargs)
    if max_seq_length <= overhead:
        raise DataError(
            f"max_seq_length={max_seq_length} is not more than the chat template's own {overhead} tokens "
            "per example; raise max_seq_length"
        )


def tokenize(
    canonical,
    tok,
    kind: str,
    *,
    max_seq_length: int,
    over_length: str,
    num_proc: int,
    template_kwargs: dict,
    work: Path,
    chunk_overlap: int = 0,
):
    """``canonical`` tokenized and labelled by :func:`tokenize_batch`, cached in ``work`` (a ``datasets.Dataset``);
    with ``over_length`` ``CHUNK``, text cut into chunks by :func:`chunk_text_batch` (``chunk_overlap`` tokens)."""
    log.info("tokenizing %d rows with %d process(es)", len(canonical), num_proc)
    function: Callable[..., dict]
    if over_length == CHUNK:
        function, with_indices = chunk_text_batch, True
        fn_kwargs = {"tokenizer": tok, "max_seq_length": max_seq_length, "overlap": chunk_overlap}
    else:
        function, with_indices = tokenize_batch, False
        fn_kwargs = {
            "tokenizer": tok,
            "kind": kind,
            "max_seq_length": max_seq_length,
            "truncate": over_length == "truncate",
            "template_kwargs": template_kwargs,
        }
    return canonical.map(
        function,
        with_indices=with_indices,
        batched=True,
        batch_size=sources.BATCH_ROWS,
        num_proc=num_proc if num_proc > 1 else None,
        remove_columns=canonical.column_names,
        cache_file_name=str(work / "tokenized.arrow"),
        new_fingerprint=hashlib.sha256(str(work).encode()).hexdigest()[:16],
        fn_kwargs=fn_kwargs,
        desc="tokenize",
    )


def over_length_mask(
    lengths: np.ndarray, label_tokens: np.ndarray, max_seq_length: int, over_length: str
) -> tuple[np.ndarray, int, dict]:
    """Which tokenized examples are kept under ``over_length``: (mask, examples truncated, dropped per reason).

    ``lengths`` are counted before truncation, ``label_tokens`` after it.
    """
    over = lengths > max_seq_length
    if over_length == CHUNK:  # every chunk fits
        return ~over, 0, {}
    if over_length == "drop":
        return ~over, 0, {"over_length": int(over.sum())}
    keep = label_tokens > 0  # truncation can cut away every assistant token
    return keep, int(over.sum()), {"over_length_no_labels_left": int((~keep).sum())}


def split_rows(
    tokenized,
    idx: np.ndarray,
    fitted: np.ndarray,
    label_tokens: np.ndarray,
    *,
    max_seq_length: int,
    packing: bool,
    pad_id: int,
    path: Path,
):
    """One split's training rows and counts: the examples ``idx`` of ``tokenized``, packed (into an Arrow
    file at ``path``) or one per row. ``fitted`` and ``label_tokens`` are every example's token counts."""
    s: dict[str, float] = {
        "examples": len(idx),
        "tokens": int(fitted[idx].sum()),
        "label_tokens": int(label_tokens[idx].sum()),
    }
    if packing:
        _write_stream(path, packed_batches(tokenized, idx, fitted[idx], max_seq_length, pad_id))
        rows = datasets.Dataset.from_file(str(path))
        s["rows"] = s["packed_rows"] = len(rows)
        s["packing_efficiency"] = round(s["tokens"] / (s["packed_rows"] * max_seq_length), 4)
    else:
        rows = tokenized.select(idx).select_columns(["input_ids", "labels"])
        s["rows"] = len(idx)
    return rows, s


def pack_splits(tokenized, selected: dict, fitted, label_tokens, *, max_seq_length, packing, tok, work, dropped):
    """Each split's rows (``selected``: split name -> the examples of ``tokenized`` it takes, in packing order) by
    :func:`split_rows`, into Arrow files under ``work``: ``({split: rows}, {split: counts})``. A DataError (naming
    what was ``dropped``) when a split has no example left."""
    rows, counts = {}, {}
    for split, idx in selected.items():
        if not len(idx):
            raise DataError(
                f"every {split} row was filtered out (dropped: {dropped}); "
                "raise max_seq_length, use over_length='truncate', or check the data"
            )
        rows[split], counts[split] = split_rows(
            tokenized,
            idx,
            fitted,
            label_tokens,
            max_seq_length=max_seq_length,
            packing=packing,
            pad_id=pad_id(tok),
            path=work / f"packed_{split}.arrow",
        )
    return rows, counts


def pad_id(tok) -> int:
    """The id that fills a packed row's tail: the tokenizer's pad token, else its EOS, else 0."""
    if tok.pad_token_id is not None:
        return tok.pad_token_id
    return tok.eos_token_id if tok.eos_token_id is not None else 0


def _write_stream(path: Path, batches) -> None:
    writer = None
    for batch in batches:
        if writer is None:
            writer = pa.ipc.new_stream(str(path), batch.schema)
        writer.write_batch(batch)
    assert writer is not None, f"{path}: no batches to write"  # a split always has at least one row
    writer.close()
