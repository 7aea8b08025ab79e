"""Instruction data in, packed tokenized training data out; the data step outside KFP.

    python -m components.data.prepare --source SRC [--source SRC2 ...] --tokenizer PATH_OR_ID --out DIR \\
        [--format auto|messages|sharegpt|alpaca|prompt_completion|text|preference] [--max-seq-length N] \\
        [--eval-size N_OR_FRACTION] [--num-proc N] [--over-length drop|truncate|chunk] [--chunk-overlap N] \\
        [--near-dedup-threshold J]

Three stages, one module each:

- reading (:mod:`components.data.reading`): every source (:mod:`components.data.sources`) to one
  canonical form (:mod:`components.data.formats`, Unicode NFC); rows with nothing to learn and exact
  duplicates dropped (counted per reason), and near-duplicates with ``near_dedup_threshold``
  (:mod:`components.data.near_dedup`); each row keyed for a train/eval split by a seeded hash (stable
  across runs and machines), or eval taken from its own source;
- tokenizing (:mod:`components.data.tokenizing`): chat rows rendered with the model's chat template and
  only assistant tokens labelled (-100 elsewhere; ``text`` rows learn every token), tokenized in batches
  with ``num_proc`` workers, long text documents cut into chunks (``over_length="chunk"``), and packed into
  rows of exactly ``max_seq_length`` tokens
  (:mod:`components.models.packing`);
- caching (:mod:`components.data.caching`): with ``cache_dir``, the result is kept under a fingerprint of
  sources + tokenizer + template + options, and a run with unchanged inputs reuses it instead of redoing
  the work.

Writes a ``datasets`` DatasetDict with ``save_to_disk`` plus ``stats.json`` into a temporary folder renamed
into place only when complete.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import sys
import tempfile
import time
from dataclasses import KW_ONLY, dataclass
from pathlib import Path
from typing import Any

import datasets
import numpy as np

from components.data import caching, formats, near_dedup, reading, sources, tokenizing
from components.data import shards as shard_work
from components.data.formats import COMMAND_LINE, DataError, Options
from components.data.report import length_histogram
from components.data.tokenizing import CHUNK, OVER_LENGTH
from components.models.resolve import resolve_model

__all__ = ["DataError", "PrepareOptions", "prepare", "main"]

log = logging.getLogger("prepare_dataset")

N_REPORT_EXAMPLES = 3
# Kinds kept as text: TRL applies the chat template in the trainer (preference pairs for dpo and rm, prompts for grpo).
TEXT_KINDS = ("preference", "prompts")


@dataclass(frozen=True)
class PrepareOptions:
    """How ``prepare`` prepares its sources (every field but the first three is keyword-only).

    Attributes:
        max_seq_length: the packed row length; longer examples are dropped, truncated or chunked (``over_length``).
        eval_size: a fraction (< 1) or a number of rows (>= 1) held out for evaluation; ignored with ``eval_source``.
        seed: seeds the train/eval split.
        format: ``auto`` (detected per source from its columns) or one of :data:`formats.FORMATS`.
        columns: canonical column name -> the source's column name, e.g. ``{"messages": "dialog"}``.
        eval_source: source(s) for the eval split instead of a held-out part of ``source``.
        packing: pack into rows of exactly ``max_seq_length`` with restarting ``position_ids``; when off,
            one example per row (``input_ids``, ``labels``).
        over_length: ``drop`` or ``truncate`` examples longer than ``max_seq_length``, or (text rows only)
            ``chunk`` them: consecutive chunks of ``max_seq_length`` tokens, each one a training example.
        num_proc: tokenizer worker processes; 0: one per CPU this process may use.
        chat_template: a Jinja file or template text that replaces the tokenizer's chat template.
        enable_thinking: passed to the chat template (Qwen3's thinking switch); ``None`` leaves its default.
        max_bad_rows: skip up to this many unparseable / invalid UTF-8 / unknown-role rows (counted) instead of failing.
        pvc_mounts: claim name -> mount path, to resolve ``pvc://claim/path`` sources.
        cache_dir: keep results here under their fingerprint and reuse them when inputs are unchanged.
        chunk_overlap: with ``over_length="chunk"``, tokens each chunk repeats from the end of the one before it, as
            context (labels -100: each token is learned once); below ``max_seq_length``.
        near_dedup_threshold: drop rows whose estimated Jaccard similarity to an earlier row (MinHash LSH over word
            5-grams) is at least this, in (0, 1]; 0: off.
        names: what errors call the options: this command's flags (the default), or a pipeline stage's settings
            (components/data/run.py).
        shards: tokenize the files in this many slices, each kept by fingerprint under ``shard_cache``, and join
            them (components/data/shards.py: what the pipeline's shard pods do with ``data_shards`` > 1); the
            result is the same for 1, 2 or more. 0: read and tokenize here in one pass, rows packed in reading order.
        shard_cache: where shards are kept (default: ``shards`` beside ``cache_dir``, else ``.shards`` beside
            ``out_dir``).
        only_shard: prepare this one shard of ``shards`` into ``shard_cache`` and return its stats, without a
            dataset at ``out_dir`` (what a shard pod does; the data step's join finds it there).
        filters: noise filters (components/data/filters.py ``NoiseFilters``) each row must pass; None: none.
    """

    max_seq_length: int = 2048
    eval_size: float = 0.05
    seed: int = 42
    _: KW_ONLY
    format: str = "auto"
    columns: dict | None = None
    eval_source: Any = None
    packing: bool = True
    over_length: str = "drop"
    num_proc: int = 1
    chat_template: str | None = None
    enable_thinking: bool | None = None
    max_bad_rows: int = 0
    pvc_mounts: dict | None = None
    cache_dir: str | None = None
    chunk_overlap: int = 0
    near_dedup_threshold: float = 0.0
    names: Options = COMMAND_LINE
    shards: int = 0
    shard_cache: str | None = None
    only_shard: int | None = None
    filters: Any = None


def prepare(source, tokenizer: str, out_dir: str, options: PrepareOptions = PrepareOptions()) -> dict:
    """Prepare ``source`` with ``tokenizer`` into ``out_dir`` as ``options`` say; return the stats written to
    stats.json.

    Args:
        source: one source string or a list of them (see :mod:`components.data.sources`).
        tokenizer: a tokenizer folder or Hub id; chat data needs a chat template (its own or ``chat_template``).
        out_dir: where the DatasetDict (train, eval) and stats.json go; replaced only when complete.
        options: the row length, eval split, seed, format and the rest (:class:`PrepareOptions`).
    """
    started = time.time()
    o = options
    source_list = [source] if isinstance(source, str) else list(source)
    eval_list = [o.eval_source] if isinstance(o.eval_source, str) else list(o.eval_source or [])
    columns, pvc_mounts = dict(o.columns or {}), dict(o.pvc_mounts or {})
    num_proc = o.num_proc or shard_work.available_cpus()
    _check_options(o.format, columns, o.over_length, o.max_seq_length, o.eval_size, eval_list, num_proc, o.max_bad_rows)
    _check_corpus_options(o.over_length, o.chunk_overlap, o.max_seq_length, o.near_dedup_threshold)
    tok = tokenizing.load_tokenizer(tokenizer, o.chat_template)
    template_kwargs = {} if o.enable_thinking is None else {"enable_thinking": o.enable_thinking}
    resolved = reading.resolve_sources(source_list + eval_list, pvc_mounts)
    fingerprinted = {
        "sources": source_list,
        "eval_sources": eval_list,
        "format": o.format,
        "columns": columns,
        "max_seq_length": o.max_seq_length,
        "eval_size": o.eval_size,
        "seed": o.seed,
        "packing": o.packing,
        "over_length": o.over_length,
        "chunk_overlap": o.chunk_overlap,
        "near_dedup_threshold": o.near_dedup_threshold,
        "template_kwargs": template_kwargs,
        "sharded": o.shards > 0,  # the join packs in split-key order: the same rows, packed differently
        "filters": None if o.filters is None else o.filters.describe(),
    }
    shard_cache = o.shard_cache or str(
        Path(o.cache_dir).parent / "shards" if o.cache_dir else Path(out_dir).parent / ".shards"
    )
    prep = shard_work.Preparation(
        train=list(zip(source_list, resolved[: len(source_list)], strict=True)),
        eval=list(zip(eval_list, resolved[len(source_list) :], strict=True)),
        tok=tok,
        cache=shard_cache,
        options=shard_work.shard_request(fingerprinted),
        read=reading.ReadOptions(o.format, columns, pvc_mounts, o.max_bad_rows, o.seed, o.names, o.filters),
        tokenize={"max_seq_length": o.max_seq_length, "over_length": o.over_length, "chunk_overlap": o.chunk_overlap}
        | {"num_proc": num_proc, "template_kwargs": template_kwargs},
        near_dedup_threshold=o.near_dedup_threshold,
    )
    if o.only_shard is not None:  # a shard pod's part: its slice read and tokenized, kept for the join
        return shard_work.build_one(prep, o.shards, o.only_shard)
    key = caching.fingerprint(resolved, tok, fingerprinted) if o.cache_dir else None
    _check_space(resolved, Path(out_dir).parent, o.names)
    stats = _write(prep, Path(out_dir), o.cache_dir, key, shards=o.shards, eval_size=o.eval_size, packing=o.packing)
    stats["seconds"] = round(time.time() - started, 2)
    (Path(out_dir) / "stats.json").unlink()  # on a cache hit a hard link to the cached copy, which must not change
    (Path(out_dir) / "stats.json").write_text(json.dumps(stats, indent=2, ensure_ascii=False))
    log.info(
        "prepared %s train / %s eval rows (%s train tokens, packing efficiency %s) in %.1fs -> %s",
        stats["train"]["rows"],
        stats["eval"]["rows"],
        stats["train"].get("tokens"),
        stats["train"].get("packing_efficiency", "n/a"),
        stats["seconds"],
        out_dir,
    )
    return stats


def _write(prep, out: Path, cache_dir: str | None, key: str | None, *, shards: int, eval_size, packing) -> dict:
    """``prep``'s dataset at ``out``: built in a temporary folder beside it (sharded or in one pass), or linked from
    the cache under ``key``, and renamed into place only when complete; its stats (also in ``stats.json``)."""
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}-", dir=out.parent))
    try:
        # key is set exactly when cache_dir is.
        if cache_dir and key and (stats := caching.reuse(cache_dir, key, tmp)) is not None:
            stats.update(cache_hit=True)
            log.info("inputs unchanged (fingerprint %s): reusing %s", key[:16], Path(cache_dir) / key)
        else:
            if shards > 0:
                stats = shard_work.build_sharded(prep, tmp, shards=shards, eval_size=eval_size, packing=packing)
            else:
                stats = _build(prep, tmp, eval_size, packing)
            stats.update(fingerprint=key, cache_hit=False)
            (tmp / "stats.json").write_text(json.dumps(stats, indent=2, ensure_ascii=False))
            if cache_dir and key:
                caching.keep(cache_dir, key, tmp)
        if out.exists():
            shutil.rmtree(out)
        os.rename(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return stats


def _check_options(fmt, columns, over_length, max_seq_length, eval_size, eval_list, num_proc, max_bad_rows) -> None:
    problems = []
    if fmt not in formats.DATASET_FORMATS:
        problems.append(f"format {fmt!r}: use auto or one of {', '.join(formats.FORMATS)}")
    known = {c for cols in formats.REQUIRED.values() for c in cols} | {"input", "system", "answer"}
    problems += [
        f"columns: {k!r} is not a column any format reads; map onto one of {sorted(known)}"
        for k in columns
        if k not in known
    ]
    if over_length not in (*OVER_LENGTH, CHUNK):
        problems.append(f"over_length {over_length!r}: use {' or '.join(OVER_LENGTH)}, or {CHUNK} for text rows")
    if max_seq_length < 2:
        problems.append(f"max_seq_length {max_seq_length}: must be at least 2")
    if not eval_list and eval_size <= 0:
        problems.append(f"eval_size {eval_size}: must be > 0 (a fraction < 1 or a row count), or pass an eval source")
    if eval_size >= 1 and eval_size != int(eval_size):
        problems.append(f"eval_size {eval_size}: a count must be a whole number (a fraction must be < 1)")
    if num_proc < 0:
        problems.append(f"num_proc {num_proc}: must be at least 1, or 0 for one per CPU")
    if max_bad_rows < 0:
        problems.append(f"max_bad_rows {max_bad_rows}: must be >= 0")
    if problems:
        raise DataError("; ".join(problems))


# Bytes on the output's volume per byte of source text: the tokenized rows (input_ids and labels, int32 and int64,
# lengths: ~12 bytes a token) while the step runs, then the packed dataset (as much again), for about 3.8 bytes of
# JSONL per token (Qwen3's tokenizer on chat rows: benchmarks/results/data_shards.md). Compressed files count
# COMPRESSION times their size (text compresses 3-5x with gzip and zstd).
SPACE_PER_SOURCE_BYTE = 6.5
COMPRESSION = 4


def _check_space(resolved: list, volume: Path, names: Options) -> None:
    """A DataError before any reading when the sources' files clearly need more room than ``volume`` has free
    (what the step would otherwise find out hours in, with ENOSPC); Hub datasets, whose size is not known here, are
    not counted."""
    from components.data.peek import codec_of

    files = [f for res in resolved if isinstance(res, list) for f in res]
    ids = sources.identity(files) if files else None
    if not ids:
        return
    text = sum(int(size) * (COMPRESSION if codec_of(str(path)) else 1) for path, size, *_ in ids)
    while not volume.exists():  # the output's folder is made later: its nearest existing parent is on its volume
        volume = volume.parent
    need, free = text * SPACE_PER_SOURCE_BYTE, shutil.disk_usage(volume).free
    if need > free:
        grow = "the volume --out is on" if names.flags else "the data claim (data_pvc)"
        raise DataError(
            f"{names.source}: {len(files)} file(s) of about {_size(text)} of text need about {_size(need)} free on "
            f"{volume} for their tokenized rows and the packed dataset, and {_size(free)} is free: grow {grow}, free "
            "space on it, or prepare fewer files at once"
        )


def _size(n: float) -> str:
    return f"{n / 1e9:,.1f} GB" if n >= 1e9 else f"{n / 1e6:,.1f} MB"


def _check_corpus_options(over_length, chunk_overlap, max_seq_length, near_dedup_threshold) -> None:
    problems = []
    if chunk_overlap and over_length != CHUNK:
        problems.append(f"chunk_overlap {chunk_overlap}: only over_length {CHUNK!r} makes chunks to overlap")
    if not 0 <= chunk_overlap < max_seq_length:
        problems.append(f"chunk_overlap {chunk_overlap}: must be >= 0 and below max_seq_length ({max_seq_length})")
    if near_dedup_threshold and not 0 < near_dedup_threshold <= 1:
        problems.append(f"near_dedup_threshold {near_dedup_threshold}: must be in (0, 1], or 0 (off)")
    if problems:
        raise DataError("; ".join(problems))


def _build(prep: shard_work.Preparation, tmp: Path, eval_size, packing) -> dict:
    """The dataset of ``prep`` read, cleaned, split, tokenized and packed in one pass here, into ``tmp``."""
    source_list, eval_list = [source for source, _ in prep.train], [source for source, _ in prep.eval]
    tok, names = prep.tok, prep.read.names
    max_seq_length, over_length = prep.tokenize["max_seq_length"], prep.tokenize["over_length"]
    template_kwargs, near_dedup_threshold = prep.tokenize["template_kwargs"], prep.near_dedup_threshold
    work = tmp / "_work"
    work.mkdir()
    kind, n_rows, counts = reading.read_sources(source_list, eval_list, work, prep.read)
    if kind not in TEXT_KINDS:
        tokenizing.check_tokenizer(tok, kind, max_seq_length, template_kwargs)
    if over_length == CHUNK and kind != "text":
        raise DataError(f"over_length {CHUNK!r} cuts text rows (the cpt stage's); {kind} rows are dropped or truncated")
    canonical = datasets.Dataset.from_file(str(work / "canonical.arrow"))
    if eval_list:
        eval_rows = datasets.Dataset.from_file(str(work / "canonical_eval.arrow"))
        canonical = datasets.concatenate_datasets([canonical, eval_rows])
    near_dedup_seconds = None
    if near_dedup_threshold:
        near_started = time.time()
        near = near_dedup.near_duplicates(canonical, near_dedup_threshold)
        near_dedup_seconds = round(time.time() - near_started, 2)
        counts["dropped"]["near_duplicate"] = int(near.sum())
        if near.any():
            n_rows -= int(near[:n_rows].sum())
            kept_rows = canonical.select(np.flatnonzero(~near))
            canonical = kept_rows.flatten_indices(cache_file_name=str(work / "near_deduplicated.arrow"))
    if eval_list:
        is_eval = np.arange(len(canonical)) >= n_rows
    else:
        n_eval = round(eval_size * n_rows) if eval_size < 1 else int(eval_size)
        if not 0 < n_eval < n_rows:
            duplicates, near = counts["dropped"].get("duplicate", 0), counts["dropped"].get("near_duplicate", 0)
            # Rows are counted after duplicates are dropped: say so when that is why there are few.
            which = [f"{duplicates} of them exact duplicates of another"] if duplicates else []
            which += [f"{near} near-duplicates (near_dedup_threshold)"] if near else []
            deduplicated = f" ({counts['rows_in']} rows read, {' and '.join(which)}, dropped)" if which else ""
            raise DataError(
                f"{names.set('eval_size', eval_size)} gives {n_eval} eval rows out of {n_rows}{deduplicated}; "
                f"it must leave at least one for each split (change {names.eval_size}, or add data)"
            )
        keys = _column(canonical, "split_key")
        is_eval = np.zeros(n_rows, dtype=bool)
        is_eval[np.argsort(keys, kind="stable")[:n_eval]] = True
    stats = {
        "sources": source_list,
        "eval_sources": eval_list,
        "format": kind,
        "formats": counts["formats"],
        "rows_in": counts["rows_in"],
        "rows_kept": len(canonical),
        "dropped": counts["dropped"],
        "truncated": 0,
        "max_seq_length": max_seq_length,
        "packing": packing and kind not in TEXT_KINDS,
    }
    if near_dedup_seconds is not None:
        stats.update(near_dedup_threshold=near_dedup_threshold, near_dedup_seconds=near_dedup_seconds)

    if kind in TEXT_KINDS:  # kept as text for the trainer (TRL tokenizes it): nothing to tokenize or pack
        ds = datasets.DatasetDict(
            {
                split: canonical.select(np.flatnonzero(mask)).remove_columns("split_key")
                for split, mask in (("train", ~is_eval), ("eval", is_eval))
            }
        )
        for split in ("train", "eval"):
            stats[split] = {"examples": len(ds[split]), "rows": len(ds[split])}
        ds.save_to_disk(str(tmp))
        shutil.rmtree(work)
        return stats

    tokenized = tokenizing.tokenize(canonical, tok, kind, work=work, **prep.tokenize)
    lengths, label_tokens = _column(tokenized, "length"), _column(tokenized, "label_tokens")
    keep, stats["truncated"], dropped = tokenizing.over_length_mask(lengths, label_tokens, max_seq_length, over_length)
    stats["dropped"].update(dropped)
    if over_length == CHUNK:  # rows are chunks now: each goes to its document's split
        is_eval = is_eval[_column(tokenized, "doc")]
        chunk = _column(tokenized, "chunk")
        chunked = int((chunk == 1).sum())
        stats.update(
            chunk_overlap=prep.tokenize["chunk_overlap"],
            chunked_documents=chunked,
            chunks=int((chunk >= 1).sum()) + chunked,
        )
    fitted = np.minimum(lengths, max_seq_length)
    stats["length_histogram"] = length_histogram(lengths)

    selected = {split: np.flatnonzero(mask) for split, mask in (("train", ~is_eval & keep), ("eval", is_eval & keep))}
    splits, counts_of = tokenizing.pack_splits(
        tokenized,
        selected,
        fitted,
        label_tokens,
        max_seq_length=max_seq_length,
        packing=stats["packing"],
        tok=tok,
        work=work,
        dropped=stats["dropped"],
    )
    stats.update(counts_of)
    first = tokenized.select(np.flatnonzero(~is_eval & keep)[:N_REPORT_EXAMPLES])["input_ids"]
    stats["examples"] = [tok.decode(ids) for ids in first]
    datasets.DatasetDict(splits).save_to_disk(str(tmp))
    del splits, tokenized, canonical
    shutil.rmtree(work)
    return stats


def _column(ds, name: str) -> np.ndarray:
    """One scalar column as a numpy array, straight from Arrow (a formatted column is read row by row)."""
    return ds.data.column(name).to_numpy()


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
    p.add_argument(
        "--source",
        required=True,
        action="append",
        help="builtin:sample, a file/folder/glob, pvc://claim/path, hf://..., or a Hub id "
        "(org/name?config=C&split=S&revision=R); repeat to mix sources",
    )
    p.add_argument("--eval-source", action="append", help="take the eval split from this source instead of --eval-size")
    p.add_argument("--tokenizer", required=True, help="tokenizer folder or Hub id (builtin:tiny-qwen3 works)")
    p.add_argument("--out", required=True, help="output folder (replaced only when complete)")
    p.add_argument("--format", default="auto", choices=formats.DATASET_FORMATS)
    p.add_argument(
        "--columns",
        action="append",
        default=[],
        metavar="CANONICAL=SOURCE_COLUMN",
        help="map a source column onto the name a format reads, e.g. messages=dialog (repeatable)",
    )
    p.add_argument("--max-seq-length", type=int, default=2048, help="packed row length; longer examples are dropped")
    p.add_argument(
        "--over-length",
        choices=(*OVER_LENGTH, CHUNK),
        default="drop",
        help="examples longer than --max-seq-length: drop, truncate, or chunk (text: consecutive chunks, each learned)",
    )
    p.add_argument("--chunk-overlap", type=int, default=0, help="with chunk: tokens repeated as context (unlabelled)")
    p.add_argument(
        "--near-dedup-threshold",
        type=float,
        default=0.0,
        help="drop rows at least this similar (MinHash Jaccard, in (0, 1]) to an earlier row; 0: off",
    )
    p.add_argument("--eval-size", type=float, default=0.05, help="fraction (<1) or count (>=1)")
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--num-proc", type=int, default=1, help="tokenizer worker processes")
    p.add_argument("--no-packing", dest="packing", action="store_false", help="one example per row, no position_ids")
    p.add_argument("--chat-template", help="Jinja file that replaces the tokenizer's chat template")
    p.add_argument("--enable-thinking", choices=("true", "false"), help="Qwen3's thinking switch for the template")
    p.add_argument("--max-bad-rows", type=int, default=0, help="skip up to N unparseable/unknown-role rows (counted)")
    p.add_argument(
        "--pvc-mount",
        action="append",
        default=[],
        metavar="CLAIM=MOUNT_PATH",
        help="where a claim named in pvc:// sources is mounted",
    )
    p.add_argument("--data-cache", help="reuse results kept here when sources, tokenizer and options are unchanged")
    p.add_argument(
        "--cache-dir", default=os.path.expanduser("~/.cache/llm-post-training"), help="where built-in models are built"
    )
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    try:
        stats = prepare(
            args.source,
            resolve_model(args.tokenizer, args.cache_dir),
            args.out,
            PrepareOptions(
                args.max_seq_length,
                int(args.eval_size) if args.eval_size >= 1 else args.eval_size,
                args.seed,
                format=args.format,
                columns=_mapping(args.columns, "--columns"),
                eval_source=args.eval_source,
                packing=args.packing,
                over_length=args.over_length,
                num_proc=args.num_proc,
                chat_template=args.chat_template,
                enable_thinking=None if args.enable_thinking is None else args.enable_thinking == "true",
                max_bad_rows=args.max_bad_rows,
                pvc_mounts=_mapping(args.pvc_mount, "--pvc-mount"),
                cache_dir=args.data_cache,
                chunk_overlap=args.chunk_overlap,
                near_dedup_threshold=args.near_dedup_threshold,
            ),
        )
    except DataError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(json.dumps({k: v for k, v in stats.items() if k != "examples"}, indent=2, ensure_ascii=False))
    return 0


if __name__ == "__main__":
    from components.quick_exit import freeze_heap_at_exit

    freeze_heap_at_exit()
    sys.exit(main())
