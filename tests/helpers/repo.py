"""Where the tests find things: the repository root, the reference specs (tests/reference/), and the command line."""

import contextlib
import io
import logging
import os
import runpy
import subprocess
import sys
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# The real CRDs, runtimes and API specs tests check against, copied unchanged from upstream with their sources and
# licences in tests/reference/README.md. REFERENCE_DIR names another folder of the same layout instead.
REFERENCE = Path(os.environ.get("REFERENCE_DIR") or ROOT / "tests" / "reference")


def in_ci() -> bool:
    """Whether the tests run in CI (``CI=true``, as GitHub Actions and GitLab set it)."""
    return os.environ.get("CI", "").lower() in ("true", "1")


def run_cli(*args: str, timeout: float = 120, env=None) -> subprocess.CompletedProcess:
    """Run ``python -m <args>`` in the repo root the way a user does; return the CompletedProcess."""
    return subprocess.run(
        [sys.executable, "-m", *args], cwd=ROOT, capture_output=True, text=True, timeout=timeout, env=env
    )


def run_module(*args: str) -> subprocess.CompletedProcess:
    """Run ``python -m <args>`` in this process: the module's ``__main__`` code, with ``sys.argv`` set, its
    stdout and stderr captured and its ``sys.exit`` code kept; return what ``run_cli`` returns.

    For a command line's error paths, which end before any real work: this spares a new interpreter's start-up
    and imports (seconds for torch and transformers). One test per entry point still runs the real process
    (``run_cli``) for its exit code and its ``error:`` line.
    """
    argv, root = sys.argv, logging.getLogger()
    handlers, level = root.handlers[:], root.level
    out, err, code = io.StringIO(), io.StringIO(), 0
    sys.argv = [args[0], *args[1:]]
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err), warnings.catch_warnings():
            # The module is usually imported already (by the test); runpy warns that it runs a second copy.
            warnings.filterwarnings("ignore", "'.*' found in sys.modules", RuntimeWarning)
            runpy.run_module(args[0], run_name="__main__", alter_sys=False)
    except SystemExit as stop:
        code = stop.code if isinstance(stop.code, int) else (0 if stop.code is None else 1)
        if isinstance(stop.code, str):
            err.write(stop.code + "\n")
    finally:
        sys.argv = argv
        root.handlers[:], root.level = handlers, level  # undo a logging.basicConfig of the module
    return subprocess.CompletedProcess([sys.executable, "-m", *args], code, out.getvalue(), err.getvalue())
