"""Where instruction data comes from: files, folders, globs, ``pvc://`` paths and Hugging Face Hub datasets.

A source is one string:

- ``builtin:sample``, ``builtin:domain-text``, ``builtin:preference`` -- the bundled samples
  (:mod:`components.data.samples`);
- a local path to a JSONL / JSON / Parquet / CSV file, a folder of them, a glob, or a folder written by
  ``datasets.save_to_disk`` (its ``train`` split when it is a DatasetDict);
- ``pvc://<claim>/<path>`` -- the same, on a claim mounted in this pod (``pvc_mounts`` maps claim -> mount);
- ``hf://datasets/<org>/<name>/<file>`` -- a file in a Hub dataset repository;
- ``<org>/<name>[?config=C&split=S&revision=R]`` -- a Hub dataset by id (split defaults to ``train``).

Every reader streams rows as ``(where, row)`` so errors name the file and line, and memory stays flat.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import datasets
import pyarrow.csv as pacsv
import pyarrow.parquet as pq
from huggingface_hub import HfFileSystem

from components.data.formats import RowError
from components.data.peek import FILE_TYPES, SourceError, local_files
from components.data.samples import BUILTIN, builtin_path

__all__ = ["FILE_TYPES", "SourceError", "resolve", "read_rows", "identity"]

BATCH_ROWS = 1000


def resolve(source: str, pvc_mounts: dict[str, str]) -> list[str] | dict:
    """The files (or a saved-dataset folder, or a Hub spec dict) that ``source`` names; raise if none exist."""
    if source in BUILTIN:
        return [builtin_path(source)]
    if source.startswith("pvc://"):
        claim, _, rel = source[len("pvc://") :].partition("/")
        if claim not in pvc_mounts:
            raise SourceError(
                f"source {source!r}: claim {claim!r} is not mounted in this step "
                f"(mounted: {sorted(pvc_mounts) or 'none'}); "
                "put the data on the data claim or pass --pvc-mount CLAIM=MOUNT_PATH"
            )
        source = os.path.join(pvc_mounts[claim], rel)
    if source.startswith("hf://"):
        return [source]
    found = local_files(source)  # the files here, or None for a Hub id (components/data/peek.py)
    return _hub_spec(source) if found is None else found


def _hub_spec(source: str) -> dict:
    parts = urlsplit(source)
    query = {k: v[-1] for k, v in parse_qs(parts.query).items()}
    unknown = set(query) - {"config", "split", "revision"}
    if unknown:
        raise SourceError(f"source {source!r}: unknown option(s) {sorted(unknown)}; use config=, split= and revision=")
    return {
        "hub": parts.path,
        "config": query.get("config"),
        "split": query.get("split", "train"),
        "revision": query.get("revision"),
    }


def read_rows(resolved):
    """Yield ``(where, row)`` for every row of a resolved source; ``row`` is a :class:`RowError` for a bad line."""
    if isinstance(resolved, dict):
        yield from _read_dataset(resolved)
        return
    for path in resolved:
        if path.endswith((".jsonl", ".json")):
            yield from _read_json(path)
        elif path.endswith(".parquet"):
            yield from _read_batches(path, pq.ParquetFile(_open(path)).iter_batches(batch_size=BATCH_ROWS))
        else:
            yield from _read_batches(path, pacsv.open_csv(_open(path)))


def _open(path: str):
    if path.startswith("hf://"):
        return HfFileSystem().open(path, "rb")
    return open(path, "rb")


def _read_json(path: str):
    with _open(path) as f:
        first = f.read(1)
        while first and first.isspace():
            first = f.read(1)
        f.seek(0)
        if first == b"[":  # a JSON array file; JSONL otherwise
            try:
                records = json.loads(f.read().decode("utf-8"))
            except (UnicodeDecodeError, json.JSONDecodeError) as e:
                raise SourceError(f"{path}: not a valid JSON array ({e}); fix the file or write it as JSONL") from None
            for i, record in enumerate(records):
                yield (
                    f"{path} item {i}",
                    record
                    if isinstance(record, dict)
                    else RowError("unparseable", f"expected a JSON object, got {type(record).__name__}"),
                )
            return
        for lineno, raw in enumerate(f, 1):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                yield (
                    f"{path}:{lineno}",
                    RowError(
                        "invalid_utf8", f"invalid UTF-8 at byte {e.start} of the line; re-encode the file as UTF-8"
                    ),
                )
                continue
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as e:
                yield f"{path}:{lineno}", RowError("unparseable", f"not valid JSON ({e.msg}); fix or remove the line")
                continue
            if not isinstance(record, dict):
                yield (
                    f"{path}:{lineno}",
                    RowError("unparseable", f"expected a JSON object, got {type(record).__name__}"),
                )
                continue
            yield f"{path}:{lineno}", record


def _read_batches(path: str, batches):
    row = 0
    for batch in batches:
        for record in batch.to_pylist():
            row += 1
            yield f"{path} row {row}", _decode_json_cells(record)


def _decode_json_cells(record: dict) -> dict:
    # CSV has no nested values: conversation columns arrive as JSON strings.
    for key in ("messages", "conversations", "prompt", "chosen", "rejected"):
        value = record.get(key)
        if isinstance(value, str) and value[:1] == "[":
            try:
                record[key] = json.loads(value)
            except json.JSONDecodeError:
                pass
    return record


def _read_dataset(spec: dict):
    if "saved" in spec:
        ds = datasets.load_from_disk(spec["saved"])
        if isinstance(ds, datasets.DatasetDict):
            if "train" not in ds:
                raise SourceError(f"{spec['saved']}: a DatasetDict without a 'train' split (found {list(ds)})")
            ds = ds["train"]
        name = spec["saved"]
    else:
        name = spec["hub"]
        ds = datasets.load_dataset(spec["hub"], spec["config"], split=spec["split"], revision=spec["revision"])
    for i, record in enumerate(ds):
        yield f"{name} row {i + 1}", record


def identity(resolved) -> list | None:
    """What the fingerprint cache keys a resolved source on: file paths with size and mtime, or the Hub spec.

    Returns ``None`` for a Hub dataset without a pinned ``revision``: its content can change under the same name.
    """
    if isinstance(resolved, dict):
        if "saved" in resolved:
            root = Path(resolved["saved"])
            return [[str(p), p.stat().st_size, p.stat().st_mtime_ns] for p in sorted(root.rglob("*")) if p.is_file()]
        return None if resolved["revision"] is None else [resolved]
    if any(p.startswith("hf://") for p in resolved):
        return None
    return [[os.path.abspath(p), os.stat(p).st_size, os.stat(p).st_mtime_ns] for p in resolved]
