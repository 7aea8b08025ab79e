"""Fixtures for every test. Shared helpers live in tests/helpers/ and fake servers in tests/fakes/: test
modules import from there, never from one another (nor from this file)."""

from pathlib import Path

import pytest

from tests.helpers.repo import require_reference


@pytest.fixture
def reference() -> Path:
    """``REFERENCE`` (``../shared/reference``); tests that need it skip where it is absent, and fail in CI."""
    return require_reference()
