"""Local sources without the data step's libraries: which files a path, folder or glob names, the columns of their
first row, and the decompressed stream of a compressed JSONL file. The data step resolves local sources with it
(components/data/sources.py); validate_inputs asks it, for a local run, whether each source is there and has the
columns its format and column mapping name, before the run starts.

This module imports nothing heavy at module level (no datasets, no pyarrow but to read a Parquet schema, zstandard
only for a ``.zst`` file), and must not: ``python -m pipelines.run`` checks a run's settings through it.
"""

from __future__ import annotations

import bz2
import csv
import glob
import gzip
import io
import json
import lzma
import os
import zlib
from pathlib import Path
from typing import IO, cast

# JSON Lines compressed whole (a compressed .json holds JSON Lines too): read through the codec as a stream. The
# command that checks such a file: each codec's own -t.
CODECS = {".gz": "gzip", ".zst": "zstd", ".bz2": "bzip2", ".xz": "xz"}
COMPRESSED_TYPES = tuple(f"{kind}{suffix}" for kind in (".jsonl", ".json") for suffix in CODECS)
FILE_TYPES = (".jsonl", ".json", ".parquet", ".csv", *COMPRESSED_TYPES)
TYPES_TEXT = ".jsonl, .json, .parquet or .csv (.jsonl and .json also as .gz, .zst, .bz2 or .xz)"
# A binary stream read in order: a file, an object's reader, a decompressing reader.
Stream = IO[bytes] | io.RawIOBase | io.BufferedIOBase
# How far into a JSONL file the first row is looked for: a file of blank lines is empty either way.
FIRST_ROW_BYTES = 1 << 20
# Compressed bytes fed to the zstd decoder at a time: its output for them is held whole.
ZSTD_CHUNK = 1 << 16


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
        files = sorted(str(p) for p in Path(source).rglob("*") if p.name.endswith(FILE_TYPES) and p.is_file())
        if not files:
            raise SourceError(f"source {source!r}: the folder holds no {TYPES_TEXT} files")
        return files
    if any(ch in source for ch in "*?[") and not looks_like_hub_id(source):
        files = sorted(f for f in glob.glob(source, recursive=True) if f.endswith(FILE_TYPES))
        if not files:
            raise SourceError(f"source {source!r}: the pattern matches no {TYPES_TEXT} files")
        return files
    if os.path.isfile(source):
        if not source.endswith(FILE_TYPES):
            raise SourceError(f"source {source!r}: unsupported file type; use {TYPES_TEXT}")
        return [source]
    if looks_like_hub_id(source):
        return None
    raise SourceError(
        f"source {source!r}: no such file or folder; check the path (or the PVC mount) or pass a Hub dataset id"
    )


def first_columns(path: str) -> list[str] | None:
    """The column names of the first row of a local JSONL (compressed too), JSON, CSV or Parquet file; None when the
    first line is longer than ``FIRST_ROW_BYTES`` (the data step reads it). SourceError, naming the file (and line),
    for an empty file, a first row that is not UTF-8 JSON (an object), or a compressed file that does not decompress.
    """
    if path.endswith(".parquet"):
        import pyarrow.parquet as pq  # only for a Parquet file: its schema, not its rows

        return list(pq.read_schema(path).names)
    if path.endswith(".csv"):
        with open(path, newline="", encoding="utf-8", errors="replace") as f:
            header = next(csv.reader(f), None)
        if not header:
            raise SourceError(f"{path}: the file is empty; add a header line and at least one row")
        return header
    damaged = DECODE_ERRORS if codec_of(path) else ()
    with open(path, "rb") as file, decompressed(file, path) as f:
        try:
            head = _read_up_to(f, FIRST_ROW_BYTES)
            rest = f.read() if head.lstrip()[:1] == b"[" else b""  # a JSON array file, read whole as the data step
        except damaged as e:
            raise SourceError(corrupt_message(path, "before its first row", e)) from None
    if head.lstrip()[:1] == b"[":
        try:
            records = json.loads((head + rest).decode("utf-8"))
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


def codec_of(path: str) -> str | None:
    """The compression ``path``'s name says (``gzip``, ``zstd``, ``bzip2``, ``xz``); None for a plain file."""
    return CODECS[os.path.splitext(path)[1]] if path.endswith(COMPRESSED_TYPES) else None


def decompressed(raw: Stream, path: str) -> Stream:
    """``raw`` (a binary stream of the file ``path``) read through the codec ``path``'s name says, decompressing as
    it is read; ``raw`` itself for a plain file. Closing the result leaves ``raw`` open. A truncated or corrupt
    stream raises one of ``DECODE_ERRORS`` when the read reaches the damage."""
    codec = codec_of(path)
    if codec == "gzip":
        return gzip.GzipFile(fileobj=raw, mode="rb")
    if codec == "bzip2":
        return bz2.BZ2File(raw)
    if codec == "xz":
        return lzma.LZMAFile(cast(IO[bytes], raw))  # any readable stream does; typeshed says IO
    if codec == "zstd":
        return io.BufferedReader(_ZstdReader(raw))
    return raw


def corrupt_message(path: str, reached: str, error: BaseException) -> str:
    """The one line for a compressed file that stops decompressing; ``reached``: where (``after line 12``)."""
    codec = codec_of(path) or "compressed"
    return (
        f"{path}: the {codec} data is truncated or corrupt {reached} ({str(error) or type(error).__name__}); "
        f"compress or copy the file again (`{codec} -t FILE` checks it)"
    )


def _read_up_to(f: Stream, size: int) -> bytes:
    """``size`` bytes of ``f``, fewer only at its end (a decoder's read may return less)."""
    parts, got = [], 0
    while got < size and (part := f.read(size - got)):
        parts.append(part)
        got += len(part)
    return b"".join(parts)


class _ZstdReader(io.RawIOBase):
    """zstd frames decoded as they are read, ``ZSTD_CHUNK`` compressed bytes at a time. Unlike zstandard's own
    stream reader, a stream that ends inside a frame raises EOFError instead of ending quietly; a corrupt one raises
    OSError, as gzip's and bz2's readers do."""

    def __init__(self, raw: Stream):
        import zstandard

        self._raw, self._decoder, self._error = raw, zstandard.ZstdDecompressor(), zstandard.ZstdError
        self._frame = self._decoder.decompressobj()
        self._in_frame = False  # bytes of the current frame were fed: the stream may not end here
        self._out, self._at = b"", 0

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        while self._at == len(self._out):
            chunk = self._raw.read(ZSTD_CHUNK)
            if not chunk:
                if self._in_frame:
                    raise EOFError("the zstd stream ends inside a frame")
                return 0
            self._out, self._at = self._decode(chunk), 0
        n = min(len(buffer), len(self._out) - self._at)
        buffer[:n] = self._out[self._at : self._at + n]
        self._at += n
        return n

    def _decode(self, chunk: bytes) -> bytes:
        out = []
        while chunk:
            self._in_frame = True
            try:
                out.append(self._frame.decompress(chunk))
            except self._error as e:
                raise OSError(f"zstd: {e}") from None
            chunk = b""
            if self._frame.eof:  # the frame is whole; what follows it starts the next one
                chunk, self._frame, self._in_frame = self._frame.unused_data, self._decoder.decompressobj(), False
        return b"".join(out)


# What a truncated or corrupt compressed stream raises (gzip.BadGzipFile, bz2's and _ZstdReader's are OSErrors).
DECODE_ERRORS = (EOFError, OSError, zlib.error, lzma.LZMAError)
