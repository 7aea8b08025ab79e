"""The store's side of a transfer: its URIs (``s3://bucket/prefix``, ``gs://bucket/prefix``), the boto3 client that
talks to it, the credentials it takes (a Secret's keys, else boto3's chain), and the object calls every transfer
shares (a checked HEAD, a DELETE, the progress line).

boto3 is imported inside the functions: the launcher's modules import this one at no cost.
"""

from __future__ import annotations

import base64
import logging
import os
import re
import threading
import time
from dataclasses import dataclass
from urllib.parse import urlparse

from components.secrets import STORE_KEYS

log = logging.getLogger("model_store")

SCHEMES = ("s3", "gs")
# Google Cloud Storage's XML API speaks S3's protocol, multipart uploads included, with HMAC keys
# (cloud.google.com/storage/docs/aws-simple-migration).
GCS_ENDPOINT = "https://storage.googleapis.com"
MIB = 1024**2
DEFAULT_WORKERS = 8
# A bucket name: S3's rules (3-63 characters: lowercase letters, digits, '.', '-', starting and ending with a letter
# or digit); GCS also allows '_' and, with dots, up to 222.
_BUCKET = re.compile(r"^[a-z0-9][a-z0-9._-]{1,220}[a-z0-9]$")
# What a server answers for a key it does not hold (S3 and moto NoSuchKey, GCS 404).
MISSING_KEY = ("404", "NoSuchKey", "NotFound")


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


def as_store_uri(uri: str | StoreURI) -> StoreURI:
    """``uri`` itself when it is a ``StoreURI``, else parsed (``parse_store_uri``)."""
    return uri if isinstance(uri, StoreURI) else parse_store_uri(uri)


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


def sends_checksums(s3) -> bool:
    """Whether uploads through ``s3`` carry ``x-amz-checksum-sha256``: not to GCS's XML API, which keeps no such
    checksum and is reported to refuse requests with checksum headers it does not expect (its objects are checked by
    their MD5 ETags)."""
    return urlparse(s3.meta.endpoint_url or "").netloc != urlparse(GCS_ENDPOINT).netloc


def head(s3, bucket: str, key: str) -> dict | None:
    """``head_object`` with the server's checksum (``ChecksumMode="ENABLED"``); None when there is no such key."""
    from botocore.exceptions import ClientError

    try:
        return s3.head_object(Bucket=bucket, Key=key, ChecksumMode="ENABLED")
    except ClientError as exc:
        if exc.response.get("Error", {}).get("Code") in MISSING_KEY:
            return None
        raise


def delete_key(s3, bucket: str, key: str) -> None:
    """Delete one object; one already gone is no error (S3 answers 204 there, GCS 404)."""
    from botocore.exceptions import ClientError

    try:
        s3.delete_object(Bucket=bucket, Key=key)
    except ClientError as exc:
        if exc.response.get("Error", {}).get("Code") not in MISSING_KEY:
            raise


class Progress:
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
