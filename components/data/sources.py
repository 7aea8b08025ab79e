"""Where instruction data comes from: files, folders, globs, ``pvc://`` paths, object stores and Hugging Face Hub
datasets.

A source is one string:

- ``builtin:sample``, ``builtin:domain-text``, ``builtin:preference`` -- the bundled samples
  (:mod:`components.data.samples`);
- a local path to a JSONL / JSON / Parquet / CSV file, a folder of them, a glob, or a folder written by
  ``datasets.save_to_disk`` (its ``train`` split when it is a DatasetDict); JSONL (and JSON Lines in a ``.json``)
  may be compressed: ``.jsonl.gz``, ``.jsonl.zst``, ``.jsonl.bz2``, ``.jsonl.xz`` (``.json.gz`` ...), decompressed
  as it is read;
- ``pvc://<claim>/<path>`` -- the same, on a claim mounted in this pod (``pvc_mounts`` maps claim -> mount);
- ``s3://<bucket>/<prefix>``, ``gs://<bucket>/<prefix>`` -- every object of those types under the prefix (in key
  order), or the one object the key names; read through boto3 with its own credential chain (the pipeline puts
  ``model_store_secret``'s ``AWS_ACCESS_KEY_ID`` and ``AWS_SECRET_ACCESS_KEY`` in the step's environment), at
  ``AWS_ENDPOINT_URL`` when it is set (MinIO, Ceph), else AWS, or GCS's S3-compatible endpoint for ``gs://``;
- ``hf://datasets/<org>/<name>/<file>`` -- a file in a Hub dataset repository;
- ``<org>/<name>[?config=C&split=S&revision=R]`` -- a Hub dataset by id (split defaults to ``train``).

Every reader streams rows as ``(where, row)`` so errors name the file and line, and memory stays flat: an object is
read as one GET that resumes where it broke off, a Parquet object through ranged GETs (its footer, then each column
chunk), never whole.
"""

from __future__ import annotations

import io
import json
import logging
import os
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import datasets
import pyarrow.csv as pacsv
import pyarrow.parquet as pq
from huggingface_hub import HfFileSystem

from components.data.formats import RowError
from components.data.peek import (
    COMPRESSED_TYPES,
    DECODE_ERRORS,
    FILE_TYPES,
    TYPES_TEXT,
    SourceError,
    Stream,
    codec_of,
    corrupt_message,
    decompressed,
    local_files,
)
from components.data.samples import BUILTIN, builtin_path
from components.storage import StoreURI, is_store_uri, parse_store_uri, s3_client

__all__ = ["FILE_TYPES", "SourceError", "resolve", "read_rows", "identity", "store_client", "StoreObject"]

log = logging.getLogger("prepare_dataset")

BATCH_ROWS = 1000
# Bytes asked of an object's stream at a time.
READ_BYTES = 1 << 20
# New GETs, from the byte reached, after an object's stream breaks off (botocore retries each GET itself).
RESUMES = 3


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
    if is_store_uri(source):
        return _list_objects(source)
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
    clients: dict[str, Any] = {}  # one per store scheme, for every object of the source
    for path in resolved:
        if path.endswith((".jsonl", ".json", *COMPRESSED_TYPES)):
            yield from _read_json(path, clients)
        elif path.endswith(".parquet"):
            with _open(path, clients, ranged=True) as f:
                yield from _read_batches(path, pq.ParquetFile(f).iter_batches(batch_size=BATCH_ROWS))
        else:
            with _open(path, clients) as f:
                yield from _read_batches(path, pacsv.open_csv(f))


def _open(path: str, clients: dict[str, Any], *, ranged: bool = False) -> Stream:
    if path.startswith("hf://"):
        return HfFileSystem().open(path, "rb")
    if is_store_uri(path):
        store, _ = _split(path)
        if store.scheme not in clients:
            clients[store.scheme] = store_client(store)
        reader = ObjectReader(clients[store.scheme], path, ranged=ranged)
        return reader if ranged else io.BufferedReader(reader, READ_BYTES)
    return open(path, "rb")


def _read_json(path: str, clients: dict[str, Any]):
    damaged = DECODE_ERRORS if codec_of(path) else ()  # a plain file's OSError is no decoding error
    lineno, starting = 0, True
    with _open(path, clients) as raw, decompressed(raw, path) as f:
        try:
            for lineno, data in enumerate(f, 1):
                if starting and data.strip():
                    starting = False
                    if data.lstrip()[:1] == b"[":  # a JSON array file, read whole; JSONL otherwise
                        yield from _read_json_array(path, data + f.read())
                        return
                row = _json_line(data)
                if row is not None:
                    yield f"{path}:{lineno}", row
        except damaged as e:
            reached = f"after line {lineno}" if lineno else "before its first line"
            raise SourceError(corrupt_message(path, reached, e)) from None


def _json_line(data: bytes) -> dict | RowError | None:
    """One JSONL line's row, a RowError for a bad one, None for a blank one."""
    try:
        line = data.decode("utf-8")
    except UnicodeDecodeError as e:
        return RowError("invalid_utf8", f"invalid UTF-8 at byte {e.start} of the line; re-encode the file as UTF-8")
    if not line.strip():
        return None
    try:
        record = json.loads(line)
    except json.JSONDecodeError as e:
        return RowError("unparseable", f"not valid JSON ({e.msg}); fix or remove the line")
    if not isinstance(record, dict):
        return RowError("unparseable", f"expected a JSON object, got {type(record).__name__}")
    return record


def _read_json_array(path: str, data: bytes):
    try:
        records = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise SourceError(f"{path}: not a valid JSON array ({e}); fix the file or write it as JSONL") from None
    for i, record in enumerate(records):
        yield (
            f"{path} item {i}",
            record
            if isinstance(record, dict)
            else RowError("unparseable", f"expected a JSON object, got {type(record).__name__}"),
        )


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
    """What the fingerprint cache keys a resolved source on: file paths with size and mtime, objects with size and
    ETag (from the listing; a HEAD for an object named without them), or the Hub spec.

    Returns ``None`` for a Hub dataset without a pinned ``revision``: its content can change under the same name.
    """
    if isinstance(resolved, dict):
        if "saved" in resolved:
            root = Path(resolved["saved"])
            return [[str(p), p.stat().st_size, p.stat().st_mtime_ns] for p in sorted(root.rglob("*")) if p.is_file()]
        return None if resolved["revision"] is None else [resolved]
    if any(p.startswith("hf://") for p in resolved):
        return None
    clients: dict[str, Any] = {}
    return [
        _object_identity(p, clients) if is_store_uri(p) else [os.path.abspath(p), *_size_and_mtime(p)] for p in resolved
    ]


def _size_and_mtime(path: str) -> list[int]:
    stat = os.stat(path)
    return [stat.st_size, stat.st_mtime_ns]


def _object_identity(uri: str, clients: dict[str, Any]) -> list:
    if not isinstance(uri, StoreObject):
        store, key = _split(uri)
        if store.scheme not in clients:
            clients[store.scheme] = store_client(store)
        uri = _head(clients[store.scheme], uri)
    return [str(uri), uri.size, uri.etag]


# Object stores: s3:// and gs:// (components/storage/'s client).


class StoreObject(str):
    """An object's URI, ``s3://bucket/key``, with the size and ETag its listing gave: what identity() keys on, and
    the version every GET of it asks for (``If-Match``), so an object replaced mid-read fails instead of mixing."""

    size: int
    etag: str

    def __new__(cls, uri: str, size: int, etag: str) -> StoreObject:
        self = super().__new__(cls, uri)
        self.size, self.etag = size, etag
        return self

    def __reduce__(self):
        return StoreObject, (str(self), self.size, self.etag)


def store_client(store: StoreURI):
    """A boto3 S3 client for the sources in ``store``'s scheme: at ``AWS_ENDPOINT_URL_S3`` or ``AWS_ENDPOINT_URL``
    (boto3's own variables) when set, else AWS for ``s3://`` and GCS's S3-compatible endpoint for ``gs://``;
    credentials from boto3's chain; ``AWS_MAX_ATTEMPTS`` tries per request (5 when unset)."""
    endpoint = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL") or ""
    return s3_client(store, endpoint, attempts=int(os.environ.get("AWS_MAX_ATTEMPTS") or 5))


def _split(uri: str) -> tuple[StoreURI, str]:
    """``scheme://bucket/key`` as the bucket's StoreURI and the key, kept as it is."""
    scheme, _, rest = uri.partition("://")
    bucket, _, key = rest.partition("/")
    return StoreURI(scheme, bucket), key


def _list_objects(source: str) -> list[str]:
    """The objects of a supported type under ``source``'s prefix, in key order, or the one object its key names."""
    from botocore.exceptions import BotoCoreError, ClientError

    try:
        store = parse_store_uri(source, "source")
    except ValueError as e:
        raise SourceError(str(e)) from None
    client = store_client(store)
    base = f"{store.scheme}://{store.bucket}/"
    folder = f"{store.prefix}/" if store.prefix else ""
    found: list[str] = []
    total, others, example = 0, 0, ""  # the data's bytes; the other objects: how many, and the first
    try:
        for page in client.get_paginator("list_objects_v2").paginate(Bucket=store.bucket, Prefix=store.prefix):
            for obj in page.get("Contents", []):
                key = obj["Key"]
                if key == store.prefix and not source.endswith("/"):  # listed first: the source names one object
                    if not key.endswith(FILE_TYPES):
                        raise SourceError(f"source {source!r}: unsupported file type; use {TYPES_TEXT}")
                    return [StoreObject(base + key, obj["Size"], obj["ETag"])]
                if key.startswith(folder) and not key.endswith("/"):  # not a sibling, nor a folder marker
                    if key.endswith(FILE_TYPES):
                        found.append(StoreObject(base + key, obj["Size"], obj["ETag"]))
                        total += obj["Size"]
                    else:
                        others, example = others + 1, example or key
    except (BotoCoreError, ClientError) as e:
        raise SourceError(_store_problem(f"source {source!r}", client, e)) from None
    if not found:
        if not others:
            raise SourceError(
                f"source {source!r}: no objects under it at {client.meta.endpoint_url}; check the bucket and the "
                "path (and AWS_ENDPOINT_URL when the data is on another server)"
            )
        raise SourceError(
            f"source {source!r}: none of the {others} object(s) under it is a {TYPES_TEXT} file (e.g. "
            f"{example!r}); point the source at the data files' folder, or convert them"
        )
    log.info(
        "%s: %d object(s), %.1f MiB%s",
        source,
        len(found),
        total / 2**20,
        f"; {others} other object(s) left out" if others else "",
    )
    return sorted(found)


def _head(client, uri: str) -> StoreObject:
    from botocore.exceptions import BotoCoreError, ClientError

    store, key = _split(uri)
    try:
        head = client.head_object(Bucket=store.bucket, Key=key)
    except (BotoCoreError, ClientError) as e:
        raise SourceError(_store_problem(uri, client, e)) from None
    return StoreObject(uri, head["ContentLength"], head["ETag"])


def _store_problem(what: str, client, error: Exception) -> str:
    """One line for a store's refusal or silence: what it concerns, and the setting to fix."""
    from botocore.exceptions import ClientError, NoCredentialsError

    at = client.meta.endpoint_url
    if isinstance(error, NoCredentialsError):
        return (
            f"{what}: no credentials for the object store at {at}; set model_store_secret to a Secret with "
            "AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY"
        )
    if isinstance(error, ClientError):
        code = error.response.get("Error", {}).get("Code", "")
        status = error.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
        if code == "NoSuchBucket":
            return f"{what}: no such bucket at {at}; check the source (and AWS_ENDPOINT_URL for another server)"
        if code in ("NoSuchKey", "NotFound") or status == 404:
            return f"{what}: no such object at {at} (removed since the source was listed?); check the source"
        if code == "PreconditionFailed" or status == 412:
            return f"{what}: the object was replaced while it was read; run again once it is written"
        if status in (401, 403):
            return (
                f"{what}: the store at {at} refuses access ({code or status}); check model_store_secret: its "
                "AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY must be allowed to list and read the bucket"
            )
        return f"{what}: the store at {at} answered HTTP {status} {code}: {error}"
    return (
        f"{what}: cannot reach the object store at {at} ({error}); check AWS_ENDPOINT_URL (an S3-compatible "
        "server's URL; unset: AWS, or GCS for gs://) and the network"
    )


class ObjectReader(io.RawIOBase):
    """An object's bytes as they are consumed, never held whole: one GET from the position reached, a new one from
    there when the stream breaks off (``RESUMES`` times); ``ranged``: one bounded GET per read instead, for a reader
    that seeks (Parquet: the footer, then each column chunk). A store's refusal raises SourceError naming the
    object and the setting to fix."""

    def __init__(self, client, uri: str, *, ranged: bool = False):
        self._client, self.uri, self._ranged = client, uri, ranged
        self._store, self._key = _split(uri)
        self._listed = uri if isinstance(uri, StoreObject) else None
        self._pos = 0
        self._body: Any = None

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        start = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: self._size()}[whence]
        if start + offset != self._pos:
            self._drop()
            self._pos = start + offset
        return self._pos

    def readinto(self, buffer) -> int:
        from botocore.exceptions import BotoCoreError, ClientError, NoCredentialsError

        resumes = 0
        while True:
            try:
                n = self._read(buffer)
            except (ClientError, NoCredentialsError) as e:
                self._drop()
                raise SourceError(_store_problem(self.uri, self._client, e)) from None
            except BotoCoreError as e:  # the connection broke off: a new GET from the byte reached
                self._drop()
                if resumes == RESUMES:
                    raise SourceError(_store_problem(self.uri, self._client, e)) from None
                resumes += 1
                log.warning("%s: %s; reading on from byte %d", self.uri, e, self._pos)
                continue
            self._pos += n
            return n

    def close(self) -> None:
        self._drop()
        super().close()

    def _read(self, buffer) -> int:
        if self._ranged:
            if self._pos >= self._size() or not len(buffer):
                return 0
            end = min(self._pos + len(buffer), self._size()) - 1
            data = self._get(f"bytes={self._pos}-{end}").read()
        else:
            if self._body is None:
                if self._pos and self._pos >= self._size():
                    return 0
                self._body = self._get(f"bytes={self._pos}-" if self._pos else None)
            data = self._body.read(len(buffer))
        buffer[: len(data)] = data
        return len(data)

    def _get(self, byte_range: str | None):
        args = {"Bucket": self._store.bucket, "Key": self._key}
        if byte_range:
            args["Range"] = byte_range
        if self._listed is not None:
            args["IfMatch"] = self._listed.etag
        return self._client.get_object(**args)["Body"]

    def _size(self) -> int:
        if self._listed is None:
            self._listed = _head(self._client, self.uri)
        return self._listed.size

    def _drop(self) -> None:
        if self._body is not None:
            self._body.close()
            self._body = None
