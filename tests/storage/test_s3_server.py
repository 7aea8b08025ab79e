"""The tests' S3 server (tests/helpers/s3_server.py) answers whatever the test process is doing: in CI a server run in
a thread of the test process once stopped answering it after 47 minutes of earlier tests (every request timed out),
which failed the run. Here the test process keeps the interpreter to itself for a while, as a stuck lock or a long C
call does, and a client in another process (signed with the test user's key) must still get its answer in time."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time

from tests.helpers.s3_server import BUCKET

BUSY_SECONDS = 6.0
CLIENT = textwrap.dedent(
    """
    import sys, boto3
    from botocore.config import Config
    config = Config(read_timeout=3, retries={"total_max_attempts": 1})
    s3 = boto3.client("s3", endpoint_url=sys.argv[1], region_name="us-east-1", config=config)
    print(s3.list_objects_v2(Bucket=sys.argv[2])["ResponseMetadata"]["HTTPStatusCode"])
    """
)


def test_the_server_answers_while_the_test_process_holds_the_interpreter(s3_server):
    client = subprocess.Popen(
        [sys.executable, "-c", CLIENT, s3_server.endpoint, BUCKET],
        env={**os.environ, **s3_server.keys},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    interval = sys.getswitchinterval()
    sys.setswitchinterval(BUSY_SECONDS * 10)  # no other thread of this process runs until the loop ends
    try:
        end = time.monotonic() + BUSY_SECONDS
        while time.monotonic() < end:
            pass
    finally:
        sys.setswitchinterval(interval)
    out, err = client.communicate(timeout=60)
    assert (client.returncode, out.strip()) == (0, "200"), err[-1000:]
