"""Shared test helpers: the repository root and the reference specs beside it."""

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
REFERENCE = ROOT.parent / "shared" / "reference"


def run_cli(*args: str, timeout: float = 120, env=None):
    """Run ``python -m <args>`` in the repo root the way a user does; return the CompletedProcess."""
    import subprocess

    return subprocess.run([sys.executable, "-m", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout, env=env)


@pytest.fixture
def reference() -> Path:
    """``../shared/reference``; tests that need it skip where it is absent."""
    if not REFERENCE.is_dir():
        pytest.skip(f"reference specs not found at {REFERENCE}")
    return REFERENCE
