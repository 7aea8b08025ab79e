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
from pathlib import Path

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


def read_sources(source_list: list[str], eval_list: list[str], work: Path, **read) -> tuple[str, int, dict]:
    """Read the training sources into ``work/canonical.arrow`` and the eval sources, if any, into
    ``work/canonical_eval.arrow``; return (kind, training rows written, counts).

    ``read`` are :func:`read_canonical`'s keyword options. Duplicates are dropped across both, and both must
    be of the same kind (chat, text or preference). ``counts`` has ``rows_in``, ``dropped`` (per reason) and
    ``formats`` (per source).
    """
    counts = {"rows_in": 0, "dropped": {}, "formats": {}}
    seen: set = set()
    kind, n_rows = read_canonical(source_list, work / "canonical.arrow", seen=seen, counts=counts, **read)
    assert kind is not None  # only a shard's slice may have no rows
    if eval_list:
        eval_kind, _ = read_canonical(eval_list, work / "canonical_eval.arrow", seen=seen, counts=counts, **read)
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
    *,
    fmt: str,
    columns: dict,
    pvc_mounts: dict,
    max_bad_rows: int,
    seed: int,
    seen: set,
    counts: dict,
    names: Options = COMMAND_LINE,
    resolved: list[tuple[str, object]] | None = None,
    shard: bool = False,
    filters=None,
) -> tuple[str | None, int]:
    """Stream ``source_list`` into an Arrow file of canonical rows at ``path``; return (kind, rows written).

    ``seen`` holds the digests of rows already kept (duplicates are dropped across all sources);
    ``counts`` collects ``rows_in`` and the dropped rows per reason. ``names``: what the errors call the options
    (the command's flags, or a pipeline stage's settings).

    A shard of the data (components/data/shards.py) passes ``resolved``, its own slice of each source's files as
    ``(source, files)``, and ``shard=True``: each row then keeps its ``digest`` (the join drops duplicates across
    shards by it), a source may have no rows in this slice (``counts["source_rows"]`` has each source's rows, for
    the join to check), and a slice with no row at all returns ``(None, 0)``.

    ``filters``: the noise filters (components/data/filters.py ``NoiseFilters``) each row must pass; a row they
    drop is counted under the filter's reason.
    """
    if resolved is None:
        resolved = [(s, sources.resolve(s, pvc_mounts)) for s in source_list]  # every path checked before reading
    counts.setdefault("source_rows", {})
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
                        source_fmt = formats.detect_format(row, where, names)
                    if first_where is None:
                        formats.check_columns(source_fmt, row, where, names)
                        first_where = where
                    elif any(c not in row for c in formats.REQUIRED[source_fmt]):
                        try:
                            other = formats.detect_format(row, where, names)
                        except ValueError:
                            formats.check_columns(source_fmt, row, where, names)
                        separately = (
                            f"pass them as separate {names.source} arguments"
                            if names.flags
                            else f"list them as separate sources in {names.source} (comma-separated)"
                        )
                        raise DataError(
                            f"{where}: mixed formats: this row is {other!r} but {first_where} is {source_fmt!r}; "
                            f"put each format in its own file and {separately}"
                        )
                    row = formats.clean(formats.to_canonical(source_fmt, row))
                    if filters is not None and (noise := filters.row_reason(row)):
                        counts["dropped"][noise] = counts["dropped"].get(noise, 0) + 1
                        continue
                except RowError as e:
                    if e.reason in CLEANING_REASONS:
                        counts["dropped"][e.reason] = counts["dropped"].get(e.reason, 0) + 1
                        continue
                    n_bad = counts["dropped"].get(e.reason, 0) + 1
                    if sum(counts["dropped"].get(r, 0) for r in BAD_ROW_REASONS) + 1 > max_bad_rows:
                        cap = (
                            f" (more than the {max_bad_rows} bad rows {names.max_bad_rows} allows)"
                            if max_bad_rows
                            else ""
                        )
                        skip = names.set("max_bad_rows", max(10, 2 * max_bad_rows))
                        verb = "pass" if names.flags else "set"
                        raise DataError(f"{where}: {e}{cap}; to skip such rows instead, {verb} {skip}") from None
                    counts["dropped"][e.reason] = n_bad
                    log.warning("skipping %s: %s", where, e)
                    continue
                except ValueError as e:
                    raise DataError(str(e)) from None
                row_kind = _kind(source_fmt)
                if kind is None:
                    kind, first_kind_source = row_kind, source
                    schema = _schema(kind, with_digest=shard).arrow_schema
                    writer = pa.ipc.new_stream(str(path), schema)
                elif row_kind != kind:
                    raise DataError(
                        f"mixed formats: {source!r} is {source_fmt!r} ({row_kind}) but {first_kind_source!r} is "
                        f"{kind}; "
                        "prepare chat, text and preference data in separate runs"
                    )
                digest = _digest(row)
                if digest in seen:
                    counts["dropped"]["duplicate"] = counts["dropped"].get("duplicate", 0) + 1
                    continue
                seen.add(digest)
                row["split_key"] = _split_key(digest, seed)
                if shard:
                    row["digest"] = digest
                batch.append(row)
                if len(batch) >= sources.BATCH_ROWS:
                    assert writer is not None  # opened with the first row's kind
                    writer.write_batch(pa.RecordBatch.from_pylist(batch, schema=schema))
                    written += len(batch)
                    batch = []
            counts["source_rows"][source] = counts["source_rows"].get(source, 0) + n_source
            if n_source == 0 and not shard:
                raise DataError(f"source {source!r}: the dataset is empty; add at least one row")
            if source_fmt is not None:
                counts["formats"][source] = source_fmt
        if kind is None and shard:
            return None, 0
        if kind is None:
            raise DataError(f"every row of {source_list} was filtered out ({counts['dropped']}); check the data")
        if batch:
            assert writer is not None  # opened with the first row's kind
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
