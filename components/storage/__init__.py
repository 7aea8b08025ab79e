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

The package's modules: ``client`` (URIs, the boto3 client, credentials), ``integrity`` (digests and the server's
checksums), ``upload`` (``upload_folder``), ``prune`` (what the folder no longer has), ``download`` (``read_manifest``,
``download_folder``) and ``cli`` (``python -m components.storage``). boto3 is imported inside the functions: the
launcher's modules import this package at no cost.
"""

from components.storage.cli import main
from components.storage.client import (
    DEFAULT_WORKERS,
    GCS_ENDPOINT,
    MIB,
    SCHEMES,
    StoreURI,
    access_problem,
    endpoint_for,
    is_store_uri,
    parse_store_uri,
    s3_client,
    secret_credentials,
)
from components.storage.download import download_folder, read_manifest
from components.storage.integrity import (
    DEFAULT_PART_SIZE,
    MANIFEST,
    MAX_PARTS,
    MIN_PART_SIZE,
    SHA256_METADATA,
    folder_manifest,
)
from components.storage.upload import CHECKSUM_ALGORITHM, PartHook, upload_folder

__all__ = [
    "CHECKSUM_ALGORITHM",
    "DEFAULT_PART_SIZE",
    "DEFAULT_WORKERS",
    "GCS_ENDPOINT",
    "MANIFEST",
    "MAX_PARTS",
    "MIB",
    "MIN_PART_SIZE",
    "SCHEMES",
    "SHA256_METADATA",
    "PartHook",
    "StoreURI",
    "access_problem",
    "download_folder",
    "endpoint_for",
    "folder_manifest",
    "is_store_uri",
    "main",
    "parse_store_uri",
    "read_manifest",
    "s3_client",
    "secret_credentials",
    "upload_folder",
]
