"""What an upload leaves under its folder once every file is whole: the objects the local folder no longer has are
deleted (KServe's storage initializer downloads the whole prefix) and the multipart uploads left open there are
aborted (their parts would be billed for nothing). At a bucket's root nothing is: the bucket is not the folder's."""

from __future__ import annotations

import logging

from components.storage.client import StoreURI, delete_key

log = logging.getLogger("model_store")

DELETE_BATCH = 1000  # S3's most keys per DeleteObjects


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
                delete_key(s3, dest.bucket, key)
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


def prune_folder(s3, dest: StoreURI, keep: set[str]) -> None:
    """Delete the objects under the folder ``dest`` not in ``keep`` and abort the multipart uploads open under it;
    at a bucket's root (no prefix), only a warning that nothing there was touched."""
    if not dest.prefix:
        log.warning("%s is the bucket's root: other objects and open uploads there are left as they are", dest)
        return
    if deleted := _delete_stale(s3, dest, keep):
        log.info("deleted %d objects under %s that the folder no longer has", deleted, dest)
    if aborted := _abort_open_uploads(s3, dest):
        log.info("aborted %d multipart uploads left open under %s", aborted, dest)
