"""The S3 server of tests/storage/ (tests/helpers/s3_server.py), one for the session."""

import pytest

from tests.helpers.s3_server import s3_server as start_s3_server


@pytest.fixture(scope="session")
def s3_server():
    with start_s3_server() as server:
        yield server
