"""Sharded preparation (``data_shards``): a corpus tokenized on many pods at once, then joined into one dataset.

A shard is a slice of the input files: every source's files (``components/data/sources.py``) are dealt to
``shards`` slices by size, largest first to the lightest slice, so each pod gets about the same bytes. Shard ``i``
reads its files into canonical rows (``components/data/reading.py``: formats, cleaning, the noise filters, exact
duplicates within the slice), keeps each row's digest and split key, and tokenizes them with its pod's CPUs. What it
writes is kept by fingerprint (its files, the tokenizer, the options, ``i`` and ``shards``) under
``<data cache>/shards/<fingerprint>``, renamed into place when complete: a retried run, or a data step that finds
it there, skips it.

The join (the data step itself) takes every shard, preparing here any that is not complete yet, and makes the dataset
the trainer reads, as ``prepare`` does for one pod:

- exact duplicates across shards dropped by digest (a row is kept once, whichever shard read it: the rows do not
  depend on the shard count), and near-duplicates where ``near_dedup_threshold`` is set, over every shard's rows;
- the eval split by split key, as ``prepare`` takes it (the ``eval_size`` rows with the smallest keys), or the eval
  sources, read and tokenized here (eval data is small);
- over-length examples dropped or truncated, then both splits packed in one fixed order (split key, then digest):
  1, 2 or 3 shards give the same rows.

Only files are dealt out; a Hub dataset id or a ``save_to_disk`` folder is one unit, read by shard 0. A source of
fewer files than shards leaves some shards empty: split a corpus into many files (JSONL, compressed or not, or
Parquet) to spread it.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import datasets
import numpy as np

from components.data import caching, reading, sources, tokenizing
from components.data.formats import COMMAND_LINE, DataError, Options
from components.data.report import length_histogram
from components.data.tokenizing import CHUNK

log = logging.getLogger("prepare_dataset")

SHARD_STATS = "shard.json"
KEYS_FILE = "keys.npz"
# Kinds a shard tokenizes: chat and text rows (the sft and cpt stages' data). Preference and prompt rows stay text
# for TRL, and are small: the data step reads them alone.
TOKENIZED_KINDS = ("messages", "text")


def available_cpus() -> int:
    """CPUs this process may use: the cgroup's CPU quota where one is set (a pod's CPU limit), else the CPUs the
    scheduler lets it run on. ``num_proc=0`` means this many tokenizer workers."""
    cpus = len(os.sched_getaffinity(0))
    try:  # cgroup v2: "max 100000" or "<quota> <period>"
        quota, period = Path("/sys/fs/cgroup/cpu.max").read_text().split()
        if quota != "max":
            cpus = min(cpus, max(1, int(quota) // int(period)))
    except (OSError, ValueError):
        pass
    return cpus


def deal_files(files: list[str], sizes: list[int], shards: int) -> list[list[str]]:
    """``files`` dealt to ``shards`` slices: largest first, each to the slice with the fewest bytes so far (ties to
    the lowest index); each slice in the files' own order. The same files give the same slices on every machine."""
    slices: list[list[int]] = [[] for _ in range(shards)]
    load = [0] * shards
    for i in sorted(range(len(files)), key=lambda i: (-sizes[i], files[i])):
        target = min(range(shards), key=lambda s: (load[s], s))
        slices[target].append(i)
        load[target] += sizes[i]
    return [[files[i] for i in sorted(s)] for s in slices]


def _sizes(files: list[str]) -> list[int]:
    """Each file's size, from what the fingerprint cache records (no download of an object-store file)."""
    ids = sources.identity(files)
    return [int(entry[1]) for entry in ids] if ids is not None else [1] * len(files)


def shard_slices(resolved: list[tuple[str, object]], shards: int) -> list[list[tuple[str, object]]]:
    """Each shard's part of every source, as ``(source, resolved)`` pairs: files dealt by :func:`deal_files` over all
    sources together; a source that is not a list of files (a Hub dataset, a saved dataset) goes whole to shard 0."""
    files = [(source, f) for source, res in resolved if isinstance(res, list) for f in res]
    dealt = deal_files([f for _, f in files], _sizes([f for _, f in files]), shards)
    owner = {f: i for i, part in enumerate(dealt) for f in part}
    out: list[list[tuple[str, object]]] = [[] for _ in range(shards)]
    for source, res in resolved:
        if not isinstance(res, list):
            out[0].append((source, res))
            continue
        for i in range(shards):
            mine = [f for f in res if owner[f] == i]
            if mine:
                out[i].append((source, mine))
    return out


def digest_words(digests: list[bytes]) -> np.ndarray:
    """Rows' 16-byte digests as an (n, 2) array of uint64 words, to sort and compare with numpy."""
    return np.frombuffer(b"".join(digests), dtype=">u8").reshape(-1, 2).astype(np.uint64)


def shard_key(part: list[tuple[str, object]], tok, options: dict, shard: int, shards: int) -> str | None:
    """The fingerprint a shard is kept under: its files, the tokenizer, the options, its index and the count."""
    return caching.fingerprint([res for _, res in part], tok, {**options, "shard": [shard, shards]})


def prepare_shard(work: Preparation, part: list[tuple[str, object]], key: str | None) -> Path:
    """Read and tokenize one shard's ``part`` of ``work`` into ``<work.cache>/<key>`` (reused as it is when complete
    there); return the folder. It holds the tokenized rows (``datasets`` ``save_to_disk``), ``keys.npz`` (each
    document's digest and split key, and its MinHash signature when ``near_dedup_threshold`` is set) and
    ``shard.json``."""
    cache_dir = work.cache
    if key is not None and (Path(cache_dir) / key / SHARD_STATS).is_file():
        log.info("shard %s is complete: reusing it", key[:16])
        return Path(cache_dir) / key
    started = time.time()
    os.makedirs(cache_dir, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".shard-", dir=cache_dir))
    try:
        counts: dict = {"rows_in": 0, "dropped": {}, "formats": {}}
        kind, n_rows = reading.read_canonical(
            [source for source, _ in part],
            tmp / "canonical.arrow",
            work.read,
            seen=set(),
            counts=counts,
            resolved=part,
            shard=True,
        )
        stats: dict = {"kind": kind, "documents": n_rows, "counts": counts}
        if kind is not None:
            _tokenize_shard(work, kind, tmp)
        (tmp / "canonical.arrow").unlink(missing_ok=True)
        stats["seconds"] = round(time.time() - started, 2)
        (tmp / SHARD_STATS).write_text(json.dumps(stats, indent=2, ensure_ascii=False))
        if key is None:  # a source that cannot be pinned (an unpinned Hub dataset): not kept for another run
            key = f"unpinned-{os.getpid()}-{time.time_ns()}"
        dest = Path(cache_dir) / key
        if dest.exists():  # another pod finished the same shard first: its copy is as good
            shutil.rmtree(tmp)
        else:
            os.rename(tmp, dest)
        log.info("shard: %d documents read and tokenized in %.1fs -> %s", n_rows, stats["seconds"], dest)
        return dest
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def _tokenize_shard(work: Preparation, kind: str, tmp: Path) -> None:
    """The shard's canonical rows in ``tmp`` (of ``kind``) tokenized into ``tmp/rows``, with their documents' keys in
    ``tmp/keys.npz``."""
    tok, max_seq_length = work.tok, work.tokenize["max_seq_length"]
    if kind not in TOKENIZED_KINDS:
        raise DataError(f"data_shards: {kind} rows are read by the data step alone; set data_shards=1")
    tokenizing.check_tokenizer(tok, kind, max_seq_length, work.tokenize["template_kwargs"])
    if work.tokenize["over_length"] == CHUNK and kind != "text":
        raise DataError(f"over_length {CHUNK!r} cuts text rows (the cpt stage's); {kind} rows are dropped or truncated")
    canonical = datasets.Dataset.from_file(str(tmp / "canonical.arrow"))
    keys = {
        "digest": digest_words(canonical.data.column("digest").to_pylist()),
        "split_key": canonical.data.column("split_key").to_numpy(),
    }
    if work.near_dedup_threshold:
        from components.data.near_dedup import signatures

        keys["minhash"] = signatures(canonical)
    scratch = tmp / "_work"
    scratch.mkdir()
    tokenized = tokenizing.tokenize(canonical, tok, kind, work=scratch, **work.tokenize)
    tokenized.save_to_disk(str(tmp / "rows"))
    np.savez(tmp / KEYS_FILE, **keys)
    del tokenized, canonical
    shutil.rmtree(scratch)


def join_shards(
    shard_dirs: list[Path],
    tok,
    out: Path,
    *,
    source_list: list[str],
    eval_dir: Path | None = None,
    eval_size: float,
    max_seq_length: int,
    over_length: str,
    packing: bool,
    near_dedup_threshold: float = 0.0,
    names: Options = COMMAND_LINE,
) -> dict:
    """The shards in ``shard_dirs`` joined into a DatasetDict (train, eval) saved at ``out``; return the stats.

    ``eval_dir``: the eval sources read and tokenized as one more shard (:func:`prepare_shard`), or None to hold out
    ``eval_size`` of the data by split key."""
    shard_stats = [json.loads((d / SHARD_STATS).read_text()) for d in shard_dirs]
    kinds = {s["kind"] for s in shard_stats if s["kind"] is not None}
    if not kinds:
        raise DataError(f"every row of {source_list} was filtered out; check the data")
    if len(kinds) > 1:
        raise DataError(f"mixed formats across the shards' files ({sorted(kinds)}); prepare each kind in its own run")
    kind = kinds.pop()
    counts = _merged_counts(shard_stats)
    for source in source_list:
        if counts["source_rows"].get(source, 0) == 0:
            raise DataError(f"source {source!r}: the dataset is empty; add at least one row")
    parts = [
        (datasets.load_from_disk(str(d / "rows")), dict(np.load(d / KEYS_FILE)))
        for d in shard_dirs
        if (d / KEYS_FILE).exists()  # an empty shard has none
    ]
    if eval_dir is not None:
        parts.append((datasets.load_from_disk(str(eval_dir / "rows")), dict(np.load(eval_dir / KEYS_FILE))))
    docs = _Documents.of([k for _, k in parts], eval_part=eval_dir is not None)
    counts["dropped"]["duplicate"] = counts["dropped"].get("duplicate", 0) + int((~docs.kept).sum())
    near_dedup_seconds = None
    if near_dedup_threshold:
        near_started = time.time()
        counts["dropped"]["near_duplicate"] = docs.drop_near_duplicates(parts, near_dedup_threshold)
        near_dedup_seconds = round(time.time() - near_started, 2)
    if eval_dir is None:
        docs.hold_out(eval_size, names)
    is_eval_doc, kept_doc, rank, doc_offsets = docs.is_eval, docs.kept, docs.rank, docs.offsets
    # Tokenized rows: each one's document, then kept or not, split and order.
    tokenized = datasets.concatenate_datasets([ds for ds, _ in parts])
    row_doc = np.concatenate(
        [
            (ds.data.column("doc").to_numpy() if "doc" in ds.column_names else np.arange(len(ds))) + doc_offsets[p]
            for p, (ds, _) in enumerate(parts)
        ]
    )
    chunk = np.concatenate(
        [
            ds.data.column("chunk").to_numpy() if "chunk" in ds.column_names else np.zeros(len(ds), dtype=np.int64)
            for ds, _ in parts
        ]
    )
    lengths = tokenized.data.column("length").to_numpy()
    label_tokens = tokenized.data.column("label_tokens").to_numpy()
    keep, truncated, dropped = tokenizing.over_length_mask(lengths, label_tokens, max_seq_length, over_length)
    for reason, n in dropped.items():
        counts["dropped"][reason] = counts["dropped"].get(reason, 0) + n
    keep &= kept_doc[row_doc]
    row_order = np.lexsort((chunk, rank[row_doc]))
    fitted = np.minimum(lengths, max_seq_length)
    stats: dict = {
        "sources": source_list,
        "format": kind,
        "formats": counts["formats"],
        "rows_in": counts["rows_in"],
        "rows_kept": int(kept_doc.sum()),
        "dropped": counts["dropped"],
        "truncated": truncated,
        "max_seq_length": max_seq_length,
        "packing": packing,
        "shards": len(shard_dirs),
        "shard_seconds": [s["seconds"] for s in shard_stats],
        "length_histogram": length_histogram(lengths[kept_doc[row_doc]]),
    }
    if near_dedup_seconds is not None:
        stats.update(near_dedup_threshold=near_dedup_threshold, near_dedup_seconds=near_dedup_seconds)
    if over_length == CHUNK:  # counted as prepare counts them, over the documents kept
        kept_chunk = chunk[kept_doc[row_doc]]
        chunked = int((kept_chunk == 1).sum())
        stats.update(chunked_documents=chunked, chunks=int((kept_chunk >= 1).sum()) + chunked)
    work = out / "_work"
    work.mkdir(parents=True)
    selected = {
        split: row_order[mask[row_order]]
        for split, mask in (("train", ~is_eval_doc[row_doc] & keep), ("eval", is_eval_doc[row_doc] & keep))
    }
    splits, counts_of = tokenizing.pack_splits(
        tokenized,
        selected,
        fitted,
        label_tokens,
        max_seq_length=max_seq_length,
        packing=packing,
        tok=tok,
        work=work,
        dropped=stats["dropped"],
    )
    stats.update(counts_of)
    stats["examples"] = [tok.decode(ids) for ids in tokenized.select(selected["train"][:3])["input_ids"]]
    datasets.DatasetDict(splits).save_to_disk(str(out))
    del splits, tokenized
    shutil.rmtree(work)
    return stats


@dataclass
class _Documents:
    """Every part's documents in one numbering (part after part): which are kept (one copy of each digest), which
    are eval, and their rank in the fixed order every later step follows (split key, then digest)."""

    digests: np.ndarray  # (n, 2) uint64
    split_keys: np.ndarray
    offsets: np.ndarray  # where each part's documents start
    is_eval: np.ndarray
    kept: np.ndarray
    rank: np.ndarray

    @classmethod
    def of(cls, keys: list[dict], *, eval_part: bool) -> _Documents:
        """From the parts' ``keys.npz``; with ``eval_part`` the last part is the eval sources'."""
        digests = np.concatenate([k["digest"] for k in keys])
        split_keys = np.concatenate([k["split_key"] for k in keys])
        offsets = np.cumsum([0] + [len(k["digest"]) for k in keys])
        is_eval = np.zeros(len(digests), dtype=bool)
        if eval_part:
            is_eval[offsets[-2] :] = True
        # One copy of each document: the first of equal digests in (training before eval, then) part order; all
        # copies are the same row.
        order = np.lexsort((np.arange(len(digests)), is_eval, digests[:, 1], digests[:, 0]))
        ordered = digests[order]
        first = np.ones(len(order), dtype=bool)
        first[1:] = (ordered[1:] != ordered[:-1]).any(axis=1)
        kept = np.zeros(len(digests), dtype=bool)
        kept[order[first]] = True
        rank = np.empty(len(digests), dtype=np.int64)  # a total order on distinct rows
        rank[np.lexsort((digests[:, 1], digests[:, 0], split_keys))] = np.arange(len(digests))
        return cls(digests, split_keys, offsets, is_eval, kept, rank)

    def drop_near_duplicates(self, parts: list, threshold: float) -> int:
        """Drop the kept documents whose MinHash signatures (each part's ``minhash``) are within ``threshold`` of
        an earlier kept one, training before eval and then in rank order; how many were dropped."""
        from components.data.near_dedup import near_duplicates_of

        candidates = np.flatnonzero(self.kept)
        candidates = candidates[np.lexsort((self.rank[candidates], self.is_eval[candidates]))]
        minhash = np.concatenate([k["minhash"] for _, k in parts])
        near = near_duplicates_of(minhash[candidates], threshold)
        self.kept[candidates[near]] = False
        return int(near.sum())

    def hold_out(self, eval_size: float, names: Options) -> None:
        """Mark ``eval_size`` of the kept documents eval (a fraction, or a count), those with the smallest split
        keys, as ``prepare`` takes them."""
        n_docs = int((self.kept & ~self.is_eval).sum())
        n_eval = round(eval_size * n_docs) if eval_size < 1 else int(eval_size)
        if not 0 < n_eval < n_docs:
            raise DataError(
                f"{names.set('eval_size', eval_size)} gives {n_eval} eval rows out of {n_docs}; "
                f"it must leave at least one for each split (change {names.eval_size}, or add data)"
            )
        train_docs = np.flatnonzero(self.kept)
        self.is_eval[train_docs[np.argsort(self.split_keys[train_docs], kind="stable")[:n_eval]]] = True


def _merged_counts(shard_stats: list[dict]) -> dict:
    """The shards' reading counts added up: rows read, dropped per reason, each source's rows and format."""
    merged: dict = {"rows_in": 0, "dropped": {}, "formats": {}, "source_rows": {}}
    for s in shard_stats:
        c = s["counts"]
        merged["rows_in"] += c["rows_in"]
        for reason, n in c["dropped"].items():
            merged["dropped"][reason] = merged["dropped"].get(reason, 0) + n
        for source, n in c.get("source_rows", {}).items():
            merged["source_rows"][source] = merged["source_rows"].get(source, 0) + n
        merged["formats"].update(c["formats"])
    return merged


@dataclass(frozen=True)
class Preparation:
    """One preparation, as ``prepare`` sets it up: the training and eval sources with what they resolved to, the
    tokenizer, where shards are kept, the options their fingerprint covers, and how rows are read
    (``reading.read_canonical``'s options) and tokenized (``tokenizing.tokenize``'s). Both the one-pass build and
    the sharded one read it."""

    train: list[tuple[str, object]]
    eval: list[tuple[str, object]]
    tok: Any
    cache: str
    options: dict
    read: reading.ReadOptions
    tokenize: dict
    near_dedup_threshold: float = 0.0

    def prepare(self, part: list[tuple[str, object]], key: str | None) -> Path:
        return prepare_shard(self, part, key)


def build_one(work: Preparation, shards: int, shard: int) -> dict:
    """Shard ``shard`` of ``shards`` prepared (or found complete); its stats, with ``folder`` where it is kept."""
    if not 0 <= shard < shards:
        raise DataError(f"shard {shard}: there are {shards} (data_shards), numbered from 0")
    part, key = shard_plan(work.train, work.tok, work.options, shards)[shard]
    folder = work.prepare(part, key)
    return {**json.loads((folder / SHARD_STATS).read_text()), "folder": str(folder), "shard": [shard, shards]}


def build_sharded(work: Preparation, out: Path, *, shards: int, eval_size: float, packing: bool) -> dict:
    """What ``prepare`` builds with ``shards`` > 0: each shard of the training sources prepared, or taken as it is
    where a shard pod completed it (:func:`shard_plan` names the same folders), the eval sources read as one more
    part, and the parts joined into ``out`` (:func:`join_shards`)."""
    dirs = [work.prepare(part, key) for part, key in shard_plan(work.train, work.tok, work.options, shards)]
    eval_dir = None
    if work.eval:
        eval_dir = work.prepare(work.eval, shard_key(work.eval, work.tok, {**work.options, "eval": True}, 0, 1))
    stats = join_shards(
        dirs,
        work.tok,
        out,
        source_list=[source for source, _ in work.train],
        eval_dir=eval_dir,
        eval_size=eval_size,
        max_seq_length=work.tokenize["max_seq_length"],
        over_length=work.tokenize["over_length"],
        packing=packing,
        near_dedup_threshold=work.near_dedup_threshold,
        names=work.read.names,
    )
    stats["eval_sources"] = [source for source, _ in work.eval]
    return stats


def shard_request(options: dict) -> dict:
    """The options a shard's rows depend on (``prepare``'s, less what only the join reads: the eval split, packing,
    the source names, whose files the key covers)."""
    return {k: v for k, v in options.items() if k not in ("sources", "eval_sources", "eval_size", "packing")}


def shard_plan(train: list[tuple[str, object]], tok, shard_options: dict, shards: int) -> list[tuple[list, str | None]]:
    """Each shard's part of ``train`` and the fingerprint it is kept under: the same for the shard pods and the join."""
    return [
        (part, shard_key(part, tok, shard_options, i, shards)) for i, part in enumerate(shard_slices(train, shards))
    ]
