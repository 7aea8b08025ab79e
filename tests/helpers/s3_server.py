"""A real S3 server on this machine (moto's server mode, in a thread on a free port) with one bucket, one IAM user
allowed S3 and its access key; every request after the setup is authenticated (moto checks the signature and the
key), so a wrong key is refused as AWS refuses it."""

from __future__ import annotations

import json
import socket
from contextlib import contextmanager
from dataclasses import dataclass

BUCKET = "models"


@dataclass
class S3Server:
    endpoint: str
    keys: dict  # AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY of a user allowed s3:*

    def client(self, keys: dict | None = None):
        import boto3

        keys = keys or self.keys
        return boto3.client(
            "s3",
            endpoint_url=self.endpoint,
            region_name="us-east-1",
            aws_access_key_id=keys["AWS_ACCESS_KEY_ID"],
            aws_secret_access_key=keys["AWS_SECRET_ACCESS_KEY"],
        )


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _set_auth(free_requests: float) -> None:
    """moto authenticates every request once this many have been served since (``inf``: never). Set in this process,
    where the server's thread reads it, as moto's ``POST /moto-api/reset-auth`` sets it: not over HTTP, so stopping a
    server does not wait on it (a CI run's teardown once timed out on that request after 50 minutes of tests)."""
    from moto import settings
    from moto.core.responses import ActionAuthenticatorMixin

    settings.INITIAL_NO_AUTH_ACTION_COUNT = free_requests
    ActionAuthenticatorMixin.request_count = 0


@contextmanager
def s3_server():
    """Start the server, set it up, and yield an ``S3Server``; stopped on exit."""
    import boto3
    from moto.server import ThreadedMotoServer

    port = _free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    endpoint = f"http://127.0.0.1:{port}"
    setup = {"endpoint_url": endpoint, "region_name": "us-east-1", "aws_access_key_id": "setup"}
    iam = boto3.client("iam", aws_secret_access_key="setup", **setup)
    iam.create_user(UserName="trainer")
    policy = {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "s3:*", "Resource": "*"}]}
    iam.put_user_policy(UserName="trainer", PolicyName="s3", PolicyDocument=json.dumps(policy))
    key = iam.create_access_key(UserName="trainer")["AccessKey"]
    boto3.client("s3", aws_secret_access_key="setup", **setup).create_bucket(Bucket=BUCKET)
    _set_auth(0)
    try:
        yield S3Server(
            endpoint, {"AWS_ACCESS_KEY_ID": key["AccessKeyId"], "AWS_SECRET_ACCESS_KEY": key["SecretAccessKey"]}
        )
    finally:
        _set_auth(float("inf"))
        server.stop()
