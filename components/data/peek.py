"""Local sources without the data step's libraries: which files a path, folder or glob names, and the columns of
their first row. The data step resolves local sources with it (components/data/sources.py); validate_inputs asks it,
for a local run, whether each source is there and has the columns its format and column mapping name, before the
run starts.

This module imports nothing heavy at module level (no datasets, no pyarrow but to read a Parquet schema), and must
not: ``python -m pipelines.run`` checks a run's settings through it.
"""

from __future__ import annotations

import csv
import glob
import json
import os
from pathlib import Path

FILE_TYPES = (".jsonl", ".json", ".parquet", ".csv")
# How far into a JSONL file the first row is looked for: a file of blank lines is empty either way.
FIRST_ROW_BYTES = 1 << 20


class SourceError(ValueError):
    """A source cannot be read; the message names the source and the fix."""


def looks_like_hub_id(source: str) -> bool:
    """Whether ``source`` reads as a Hub dataset id (``org/name[?...]``) rather than a local path."""
    name = source.split("?", 1)[0]
    return (
        name.count("/") == 1
        and not name.startswith((".", "/", "~"))
        and not name.endswith(FILE_TYPES)
        and not os.path.exists(os.path.dirname(name) or ".")
    )


def local_files(source: str) -> list[str] | dict | None:
    """The files a local path, folder or glob names (a folder written by ``datasets.save_to_disk``:
    ``{"saved": folder}``); None when ``source`` is no path here and reads as a Hub id. SourceError when it names
    nothing usable."""
    if os.path.isdir(source):
        if any(os.path.exists(os.path.join(source, f)) for f in ("dataset_info.json", "dataset_dict.json")):
            return {"saved": source}
        files = sorted(str(p) for p in Path(source).rglob("*") if p.suffix in FILE_TYPES and p.is_file())
        if not files:
            raise SourceError(f"source {source!r}: the folder holds no {'/'.join(FILE_TYPES)} files")
        return files
    if any(ch in source for ch in "*?[") and not looks_like_hub_id(source):
        files = sorted(f for f in glob.glob(source, recursive=True) if f.endswith(FILE_TYPES))
        if not files:
            raise SourceError(f"source {source!r}: the pattern matches no {'/'.join(FILE_TYPES)} files")
        return files
    if os.path.isfile(source):
        if not source.endswith(FILE_TYPES):
            raise SourceError(f"source {source!r}: unsupported file type; use one of {', '.join(FILE_TYPES)}")
        return [source]
    if looks_like_hub_id(source):
        return None
    raise SourceError(
        f"source {source!r}: no such file or folder; check the path (or the PVC mount) or pass a Hub dataset id"
    )


def first_columns(path: str) -> list[str] | None:
    """The column names of the first row of a local JSONL, JSON, CSV or Parquet file; None when the first line is
    longer than ``FIRST_ROW_BYTES`` (the data step reads it). SourceError, naming the file (and line), for an empty
    file or a first row that is not UTF-8 JSON (an object)."""
    if path.endswith(".parquet"):
        import pyarrow.parquet as pq  # only for a Parquet file: its schema, not its rows

        return list(pq.read_schema(path).names)
    if path.endswith(".csv"):
        with open(path, newline="", encoding="utf-8", errors="replace") as f:
            header = next(csv.reader(f), None)
        if not header:
            raise SourceError(f"{path}: the file is empty; add a header line and at least one row")
        return header
    with open(path, "rb") as f:
        head = f.read(FIRST_ROW_BYTES)
    if head.lstrip()[:1] == b"[":  # a JSON array file, read whole as the data step does
        try:
            records = json.loads(Path(path).read_bytes().decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise SourceError(f"{path}: not a valid JSON array ({e}); fix the file or write it as JSONL") from None
        if not records:
            raise SourceError(f"{path}: the file is empty; add at least one row")
        return _columns(records[0], f"{path} item 0")
    for number, raw in enumerate(head.split(b"\n"), 1):
        if not raw.strip():
            continue
        where = f"{path}:{number}"
        try:
            return _columns(json.loads(raw.decode("utf-8")), where)
        except UnicodeDecodeError as e:
            raise SourceError(
                f"{where}: invalid UTF-8 at byte {e.start} of the line; re-encode the file as UTF-8"
            ) from None
        except json.JSONDecodeError as e:
            if len(head) == FIRST_ROW_BYTES and number == head.count(b"\n") + 1:
                return None  # a first line longer than what was read: the data step reads it whole
            raise SourceError(f"{where}: not valid JSON ({e.msg}); fix or remove the line") from None
    if len(head) == FIRST_ROW_BYTES:
        return None  # blank lines as far as was read: the data step reads on
    raise SourceError(f"{path}: the file is empty; add at least one row")


def _columns(record, where: str) -> list[str]:
    if not isinstance(record, dict):
        raise SourceError(f"{where}: expected a JSON object, got {type(record).__name__}")
    return list(record)
