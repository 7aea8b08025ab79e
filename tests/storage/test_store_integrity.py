"""What an upload to the object store may be trusted for (components/storage/, issue 39 item 7), against a real S3
server on this machine (moto's server mode, tests/helpers/s3_server.py): each object's sha256 is the server's
checksum (S3's own ``x-amz-checksum-sha256``, composite for a multipart upload), not metadata the client wrote; an
object replaced on the server with other bytes and a forged ``x-amz-meta-sha256`` is found out and sent again; a
server that returns no checksums is checked by its MD5 ETag; a re-upload to the same folder leaves no key the folder
no longer has; and no multipart upload stays open under the folder once an upload finished."""

from __future__ import annotations

import base64
import hashlib
import logging
import os

import pytest

from components import storage
from components.storage import client as store_client
from components.storage import prune
from tests.helpers.s3_server import BUCKET

PART = storage.MIN_PART_SIZE  # 5 MiB: S3's (and moto's) smallest part


class Interrupted(Exception):
    pass


def _b64(digest: bytes) -> str:
    return base64.b64encode(digest).decode()


def _sha256_b64(data: bytes) -> str:
    return _b64(hashlib.sha256(data).digest())


def _composite(data: bytes, part_size: int) -> str:
    """S3's COMPOSITE SHA256 of a multipart object: the sha256 of its parts' sha256 digests, one after another."""
    parts = [data[i : i + part_size] for i in range(0, len(data), part_size)]
    return _b64(hashlib.sha256(b"".join(hashlib.sha256(p).digest() for p in parts)).digest())


def _write(root, files: dict[str, bytes]) -> None:
    for name, data in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(data)


def _keys(s3, prefix: str) -> set[str]:
    pages = s3.get_paginator("list_objects_v2").paginate(Bucket=BUCKET, Prefix=prefix)
    return {o["Key"] for page in pages for o in page.get("Contents", [])}


def _open_uploads(s3, prefix: str) -> set[str]:
    return {u["Key"] for u in s3.list_multipart_uploads(Bucket=BUCKET, Prefix=prefix).get("Uploads", [])}


def _forge(s3, key: str, size: int, claimed_sha256: str) -> bytes:
    """Replace ``key`` with other bytes of the same size that claim the original's sha256 in their metadata (with S3's
    own checksum of what they really are, as a server computes it)."""
    forged = os.urandom(size)
    s3.put_object(
        Bucket=BUCKET,
        Key=key,
        Body=forged,
        Metadata={storage.SHA256_METADATA: claimed_sha256},
        ChecksumAlgorithm="SHA256",
        ChecksumSHA256=_sha256_b64(forged),
    )
    return forged


def _strip_checksums(s3):
    """``s3`` made to see the server as one that returns no checksums (an older MinIO, GCS's XML API)."""

    def strip(parsed, **_):
        for name in [k for k in parsed if k.startswith("Checksum")]:
            del parsed[name]
        for part in parsed.get("Parts", []):
            for name in [k for k in part if k.startswith("Checksum")]:
                del part[name]

    s3.meta.events.register("after-call.s3", strip)
    return s3


def test_each_object_carries_the_servers_sha256_and_the_manifest_records_it(s3_server, tmp_path):
    src = tmp_path / "final"
    files = {"model.bin": os.urandom(2 * PART + 4321), "config.json": b'{"model_type": "qwen3"}'}  # 3 parts, 1 PUT
    _write(src, files)
    dest = storage.parse_store_uri(f"s3://{BUCKET}/checksums/final")
    s3 = s3_server.client()
    manifest = storage.upload_folder(dest, str(src), client=s3, part_size=PART, workers=2)

    expected = {"model.bin": _composite(files["model.bin"], PART), "config.json": _sha256_b64(files["config.json"])}
    for name, data in files.items():
        # moto computes a multipart object's composite from the part bytes it holds; a PUT's is the one sent, which
        # AWS (not moto) checks against the bytes on receipt.
        head = s3.head_object(Bucket=BUCKET, Key=dest.key(name), ChecksumMode="ENABLED")
        assert head["ChecksumSHA256"].partition("-")[0] == expected[name], name
        entry = manifest["files"][name]
        assert entry["size"] == len(data) and entry["sha256"] == hashlib.sha256(data).hexdigest()
        assert entry["server_checksum"]["ChecksumSHA256"].partition("-")[0] == expected[name]
    assert manifest["files"]["model.bin"]["server_checksum"]["ChecksumSHA256"] == f"{expected['model.bin']}-3"
    assert manifest["files"]["model.bin"]["server_checksum"]["ChecksumType"] == "COMPOSITE"
    assert manifest["files"]["config.json"]["server_checksum"]["ChecksumType"] == "FULL_OBJECT"
    assert storage.read_manifest(dest, client=s3)["files"] == manifest["files"]
    out = tmp_path / "copy"
    storage.download_folder(dest, str(out), client=s3, part_size=PART)
    assert {n: (out / n).read_bytes() for n in files} == files


def test_objects_replaced_with_forged_metadata_are_sent_again(s3_server, tmp_path):
    """The server's checksum of what it holds decides what is already there, not the x-amz-meta-sha256 the client
    (or whoever wrote the object) claimed."""
    src = tmp_path / "final"
    files = {"model.bin": os.urandom(PART + 99), "config.json": b'{"hidden_size": 64}'}
    _write(src, files)
    uri = f"s3://{BUCKET}/forged/final"
    s3 = s3_server.client()
    storage.upload_folder(uri, str(src), client=s3, part_size=PART)
    for name, data in files.items():
        _forge(s3, f"forged/final/{name}", len(data), hashlib.sha256(data).hexdigest())

    sent: list[str] = []
    manifest = storage.upload_folder(
        uri, str(src), client=s3, part_size=PART, on_part=lambda key, n, size: sent.append(key)
    )
    assert set(sent) == {"forged/final/model.bin", "forged/final/config.json"}
    assert manifest["uploaded"]["config.json"] == "put" and manifest["uploaded"]["model.bin"] == "2 of 2 parts sent"
    for name, data in files.items():
        assert s3.get_object(Bucket=BUCKET, Key=f"forged/final/{name}")["Body"].read() == data, name


def test_an_object_changed_on_the_server_after_it_was_sent_fails_the_upload(s3_server, tmp_path):
    src = tmp_path / "final"
    data = b'{"vocab_size": 151936}'
    _write(src, {"config.json": data})
    uri = f"s3://{BUCKET}/swapped/final"
    s3 = s3_server.client()

    def swap(key: str, number: int, size: int) -> None:  # someone else writes the key between the PUT and the check
        _forge(s3, key, size, hashlib.sha256(data).hexdigest())

    with pytest.raises(OSError, match="swapped/final/config.json: the server holds"):
        storage.upload_folder(uri, str(src), client=s3, part_size=PART, on_part=swap)
    assert storage.read_manifest(uri, client=s3) is None


def test_a_server_without_checksums_is_checked_by_its_md5_etag(s3_server, tmp_path):
    """Where the server returns no x-amz-checksum-* (an older MinIO, GCS's XML API), the ETag, the MD5 the server
    computed of what it holds, stands for it: recorded in the manifest, and a forged object is found out by it."""
    src = tmp_path / "final"
    files = {"model.bin": os.urandom(PART + 7), "config.json": b"{}"}
    _write(src, files)
    uri = f"s3://{BUCKET}/no-checksums/final"
    s3 = _strip_checksums(s3_server.client())
    manifest = storage.upload_folder(uri, str(src), client=s3, part_size=PART)
    md5s = [hashlib.md5(files["model.bin"][i : i + PART]).digest() for i in (0, PART)]
    assert manifest["files"]["model.bin"]["server_checksum"] == {"ETag": f"{hashlib.md5(b''.join(md5s)).hexdigest()}-2"}
    assert manifest["files"]["config.json"]["server_checksum"] == {"ETag": hashlib.md5(b"{}").hexdigest()}

    _forge(s3_server.client(), "no-checksums/final/config.json", 2, hashlib.sha256(b"{}").hexdigest())
    sent: list[str] = []
    storage.upload_folder(uri, str(src), client=s3, part_size=PART, on_part=lambda key, n, size: sent.append(key))
    assert sent == ["no-checksums/final/config.json"]
    assert s3.get_object(Bucket=BUCKET, Key="no-checksums/final/config.json")["Body"].read() == b"{}"


def test_a_re_upload_deletes_the_keys_the_folder_no_longer_has(s3_server, tmp_path, monkeypatch, caplog):
    """KServe's storage initializer downloads the whole prefix: what the new folder lacks must not stay there. Keys
    of a neighbouring prefix that merely starts alike (final-old/) are not the folder's."""
    src = tmp_path / "final"
    old = {f"shard-{i}.bin": b"old %d" % i for i in range(5)} | {"config.json": b"{}", "sub/tokenizer.json": b"{}"}
    _write(src, old)
    uri = storage.parse_store_uri(f"s3://{BUCKET}/reused/final")
    s3 = s3_server.client()
    s3.put_object(Bucket=BUCKET, Key="reused/final-old/model.bin", Body=b"a neighbour's")
    storage.upload_folder(uri, str(src), client=s3)
    assert len(_keys(s3, "reused/final/")) == len(old) + 1  # and its MANIFEST.json

    for name in old:
        if name.startswith("shard-"):
            (src / name).unlink()
    _write(src, {"model.safetensors": b"new weights"})
    monkeypatch.setattr(prune, "DELETE_BATCH", 2)  # S3 takes 1,000 keys a request; 5 stale keys in 3 requests
    with caplog.at_level(logging.INFO, logger="model_store"):
        manifest = storage.upload_folder(uri, str(src), client=s3)
    assert _keys(s3, "reused/final/") == {uri.key(n) for n in (*manifest["files"], storage.MANIFEST)}
    assert set(manifest["files"]) == {"config.json", "sub/tokenizer.json", "model.safetensors"}
    assert "deleted 5 objects under s3://models/reused/final that the folder no longer has" in caplog.text
    assert _keys(s3, "reused/final-old/") == {"reused/final-old/model.bin"}


def test_an_upload_to_the_bucket_root_deletes_nothing_else(s3_server, tmp_path, caplog):
    src = tmp_path / "model"
    _write(src, {"root-config.json": b"{}"})
    s3 = s3_server.client()
    s3.put_object(Bucket=BUCKET, Key="someone-else/model.bin", Body=b"theirs")
    with caplog.at_level(logging.WARNING, logger="model_store"):
        storage.upload_folder(f"s3://{BUCKET}", str(src), client=s3)
    assert "someone-else/model.bin" in _keys(s3, "someone-else/")
    assert "the bucket's root: other objects and open uploads there are left as they are" in caplog.text
    s3.delete_objects(Bucket=BUCKET, Delete={"Objects": [{"Key": "root-config.json"}, {"Key": storage.MANIFEST}]})


def test_no_multipart_upload_stays_open_under_the_folder_once_an_upload_finished(s3_server, tmp_path):
    """An upload stopped mid-way (an evicted pod) whose file the folder no longer has, and an older duplicate upload
    of a key, are aborted at the end of the next upload; a neighbouring prefix's open upload is not touched."""
    src = tmp_path / "final"
    _write(src, {"model-00001.bin": os.urandom(2 * PART + 1), "config.json": b"{}"})  # 3 parts
    uri = storage.parse_store_uri(f"s3://{BUCKET}/abandoned/final")
    s3 = s3_server.client()

    def stop_after_one(key: str, number: int, size: int) -> None:
        if key.endswith(".bin"):
            raise Interrupted("the pod was evicted")

    with pytest.raises(Interrupted):
        storage.upload_folder(uri, str(src), client=s3, part_size=PART, workers=1, on_part=stop_after_one)
    assert _open_uploads(s3, "abandoned/final/") == {"abandoned/final/model-00001.bin"}
    s3.create_multipart_upload(Bucket=BUCKET, Key="abandoned/final/config.json")  # an older run's, never finished
    neighbour = s3.create_multipart_upload(Bucket=BUCKET, Key="abandoned/final-2/model.bin")["UploadId"]

    (src / "model-00001.bin").rename(src / "model.safetensors")  # the folder changed: re-exported under a new name
    manifest = storage.upload_folder(uri, str(src), client=s3, part_size=PART, workers=2)
    assert set(manifest["files"]) == {"model.safetensors", "config.json"}
    assert _open_uploads(s3, "abandoned/final/") == set()
    left = s3.list_multipart_uploads(Bucket=BUCKET, Prefix="abandoned/final-2/")["Uploads"]
    assert [u["UploadId"] for u in left] == [neighbour]
    s3.abort_multipart_upload(Bucket=BUCKET, Key="abandoned/final-2/model.bin", UploadId=neighbour)


def _refuse(s3, operation: str, code: str, when=lambda params: True):
    """``s3`` made to see ``operation`` refused with ``code`` (where ``when`` holds for its parameters), as a server
    that lacks it, or refuses the request, answers."""
    from botocore.exceptions import ClientError

    def refuse(params, **_):
        if when(params):
            raise ClientError({"Error": {"Code": code, "Message": "refused by the test"}}, operation)

    s3.meta.events.register(f"provide-client-params.s3.{operation}", refuse)
    return s3


def test_where_the_server_has_no_delete_objects_stale_keys_go_one_by_one(s3_server, tmp_path):
    """GCS's XML API has no DeleteObjects (it answers NotImplemented or InvalidArgument)."""
    src = tmp_path / "final"
    _write(src, {"a.json": b"{}", "b.json": b"{}"})
    uri = f"s3://{BUCKET}/gcs-like/final"
    s3 = _refuse(s3_server.client(), "DeleteObjects", "NotImplemented")
    storage.upload_folder(uri, str(src), client=s3)
    (src / "b.json").unlink()
    storage.upload_folder(uri, str(src), client=s3)
    assert _keys(s3, "gcs-like/final/") == {"gcs-like/final/a.json", f"gcs-like/final/{storage.MANIFEST}"}


def test_an_open_upload_the_server_will_not_continue_is_begun_again(s3_server, tmp_path):
    """An upload an earlier version of this module opened without a SHA256 checksum: AWS refuses parts with one
    there (InvalidRequest, "Checksum Type mismatch"; moto does not, so the test's client plays it)."""
    src = tmp_path / "final"
    data = os.urandom(PART + 5)
    _write(src, {"model.bin": data})
    key = "refused/final/model.bin"
    s3 = s3_server.client()
    old = s3.create_multipart_upload(Bucket=BUCKET, Key=key)["UploadId"]
    s3.upload_part(Bucket=BUCKET, Key=key, UploadId=old, PartNumber=1, Body=data[:PART])
    s3 = _refuse(s3, "UploadPart", "InvalidRequest", when=lambda params: params["UploadId"] == old)
    manifest = storage.upload_folder(f"s3://{BUCKET}/refused/final", str(src), client=s3, part_size=PART)
    assert manifest["uploaded"]["model.bin"] == "2 of 2 parts sent"
    assert s3.get_object(Bucket=BUCKET, Key=key)["Body"].read() == data
    assert _open_uploads(s3, "refused/final/") == set()


def test_uploads_to_gcs_carry_no_sha256_checksum_and_are_checked_by_their_etags(s3_server, tmp_path, monkeypatch):
    """GCS's XML API keeps no x-amz-checksum-*: the test's server stands in for its endpoint."""
    monkeypatch.setattr(store_client, "GCS_ENDPOINT", s3_server.endpoint)
    src = tmp_path / "final"
    files = {"model.bin": os.urandom(PART + 3), "config.json": b"{}"}
    _write(src, files)
    s3 = s3_server.client()
    manifest = storage.upload_folder(f"s3://{BUCKET}/gcs/final", str(src), client=s3, part_size=PART)
    for name in files:
        head = s3.head_object(Bucket=BUCKET, Key=f"gcs/final/{name}", ChecksumMode="ENABLED")
        assert "ChecksumSHA256" not in head, name
        assert set(manifest["files"][name]["server_checksum"]) == {"ETag"}, name
    assert storage.upload_folder(f"s3://{BUCKET}/gcs/final", str(src), client=s3, part_size=PART)["uploaded"] == {
        "model.bin": "present",
        "config.json": "present",
    }
