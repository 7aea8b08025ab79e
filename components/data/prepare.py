"""Instruction data in, packed tokenized training data out; the data step outside KFP.

    python -m components.data.prepare --source SRC [--source SRC2 ...] --tokenizer PATH_OR_ID --out DIR \\
        [--format auto|messages|sharegpt|alpaca|prompt_completion|text|preference] [--max-seq-length N] \\
        [--eval-size N_OR_FRACTION] [--num-proc N]

Reads every source (see :mod:`components.data.sources`), converts each row to one canonical form
(:mod:`components.data.formats`, Unicode NFC), drops rows with nothing to learn and exact duplicates
(counted per reason), splits train/eval by a seeded hash of each row (stable across runs and machines)
or takes eval from its own source, renders chat rows with the model's chat template and labels only
assistant tokens (-100 elsewhere; ``text`` rows learn every token), tokenizes in batches with
``num_proc`` workers, and packs examples into rows of exactly ``max_seq_length`` tokens
(:mod:`components.data.packing`). Writes a ``datasets`` DatasetDict with ``save_to_disk`` plus
``stats.json`` into a temporary folder renamed into place only when complete. With ``cache_dir``, the
result is kept under a fingerprint of sources + tokenizer + template + options, and a run with unchanged
inputs reuses it instead of redoing the work.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from components.data import formats, sources
from components.data.formats import RowError
from components.data.packing import packed_batches
from components.data.report import length_histogram
from components.data.sources import BUILTIN_SAMPLE, SourceError  # noqa: F401 (re-exported for callers)

log = logging.getLogger("prepare_dataset")

IGNORE_INDEX = -100
# Bump when the output for the same inputs changes, so cached results are not reused.
CACHE_VERSION = "2"
N_REPORT_EXAMPLES = 3
# Rows with nothing to learn are cleaning, always dropped and counted; broken rows fail the run unless
# --max-bad-rows allows skipping that many.
CLEANING_REASONS = ("empty_turn", "no_assistant_turn", "empty_text")
BAD_ROW_REASONS = ("unparseable", "invalid_utf8", "unknown_role", "malformed")


class DataError(ValueError):
    """The data cannot be prepared; the message names the file/line/field and the fix."""


# --------------------------------------------------------------------------- reading and cleaning


def _schema(kind: str):
    import datasets

    turns = datasets.List({"role": datasets.Value("string"), "content": datasets.Value("string")})
    columns = {"text": {"text": datasets.Value("string")}, "messages": {"messages": turns},
               "preference": {"prompt": turns, "chosen": turns, "rejected": turns}}[kind]
    return datasets.Features({**columns, "split_key": datasets.Value("float64")})


def _kind(fmt: str) -> str:
    return "messages" if fmt in formats.CHAT_FORMATS else fmt


def _digest(row: dict) -> bytes:
    return hashlib.blake2b(json.dumps(row, ensure_ascii=False, sort_keys=True).encode(), digest_size=16).digest()


def read_canonical(source_list: list[str], path: Path, *, fmt: str, columns: dict, pvc_mounts: dict,
                   max_bad_rows: int, seed: int, seen: set, counts: dict) -> tuple[str, int]:
    """Stream ``source_list`` into an Arrow file of canonical rows at ``path``; return (kind, rows written).

    ``seen`` holds the digests of rows already kept (duplicates are dropped across all sources);
    ``counts`` collects ``rows_in`` and the dropped rows per reason.
    """
    import pyarrow as pa

    resolved = [(s, sources.resolve(s, pvc_mounts)) for s in source_list]  # every path checked before reading
    kind, first_kind_source, writer, batch, written = None, None, None, [], 0
    rename = {src: canonical for canonical, src in columns.items()}
    try:
        for source, res in resolved:
            source_fmt, first_where, n_source = None if fmt == "auto" else fmt, None, 0
            for where, row in sources.read_rows(res):
                counts["rows_in"] += 1
                n_source += 1
                try:
                    if isinstance(row, RowError):
                        raise row
                    row = {rename.get(k, k): v for k, v in row.items()}
                    if source_fmt is None:
                        source_fmt = formats.detect_format(row, where)
                    if first_where is None:
                        formats.check_columns(source_fmt, row, where)
                        first_where = where
                    elif any(c not in row for c in formats.REQUIRED[source_fmt]):
                        try:
                            other = formats.detect_format(row, where)
                        except ValueError:
                            formats.check_columns(source_fmt, row, where)
                        raise DataError(
                            f"{where}: mixed formats: this row is {other!r} but {first_where} is {source_fmt!r}; "
                            "put each format in its own file and pass them as separate --source arguments"
                        )
                    row = formats.clean(formats.to_canonical(source_fmt, row))
                except RowError as e:
                    if e.reason in CLEANING_REASONS:
                        counts["dropped"][e.reason] = counts["dropped"].get(e.reason, 0) + 1
                        continue
                    n_bad = counts["dropped"].get(e.reason, 0) + 1
                    if sum(counts["dropped"].get(r, 0) for r in BAD_ROW_REASONS) + 1 > max_bad_rows:
                        cap = f" (more than max_bad_rows={max_bad_rows} bad rows)" if max_bad_rows else ""
                        raise DataError(f"{where}: {e}{cap}; fix the data, or raise --max-bad-rows to skip such rows") from None
                    counts["dropped"][e.reason] = n_bad
                    log.warning("skipping %s: %s", where, e)
                    continue
                except ValueError as e:
                    raise DataError(str(e)) from None
                row_kind = _kind(source_fmt)
                if kind is None:
                    kind, first_kind_source = row_kind, source
                    schema = _schema(kind).arrow_schema
                    writer = pa.ipc.new_stream(str(path), schema)
                elif row_kind != kind:
                    raise DataError(
                        f"mixed formats: {source!r} is {source_fmt!r} ({row_kind}) but {first_kind_source!r} is {kind}; "
                        "prepare chat, text and preference data in separate runs"
                    )
                digest = _digest(row)
                if digest in seen:
                    counts["dropped"]["duplicate"] = counts["dropped"].get("duplicate", 0) + 1
                    continue
                seen.add(digest)
                row["split_key"] = _split_key(digest, seed)
                batch.append(row)
                if len(batch) >= sources.BATCH_ROWS:
                    writer.write_batch(pa.RecordBatch.from_pylist(batch, schema=schema))
                    written += len(batch)
                    batch = []
            if n_source == 0:
                raise DataError(f"source {source!r}: the dataset is empty; add at least one row")
            counts["formats"][source] = source_fmt
        if kind is None:
            raise DataError(f"every row of {source_list} was filtered out ({counts['dropped']}); check the data")
        if batch:
            writer.write_batch(pa.RecordBatch.from_pylist(batch, schema=schema))
            written += len(batch)
    except SourceError as e:
        raise DataError(str(e)) from None
    finally:
        if writer is not None:
            writer.close()
    return kind, written


def _split_key(digest: bytes, seed: int) -> float:
    return int.from_bytes(hashlib.sha256(seed.to_bytes(8, "big", signed=True) + digest).digest()[:8], "big") / 2**64


# --------------------------------------------------------------------------- tokenisation


def load_tokenizer(name_or_path: str, chat_template: str | None = None):
    """The tokenizer, with ``chat_template`` (a Jinja file path or the template text) overriding the model's."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(name_or_path)
    if chat_template:
        tok.chat_template = Path(chat_template).read_text(encoding="utf-8") if os.path.isfile(chat_template) else chat_template
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
            raise DataError(f"the chat template does not render an assistant turn verbatim ({content[:60]!r}); "
                            "use a template that keeps assistant content (--chat-template)")
        end = start + len(content)
        stop = text.find(end_token, end)
        end = len(text) if stop < 0 else stop + len(end_token)
        if text.startswith("\n", end):
            end += 1
        spans.append((start, end))
        cursor = end
    return spans


def tokenize_batch(batch: dict, tokenizer, kind: str, max_seq_length: int, truncate: bool, template_kwargs: dict) -> dict:
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
        for i, (text, messages, ids) in enumerate(zip(texts, batch["messages"], ids_list)):
            labels = [IGNORE_INDEX] * len(ids)
            for a, b in assistant_spans(text, messages, tokenizer.eos_token):
                # two lookups per turn in the tokenizer's own alignment, instead of a pass over every token
                start, end = _token_at(enc, i, a, text, len(ids)), _token_at(enc, i, b, text, len(ids))
                labels[start:end] = ids[start:end]
            labels_list.append(labels)
    out = {"input_ids": [], "labels": [], "length": [], "label_tokens": []}
    for ids, labels in zip(ids_list, labels_list):
        out["length"].append(len(ids))
        if truncate and len(ids) > max_seq_length:
            ids, labels = ids[:max_seq_length], labels[:max_seq_length]
        out["input_ids"].append(ids)
        out["labels"].append(labels)
        out["label_tokens"].append(len(labels) - labels.count(IGNORE_INDEX))
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
    return len(tokenizer(tokenizer.apply_chat_template(empty, tokenize=False, **template_kwargs),
                         add_special_tokens=False)["input_ids"])


# --------------------------------------------------------------------------- fingerprint cache


def fingerprint(resolved: list, tokenizer, options: dict) -> str | None:
    """A key for sources + tokenizer + template + options; ``None`` when a source cannot be pinned."""
    ids = [sources.identity(r) for r in resolved]
    if any(i is None for i in ids):
        return None
    h = hashlib.sha256()
    h.update(json.dumps([CACHE_VERSION, ids, options], sort_keys=True, default=str).encode())
    h.update(tokenizer.backend_tokenizer.to_str().encode() if tokenizer.is_fast else repr(tokenizer.get_vocab()).encode())
    h.update((tokenizer.chat_template or "").encode())
    h.update(json.dumps(tokenizer.special_tokens_map, sort_keys=True, default=str).encode())
    return h.hexdigest()


def _link_tree(src: Path, dst: Path) -> None:
    """Copy a finished dataset folder by hard links where the filesystem allows (same volume: no data copied)."""
    def link(a, b):
        try:
            os.link(a, b)
        except OSError:
            shutil.copy2(a, b)
    shutil.copytree(src, dst, copy_function=link)


# --------------------------------------------------------------------------- prepare


def prepare(
    source,
    tokenizer: str,
    out_dir: str,
    max_seq_length: int = 2048,
    eval_size: float = 0.05,
    seed: int = 42,
    *,
    format: str = "auto",
    columns: dict | None = None,
    eval_source=None,
    packing: bool = True,
    over_length: str = "drop",
    num_proc: int = 1,
    chat_template: str | None = None,
    enable_thinking: bool | None = None,
    max_bad_rows: int = 0,
    pvc_mounts: dict | None = None,
    cache_dir: str | None = None,
) -> dict:
    """Prepare ``source`` with ``tokenizer`` into ``out_dir``; return the stats written to stats.json.

    Args:
        source: one source string or a list of them (see :mod:`components.data.sources`).
        tokenizer: a tokenizer folder or Hub id; chat data needs a chat template (its own or ``chat_template``).
        out_dir: where the DatasetDict (train, eval) and stats.json go; replaced only when complete.
        max_seq_length: the packed row length; longer examples are dropped or truncated (``over_length``).
        eval_size: a fraction (< 1) or a number of rows (>= 1) held out for evaluation; ignored with ``eval_source``.
        seed: seeds the train/eval split.
        format: ``auto`` (detected per source from its columns) or one of :data:`formats.FORMATS`.
        columns: canonical column name -> the source's column name, e.g. ``{"messages": "dialog"}``.
        eval_source: source(s) for the eval split instead of a held-out part of ``source``.
        packing: pack into rows of exactly ``max_seq_length`` with restarting ``position_ids``; when off,
            one example per row (``input_ids``, ``labels``).
        over_length: ``drop`` or ``truncate`` examples longer than ``max_seq_length``.
        num_proc: tokenizer worker processes.
        chat_template: a Jinja file or template text that replaces the tokenizer's chat template.
        enable_thinking: passed to the chat template (Qwen3's thinking switch); ``None`` leaves its default.
        max_bad_rows: skip up to this many unparseable / invalid UTF-8 / unknown-role rows (counted) instead of failing.
        pvc_mounts: claim name -> mount path, to resolve ``pvc://claim/path`` sources.
        cache_dir: keep results here under their fingerprint and reuse them when inputs are unchanged.
    """
    started = time.time()
    source_list = [source] if isinstance(source, str) else list(source)
    eval_list = [eval_source] if isinstance(eval_source, str) else list(eval_source or [])
    columns, pvc_mounts = dict(columns or {}), dict(pvc_mounts or {})
    _check_options(format, columns, over_length, max_seq_length, eval_size, eval_list, num_proc, max_bad_rows)
    tok = load_tokenizer(tokenizer, chat_template)
    template_kwargs = {} if enable_thinking is None else {"enable_thinking": enable_thinking}
    try:
        resolved = [sources.resolve(s, pvc_mounts) for s in source_list + eval_list]
    except SourceError as e:
        raise DataError(str(e)) from None
    options = {"sources": source_list, "eval_sources": eval_list, "format": format, "columns": columns,
               "max_seq_length": max_seq_length, "eval_size": eval_size, "seed": seed, "packing": packing,
               "over_length": over_length, "template_kwargs": template_kwargs}
    key = fingerprint(resolved, tok, options) if cache_dir else None
    out = Path(out_dir)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}-", dir=out.parent))
    try:
        cached = Path(cache_dir) / key if key else None
        if cached is not None and (cached / "stats.json").exists():
            shutil.rmtree(tmp)
            _link_tree(cached, tmp)
            stats = json.loads((tmp / "stats.json").read_text())
            stats.update(cache_hit=True, seconds=round(time.time() - started, 2))
            log.info("inputs unchanged (fingerprint %s): reusing %s", key[:16], cached)
        else:
            stats = _build(source_list, eval_list, tok, tmp, max_seq_length, eval_size, seed, format, columns, packing,
                           over_length, num_proc, template_kwargs, max_bad_rows, pvc_mounts)
            stats.update(fingerprint=key, cache_hit=False, seconds=round(time.time() - started, 2))
        # Unlink first: on a cache hit the file is a hard link to the cached copy, which must not change.
        (tmp / "stats.json").unlink(missing_ok=True)
        (tmp / "stats.json").write_text(json.dumps(stats, indent=2, ensure_ascii=False))
        if cached is not None and not cached.exists():
            staging = Path(tempfile.mkdtemp(prefix=f".{key}-", dir=_mkdir(cache_dir)))
            shutil.rmtree(staging)
            _link_tree(tmp, staging)
            os.rename(staging, cached)
        if out.exists():
            shutil.rmtree(out)
        os.rename(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    log.info("prepared %s train / %s eval rows (%s train tokens, packing efficiency %s) in %.1fs -> %s",
             stats["train"]["rows"], stats["eval"]["rows"], stats["train"].get("tokens"),
             stats["train"].get("packing_efficiency", "n/a"), stats["seconds"], out)
    return stats


def _mkdir(path: str) -> str:
    os.makedirs(path, exist_ok=True)
    return path


def _check_options(fmt, columns, over_length, max_seq_length, eval_size, eval_list, num_proc, max_bad_rows) -> None:
    problems = []
    if fmt != "auto" and fmt not in formats.FORMATS:
        problems.append(f"format {fmt!r}: use auto or one of {', '.join(formats.FORMATS)}")
    known = {c for cols in formats.REQUIRED.values() for c in cols} | {"input", "system"}
    problems += [f"columns: {k!r} is not a column any format reads; map onto one of {sorted(known)}" for k in columns if k not in known]
    if over_length not in ("drop", "truncate"):
        problems.append(f"over_length {over_length!r}: use drop or truncate")
    if max_seq_length < 2:
        problems.append(f"max_seq_length {max_seq_length}: must be at least 2")
    if not eval_list and eval_size <= 0:
        problems.append(f"eval_size {eval_size}: must be > 0 (a fraction < 1 or a row count), or pass an eval source")
    if eval_size >= 1 and eval_size != int(eval_size):
        problems.append(f"eval_size {eval_size}: a count must be a whole number (a fraction must be < 1)")
    if num_proc < 1:
        problems.append(f"num_proc {num_proc}: must be at least 1")
    if max_bad_rows < 0:
        problems.append(f"max_bad_rows {max_bad_rows}: must be >= 0")
    if problems:
        raise DataError("; ".join(problems))


def _build(source_list, eval_list, tok, tmp: Path, max_seq_length, eval_size, seed, fmt, columns, packing,
           over_length, num_proc, template_kwargs, max_bad_rows, pvc_mounts) -> dict:
    import datasets

    work = tmp / "_work"
    work.mkdir()
    counts = {"rows_in": 0, "dropped": {}, "formats": {}}
    seen: set = set()
    read = {"fmt": fmt, "columns": columns, "pvc_mounts": pvc_mounts, "max_bad_rows": max_bad_rows, "seed": seed,
            "seen": seen, "counts": counts}
    kind, n_rows = read_canonical(source_list, work / "canonical.arrow", **read)
    if eval_list:
        eval_kind, _ = read_canonical(eval_list, work / "canonical_eval.arrow", **read)
        if eval_kind != kind:
            raise DataError(f"mixed formats: the eval source is {eval_kind} but the training sources are {kind}")
    del seen
    if kind != "preference":
        if kind == "messages" and not tok.chat_template:
            raise DataError("the tokenizer has no chat template, which chat data needs; use the model's instruct "
                            "tokenizer or pass --chat-template FILE")
        overhead = template_overhead(tok, kind, template_kwargs)
        if max_seq_length <= overhead:
            raise DataError(f"max_seq_length={max_seq_length} is not more than the chat template's own {overhead} tokens "
                            "per example; raise max_seq_length")
    canonical = datasets.Dataset.from_file(str(work / "canonical.arrow"))
    if eval_list:
        canonical = datasets.concatenate_datasets([canonical, datasets.Dataset.from_file(str(work / "canonical_eval.arrow"))])
        is_eval = np.arange(len(canonical)) >= n_rows
    else:
        n_eval = round(eval_size * n_rows) if eval_size < 1 else int(eval_size)
        if not 0 < n_eval < n_rows:
            raise DataError(f"eval_size {eval_size} gives {n_eval} eval rows out of {n_rows}; "
                            "it must leave at least one for each split (lower eval_size or add data)")
        keys = _column(canonical, "split_key")
        is_eval = np.zeros(n_rows, dtype=bool)
        is_eval[np.argsort(keys, kind="stable")[:n_eval]] = True
    stats = {"sources": source_list, "eval_sources": eval_list, "format": kind, "formats": counts["formats"],
             "rows_in": counts["rows_in"], "rows_kept": len(canonical), "dropped": counts["dropped"], "truncated": 0,
             "max_seq_length": max_seq_length, "packing": packing and kind != "preference"}

    if kind == "preference":  # kept as text for a later preference-tuning stage: nothing to tokenize or pack
        ds = datasets.DatasetDict({
            split: canonical.select(np.flatnonzero(mask)).remove_columns("split_key")
            for split, mask in (("train", ~is_eval), ("eval", is_eval))})
        for split in ("train", "eval"):
            stats[split] = {"examples": len(ds[split]), "rows": len(ds[split])}
        ds.save_to_disk(str(tmp))
        shutil.rmtree(work)
        return stats

    log.info("tokenizing %d rows with %d process(es)", len(canonical), num_proc)
    tokenized = canonical.map(
        tokenize_batch, batched=True, batch_size=sources.BATCH_ROWS, num_proc=num_proc if num_proc > 1 else None,
        remove_columns=canonical.column_names, cache_file_name=str(work / "tokenized.arrow"),
        new_fingerprint=hashlib.sha256(str(work).encode()).hexdigest()[:16],
        fn_kwargs={"tokenizer": tok, "kind": kind, "max_seq_length": max_seq_length,
                   "truncate": over_length == "truncate", "template_kwargs": template_kwargs},
        desc="tokenize",
    )
    lengths, label_tokens = _column(tokenized, "length"), _column(tokenized, "label_tokens")
    over = lengths > max_seq_length
    if over_length == "drop":
        keep = ~over
        stats["dropped"]["over_length"] = int(over.sum())
    else:
        keep = label_tokens > 0  # truncation can cut away every assistant token
        stats["truncated"] = int(over.sum())
        stats["dropped"]["over_length_no_labels_left"] = int((~keep).sum())
    fitted = np.minimum(lengths, max_seq_length)
    stats["length_histogram"] = length_histogram(lengths)

    splits = {}
    for split, mask in (("train", ~is_eval & keep), ("eval", is_eval & keep)):
        idx = np.flatnonzero(mask)
        if not len(idx):
            raise DataError(f"every {split} row was filtered out (dropped: {stats['dropped']}); "
                            "raise max_seq_length, use over_length='truncate', or check the data")
        s = {"examples": len(idx), "tokens": int(fitted[idx].sum()), "label_tokens": int(label_tokens[idx].sum())}
        if stats["packing"]:
            path = work / f"packed_{split}.arrow"
            _write_stream(path, packed_batches(tokenized, idx, fitted[idx], max_seq_length, _pad_id(tok)))
            splits[split] = datasets.Dataset.from_file(str(path))
            s["rows"] = s["packed_rows"] = len(splits[split])
            s["packing_efficiency"] = round(s["tokens"] / (s["packed_rows"] * max_seq_length), 4)
        else:
            splits[split] = tokenized.select(idx).select_columns(["input_ids", "labels"])
            s["rows"] = len(idx)
        stats[split] = s
    first = tokenized.select(np.flatnonzero(~is_eval & keep)[:N_REPORT_EXAMPLES])["input_ids"]
    stats["examples"] = [tok.decode(ids) for ids in first]
    datasets.DatasetDict(splits).save_to_disk(str(tmp))
    del splits, tokenized, canonical
    shutil.rmtree(work)
    return stats


def _column(ds, name: str) -> np.ndarray:
    """One scalar column as a numpy array, straight from Arrow (a formatted column is read row by row)."""
    return ds.data.column(name).to_numpy()


def _pad_id(tok) -> int:
    if tok.pad_token_id is not None:
        return tok.pad_token_id
    return tok.eos_token_id if tok.eos_token_id is not None else 0


def _write_stream(path: Path, batches) -> None:
    import pyarrow as pa

    writer = None
    for batch in batches:
        if writer is None:
            writer = pa.ipc.new_stream(str(path), batch.schema)
        writer.write_batch(batch)
    writer.close()


# --------------------------------------------------------------------------- command line


def _mapping(items: list[str], flag: str) -> dict:
    out = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key or not value:
            raise DataError(f"{flag} {item!r}: expected NAME=VALUE")
        out[key] = value
    return out


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point: the same code the KFP component runs."""
    p = argparse.ArgumentParser(prog="python -m components.data.prepare", description=__doc__.split("\n")[0])
    p.add_argument("--source", required=True, action="append",
                   help="builtin:sample, a file/folder/glob, pvc://claim/path, hf://..., or a Hub id "
                        "(org/name?config=C&split=S&revision=R); repeat to mix sources")
    p.add_argument("--eval-source", action="append", help="take the eval split from this source instead of --eval-size")
    p.add_argument("--tokenizer", required=True, help="tokenizer folder or Hub id (builtin:tiny-qwen3 works)")
    p.add_argument("--out", required=True, help="output folder (replaced only when complete)")
    p.add_argument("--format", default="auto", choices=("auto", *formats.FORMATS))
    p.add_argument("--columns", action="append", default=[], metavar="CANONICAL=SOURCE_COLUMN",
                   help="map a source column onto the name a format reads, e.g. messages=dialog (repeatable)")
    p.add_argument("--max-seq-length", type=int, default=2048, help="packed row length; longer examples are dropped")
    p.add_argument("--over-length", choices=("drop", "truncate"), default="drop")
    p.add_argument("--eval-size", type=float, default=0.05, help="fraction (<1) or count (>=1)")
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--num-proc", type=int, default=1, help="tokenizer worker processes")
    p.add_argument("--no-packing", dest="packing", action="store_false", help="one example per row, no position_ids")
    p.add_argument("--chat-template", help="Jinja file that replaces the tokenizer's chat template")
    p.add_argument("--enable-thinking", choices=("true", "false"), help="Qwen3's thinking switch for the template")
    p.add_argument("--max-bad-rows", type=int, default=0, help="skip up to N unparseable/unknown-role rows (counted)")
    p.add_argument("--pvc-mount", action="append", default=[], metavar="CLAIM=MOUNT_PATH",
                   help="where a claim named in pvc:// sources is mounted")
    p.add_argument("--data-cache", help="reuse results kept here when sources, tokenizer and options are unchanged")
    p.add_argument("--cache-dir", default=os.path.expanduser("~/.cache/llm-post-training"),
                   help="where built-in models are built")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    from components.models.tiny import resolve_model

    try:
        stats = prepare(
            args.source, resolve_model(args.tokenizer, args.cache_dir), args.out, args.max_seq_length,
            int(args.eval_size) if args.eval_size >= 1 else args.eval_size, args.seed,
            format=args.format, columns=_mapping(args.columns, "--columns"), eval_source=args.eval_source,
            packing=args.packing, over_length=args.over_length, num_proc=args.num_proc,
            chat_template=args.chat_template,
            enable_thinking=None if args.enable_thinking is None else args.enable_thinking == "true",
            max_bad_rows=args.max_bad_rows, pvc_mounts=_mapping(args.pvc_mount, "--pvc-mount"),
            cache_dir=args.data_cache,
        )
    except DataError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(json.dumps({k: v for k, v in stats.items() if k != "examples"}, indent=2, ensure_ascii=False))
    return 0


if __name__ == "__main__":
    sys.exit(main())
