"""Shared test helpers: the repository root and the reference specs beside it."""

import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# The real CRDs, runtimes and API specs tests check against (../shared/reference/README.md); REFERENCE_DIR
# points elsewhere, e.g. at a checkout of them in CI.
REFERENCE = Path(os.environ.get("REFERENCE_DIR") or ROOT.parent / "shared" / "reference")


def in_ci() -> bool:
    """Whether the tests run in CI (``CI=true``, as GitHub Actions and GitLab set it)."""
    return os.environ.get("CI", "").lower() in ("true", "1")


def require_reference(*parts: str) -> Path:
    """``REFERENCE``, once ``REFERENCE/<parts>`` exists. Where it is absent the calling test skips with the
    reason, except in CI, where it fails: a skipped check against the real specs would pass unseen there."""
    needed = REFERENCE.joinpath(*parts)
    if not needed.exists():
        why = (f"reference specs not found at {needed} (they live beside the project, in shared/reference; "
               "REFERENCE_DIR names another folder)")
        if in_ci():
            pytest.fail(f"{why}; CI runs every check against them", pytrace=False)
        pytest.skip(why)
    return REFERENCE


def run_cli(*args: str, timeout: float = 120, env=None):
    """Run ``python -m <args>`` in the repo root the way a user does; return the CompletedProcess."""
    import subprocess

    return subprocess.run([sys.executable, "-m", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout, env=env)


@pytest.fixture
def reference() -> Path:
    """``REFERENCE`` (``../shared/reference``); tests that need it skip where it is absent, and fail in CI."""
    return require_reference()
