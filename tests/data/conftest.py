"""The corpus and tokenizer the data preparation tests share: one of each per test module (a test may change
the corpus, to check that a changed source misses the cache); an S3 server for the sources in object stores."""

import pytest

from components.models.tiny import build_tokenizer
from tests.helpers.data import conversation, write_jsonl
from tests.helpers.s3_server import s3_server as start_s3_server


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """60 chats, English and Korean alternating, in ``chat.jsonl``."""
    rows = [conversation(i, "ko" if i % 2 else "en") for i in range(60)]
    return write_jsonl(tmp_path_factory.mktemp("data") / "chat.jsonl", rows)


@pytest.fixture(scope="module")
def tokenizer_dir(corpus, tmp_path_factory):
    """A tiny tokenizer trained on ``corpus``, saved; its folder as a string."""
    out = tmp_path_factory.mktemp("tok")
    build_tokenizer(corpus).save_pretrained(out)
    return str(out)


@pytest.fixture(scope="session")
def s3_server():
    """A real S3 server on loopback (moto's server mode, tests/helpers/s3_server.py) with bucket ``models``."""
    with start_s3_server() as server:
        yield server
