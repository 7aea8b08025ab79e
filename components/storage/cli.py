"""``python -m components.storage``: an upload or a download by hand (components/storage/__main__.py runs it)."""

from __future__ import annotations

import argparse
import logging

from components.storage.client import DEFAULT_WORKERS, MIB, parse_store_uri
from components.storage.download import download_folder
from components.storage.integrity import DEFAULT_PART_SIZE
from components.storage.upload import upload_folder


def main(argv: list[str] | None = None) -> int:
    """``python -m components.storage upload|download URI FOLDER [--endpoint URL]``: the same transfers by hand
    (resumable, verified), with the environment's credentials; e.g. a later run's base model put on the claim."""
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
