"""Object storage for models and checkpoints: S3 and what speaks its API (AWS, MinIO, Ceph RGW, and Google Cloud
Storage through its XML API with HMAC keys), optional and off by default (``model_store_uri`` empty).

    dest = parse_store_uri("s3://my-bucket/llm")               # ValueError naming model_store_uri if it does not
    manifest = upload_folder(dest.join("runs/r1/sft/final"), "/mnt/models/runs/r1/sft/final", endpoint=...)
    download_folder("s3://my-bucket/llm/runs/r1/sft/final", "/mnt/models/store/...")

An upload is resumable and verified by the server's own checksums. Each file goes up in ``part_size`` parts (one PUT
when it fits in one), several at a time (``workers`` threads), each part with its ``Content-MD5`` and its
``x-amz-checksum-sha256`` (``ChecksumAlgorithm="SHA256"``, the value computed here from the local file), so the server
refuses bytes that changed on the way. The server stores a SHA256 checksum of what it holds: the whole file's for a
PUT (``FULL_OBJECT``), for a multipart upload the sha256 of its parts' sha256 digests (``COMPOSITE``; AWS's HEAD
appends ``-<parts>``). A run that stops mid-way (the pod evicted, the network lost) leaves its multipart upload open on
the server: the next ``upload_folder`` finds it (``list_multipart_uploads``), keeps every part the server holds whose
size and checksum (``list_parts``' ``ChecksumSHA256``, else its ETag, the part's MD5) match the local bytes and sends
only the others; a file the server already holds whole (same size and the server's checksum of it equal to the local
file's) is not sent again. After the files, every object is checked against the local file by what the server returns
for it (``head_object(ChecksumMode="ENABLED")``: its size and ``ChecksumSHA256``); then the objects under the folder
that it no longer has are deleted (``KServe``'s storage initializer downloads the whole prefix), multipart uploads
left open under it are aborted, and ``MANIFEST.json`` is written last (each file's size, sha256 and the server's
checksum): a folder with a manifest is complete; the previous one is deleted when an upload starts.
``download_folder`` reads the manifest, fetches the files with parallel ranged GETs (boto3's transfer manager) and
checks each one's size and sha256.

Where a server returns no SHA256 checksum (an older MinIO, GCS's XML API, an object another client wrote without
one), the check falls back to the ETag where it is the MD5 of what the server holds (not under SSE-KMS: there only
``Content-MD5``, checked by the server on receipt, stands for it), and the manifest records that ETag instead. Either
way the ``x-amz-meta-sha256`` this module writes must match too, but it is never enough on its own: a client wrote it.
moto (the tests' server) checks neither ``Content-MD5`` nor a PUT's ``x-amz-checksum-sha256`` against the bytes and
stores the sent value; it computes a multipart object's composite from the parts it holds. An upload to a bucket's
root (no prefix) deletes and aborts nothing there: the bucket is not this folder's.

Credentials: a Secret's ``AWS_ACCESS_KEY_ID`` and ``AWS_SECRET_ACCESS_KEY`` (``model_store_secret``; the launcher and
preflight read it through the Kubernetes API), else boto3's own chain (the environment, ``~/.aws``, an IAM role for
the pod's service account). ``gs://bucket`` means GCS's S3-compatible endpoint (``GCS_ENDPOINT``) with HMAC keys;
google-cloud-storage is not needed.

boto3 is imported inside the functions: the launcher's modules import this one at no cost.
"""

from __future__ import annotations

import base64
import hashlib
import json
import logging
import os
import re
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlparse

from components.secrets import STORE_KEYS

log = logging.getLogger("model_store")

SCHEMES = ("s3", "gs")
# Google Cloud Storage's XML API speaks S3's protocol, multipart uploads included, with HMAC keys
# (cloud.google.com/storage/docs/aws-simple-migration).
GCS_ENDPOINT = "https://storage.googleapis.com"
MANIFEST = "MANIFEST.json"
MIB = 1024**2
MIN_PART_SIZE = 5 * MIB  # S3's smallest part but the last one
MAX_PARTS = 10_000  # S3's most parts per upload
DEFAULT_PART_SIZE = 64 * MIB
DEFAULT_WORKERS = 8
SHA256_METADATA = "sha256"  # x-amz-meta-sha256: the whole file's, set when its upload starts
CHECKSUM_ALGORITHM = "SHA256"  # S3's additional checksum: the server checks each PUT's and part's and stores it
DELETE_BATCH = 1000  # S3's most keys per DeleteObjects
# A resumed upload the server will not continue: created without a SHA256 checksum (by an earlier version of this
# module), or aborted since it was listed. It is begun again.
_RESUME_REFUSED = ("InvalidRequest", "InvalidPart", "InvalidArgument", "BadDigest", "NoSuchUpload")
# A bucket name: S3's rules (3-63 characters: lowercase letters, digits, '.', '-', starting and ending with a letter
# or digit); GCS also allows '_' and, with dots, up to 222.
_BUCKET = re.compile(r"^[a-z0-9][a-z0-9._-]{1,220}[a-z0-9]$")

# Called after each part (or single-part file) reaches the server: (key, part number, bytes).
PartHook = Callable[[str, int, int], None]


@dataclass(frozen=True)
class StoreURI:
    """``scheme://bucket/prefix``: a folder in a bucket (``prefix`` without leading or trailing ``/``)."""

    scheme: str
    bucket: str
    prefix: str = ""

    def __str__(self) -> str:
        return f"{self.scheme}://{self.bucket}/{self.prefix}".rstrip("/")

    def join(self, *parts: str) -> StoreURI:
        path = "/".join(p.strip("/") for p in (self.prefix, *parts) if p.strip("/"))
        return StoreURI(self.scheme, self.bucket, path)

    def key(self, relative: str) -> str:
        return "/".join(p for p in (self.prefix, relative.replace(os.sep, "/")) if p)


def is_store_uri(value: str) -> bool:
    """Whether ``value`` names object storage (``s3://`` or ``gs://``) rather than a Hub id or a path."""
    return str(value).startswith(tuple(f"{s}://" for s in SCHEMES))


def parse_store_uri(uri: str, field: str = "model_store_uri") -> StoreURI:
    """``uri`` as a ``StoreURI``; a ValueError naming ``field`` and the fix when it is not ``s3://bucket[/prefix]`` or
    ``gs://bucket[/prefix]``."""
    example = "e.g. 's3://my-bucket/llm' or 'gs://my-bucket/llm'"
    scheme, sep, rest = str(uri).strip().partition("://")
    if not sep or scheme not in SCHEMES:
        raise ValueError(
            f"{field}={uri!r} is not an s3:// or gs:// URI; {example} (an S3-compatible server: s3:// "
            "and model_store_endpoint)"
        )
    bucket, _, prefix = rest.partition("/")
    if not _BUCKET.match(bucket) or (scheme == "s3" and (len(bucket) > 63 or "_" in bucket)) or ".." in bucket:
        raise ValueError(
            f"{field}={uri!r}: {bucket!r} is not a bucket name (3-63 lowercase letters, digits, '.' and '-', "
            f"starting and ending with a letter or digit); {example}"
        )
    if any(c in prefix for c in "?#\\") or any(p in (".", "..") for p in prefix.split("/")):
        raise ValueError(f"{field}={uri!r}: the path after the bucket may not hold '?', '#', '\\', '.' or '..'")
    return StoreURI(scheme, bucket, "/".join(p for p in prefix.split("/") if p))


def endpoint_for(uri: StoreURI, endpoint: str = "") -> str | None:
    """The endpoint URL to talk to: ``endpoint`` (an S3-compatible server), GCS's for ``gs://``, else AWS (None)."""
    return endpoint or (GCS_ENDPOINT if uri.scheme == "gs" else None)


def s3_client(
    uri: StoreURI,
    endpoint: str = "",
    credentials: dict | None = None,
    *,
    workers: int = DEFAULT_WORKERS,
    attempts: int = 5,
    connect_timeout: float = 10,
):
    """A boto3 S3 client for ``uri``'s server: ``credentials`` (``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``,
    optional ``AWS_SESSION_TOKEN``) or boto3's own chain; path-style addressing on a custom endpoint (MinIO, Ceph),
    ``attempts`` tries with back-off, a connection per worker."""
    import boto3
    from botocore.config import Config

    url = endpoint_for(uri, endpoint)
    creds = credentials or {}
    config = Config(
        retries={"max_attempts": attempts, "mode": "standard"},
        max_pool_connections=max(10, workers + 2),
        s3={"addressing_style": "path" if url else "auto"},
        connect_timeout=connect_timeout,
        read_timeout=120,
    )
    return boto3.session.Session().client(
        "s3",
        endpoint_url=url,
        aws_access_key_id=creds.get("AWS_ACCESS_KEY_ID"),
        aws_secret_access_key=creds.get("AWS_SECRET_ACCESS_KEY"),
        aws_session_token=creds.get("AWS_SESSION_TOKEN") or None,
        region_name=os.environ.get("AWS_DEFAULT_REGION") or os.environ.get("AWS_REGION") or "us-east-1",
        config=config,
    )


def access_problem(uri: StoreURI, endpoint: str = "", credentials: dict | None = None, *, who: str) -> str | None:
    """Why these credentials cannot reach ``uri``'s bucket (a HEAD on it), one line naming ``who`` (where the keys
    came from: ``model_store_secret='x'``) or ``model_store_uri``/``model_store_endpoint``; None when they can."""
    from botocore.exceptions import BotoCoreError, ClientError, NoCredentialsError

    where = f"model_store_uri={str(uri)!r}" + (f" at model_store_endpoint={endpoint!r}" if endpoint else "")
    try:
        # Two tries, 5 s to connect: an endpoint that does not answer fails validate_inputs in seconds.
        s3_client(uri, endpoint, credentials, attempts=2, connect_timeout=5).head_bucket(Bucket=uri.bucket)
    except NoCredentialsError:
        return f"{who}: no credentials for {where}; name a Secret with keys {' and '.join(STORE_KEYS)}"
    except ClientError as exc:
        status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
        code = exc.response.get("Error", {}).get("Code", "")
        if status == 404 or code in ("404", "NoSuchBucket", "NotFound"):
            return f"model_store_uri={str(uri)!r}: bucket {uri.bucket!r} does not exist; create it or name another"
        if status in (400, 401, 403):
            reason = code if code and not code.isdigit() else {400: "Bad Request", 401: "Unauthorized"}.get(status)
            return (
                f"{who}: the server refuses these credentials for {where} (HTTP {status} {reason or 'Forbidden'}): a "
                f"wrong {' or '.join(STORE_KEYS)}, or keys without access to bucket {uri.bucket!r}"
            )
        return f"{where}: HEAD bucket failed: {exc}"
    except BotoCoreError as exc:  # an endpoint that does not answer, a bad URL
        return f"{where}: cannot reach the store ({exc}); check model_store_endpoint"
    return None


def _credentials_from_secret(data: dict, name: str) -> dict:
    """The store's keys from a Secret's ``data`` (base64 values); a ValueError naming the Secret when one lacks."""
    creds = {k: base64.b64decode(v).decode().strip() for k, v in (data or {}).items() if k.startswith("AWS_")}
    if missing := [k for k in STORE_KEYS if not creds.get(k)]:
        has = ", ".join(sorted(data or {})) or "none"
        raise ValueError(f"model_store_secret={name!r} has no key {', '.join(missing)} (it has: {has})")
    return creds


def secret_credentials(core, name: str, namespace: str) -> dict:
    """The keys of Secret ``name`` in ``namespace``, read with ``core`` (a CoreV1Api): the launcher's and preflight's
    way, so no pod holds them in its environment. A ValueError naming model_store_secret when it is missing or lacks
    a key."""
    from kubernetes.client.rest import ApiException

    try:
        secret = core.read_namespaced_secret(name, namespace)
    except ApiException as exc:
        if exc.status == 404:
            keys = " ".join(f"--from-literal={k}=..." for k in STORE_KEYS)
            raise ValueError(
                f"model_store_secret={name!r}: Secret not found in {namespace}; create it (kubectl create secret "
                f"generic {name} -n {namespace} {keys})"
            ) from None
        if exc.status == 403:
            raise ValueError(
                f"model_store_secret={name!r}: this service account may not read it in {namespace}; add its name "
                "to the Secret rule's resourceNames in manifests/rbac/role.yaml and apply it"
            ) from None
        raise
    return _credentials_from_secret(secret.data, name)


def _b64(digest: bytes) -> str:
    return base64.b64encode(digest).decode()


def _digests(path: str, part_size: int) -> tuple[str, list[str], list[str]]:
    """The file's sha256 (hex), and each ``part_size`` part's MD5 (hex) and sha256 (base64, as S3 writes checksums),
    in one read, 8 MiB at a time."""
    whole, md5s, sha256s = hashlib.sha256(), [], []
    md5, sha256, in_part = hashlib.md5(usedforsecurity=False), hashlib.sha256(), 0
    with open(path, "rb") as f:
        while chunk := f.read(min(8 * MIB, part_size - in_part)):
            whole.update(chunk)
            md5.update(chunk)
            sha256.update(chunk)
            in_part += len(chunk)
            if in_part == part_size:
                md5s.append(md5.hexdigest())
                sha256s.append(_b64(sha256.digest()))
                md5, sha256, in_part = hashlib.md5(usedforsecurity=False), hashlib.sha256(), 0
    if in_part or not md5s:
        md5s.append(md5.hexdigest())
        sha256s.append(_b64(sha256.digest()))
    return whole.hexdigest(), md5s, sha256s


def _multipart_etag(part_md5s: list[str]) -> str:
    joined = b"".join(bytes.fromhex(m) for m in part_md5s)
    return f"{hashlib.md5(joined, usedforsecurity=False).hexdigest()}-{len(part_md5s)}"


def _whole_checksum(entry: dict) -> str:
    """The file's ``FULL_OBJECT`` SHA256 checksum, as S3 writes it: its sha256, base64."""
    return _b64(bytes.fromhex(entry["sha256"]))


def _composite_checksum(entry: dict) -> str:
    """The ``COMPOSITE`` SHA256 checksum S3 stores for the file sent in its parts: the sha256 of the parts' sha256
    digests, one after another, then ``-<parts>``."""
    joined = b"".join(base64.b64decode(p) for p in entry["_sha256s"])
    return f"{_b64(hashlib.sha256(joined).digest())}-{len(entry['_sha256s'])}"


def _server_checksum(head: dict, entry: dict) -> dict:
    """What the server returned to vouch for the object ``head`` describes (one that matched ``entry``), for the
    manifest: its ``ChecksumSHA256`` and ``ChecksumType`` (a composite written as AWS's HEAD writes it, with
    ``-<parts>``: moto's leaves it out), else its ``ETag``."""
    value = head.get("ChecksumSHA256")
    if not value:
        return {"ETag": head["ETag"].strip('"')}
    if value == _whole_checksum(entry):
        return {"ChecksumSHA256": value, "ChecksumType": "FULL_OBJECT"}
    return {"ChecksumSHA256": _composite_checksum(entry), "ChecksumType": "COMPOSITE"}


def _stored_problem(head: dict, entry: dict) -> str | None:
    """Why the object ``head`` (a HEAD with ``ChecksumMode="ENABLED"``) describes is not the local file ``entry``;
    None when it is. The server's SHA256 checksum decides where it returns one (the whole file's, or the composite of
    the parts as this module cuts them: another cut does not match, and the file is sent again); where it returns
    none, its ETag where that is an MD5. x-amz-meta-sha256 must match as well: a resumed upload begun for an earlier
    version of the file carries that version's."""
    if head["ContentLength"] != entry["size"]:
        return f"{head['ContentLength']} bytes, the file has {entry['size']}"
    checksum = head.get("ChecksumSHA256")
    if checksum:
        expected = _whole_checksum(entry)
        accepted = {expected}
        if len(entry["_sha256s"]) > 1:  # a file sent whole elsewhere matches too
            expected = _composite_checksum(entry)
            accepted |= {expected, expected.rpartition("-")[0]}
        if checksum not in accepted:
            return f"SHA256 checksum {checksum}, the file's is {expected}"
    else:
        etag = head["ETag"].strip('"')
        md5s = entry["_md5s"]
        expected = md5s[0] if len(md5s) == 1 else _multipart_etag(md5s)
        if re.fullmatch(r"[0-9a-f]{32}(-\d+)?", etag) and etag != expected:
            return f"MD5 ETag {etag} (and no SHA256 checksum), the file's is {expected}"
    claimed = head.get("Metadata", {}).get(SHA256_METADATA)
    if claimed != entry["sha256"]:
        return f"x-amz-meta-{SHA256_METADATA} {claimed}, the file's is {entry['sha256']}"
    return None


def _head(s3, bucket: str, key: str) -> dict | None:
    """``head_object`` with the server's checksum (``ChecksumMode="ENABLED"``); None when there is no such key."""
    from botocore.exceptions import ClientError

    try:
        return s3.head_object(Bucket=bucket, Key=key, ChecksumMode="ENABLED")
    except ClientError as exc:
        if exc.response.get("Error", {}).get("Code") in ("404", "NoSuchKey", "NotFound"):
            return None
        raise


def _files(local_dir: str) -> list[str]:
    found = []
    for root, dirs, names in os.walk(local_dir):
        dirs.sort()
        for name in sorted(names):
            path = os.path.join(root, name)
            if os.path.isfile(path) and not os.path.islink(path):
                found.append(os.path.relpath(path, local_dir))
    return found


class _Stopped(Exception):
    """A part left unsent because another one failed."""


class _Progress:
    """Bytes sent out of the total, logged at most every ``every`` seconds and at the end."""

    def __init__(self, total: int, what: str, every: float):
        self.total, self.what, self.every = total, what, every
        self.done, self.start, self.last = 0, time.monotonic(), 0.0
        self.lock = threading.Lock()

    def add(self, n: int) -> None:
        with self.lock:
            self.done += n
            now = time.monotonic()
            if now - self.last >= self.every or self.done >= self.total:
                self.last = now
                self.report()

    def report(self) -> None:
        seconds = max(time.monotonic() - self.start, 1e-6)
        share = 100.0 * self.done / self.total if self.total else 100.0
        log.info(
            "%s: %.1f of %.1f MiB (%.0f%%), %.1f MiB/s",
            self.what,
            self.done / MIB,
            self.total / MIB,
            share,
            self.done / MIB / seconds,
        )


def _part_size_for(size: int, part_size: int) -> int:
    """``part_size``, raised where a file would need more than ``MAX_PARTS`` parts."""
    needed = -(-size // MAX_PARTS)
    return max(part_size, -(-needed // MIB) * MIB)


def _open_upload(s3, bucket: str, key: str) -> tuple[str | None, dict[int, dict]]:
    """The newest unfinished multipart upload of ``key`` and the parts the server holds for it; older ones of the
    same key are aborted (their parts would be billed for nothing)."""
    uploads = []
    for page in s3.get_paginator("list_multipart_uploads").paginate(Bucket=bucket, Prefix=key):
        uploads += [u for u in page.get("Uploads", []) if u["Key"] == key]
    if not uploads:
        return None, {}
    uploads.sort(key=lambda u: u["Initiated"])
    for stale in uploads[:-1]:
        s3.abort_multipart_upload(Bucket=bucket, Key=key, UploadId=stale["UploadId"])
    upload_id = uploads[-1]["UploadId"]
    parts: dict[int, dict] = {}
    for page in s3.get_paginator("list_parts").paginate(Bucket=bucket, Key=key, UploadId=upload_id):
        parts.update({p["PartNumber"]: p for p in page.get("Parts", [])})
    return upload_id, parts


def _md5_b64(hex_md5: str) -> str:
    return base64.b64encode(bytes.fromhex(hex_md5)).decode()


def _check_etag(what: str, etag: str, md5: str) -> None:
    """A part's ETag is the MD5 of what the server stored, except under SSE-KMS (and on GCS for some objects), where
    it is opaque: there Content-MD5, checked by the server on receipt, stands for it."""
    etag = etag.strip('"')
    if re.fullmatch(r"[0-9a-f]{32}", etag) and etag != md5:
        raise OSError(f"{what}: the server stored MD5 {etag}, sent {md5}")


def _sends_checksums(s3) -> bool:
    """Whether uploads through ``s3`` carry ``x-amz-checksum-sha256``: not to GCS's XML API, which keeps no such
    checksum and is reported to refuse requests with checksum headers it does not expect (its objects are checked by
    their MD5 ETags)."""
    return urlparse(s3.meta.endpoint_url or "").netloc != urlparse(GCS_ENDPOINT).netloc


def _part_held(part: dict, md5: str, sha256: str, length: int) -> bool:
    """Whether a part the server holds (``list_parts``) is this local part: its size, and its SHA256 checksum where
    the server lists one (AWS, a recent MinIO), else its ETag (the part's MD5; moto lists no part checksums)."""
    if part["Size"] != length:
        return False
    if part.get("ChecksumSHA256"):
        return part["ChecksumSHA256"] == sha256
    return part["ETag"].strip('"') == md5


def _upload_file(
    s3,
    dest: StoreURI,
    path: str,
    relative: str,
    entry: dict,
    *,
    part_size: int,
    pool: ThreadPoolExecutor,
    progress: _Progress,
    on_part: PartHook | None,
) -> str:
    """Send one file (``entry``: its size, sha256 and parts' digests; what the server lacks of it); returns what
    happened: present, put or parts sent/total."""
    from botocore.exceptions import ClientError

    key = dest.key(relative)
    size, part_md5s, part_sha256s = entry["size"], entry["_md5s"], entry["_sha256s"]
    checksums = _sends_checksums(s3)
    algorithm = {"ChecksumAlgorithm": CHECKSUM_ALGORITHM} if checksums else {}

    def checksum(number: int) -> dict:  # the part's sha256 (a PUT's: the whole file's) for the server to check
        return {**algorithm, "ChecksumSHA256": part_sha256s[number - 1]} if checksums else {}

    head = _head(s3, dest.bucket, key)
    if head is not None and _stored_problem(head, entry) is None:
        progress.add(size)
        return "present"
    metadata = {SHA256_METADATA: entry["sha256"]}
    if len(part_md5s) == 1:
        with open(path, "rb") as f:
            reply = s3.put_object(
                Bucket=dest.bucket,
                Key=key,
                Body=f.read(),
                ContentMD5=_md5_b64(part_md5s[0]),
                Metadata=metadata,
                **checksum(1),
            )
        _check_etag(key, reply["ETag"], part_md5s[0])
        progress.add(size)
        if on_part:
            on_part(key, 1, size)
        return "put"

    def length_of(number: int) -> int:
        return min(part_size, size - (number - 1) * part_size)

    def attempt(fresh: bool) -> str:
        upload_id, held = (None, {}) if fresh else _open_upload(s3, dest.bucket, key)
        kept = {
            n: p["ETag"]
            for n, p in held.items()
            if n <= len(part_md5s) and _part_held(p, part_md5s[n - 1], part_sha256s[n - 1], length_of(n))
        }
        if upload_id is None:
            upload_id = s3.create_multipart_upload(Bucket=dest.bucket, Key=key, Metadata=metadata, **algorithm)[
                "UploadId"
            ]
        else:
            log.info("%s: resuming its upload, %d of %d parts already on the server", key, len(kept), len(part_md5s))
        progress.add(sum(length_of(n) for n in kept))

        failed = threading.Event()  # one part failed: the parts not started yet are not sent

        def send(number: int) -> tuple[int, str]:
            if failed.is_set():
                raise _Stopped(f"{key} part {number}: not sent, another part failed")
            try:
                return send_part(number)
            except BaseException:
                failed.set()
                raise

        def send_part(number: int) -> tuple[int, str]:
            offset, length = (number - 1) * part_size, length_of(number)
            with open(path, "rb") as f:
                f.seek(offset)
                body = f.read(length)
            md5 = part_md5s[number - 1]
            reply = s3.upload_part(
                Bucket=dest.bucket,
                Key=key,
                UploadId=upload_id,
                PartNumber=number,
                Body=body,
                ContentMD5=_md5_b64(md5),
                **checksum(number),
            )
            _check_etag(f"{key} part {number}", reply["ETag"], md5)
            progress.add(length)
            if on_part:
                on_part(key, number, length)
            return number, reply["ETag"]

        missing = [n for n in range(1, len(part_md5s) + 1) if n not in kept]
        futures = [pool.submit(send, n) for n in missing]
        try:
            sent = dict(future.result() for future in futures)
        except BaseException as exc:
            failed.set()
            for future in futures:
                future.cancel()
            errors = [future.exception() for future in futures if not future.cancelled()]  # waits for those in flight
            first = next((e for e in errors if e is not None and not isinstance(e, _Stopped)), None)
            raise (first or exc) from None
        parts = [{"PartNumber": n, "ETag": etag} for n, etag in sorted({**kept, **sent}.items())]
        if checksums:  # each part's goes with it: the server refuses the upload where one differs from the part held
            for part in parts:
                part["ChecksumSHA256"] = part_sha256s[part["PartNumber"] - 1]
        reply = s3.complete_multipart_upload(
            Bucket=dest.bucket, Key=key, UploadId=upload_id, MultipartUpload={"Parts": parts}
        )
        etag = reply.get("ETag", "").strip('"')
        if re.fullmatch(r"[0-9a-f]{32}-\d+", etag) and etag != _multipart_etag(part_md5s):
            raise OSError(f"{key}: the server assembled {etag}, expected {_multipart_etag(part_md5s)}")
        return f"{len(missing)} of {len(part_md5s)} parts sent"

    for fresh in (False, True):
        try:
            done = attempt(fresh)
        except ClientError as exc:
            if fresh or exc.response.get("Error", {}).get("Code") not in _RESUME_REFUSED:
                raise
            log.warning("%s: the server would not continue the upload resumed (%s); uploading it again", key, exc)
            continue
        head = _head(s3, dest.bucket, key)
        problem = "nothing" if head is None else _stored_problem(head, entry)
        if problem is None:
            return done
        if fresh:
            raise OSError(f"{key}: uploaded twice and the server holds {problem}")
        # The open upload resumed was begun for an earlier version of this file (a re-written final/): its parts
        # that matched are this file's, but its recorded sha256 is not. Sent again whole.
        log.warning("%s: the upload resumed was of an earlier version of the file (%s); sending it again", key, problem)
        s3.delete_object(Bucket=dest.bucket, Key=key)
    raise AssertionError("unreachable")


def folder_manifest(local_dir: str, part_size: int = DEFAULT_PART_SIZE, workers: int = DEFAULT_WORKERS) -> dict:
    """Each file under ``local_dir`` (relative path -> size, sha256, and its parts' digests: ``_md5s``,
    ``_sha256s``), hashed ``workers`` files at a time."""
    names = [n for n in _files(local_dir) if n != MANIFEST]
    with ThreadPoolExecutor(max(1, workers)) as pool:
        sizes = {n: os.path.getsize(os.path.join(local_dir, n)) for n in names}
        digests = pool.map(lambda n: _digests(os.path.join(local_dir, n), _part_size_for(sizes[n], part_size)), names)
        files = {
            n: {"size": sizes[n], "sha256": d[0], "_md5s": d[1], "_sha256s": d[2]}
            for n, d in zip(names, digests, strict=True)
        }
    return {"files": files, "total_bytes": sum(sizes.values())}


def _delete_key(s3, bucket: str, key: str) -> None:
    """Delete one object; one already gone is no error (S3 answers 204 there, GCS 404)."""
    from botocore.exceptions import ClientError

    try:
        s3.delete_object(Bucket=bucket, Key=key)
    except ClientError as exc:
        if exc.response.get("Error", {}).get("Code") not in ("404", "NoSuchKey", "NotFound"):
            raise


def _delete_stale(s3, dest: StoreURI, keep: set[str]) -> int:
    """Delete the objects under the folder ``dest`` whose keys are not in ``keep``, ``DELETE_BATCH`` keys a request
    (one by one where the server has no DeleteObjects: GCS's XML API); how many."""
    from botocore.exceptions import ClientError

    pages = s3.get_paginator("list_objects_v2").paginate(Bucket=dest.bucket, Prefix=dest.prefix + "/")
    stale = [o["Key"] for page in pages for o in page.get("Contents", []) if o["Key"] not in keep]
    for start in range(0, len(stale), DELETE_BATCH):
        batch = stale[start : start + DELETE_BATCH]
        try:
            reply = s3.delete_objects(
                Bucket=dest.bucket, Delete={"Objects": [{"Key": k} for k in batch], "Quiet": True}
            )
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") not in ("NotImplemented", "InvalidArgument"):
                raise
            for key in batch:
                _delete_key(s3, dest.bucket, key)
            continue
        if errors := reply.get("Errors"):
            first = errors[0]
            raise OSError(
                f"{dest}: {len(errors)} objects the folder no longer has were not deleted, e.g. {first.get('Key')}: "
                f"{first.get('Code')} {first.get('Message')}"
            )
    return len(stale)


def _abort_open_uploads(s3, dest: StoreURI) -> int:
    """Abort every multipart upload open under the folder ``dest``; how many. Called once every file is whole: the
    uploads just finished are no longer open, so what is left was abandoned (a file the folder no longer has, an
    older duplicate, a run stopped for good) and its parts would be billed for nothing."""
    from botocore.exceptions import ClientError

    pages = s3.get_paginator("list_multipart_uploads").paginate(Bucket=dest.bucket, Prefix=dest.prefix + "/")
    uploads = [(u["Key"], u["UploadId"]) for page in pages for u in page.get("Uploads", [])]
    for key, upload_id in uploads:
        try:
            s3.abort_multipart_upload(Bucket=dest.bucket, Key=key, UploadId=upload_id)
        except ClientError as exc:  # ended meanwhile
            if exc.response.get("Error", {}).get("Code") not in ("NoSuchUpload", "404"):
                raise
    return len(uploads)


def upload_folder(
    uri: str | StoreURI,
    local_dir: str,
    *,
    endpoint: str = "",
    credentials: dict | None = None,
    part_size: int = DEFAULT_PART_SIZE,
    workers: int = DEFAULT_WORKERS,
    on_part: PartHook | None = None,
    progress_seconds: float = 10.0,
    client: Any = None,
) -> dict:
    """Upload every file under ``local_dir`` to the folder ``uri``, resuming what an earlier call left unfinished,
    then verify each object by the server's checksum of it, delete the objects under ``uri`` that ``local_dir`` no
    longer has, abort the multipart uploads left open under it, and write ``MANIFEST.json`` there last. At a bucket's
    root (no prefix) nothing is deleted or aborted.

    Args:
        uri: the destination folder, ``s3://bucket/prefix`` or ``gs://bucket/prefix``.
        local_dir: the folder to send (every regular file under it, symlinks left out).
        endpoint: an S3-compatible server's URL (MinIO, Ceph); empty: AWS, or GCS for ``gs://``.
        credentials: ``AWS_ACCESS_KEY_ID``/``AWS_SECRET_ACCESS_KEY`` (``secret_credentials``); None: boto3's chain.
        part_size: bytes per part (at least 5 MiB, S3's minimum; raised where a file would need over 10,000 parts).
        workers: parts in flight at once.
        on_part: called after each part reaches the server (the tests interrupt an upload from it).
        progress_seconds: at most one progress line this often.
        client: a boto3 S3 client to use instead of making one.

    Returns:
        The manifest: ``uri``, ``files`` (relative path -> ``size``, ``sha256`` and ``server_checksum``: the server's
        ``ChecksumSHA256`` and ``ChecksumType``, or its ``ETag`` where it returns no checksum), ``total_bytes``,
        ``uploaded`` (per file: present, put, or how many parts were sent).

    Raises:
        ValueError: a bad ``uri``, ``local_dir`` not a folder, or ``part_size`` below 5 MiB.
        OSError: an object that does not match the local file after the upload, or a stale one the server would not
            delete.
        botocore's errors: what the server refused (credentials, a missing bucket).
    """
    dest = uri if isinstance(uri, StoreURI) else parse_store_uri(uri)
    if not os.path.isdir(local_dir):
        raise ValueError(f"{local_dir} is not a folder")
    if part_size < MIN_PART_SIZE:
        raise ValueError(f"part_size={part_size} is below S3's smallest part, {MIN_PART_SIZE} bytes")
    s3 = client or s3_client(dest, endpoint, credentials, workers=workers)
    started = time.monotonic()
    manifest = folder_manifest(local_dir, part_size, workers)
    # An earlier upload's manifest would vouch for a folder whose files change from here on.
    _delete_key(s3, dest.bucket, dest.key(MANIFEST))
    progress = _Progress(manifest["total_bytes"], f"upload to {dest}", progress_seconds)
    uploaded = {}
    with ThreadPoolExecutor(max(1, workers)) as pool:

        def upload(name: str) -> str:
            entry = manifest["files"][name]
            return _upload_file(
                s3,
                dest,
                os.path.join(local_dir, name),
                name,
                entry,
                part_size=_part_size_for(entry["size"], part_size),
                pool=pool,
                progress=progress,
                on_part=on_part,
            )

        # Files of one part (configs, tokenizers, small shards) go up side by side, a task each; a larger file's
        # parts fill the same pool, one file after another.
        whole = {n: pool.submit(upload, n) for n, e in manifest["files"].items() if len(e["_md5s"]) == 1}
        for name, entry in manifest["files"].items():
            if len(entry["_md5s"]) > 1:
                uploaded[name] = upload(name)
        uploaded.update({name: future.result() for name, future in whole.items()})
        uploaded = {name: uploaded[name] for name in manifest["files"]}
    files = {}
    for name, entry in manifest["files"].items():  # what the server holds now, object by object
        head = _head(s3, dest.bucket, dest.key(name))
        problem = "nothing" if head is None else _stored_problem(head, entry)
        if head is None or problem is not None:
            raise OSError(f"{dest.key(name)}: the server holds {problem}")
        server = _server_checksum(head, entry)
        files[name] = {"size": entry["size"], "sha256": entry["sha256"], "server_checksum": server}
    if dest.prefix:
        if deleted := _delete_stale(s3, dest, {dest.key(n) for n in [*files, MANIFEST]}):
            log.info("deleted %d objects under %s that the folder no longer has", deleted, dest)
        if aborted := _abort_open_uploads(s3, dest):
            log.info("aborted %d multipart uploads left open under %s", aborted, dest)
    else:
        log.warning("%s is the bucket's root: other objects and open uploads there are left as they are", dest)
    record = {"uri": str(dest), "files": files, "total_bytes": manifest["total_bytes"]}
    s3.put_object(
        Bucket=dest.bucket,
        Key=dest.key(MANIFEST),
        Body=json.dumps(record, indent=1, sort_keys=True).encode(),
        ContentType="application/json",
    )
    seconds = time.monotonic() - started
    log.info(
        "uploaded %s to %s and verified it: %d files, %.1f MiB in %.1f s",
        local_dir,
        dest,
        len(files),
        manifest["total_bytes"] / MIB,
        seconds,
    )
    return {**record, "uploaded": uploaded}


def read_manifest(uri: str | StoreURI, *, endpoint: str = "", credentials: dict | None = None, client: Any = None):
    """The ``MANIFEST.json`` of an uploaded folder; None when there is none (an upload that did not finish)."""
    from botocore.exceptions import ClientError

    src = uri if isinstance(uri, StoreURI) else parse_store_uri(uri)
    s3 = client or s3_client(src, endpoint, credentials)
    try:
        body = s3.get_object(Bucket=src.bucket, Key=src.key(MANIFEST))["Body"].read()
    except ClientError as exc:
        if exc.response.get("Error", {}).get("Code") in ("404", "NoSuchKey", "NotFound"):
            return None
        raise
    return json.loads(body)


def _sha256(path: str) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def download_folder(
    uri: str | StoreURI,
    local_dir: str,
    *,
    endpoint: str = "",
    credentials: dict | None = None,
    part_size: int = DEFAULT_PART_SIZE,
    workers: int = DEFAULT_WORKERS,
    client: Any = None,
) -> dict:
    """Fetch the uploaded folder ``uri`` (it must have its ``MANIFEST.json``) into ``local_dir``: files already there
    with their manifest size and sha256 are kept, the others fetched with parallel ranged GETs into a temporary name,
    checked and renamed. Returns the manifest; ValueError naming ``uri`` when it has no manifest, OSError when a file
    does not match it."""
    from boto3.s3.transfer import TransferConfig

    src = uri if isinstance(uri, StoreURI) else parse_store_uri(uri)
    s3 = client or s3_client(src, endpoint, credentials, workers=workers)
    manifest = read_manifest(src, client=s3)
    if manifest is None:
        raise ValueError(f"{src} has no {MANIFEST}: not a folder upload_folder finished (or the wrong path)")
    transfer = TransferConfig(
        multipart_threshold=part_size, multipart_chunksize=part_size, max_concurrency=max(1, workers)
    )
    progress = _Progress(manifest["total_bytes"], f"download of {src}", 10.0)
    for name, entry in manifest["files"].items():
        target = os.path.normpath(os.path.join(local_dir, name))
        if not target.startswith(os.path.normpath(local_dir) + os.sep):
            raise ValueError(f"{src}/{MANIFEST} names {name!r}, outside the folder")
        if os.path.isfile(target) and os.path.getsize(target) == entry["size"] and _sha256(target) == entry["sha256"]:
            progress.add(entry["size"])
            continue
        os.makedirs(os.path.dirname(target), exist_ok=True)
        partial = target + ".partial"
        s3.download_file(src.bucket, src.key(name), partial, Config=transfer, Callback=progress.add)
        if os.path.getsize(partial) != entry["size"] or _sha256(partial) != entry["sha256"]:
            os.remove(partial)
            raise OSError(f"{src.key(name)}: the downloaded bytes do not match {MANIFEST}'s size and sha256")
        os.replace(partial, target)
    with open(os.path.join(local_dir, MANIFEST), "w") as f:
        json.dump(manifest, f, indent=1, sort_keys=True)
    log.info("downloaded %s to %s: %d files, verified", src, local_dir, len(manifest["files"]))
    return manifest


def main(argv: list[str] | None = None) -> int:
    """``python -m components.storage upload|download URI FOLDER [--endpoint URL]``: the same transfers by hand
    (resumable, verified), with the environment's credentials; e.g. a later run's base model put on the claim."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m components.storage", description=main.__doc__)
    parser.add_argument("action", choices=("upload", "download"))
    parser.add_argument("uri", help="s3://bucket/prefix or gs://bucket/prefix")
    parser.add_argument("folder", help="the local folder to send, or to fetch into")
    parser.add_argument("--endpoint", default="", help="an S3-compatible server's URL; default: AWS, or GCS for gs://")
    parser.add_argument("--workers", type=int, default=DEFAULT_WORKERS, help="parts in flight at once")
    parser.add_argument("--part-size-mib", type=int, default=DEFAULT_PART_SIZE // MIB, help="at least 5")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    try:
        uri = parse_store_uri(args.uri, "uri")
    except ValueError as exc:
        parser.error(str(exc))
    options = {"endpoint": args.endpoint, "workers": args.workers, "part_size": args.part_size_mib * MIB}
    if args.action == "upload":
        upload_folder(uri, args.folder, **options)
    else:
        download_folder(uri, args.folder, **options)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
