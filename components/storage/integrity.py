"""What vouches for an uploaded file: the local file's digests (its sha256, and each part's MD5 and sha256, as S3
cuts and checks them), the checksums the server stores for it (``FULL_OBJECT`` for a PUT, ``COMPOSITE`` for a
multipart upload; an MD5 ETag where it keeps none), and whether the object the server holds is the local file."""

from __future__ import annotations

import base64
import hashlib
import os
import re
from concurrent.futures import ThreadPoolExecutor

from components.storage.client import DEFAULT_WORKERS, MIB

MANIFEST = "MANIFEST.json"
MIN_PART_SIZE = 5 * MIB  # S3's smallest part but the last one
MAX_PARTS = 10_000  # S3's most parts per upload
DEFAULT_PART_SIZE = 64 * MIB
SHA256_METADATA = "sha256"  # x-amz-meta-sha256: the whole file's, set when its upload starts


def _b64(digest: bytes) -> str:
    return base64.b64encode(digest).decode()


def md5_b64(hex_md5: str) -> str:
    """An MD5 given in hex, as ``Content-MD5`` takes it (base64)."""
    return base64.b64encode(bytes.fromhex(hex_md5)).decode()


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


def sha256_of(path: str) -> str:
    """The file's sha256, hex."""
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def multipart_etag(part_md5s: list[str]) -> str:
    """The ETag S3 gives a multipart object: the MD5 of its parts' MD5 digests, then ``-<parts>``."""
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


def server_checksum(head: dict, entry: dict) -> dict:
    """What the server returned to vouch for the object ``head`` describes (one that matched ``entry``), for the
    manifest: its ``ChecksumSHA256`` and ``ChecksumType`` (a composite written as AWS's HEAD writes it, with
    ``-<parts>``: moto's leaves it out), else its ``ETag``."""
    value = head.get("ChecksumSHA256")
    if not value:
        return {"ETag": head["ETag"].strip('"')}
    if value == _whole_checksum(entry):
        return {"ChecksumSHA256": value, "ChecksumType": "FULL_OBJECT"}
    return {"ChecksumSHA256": _composite_checksum(entry), "ChecksumType": "COMPOSITE"}


def stored_problem(head: dict, entry: dict) -> str | None:
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
        expected = md5s[0] if len(md5s) == 1 else multipart_etag(md5s)
        if re.fullmatch(r"[0-9a-f]{32}(-\d+)?", etag) and etag != expected:
            return f"MD5 ETag {etag} (and no SHA256 checksum), the file's is {expected}"
    claimed = head.get("Metadata", {}).get(SHA256_METADATA)
    if claimed != entry["sha256"]:
        return f"x-amz-meta-{SHA256_METADATA} {claimed}, the file's is {entry['sha256']}"
    return None


def check_etag(what: str, etag: str, md5: str) -> None:
    """A part's ETag is the MD5 of what the server stored, except under SSE-KMS (and on GCS for some objects), where
    it is opaque: there Content-MD5, checked by the server on receipt, stands for it."""
    etag = etag.strip('"')
    if re.fullmatch(r"[0-9a-f]{32}", etag) and etag != md5:
        raise OSError(f"{what}: the server stored MD5 {etag}, sent {md5}")


def part_held(part: dict, md5: str, sha256: str, length: int) -> bool:
    """Whether a part the server holds (``list_parts``) is this local part: its size, and its SHA256 checksum where
    the server lists one (AWS, a recent MinIO), else its ETag (the part's MD5; moto lists no part checksums)."""
    if part["Size"] != length:
        return False
    if part.get("ChecksumSHA256"):
        return part["ChecksumSHA256"] == sha256
    return part["ETag"].strip('"') == md5


def part_size_for(size: int, part_size: int) -> int:
    """``part_size``, raised where a file would need more than ``MAX_PARTS`` parts."""
    needed = -(-size // MAX_PARTS)
    return max(part_size, -(-needed // MIB) * MIB)


def _files(local_dir: str) -> list[str]:
    found = []
    for root, dirs, names in os.walk(local_dir):
        dirs.sort()
        for name in sorted(names):
            path = os.path.join(root, name)
            if os.path.isfile(path) and not os.path.islink(path):
                found.append(os.path.relpath(path, local_dir))
    return found


def folder_manifest(local_dir: str, part_size: int = DEFAULT_PART_SIZE, workers: int = DEFAULT_WORKERS) -> dict:
    """Each file under ``local_dir`` (relative path -> size, sha256, and its parts' digests: ``_md5s``,
    ``_sha256s``), hashed ``workers`` files at a time."""
    names = [n for n in _files(local_dir) if n != MANIFEST]
    with ThreadPoolExecutor(max(1, workers)) as pool:
        sizes = {n: os.path.getsize(os.path.join(local_dir, n)) for n in names}
        digests = pool.map(lambda n: _digests(os.path.join(local_dir, n), part_size_for(sizes[n], part_size)), names)
        files = {
            n: {"size": sizes[n], "sha256": d[0], "_md5s": d[1], "_sha256s": d[2]}
            for n, d in zip(names, digests, strict=True)
        }
    return {"files": files, "total_bytes": sum(sizes.values())}
