"""How busy this machine is with tests: the bound a wall-time claim gets under pytest-xdist."""

import os


def tests_at_once() -> int:
    """Tests running at once in this session: pytest-xdist's worker count (``-n``), 1 without it."""
    return int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))


def wall_time_bound(seconds: float) -> float:
    """``seconds``, a wall time measured with the machine to itself (the README's figures), times the tests that share
    its cores now: under ``-n 2`` on 2 cores each whole local run gets about one core where it was measured on two."""
    return seconds * tests_at_once()
