"""Downloads of an uploaded folder: its ``MANIFEST.json`` (written last by ``upload_folder``: a folder with one is
complete), then each file fetched with parallel ranged GETs (boto3's transfer manager) and checked against the
manifest's size and sha256."""

from __future__ import annotations

import json
import logging
import os
from typing import Any

from components.storage.client import DEFAULT_WORKERS, MISSING_KEY, Progress, StoreURI, as_store_uri, s3_client
from components.storage.integrity import DEFAULT_PART_SIZE, MANIFEST, sha256_of

log = logging.getLogger("model_store")


def read_manifest(uri: str | StoreURI, *, endpoint: str = "", credentials: dict | None = None, client: Any = None):
    """The ``MANIFEST.json`` of an uploaded folder; None when there is none (an upload that did not finish)."""
    from botocore.exceptions import ClientError

    src = as_store_uri(uri)
    s3 = client or s3_client(src, endpoint, credentials)
    try:
        body = s3.get_object(Bucket=src.bucket, Key=src.key(MANIFEST))["Body"].read()
    except ClientError as exc:
        if exc.response.get("Error", {}).get("Code") in MISSING_KEY:
            return None
        raise
    return json.loads(body)


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

    src = as_store_uri(uri)
    s3 = client or s3_client(src, endpoint, credentials, workers=workers)
    manifest = read_manifest(src, client=s3)
    if manifest is None:
        raise ValueError(f"{src} has no {MANIFEST}: not a folder upload_folder finished (or the wrong path)")
    transfer = TransferConfig(
        multipart_threshold=part_size, multipart_chunksize=part_size, max_concurrency=max(1, workers)
    )
    progress = Progress(manifest["total_bytes"], f"download of {src}", 10.0)
    for name, entry in manifest["files"].items():
        target = os.path.normpath(os.path.join(local_dir, name))
        if not target.startswith(os.path.normpath(local_dir) + os.sep):
            raise ValueError(f"{src}/{MANIFEST} names {name!r}, outside the folder")
        if os.path.isfile(target) and os.path.getsize(target) == entry["size"] and sha256_of(target) == entry["sha256"]:
            progress.add(entry["size"])
            continue
        os.makedirs(os.path.dirname(target), exist_ok=True)
        partial = target + ".partial"
        s3.download_file(src.bucket, src.key(name), partial, Config=transfer, Callback=progress.add)
        if os.path.getsize(partial) != entry["size"] or sha256_of(partial) != entry["sha256"]:
            os.remove(partial)
            raise OSError(f"{src.key(name)}: the downloaded bytes do not match {MANIFEST}'s size and sha256")
        os.replace(partial, target)
    with open(os.path.join(local_dir, MANIFEST), "w") as f:
        json.dump(manifest, f, indent=1, sort_keys=True)
    log.info("downloaded %s to %s: %d files, verified", src, local_dir, len(manifest["files"]))
    return manifest
