"""Where corpora live (components/data/sources.py, components/data/peek.py): ``s3://`` and ``gs://`` prefixes read
from a real S3 server on this machine (moto's server mode, tests/helpers/s3_server.py) through the step's environment
(the store Secret's keys, ``AWS_ENDPOINT_URL``), and compressed JSONL (gzip, zstd, bzip2, xz) on disk and in the
store, streamed: the same rows and line numbers as the plain file, one clear line for every way a source cannot be
read, the fingerprint's identity following each object's size and ETag, and memory flat while a 50 MB object streams.
"""

from __future__ import annotations

import bz2
import gzip
import io
import json
import lzma
import os
import re
import socket
import subprocess
import sys
import textwrap
import uuid
from types import SimpleNamespace

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import zstandard
from botocore.exceptions import ResponseStreamingError

from components import storage
from components.data import sources
from components.data.peek import TYPES_TEXT, SourceError, first_columns, local_files
from components.data.sources import ObjectReader, StoreObject
from components.storage import parse_store_uri
from tests.helpers.data import conversation
from tests.helpers.s3_server import BUCKET

COMPRESS = {
    "gz": gzip.compress,
    "zst": zstandard.ZstdCompressor(write_checksum=True).compress,  # zstd's command line writes the checksum too
    "bz2": bz2.compress,
    "xz": lzma.compress,
}
CODEC = {"gz": "gzip", "zst": "zstd", "bz2": "bzip2", "xz": "xz"}


def _jsonl(rows: list) -> bytes:
    return "".join((r if isinstance(r, str) else json.dumps(r, ensure_ascii=False)) + "\n" for r in rows).encode()


def _compressed(data: bytes, suffix: str) -> bytes:
    """``data`` as two members/frames/streams, as parallel compressors write it: a reader must go on past the first."""
    half = data.index(b"\n", len(data) // 2) + 1
    return COMPRESS[suffix](data[:half]) + COMPRESS[suffix](data[half:])


def _parquet(rows: list[dict]) -> bytes:
    sink = io.BytesIO()
    pq.write_table(pa.Table.from_pylist(rows), sink, row_group_size=2)  # several row groups: several ranged reads
    return sink.getvalue()


def _plain(rows) -> list:
    """Rows with each RowError as (reason, message): comparable."""
    return [(where, row if isinstance(row, dict) else (row.reason, str(row))) for where, row in rows]


def _numbered(rows) -> list:
    """Each row with its line number only (the path left out)."""
    return [(where.rsplit(":", 1)[1], row) for where, row in _plain(rows)]


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def store(s3_server, monkeypatch):
    """The data step's environment for the S3 server (the store Secret's keys, ``AWS_ENDPOINT_URL``), and a fresh
    folder of its bucket: ``put(name, bytes)``, ``uri(name, scheme)``, ``client``."""
    for name, value in s3_server.keys.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("AWS_ENDPOINT_URL", s3_server.endpoint)
    for name in ("AWS_ENDPOINT_URL_S3", "AWS_SESSION_TOKEN", "AWS_PROFILE", "AWS_MAX_ATTEMPTS"):
        monkeypatch.delenv(name, raising=False)
    folder, client = uuid.uuid4().hex, s3_server.client()

    def put(name: str, data: bytes) -> None:
        client.put_object(Bucket=BUCKET, Key=f"{folder}/{name}", Body=data)

    def uri(name: str = "", scheme: str = "s3") -> str:
        return f"{scheme}://{BUCKET}/{folder}/{name}".rstrip("/")

    return SimpleNamespace(put=put, uri=uri, client=client, folder=folder, server=s3_server)


def test_an_s3_prefix_lists_its_data_objects_in_key_order_and_reads_each_kind(store):
    rows = [conversation(i) for i in range(12)]
    store.put("corpus/a.jsonl", _jsonl([rows[0], "", rows[1]]))
    store.put("corpus/b/c.jsonl.gz", _compressed(_jsonl(rows[2:6]), "gz"))
    store.put("corpus/b/", b"")  # a folder marker, as consoles write them
    store.put("corpus/d.parquet", _parquet(rows[6:11]))
    store.put("corpus/e.jsonl.zst", _compressed(_jsonl([rows[11], "not json"]), "zst"))
    store.put("corpus/f.csv", b"text\nhello\n")
    store.put("corpus/notes.md", b"# not data")
    store.put("corpus-old/x.jsonl", _jsonl(rows[:1]))  # a sibling sharing the prefix's first letters

    resolved = sources.resolve(store.uri("corpus"), {})
    names = ["a.jsonl", "b/c.jsonl.gz", "d.parquet", "e.jsonl.zst", "f.csv"]
    assert resolved == [store.uri(f"corpus/{n}") for n in names]
    assert sources.resolve(store.uri("corpus") + "/", {}) == resolved

    got = _plain(sources.read_rows(resolved))
    a, c, d, e, f = (store.uri(f"corpus/{n}") for n in names)
    assert got == [
        (f"{a}:1", rows[0]),
        (f"{a}:3", rows[1]),
        *[(f"{c}:{i + 1}", rows[2 + i]) for i in range(4)],
        *[(f"{d} row {i + 1}", rows[6 + i]) for i in range(5)],
        (f"{e}:1", rows[11]),
        (f"{e}:2", ("unparseable", "not valid JSON (Expecting value); fix or remove the line")),
        (f"{f} row 1", {"text": "hello"}),
    ]
    # A key naming one object is that object, whatever else shares its prefix.
    assert sources.resolve(store.uri("corpus/b/c.jsonl.gz"), {}) == [c]


def test_gs_sources_go_to_gcs_unless_aws_endpoint_url_names_another_server(store, monkeypatch):
    monkeypatch.delenv("AWS_ENDPOINT_URL")
    assert sources.store_client(parse_store_uri("gs://corpora")).meta.endpoint_url == storage.GCS_ENDPOINT
    assert sources.store_client(parse_store_uri("s3://corpora")).meta.endpoint_url == "https://s3.amazonaws.com"
    monkeypatch.setenv("AWS_ENDPOINT_URL", store.server.endpoint)  # MinIO, Ceph: here the S3 server on loopback
    assert sources.store_client(parse_store_uri("gs://corpora")).meta.endpoint_url == store.server.endpoint

    store.put("gcs/chat.jsonl.gz", _compressed(_jsonl([conversation(i) for i in range(4)]), "gz"))
    resolved = sources.resolve(store.uri("gcs", scheme="gs"), {})
    assert resolved == [store.uri("gcs/chat.jsonl.gz", scheme="gs")]
    assert [where for where, _ in sources.read_rows(resolved)] == [f"{resolved[0]}:{i}" for i in range(1, 5)]


@pytest.mark.parametrize("suffix", ["jsonl.gz", "json.gz", "jsonl.zst", "jsonl.bz2", "jsonl.xz"])
def test_a_compressed_jsonl_file_gives_the_plain_files_rows_and_line_numbers(tmp_path, suffix):
    lines = [conversation(i) for i in range(6)]
    lines[2:2] = ["", "{broken", "   ", '"a string"']
    data = _jsonl(lines)
    (tmp_path / "plain.jsonl").write_bytes(data)
    folder = tmp_path / "claim" / "corpus"
    folder.mkdir(parents=True)
    packed = folder / f"chat.{suffix}"
    packed.write_bytes(_compressed(data, suffix.rsplit(".", 1)[1]))
    (folder / "readme.txt").write_text("not data")

    plain = _numbered(sources.read_rows([str(tmp_path / "plain.jsonl")]))
    assert [n for n, _ in plain] == ["1", "2", "4", "6", "7", "8", "9", "10"]
    assert _numbered(sources.read_rows([str(packed)])) == plain
    # A folder, a glob and a pvc:// path pick it up; validate_inputs peeks at its first row's columns.
    assert local_files(str(folder)) == [str(packed)]
    assert local_files(str(folder / "*")) == [str(packed)]
    assert sources.resolve(f"pvc://data/corpus/chat.{suffix}", {"data": str(tmp_path / "claim")}) == [str(packed)]
    assert first_columns(str(packed)) == first_columns(str(tmp_path / "plain.jsonl")) == ["messages"]


def test_a_prefix_without_data_files_says_which_types_and_what_else_is_there(store):
    store.put("docs/README.md", b"# corpus")
    store.put("docs/train.txt", b"plain text")
    store.put("docs/sub/", b"")
    with pytest.raises(SourceError) as e:
        sources.resolve(store.uri("docs"), {})
    assert str(e.value) == (
        f"source {store.uri('docs')!r}: none of the 2 object(s) under it is a {TYPES_TEXT} file (e.g. "
        f"'{store.folder}/docs/README.md'); point the source at the data files' folder, or convert them"
    )
    with pytest.raises(SourceError, match=r"no objects under it at http://127\.0\.0\.1:\d+; check the bucket"):
        sources.resolve(store.uri("nothing-here"), {})
    with pytest.raises(SourceError, match=r"docs/train\.txt': unsupported file type; use \.jsonl, \.json"):
        sources.resolve(store.uri("docs/train.txt"), {})
    with pytest.raises(SourceError, match=r"source='s3://Corpora/x': 'Corpora' is not a bucket name"):
        sources.resolve("s3://Corpora/x", {})


def test_an_object_that_cannot_be_read_is_one_line_naming_it_and_the_setting_to_fix(store, monkeypatch):
    store.put("chat.jsonl", _jsonl([conversation(0)]))
    store.put("table/rows.parquet", _parquet([conversation(0)]))
    uri, table = store.uri("chat.jsonl"), sources.resolve(store.uri("table"), {})

    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "not-the-secret")
    with pytest.raises(SourceError, match=rf"^source {re.escape(repr(store.uri()))}: the store at .* refuses access"):
        sources.resolve(store.uri(), {})
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", store.server.keys["AWS_SECRET_ACCESS_KEY"])
    resolved = sources.resolve(store.uri(), {})

    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIANOTAKEY")  # listed with the right keys, read with wrong ones
    with pytest.raises(SourceError) as e:
        list(sources.read_rows(resolved))
    assert str(e.value).startswith(f"{uri}: the store at {store.server.endpoint} refuses access (")
    assert "check model_store_secret: its AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY must be allowed" in str(e.value)
    with pytest.raises(SourceError, match=rf"^{re.escape(table[0])}: the store at .* refuses access"):  # via pyarrow
        list(sources.read_rows(table))
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", store.server.keys["AWS_ACCESS_KEY_ID"])

    store.put("chat.jsonl", _jsonl([conversation(1)]))  # replaced after the listing the fingerprint keyed on
    with pytest.raises(SourceError, match=rf"^{re.escape(uri)}: the object was replaced while it was read; run"):
        list(sources.read_rows(resolved))
    store.client.delete_object(Bucket=BUCKET, Key=f"{store.folder}/chat.jsonl")
    with pytest.raises(SourceError, match=rf"^{re.escape(uri)}: no such object at .* \(removed since the source was"):
        list(sources.read_rows(resolved))

    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "1")
    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{_closed_port()}")
    with pytest.raises(SourceError, match=rf"^{re.escape(uri)}: cannot reach the object store at http://127.0.0.1:"):
        list(sources.read_rows(resolved))
    with pytest.raises(SourceError) as e:
        sources.resolve(store.uri(), {})
    assert "check AWS_ENDPOINT_URL (an S3-compatible server's URL; unset: AWS, or GCS for gs://)" in str(e.value)

    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.delenv(name)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", os.devnull)
    monkeypatch.setenv("AWS_CONFIG_FILE", os.devnull)
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    with pytest.raises(SourceError, match=r"no credentials for the object store at .*; set model_store_secret to"):
        sources.resolve(store.uri(), {})


@pytest.mark.parametrize("suffix", ["gz", "zst", "bz2", "xz"])
def test_a_truncated_compressed_file_names_the_file_and_the_line_reached(tmp_path, suffix):
    # Random text compresses evenly, so a file cut at 60% still yields its first lines (bzip2's blocks are 900 kB:
    # it yields none).
    data = _jsonl([{"text": os.urandom(100).hex()} for _ in range(3000)])
    whole = COMPRESS[suffix](data)
    path = tmp_path / f"chat.jsonl.{suffix}"
    path.write_bytes(whole[: len(whole) * 3 // 5])
    read: list[str] = []
    with pytest.raises(SourceError) as e:
        read.extend(where for where, _ in sources.read_rows([str(path)]))
    last = int(read[-1].rsplit(":", 1)[1]) if read else 0
    assert last < 3000 and (last > 0 or suffix == "bz2")
    reached = f"after line {last}" if last else "before its first line"
    assert str(e.value).startswith(f"{path}: the {CODEC[suffix]} data is truncated or corrupt {reached} (")
    assert str(e.value).endswith(f"); compress or copy the file again (`{CODEC[suffix]} -t FILE` checks it)")
    small = tmp_path / f"small.jsonl.{suffix}"
    small.write_bytes(COMPRESS[suffix](_jsonl([conversation(0)]))[:-8])
    with pytest.raises(SourceError, match=rf"^{re.escape(str(small))}: the {CODEC[suffix]} data is truncated or"):
        first_columns(str(small))


def test_a_corrupt_or_truncated_object_names_the_object_and_the_line_reached(store, tmp_path):
    data = _jsonl([{"text": f"row {i} " + uuid.uuid4().hex * 20} for i in range(2000)])
    whole = gzip.compress(data)
    corrupt = whole[: len(whole) // 2] + bytes(64) + whole[len(whole) // 2 + 64 :]
    store.put("cut.jsonl.gz", whole[: len(whole) // 2])
    store.put("corrupt.jsonl.gz", corrupt)
    for name in ("cut.jsonl.gz", "corrupt.jsonl.gz"):
        with pytest.raises(SourceError, match=rf"^{re.escape(store.uri(name))}: the gzip data is truncated or corrupt"):
            list(sources.read_rows(sources.resolve(store.uri(name), {})))
    (tmp_path / "corrupt.jsonl.gz").write_bytes(corrupt)
    with pytest.raises(SourceError, match=r"corrupt\.jsonl\.gz: the gzip data is truncated or corrupt after line \d+"):
        list(sources.read_rows([str(tmp_path / "corrupt.jsonl.gz")]))


def test_identity_follows_each_objects_size_and_etag_without_reading_it(store):
    store.put("ids/a.jsonl", b'{"text": "aaaa"}\n')
    store.put("ids/b.jsonl.gz", gzip.compress(_jsonl([conversation(1)])))
    first = sources.identity(sources.resolve(store.uri("ids"), {}))
    head = store.client.head_object(Bucket=BUCKET, Key=f"{store.folder}/ids/a.jsonl")
    assert first[0] == [store.uri("ids/a.jsonl"), head["ContentLength"], head["ETag"]]
    # Objects named without their listing (a plain string) are asked for the same with a HEAD.
    assert sources.identity([store.uri("ids/a.jsonl"), store.uri("ids/b.jsonl.gz")]) == first

    store.put("ids/a.jsonl", b'{"text": "aaaa"}\n')  # the same bytes again: the same content
    assert sources.identity(sources.resolve(store.uri("ids"), {})) == first
    store.put("ids/a.jsonl", b'{"text": "bbbb"}\n')  # the same size, other bytes
    changed = sources.identity(sources.resolve(store.uri("ids"), {}))
    assert changed[0][1] == first[0][1] and changed[0][2] != first[0][2] and changed[1] == first[1]


class _BreakingBody:
    """An object's stream that breaks off after ``keep`` bytes, as a reset connection does."""

    def __init__(self, data: bytes, keep: int | None):
        self._stream, self._left = io.BytesIO(data), keep

    def read(self, amt: int | None = None) -> bytes:
        if self._left is not None and self._left <= 0:
            raise ResponseStreamingError(error="Connection broken: ConnectionResetError(104)")
        chunk = self._stream.read(amt if self._left is None else min(amt or self._left, self._left))
        if self._left is not None:
            self._left -= len(chunk)
        return chunk

    def close(self) -> None:
        pass


def test_a_stream_that_breaks_off_is_read_on_from_the_byte_reached():
    data = gzip.compress(_jsonl([conversation(i) for i in range(400)]))
    asked: list[dict] = []

    def get_object(**args):
        asked.append(args)
        start = int(args.get("Range", "bytes=0-")[6:].split("-")[0])
        return {"Body": _BreakingBody(data[start:], 1000 if len(asked) < 3 else None)}

    client = SimpleNamespace(get_object=get_object, meta=SimpleNamespace(endpoint_url="http://store"))
    uri = StoreObject("s3://corpora/chat.jsonl.gz", len(data), '"etag-1"')
    reader = io.BufferedReader(ObjectReader(client, uri), 4096)
    assert gzip.GzipFile(fileobj=reader).read() == _jsonl([conversation(i) for i in range(400)])
    assert [a.get("Range") for a in asked] == [None, "bytes=1000-", "bytes=2000-"]
    assert {a["IfMatch"] for a in asked} == {'"etag-1"'}  # every GET asks for the version listed

    # A GET that breaks off before its first byte, again and again: after RESUMES new ones, one line naming it.
    asked.clear()
    client.get_object = lambda **args: asked.append(args) or {"Body": _BreakingBody(data, 0)}
    with pytest.raises(SourceError, match=r"^s3://corpora/chat\.jsonl\.gz: cannot reach the object store at http"):
        ObjectReader(client, uri).read(4096)
    assert len(asked) == 1 + sources.RESUMES


# Peak RSS from /proc (ru_maxrss would keep the parent's peak across exec), reset to the current RSS before reading.
MEMORY_CHECK = """
import json, sys
from components.data import sources

def kib(field):
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith(field + ":"))

resolved = sources.resolve(sys.argv[1], {})
with open("/proc/self/clear_refs", "w") as f:
    f.write("5")  # VmHWM := VmRSS
before = kib("VmRSS")
rows = sum(1 for _ in sources.read_rows(resolved))
print(json.dumps({"rows": rows, "grown_mib": (kib("VmHWM") - before) / 1024}))
"""


@pytest.mark.skipif(not os.path.exists("/proc/self/clear_refs"), reason="reads Linux's /proc/self peak RSS")
def test_streaming_a_50_mb_gzip_object_keeps_memory_flat(store):
    # Hex text compresses to about half: a 50 MB object of 100 MB of JSONL, 800 rows of 125 kB.
    row = b'{"text": "' + b"%s" + b'"}\n'
    data = b"".join(row % os.urandom(62_500).hex().encode() for _ in range(800))
    body = gzip.compress(data, compresslevel=1)
    assert len(body) > 45 * 2**20
    store.put("big/corpus.jsonl.gz", body)
    env = {**os.environ, "PYTHONPATH": os.getcwd()}
    out = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(MEMORY_CHECK), store.uri("big")],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["rows"] == 800
    assert result["grown_mib"] < 100, result  # the object whole and its text would be 150 MB
