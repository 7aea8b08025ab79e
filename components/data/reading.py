"""Sources in, canonical rows out: the first stage of prepare_dataset.

Every source (:mod:`components.data.sources`) is streamed row by row, mapped onto the format's column
names, converted to the canonical row (:mod:`components.data.formats`), cleaned and deduplicated (exact
duplicates, across all sources), and written to an Arrow stream file with a ``split_key``: a seeded hash of
the row that decides train/eval the same way on every run and machine. Nothing is tokenized here.
"""

from __future__ import annotations

import hashlib
import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import datasets
import pyarrow as pa

from components.data import formats, sources
from components.data.formats import COMMAND_LINE, DataError, Options, RowError
from components.data.sources import SourceError

log = logging.getLogger("prepare_dataset")

# Rows with nothing to learn are cleaning, always dropped and counted; broken rows fail the run unless
# max_bad_rows (--max-bad-rows) allows skipping that many.
CLEANING_REASONS = ("empty_turn", "no_assistant_turn", "empty_text")
BAD_ROW_REASONS = ("unparseable", "invalid_utf8", "unknown_role", "malformed")


def resolve_sources(source_list: list[str], pvc_mounts: dict) -> list:
    """Every source resolved (:func:`components.data.sources.resolve`); a :class:`DataError` names a missing one."""
    try:
        return [sources.resolve(s, pvc_mounts) for s in source_list]
    except SourceError as e:
        raise DataError(str(e)) from None


@dataclass(frozen=True)
class ReadOptions:
    """How :func:`read_canonical` reads rows: ``fmt`` (``auto`` or one of :data:`formats.FORMATS`), ``columns``
    (canonical column name -> the source's), ``pvc_mounts`` (claim name -> mount path, for ``pvc://`` sources),
    ``max_bad_rows`` (broken rows skipped, counted, before the run fails), ``seed`` (of the split keys), ``names``
    (what the errors call the options: the command's flags, or a pipeline stage's settings) and ``filters`` (the
    noise filters, components/data/filters.py ``NoiseFilters``, each row must pass; None: none)."""

    fmt: str
    columns: dict
    pvc_mounts: dict
    max_bad_rows: int
    seed: int
    names: Options = COMMAND_LINE
    filters: Any = None


def read_sources(
    source_list: list[str], eval_list: list[str], work: Path, options: ReadOptions
) -> tuple[str, int, dict]:
    """Read the training sources into ``work/canonical.arrow`` and the eval sources, if any, into
    ``work/canonical_eval.arrow`` with ``options``; return (kind, training rows written, counts).

    Duplicates are dropped across both, and both must be of the same kind (chat, text or preference). ``counts`` has
    ``rows_in``, ``dropped`` (per reason) and ``formats`` (per source).
    """
    counts = {"rows_in": 0, "dropped": {}, "formats": {}}
    seen: set = set()
    kind, n_rows = read_canonical(source_list, work / "canonical.arrow", options, seen=seen, counts=counts)
    assert kind is not None  # only a shard's slice may have no rows
    if eval_list:
        eval_kind, _ = read_canonical(eval_list, work / "canonical_eval.arrow", options, seen=seen, counts=counts)
        if eval_kind != kind:
            raise DataError(f"mixed formats: the eval source is {eval_kind} but the training sources are {kind}")
    return kind, n_rows, counts


def _schema(kind: str, with_digest: bool = False):
    turns = datasets.List({"role": datasets.Value("string"), "content": datasets.Value("string")})
    columns = {
        "text": {"text": datasets.Value("string")},
        "messages": {"messages": turns},
        "preference": {"prompt": turns, "chosen": turns, "rejected": turns},
        "prompts": {"prompt": turns, "answer": datasets.Value("string")},
    }[kind]
    digest = {"digest": datasets.Value("binary")} if with_digest else {}
    return datasets.Features({**columns, "split_key": datasets.Value("float64"), **digest})


def _kind(fmt: str) -> str:
    return "messages" if fmt in formats.CHAT_FORMATS else fmt


def _digest(row: dict) -> bytes:
    return hashlib.blake2b(json.dumps(row, ensure_ascii=False, sort_keys=True).encode(), digest_size=16).digest()


def read_canonical(
    source_list: list[str],
    path: Path,
    options: ReadOptions,
    *,
    seen: set,
    counts: dict,
    resolved: list[tuple[str, object]] | None = None,
    shard: bool = False,
) -> tuple[str | None, int]:
    """Stream ``source_list`` into an Arrow file of canonical rows at ``path``; return (kind, rows written).

    ``seen`` holds the digests of rows already kept (duplicates are dropped across all sources);
    ``counts`` collects ``rows_in`` and the dropped rows per reason.

    A shard of the data (components/data/shards.py) passes ``resolved``, its own slice of each source's files as
    ``(source, files)``, and ``shard=True``: each row then keeps its ``digest`` (the join drops duplicates across
    shards by it), a source may have no rows in this slice (``counts["source_rows"]`` has each source's rows, for
    the join to check), and a slice with no row at all returns ``(None, 0)``.

    A row the noise filters (``options.filters``) drop is counted under the filter's reason.
    """
    if resolved is None:  # every path checked before reading
        resolved = [(s, sources.resolve(s, options.pvc_mounts)) for s in source_list]
    counts.setdefault("source_rows", {})
    out = _CanonicalWriter(path, options.seed, seen, counts, shard)
    rename = {src: canonical for canonical, src in options.columns.items()}
    try:
        for source, res in resolved:
            found, n_source = _SourceFormat(None if options.fmt == "auto" else options.fmt), 0
            for where, row in sources.read_rows(res):
                counts["rows_in"] += 1
                n_source += 1
                canonical = _canonical_row(row, where, rename, found, options, counts)
                if canonical is not None:
                    assert found.fmt is not None  # a canonical row's format is known
                    out.add(canonical, source, found.fmt)
            counts["source_rows"][source] = counts["source_rows"].get(source, 0) + n_source
            if n_source == 0 and not shard:
                raise DataError(f"source {source!r}: the dataset is empty; add at least one row")
            if found.fmt is not None:
                counts["formats"][source] = found.fmt
        if out.kind is None and shard:
            return None, 0
        if out.kind is None:
            raise DataError(f"every row of {source_list} was filtered out ({counts['dropped']}); check the data")
        out.flush()
    except SourceError as e:
        raise DataError(str(e)) from None
    finally:
        out.close()
    return out.kind, out.written


@dataclass
class _SourceFormat:
    """One source's format as its rows show it: ``fmt`` (given, or detected from its first row) and where that first
    row is (``first_where``)."""

    fmt: str | None
    first_where: str | None = None


def _canonical_row(row, where: str, rename: dict, found: _SourceFormat, o: ReadOptions, counts: dict) -> dict | None:
    """``row`` (at ``where``) as a clean canonical row of its source's format (``found``, detected from the source's
    first row with ``fmt`` auto); None when it is dropped: cleaning, a noise filter, or a broken row within
    ``max_bad_rows`` (each counted under its reason)."""
    names = o.names
    try:
        if isinstance(row, RowError):
            raise row
        row = {rename.get(k, k): v for k, v in row.items()}
        if found.fmt is None:
            found.fmt = formats.detect_format(row, where, names)
        if found.first_where is None:
            formats.check_columns(found.fmt, row, where, names)
            found.first_where = where
        elif any(c not in row for c in formats.REQUIRED[found.fmt]):
            try:
                other = formats.detect_format(row, where, names)
            except ValueError:
                formats.check_columns(found.fmt, row, where, names)
            separately = (
                f"pass them as separate {names.source} arguments"
                if names.flags
                else f"list them as separate sources in {names.source} (comma-separated)"
            )
            raise DataError(
                f"{where}: mixed formats: this row is {other!r} but {found.first_where} is {found.fmt!r}; "
                f"put each format in its own file and {separately}"
            )
        row = formats.clean(formats.to_canonical(found.fmt, row))
        if o.filters is not None and (noise := o.filters.row_reason(row)):
            counts["dropped"][noise] = counts["dropped"].get(noise, 0) + 1
            return None
        return row
    except RowError as e:
        _skip_bad_row(e, where, o, counts)
        return None
    except ValueError as e:
        raise DataError(str(e)) from None


def _skip_bad_row(e: RowError, where: str, o: ReadOptions, counts: dict) -> None:
    """Count the row ``e`` rejects under its reason, with a warning for a broken one; a DataError naming the fix when
    it is one broken row more than ``max_bad_rows`` allows."""
    if e.reason in CLEANING_REASONS:
        counts["dropped"][e.reason] = counts["dropped"].get(e.reason, 0) + 1
        return
    n_bad = counts["dropped"].get(e.reason, 0) + 1
    if sum(counts["dropped"].get(r, 0) for r in BAD_ROW_REASONS) + 1 > o.max_bad_rows:
        cap = f" (more than the {o.max_bad_rows} bad rows {o.names.max_bad_rows} allows)" if o.max_bad_rows else ""
        skip = o.names.set("max_bad_rows", max(10, 2 * o.max_bad_rows))
        verb = "pass" if o.names.flags else "set"
        raise DataError(f"{where}: {e}{cap}; to skip such rows instead, {verb} {skip}") from None
    counts["dropped"][e.reason] = n_bad
    log.warning("skipping %s: %s", where, e)


class _CanonicalWriter:
    """Canonical rows into the Arrow stream file at ``path``, in batches: every row of one kind (the first row's),
    exact duplicates of a row in ``seen`` dropped (counted), each row with its split key (and, for a ``shard``, its
    digest)."""

    def __init__(self, path: Path, seed: int, seen: set, counts: dict, shard: bool):
        self.path, self.seed, self.seen, self.counts, self.shard = path, seed, seen, counts, shard
        self.kind: str | None = None
        self.first_kind_source: str | None = None
        self.writer = None
        self.schema = None
        self.batch: list[dict] = []
        self.written = 0

    def add(self, row: dict, source: str, source_fmt: str) -> None:
        """``row``, read from ``source`` in format ``source_fmt``, unless it duplicates a row already kept."""
        row_kind = _kind(source_fmt)
        if self.kind is None:
            self.kind, self.first_kind_source = row_kind, source
            self.schema = _schema(self.kind, with_digest=self.shard).arrow_schema
            self.writer = pa.ipc.new_stream(str(self.path), self.schema)
        elif row_kind != self.kind:
            raise DataError(
                f"mixed formats: {source!r} is {source_fmt!r} ({row_kind}) but {self.first_kind_source!r} is "
                f"{self.kind}; "
                "prepare chat, text and preference data in separate runs"
            )
        digest = _digest(row)
        if digest in self.seen:
            self.counts["dropped"]["duplicate"] = self.counts["dropped"].get("duplicate", 0) + 1
            return
        self.seen.add(digest)
        row["split_key"] = _split_key(digest, self.seed)
        if self.shard:
            row["digest"] = digest
        self.batch.append(row)
        if len(self.batch) >= sources.BATCH_ROWS:
            self.flush()

    def flush(self) -> None:
        """The rows batched so far, written."""
        if self.batch:
            assert self.writer is not None  # opened with the first row's kind
            self.writer.write_batch(pa.RecordBatch.from_pylist(self.batch, schema=self.schema))
            self.written += len(self.batch)
            self.batch = []

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()


def _split_key(digest: bytes, seed: int) -> float:
    return int.from_bytes(hashlib.sha256(seed.to_bytes(8, "big", signed=True) + digest).digest()[:8], "big") / 2**64
