"""Uploads to object storage: resumable, several parts at a time, each part checked by the server on receipt
(``Content-MD5`` and ``x-amz-checksum-sha256``), every object verified by the server's checksum of it once sent,
the folder pruned of what it no longer has and its ``MANIFEST.json`` written last (components/storage/__init__.py
tells the whole protocol)."""

from __future__ import annotations

import json
import logging
import os
import re
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from components.storage.client import (
    DEFAULT_WORKERS,
    MIB,
    Progress,
    StoreURI,
    as_store_uri,
    delete_key,
    head,
    s3_client,
    sends_checksums,
)
from components.storage.integrity import (
    DEFAULT_PART_SIZE,
    MANIFEST,
    MIN_PART_SIZE,
    SHA256_METADATA,
    check_etag,
    folder_manifest,
    md5_b64,
    multipart_etag,
    part_held,
    part_size_for,
    server_checksum,
    stored_problem,
)
from components.storage.prune import prune_folder

log = logging.getLogger("model_store")

CHECKSUM_ALGORITHM = "SHA256"  # S3's additional checksum: the server checks each PUT's and part's and stores it
# A resumed upload the server will not continue: created without a SHA256 checksum (by an earlier version of this
# module), or aborted since it was listed. It is begun again.
_RESUME_REFUSED = ("InvalidRequest", "InvalidPart", "InvalidArgument", "BadDigest", "NoSuchUpload")

# Called after each part (or single-part file) reaches the server: (key, part number, bytes).
PartHook = Callable[[str, int, int], None]


class _Stopped(Exception):
    """A part left unsent because another one failed."""


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


@dataclass
class _FileUpload:
    """One file's upload to ``key`` (``entry``: its size, sha256 and parts' digests): what the server lacks of it,
    one PUT when it is one part, else its parts in ``pool``, resuming the multipart upload left open for it."""

    s3: Any
    bucket: str
    key: str
    path: str
    entry: dict
    part_size: int
    pool: ThreadPoolExecutor
    progress: Progress
    on_part: PartHook | None
    checksums: bool = field(init=False)

    def __post_init__(self) -> None:
        self.checksums = sends_checksums(self.s3)

    @property
    def algorithm(self) -> dict:
        return {"ChecksumAlgorithm": CHECKSUM_ALGORITHM} if self.checksums else {}

    @property
    def parts(self) -> int:
        return len(self.entry["_md5s"])

    def checksum(self, number: int) -> dict:
        """The part's sha256 (a PUT's: the whole file's) for the server to check."""
        return {**self.algorithm, "ChecksumSHA256": self.entry["_sha256s"][number - 1]} if self.checksums else {}

    def length_of(self, number: int) -> int:
        return min(self.part_size, self.entry["size"] - (number - 1) * self.part_size)

    def _sent(self, number: int, length: int) -> None:
        self.progress.add(length)
        if self.on_part:
            self.on_part(self.key, number, length)

    def run(self) -> str:
        """Send what the server lacks of the file; what happened: present, put or parts sent/total."""
        from botocore.exceptions import ClientError

        stored = head(self.s3, self.bucket, self.key)
        if stored is not None and stored_problem(stored, self.entry) is None:
            self.progress.add(self.entry["size"])
            return "present"
        if self.parts == 1:
            return self._put()
        for fresh in (False, True):
            try:
                done = self._attempt(fresh)
            except ClientError as exc:
                if fresh or exc.response.get("Error", {}).get("Code") not in _RESUME_REFUSED:
                    raise
                log.warning(
                    "%s: the server would not continue the upload resumed (%s); uploading it again", self.key, exc
                )
                continue
            stored = head(self.s3, self.bucket, self.key)
            problem = "nothing" if stored is None else stored_problem(stored, self.entry)
            if problem is None:
                return done
            if fresh:
                raise OSError(f"{self.key}: uploaded twice and the server holds {problem}")
            # The open upload resumed was begun for an earlier version of this file (a re-written final/): its parts
            # that matched are this file's, but its recorded sha256 is not. Sent again whole.
            log.warning(
                "%s: the upload resumed was of an earlier version of the file (%s); sending it again", self.key, problem
            )
            self.s3.delete_object(Bucket=self.bucket, Key=self.key)
        raise AssertionError("unreachable")

    def _put(self) -> str:
        md5 = self.entry["_md5s"][0]
        with open(self.path, "rb") as f:
            reply = self.s3.put_object(
                Bucket=self.bucket,
                Key=self.key,
                Body=f.read(),
                ContentMD5=md5_b64(md5),
                Metadata={SHA256_METADATA: self.entry["sha256"]},
                **self.checksum(1),
            )
        check_etag(self.key, reply["ETag"], md5)
        self._sent(1, self.entry["size"])
        return "put"

    def _attempt(self, fresh: bool) -> str:
        """Resume the upload left open (``fresh``: begin a new one), send the parts it lacks, and complete it."""
        upload_id, held = (None, {}) if fresh else _open_upload(self.s3, self.bucket, self.key)
        md5s, sha256s = self.entry["_md5s"], self.entry["_sha256s"]
        kept = {
            n: p["ETag"]
            for n, p in held.items()
            if n <= self.parts and part_held(p, md5s[n - 1], sha256s[n - 1], self.length_of(n))
        }
        if upload_id is None:
            metadata = {SHA256_METADATA: self.entry["sha256"]}
            created = self.s3.create_multipart_upload(
                Bucket=self.bucket, Key=self.key, Metadata=metadata, **self.algorithm
            )
            upload_id = created["UploadId"]
        else:
            log.info("%s: resuming its upload, %d of %d parts already on the server", self.key, len(kept), self.parts)
        self.progress.add(sum(self.length_of(n) for n in kept))
        missing = [n for n in range(1, self.parts + 1) if n not in kept]
        sent = self._send_parts(upload_id, missing)
        self._complete(upload_id, {**kept, **sent})
        return f"{len(missing)} of {self.parts} parts sent"

    def _send_parts(self, upload_id: str, numbers: list[int]) -> dict[int, str]:
        """Send parts ``numbers`` side by side in the pool; their ETags. Once one fails, those not started yet are not
        sent, and its error is raised when those in flight have ended."""
        failed = threading.Event()

        def send(number: int) -> tuple[int, str]:
            if failed.is_set():
                raise _Stopped(f"{self.key} part {number}: not sent, another part failed")
            try:
                return self._send_part(upload_id, number)
            except BaseException:
                failed.set()
                raise

        futures = [self.pool.submit(send, n) for n in numbers]
        try:
            return dict(future.result() for future in futures)
        except BaseException as exc:
            failed.set()
            for future in futures:
                future.cancel()
            errors = [future.exception() for future in futures if not future.cancelled()]  # waits for those in flight
            first = next((e for e in errors if e is not None and not isinstance(e, _Stopped)), None)
            raise (first or exc) from None

    def _send_part(self, upload_id: str, number: int) -> tuple[int, str]:
        length = self.length_of(number)
        with open(self.path, "rb") as f:
            f.seek((number - 1) * self.part_size)
            body = f.read(length)
        md5 = self.entry["_md5s"][number - 1]
        reply = self.s3.upload_part(
            Bucket=self.bucket,
            Key=self.key,
            UploadId=upload_id,
            PartNumber=number,
            Body=body,
            ContentMD5=md5_b64(md5),
            **self.checksum(number),
        )
        check_etag(f"{self.key} part {number}", reply["ETag"], md5)
        self._sent(number, length)
        return number, reply["ETag"]

    def _complete(self, upload_id: str, etags: dict[int, str]) -> None:
        """Assemble the object from its parts (``etags`` by part number) and check the server's ETag of it."""
        parts: list[dict[str, Any]] = [{"PartNumber": n, "ETag": etag} for n, etag in sorted(etags.items())]
        # Each part's checksum goes with it: the server refuses the upload where one differs from the part held.
        if self.checksums:
            for part in parts:
                part["ChecksumSHA256"] = self.entry["_sha256s"][part["PartNumber"] - 1]
        reply = self.s3.complete_multipart_upload(
            Bucket=self.bucket, Key=self.key, UploadId=upload_id, MultipartUpload={"Parts": parts}
        )
        etag = reply.get("ETag", "").strip('"')
        expected = multipart_etag(self.entry["_md5s"])
        if re.fullmatch(r"[0-9a-f]{32}-\d+", etag) and etag != expected:
            raise OSError(f"{self.key}: the server assembled {etag}, expected {expected}")


def _send_files(
    s3,
    dest: StoreURI,
    local_dir: str,
    manifest: dict,
    *,
    part_size: int,
    workers: int,
    progress: Progress,
    on_part: PartHook | None,
) -> dict[str, str]:
    """Send each file of ``manifest`` (``folder_manifest``) that the server lacks; what happened to each, in the
    manifest's order."""
    uploaded = {}
    with ThreadPoolExecutor(max(1, workers)) as pool:

        def upload(name: str) -> str:
            entry = manifest["files"][name]
            return _FileUpload(
                s3,
                dest.bucket,
                dest.key(name),
                os.path.join(local_dir, name),
                entry,
                part_size=part_size_for(entry["size"], part_size),
                pool=pool,
                progress=progress,
                on_part=on_part,
            ).run()

        # Files of one part (configs, tokenizers, small shards) go up side by side, a task each; a larger file's
        # parts fill the same pool, one file after another.
        whole = {n: pool.submit(upload, n) for n, e in manifest["files"].items() if len(e["_md5s"]) == 1}
        for name, entry in manifest["files"].items():
            if len(entry["_md5s"]) > 1:
                uploaded[name] = upload(name)
        uploaded.update({name: future.result() for name, future in whole.items()})
    return {name: uploaded[name] for name in manifest["files"]}


def _verified(s3, dest: StoreURI, manifest: dict) -> dict:
    """Each file of ``manifest`` as the server holds it now, object by object (size, sha256 and the server's
    checksum); OSError for one that does not match the local file."""
    files = {}
    for name, entry in manifest["files"].items():
        stored = head(s3, dest.bucket, dest.key(name))
        problem = "nothing" if stored is None else stored_problem(stored, entry)
        if stored is None or problem is not None:
            raise OSError(f"{dest.key(name)}: the server holds {problem}")
        files[name] = {
            "size": entry["size"],
            "sha256": entry["sha256"],
            "server_checksum": server_checksum(stored, entry),
        }
    return files


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
    dest = as_store_uri(uri)
    if not os.path.isdir(local_dir):
        raise ValueError(f"{local_dir} is not a folder")
    if part_size < MIN_PART_SIZE:
        raise ValueError(f"part_size={part_size} is below S3's smallest part, {MIN_PART_SIZE} bytes")
    s3 = client or s3_client(dest, endpoint, credentials, workers=workers)
    started = time.monotonic()
    manifest = folder_manifest(local_dir, part_size, workers)
    # An earlier upload's manifest would vouch for a folder whose files change from here on.
    delete_key(s3, dest.bucket, dest.key(MANIFEST))
    progress = Progress(manifest["total_bytes"], f"upload to {dest}", progress_seconds)
    uploaded = _send_files(
        s3, dest, local_dir, manifest, part_size=part_size, workers=workers, progress=progress, on_part=on_part
    )
    files = _verified(s3, dest, manifest)
    prune_folder(s3, dest, {dest.key(n) for n in [*files, MANIFEST]})
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
