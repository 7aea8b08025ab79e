"""The corpus and tokenizer the data preparation tests share: one of each per test module (a test may change
the corpus, to check that a changed source misses the cache). The S3 server is tests/conftest.py's."""

import pytest

from components.models.tiny import build_tokenizer
from tests.helpers.data import conversation, write_jsonl


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
