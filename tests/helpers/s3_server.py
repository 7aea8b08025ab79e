"""A real S3 server on this machine (moto's server mode) with one bucket, one IAM user allowed S3 and its access key;
every request after the setup is authenticated (moto checks the signature and the key), so a wrong key is refused as
AWS refuses it.

The server runs in a process of its own (``python -m tests.helpers.s3_server``), not in a thread of the test process:
a thread shares the test process's locks (logging's, the import system's) and whatever earlier tests left behind, and
in CI a threaded server once stopped answering a test process that had run for 47 minutes (every request timed out,
three tries of 60 s), and once did not stop. Its own process answers whatever the test process is doing, and is
killed on exit, or by the kernel when the test process ends (``components/parent_death.py``).
"""

from __future__ import annotations

import json
import select
import signal
import subprocess
import sys
import tempfile
import urllib.request
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from components import parent_death
from tests.helpers.repo import ROOT

BUCKET = "models"
START_SECONDS = 60  # importing moto and binding a port: about 1 s idle, far more beside a busy CI run


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


def _serve() -> None:
    """The server process: bind a free loopback port, print it, serve until killed. Authentication starts off
    (moto's default, ``INITIAL_NO_AUTH_ACTION_COUNT`` unset) so the fixture can create the user it then requires."""
    from moto.server import DomainDispatcherApplication, MotoRequestHandler, create_backend_app
    from werkzeug.serving import make_server

    app = DomainDispatcherApplication(create_backend_app)
    server = make_server("127.0.0.1", 0, app, threaded=True, request_handler=MotoRequestHandler)
    print(server.port, flush=True)
    server.serve_forever()


def _port(process: subprocess.Popen, log: Path) -> int:
    """The port the server process printed, or one error with its log if it printed none in START_SECONDS."""
    ready, _, _ = select.select([process.stdout], [], [], START_SECONDS)
    line = process.stdout.readline() if ready else ""
    if not line.strip().isdigit():
        process.kill()
        raise RuntimeError(f"the S3 server printed no port in {START_SECONDS} s: {log.read_text()[-2000:]}")
    return int(line)


def _require_auth(endpoint: str) -> None:
    """From now on moto authenticates every request (its ``/moto-api/reset-auth`` route; no proxy on loopback)."""
    # A body werkzeug leaves unparsed: moto reads the count from the raw data, empty for a form.
    headers = {"Content-Type": "text/plain"}
    request = urllib.request.Request(f"{endpoint}/moto-api/reset-auth", data=b"0", headers=headers, method="POST")
    urllib.request.build_opener(urllib.request.ProxyHandler({})).open(request, timeout=START_SECONDS).read()


@contextmanager
def s3_server():
    """Start the server process, set it up, and yield an ``S3Server``; the process is killed on exit."""
    import boto3
    from botocore.config import Config

    with tempfile.TemporaryDirectory(prefix="s3-server-") as folder:
        log = Path(folder) / "server.log"
        with open(log, "wb") as log_file:
            process = subprocess.Popen(
                [sys.executable, "-m", "tests.helpers.s3_server"],
                cwd=ROOT,
                stdout=subprocess.PIPE,
                stderr=log_file,
                text=True,
                preexec_fn=parent_death.preexec(signal.SIGKILL),
            )
        try:
            endpoint = f"http://127.0.0.1:{_port(process, log)}"
            # Setup fails in one try, naming the server's log, rather than after botocore's three of 60 s each.
            setup = {
                "endpoint_url": endpoint,
                "region_name": "us-east-1",
                "aws_access_key_id": "setup",
                "aws_secret_access_key": "setup",
                "config": Config(read_timeout=START_SECONDS, retries={"total_max_attempts": 1}),
            }
            iam = boto3.client("iam", **setup)
            iam.create_user(UserName="trainer")
            policy = {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "s3:*", "Resource": "*"}]}
            iam.put_user_policy(UserName="trainer", PolicyName="s3", PolicyDocument=json.dumps(policy))
            key = iam.create_access_key(UserName="trainer")["AccessKey"]
            boto3.client("s3", **setup).create_bucket(Bucket=BUCKET)
            _require_auth(endpoint)
            yield S3Server(
                endpoint, {"AWS_ACCESS_KEY_ID": key["AccessKeyId"], "AWS_SECRET_ACCESS_KEY": key["SecretAccessKey"]}
            )
        finally:
            process.kill()
            process.wait()
            process.stdout.close()


if __name__ == "__main__":
    _serve()
