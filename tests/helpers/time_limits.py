"""How long one test may hold its worker, by tier, and the hard limit behind pytest-timeout's: a pytest plugin,
named by tests/conftest.py's ``pytest_plugins``.

pytest-timeout (pyproject.toml's ``timeout``) fails a test that runs too long by raising from a SIGALRM handler, which
Python runs only between bytecodes: a test stuck in a C call that holds the interpreter (a deadlocked collective, a
blocked lock in an extension) or with the alarm blocked is never interrupted, and CI runs into its 90 minutes with
nothing printed (CI at 9bae7c2: the tests stopped at 97%). ``hard_limit`` arms the interpreter's own watchdog thread
(``faulthandler.dump_traceback_later``, which needs no interpreter lock) a little after the test's limit: it prints
every thread's stack to the worker's stderr and ends the worker; pytest-xdist reports the test as crashed and starts a
fresh worker for the rest.

A crashed worker hangs pytest-xdist 3.8.0's ``--dist loadgroup`` (the newest release): its completed groups go back on
the queue as empty units and a fresh worker handed a single test waits for a second one, so every worker parks at the
end of the run (pytest-dev/pytest-xdist#1323, #1327, #1378; fixed on its main branch by #1324 and #1328, unreleased).
``CrashTolerantGroupScheduling`` carries those fixes until a release does.
"""

from __future__ import annotations

import faulthandler
import os
from collections.abc import Iterator

import pytest
from xdist.scheduler import LoadGroupScheduling
from xdist.workermanage import WorkerController

from tests.helpers.worker_groups import ONE_AT_A_TIME, WHOLE_RUNS

# About 3x the slowest test of each tier in CI on 2 cores (fast tier: 12 s, slow tier: 175 s; the whole runs and
# the one-at-a-time modules: 400 s, with a first serving rehearsal that builds the engine's image for 4 minutes).
FAST_TIER_SECONDS = 240
SLOW_TIER_SECONDS = 600
WHOLE_RUN_SECONDS = 1200

# The process's stderr, not pytest's capture of it: the stacks must reach CI's log, not a capture file that ends with
# the worker. Copied in pytest_configure, when the capture that ran while the conftests loaded is suspended (as
# pytest's own faulthandler plugin does).
_stderr: list[int] = []


def pytest_configure(config: pytest.Config) -> None:
    if not _stderr:
        _stderr.append(os.dup(2))


# Slow modules outside ONE_AT_A_TIME whose first test builds the serving virtualenv where CI's .ci/run has not
# (tests/fakes/serving_image.py: 3-4 minutes of pip on 2 idle cores) before its own work.
BUILD_THE_SERVING_VENV = ("tests/train/trainer/test_grpo_vllm_server.py",)


def limit_for(module: str, *, slow: bool) -> int:
    """Seconds a test of ``module`` (its path from the repository root) may run, setup and teardown included."""
    if module in ONE_AT_A_TIME or module in BUILD_THE_SERVING_VENV or module.startswith(WHOLE_RUNS):
        return WHOLE_RUN_SECONDS
    return SLOW_TIER_SECONDS if slow else FAST_TIER_SECONDS


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Give each test without a ``timeout`` mark of its own its tier's limit (pytest-timeout reads the mark)."""
    for item in items:
        if item.get_closest_marker("timeout") is None:
            module = item.nodeid.split("::")[0]
            slow = item.get_closest_marker("slow") is not None
            item.add_marker(pytest.mark.timeout(limit_for(module, slow=slow)))


def _limit(item: pytest.Item) -> float:
    marker = item.get_closest_marker("timeout")
    if marker is not None and marker.args:
        return float(marker.args[0])
    return float(item.config.getini("timeout") or 0)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    """End this process with every thread's stack if ``item`` runs past its limit plus a grace (as long again, at
    most a minute) in which pytest-timeout's own failure would have ended it."""
    limit = _limit(item)
    if limit > 0:
        faulthandler.dump_traceback_later(limit + min(limit, 60.0), file=_stderr[0], exit=True)
    try:
        return (yield)
    finally:
        faulthandler.cancel_dump_traceback_later()


class CrashTolerantGroupScheduling(LoadGroupScheduling):
    """``--dist loadgroup`` whose run goes on after a worker crashes (the fixes named in this module's docstring)."""

    def remove_node(self, node: WorkerController) -> str | None:
        """Put back only the crashed worker's groups with tests still to run, its crashed test counted as run (xdist
        has reported it failed): a completed group handed out again is an empty unit nobody ever reports on."""
        workload = self.assigned_work.pop(node)
        pending = [nodeid for unit in workload.values() for nodeid, done in unit.items() if not done]
        if not pending:
            return None
        crashed = pending[0]
        for scope, unit in workload.items():
            if crashed in unit:
                unit[crashed] = True
            if not all(unit.values()):
                self.workqueue[scope] = unit
        for other in self.assigned_work:
            self._reschedule(other)
        return crashed

    def schedule(self) -> None:
        """After the first distribution (a fresh worker has joined), hand it two units as the first distribution does,
        or its shutdown: a worker runs a test only once it knows the next one or that none will come."""
        if self.collection is None:
            super().schedule()
            return
        for node in self.nodes:
            self._reschedule(node)
            if not node.shutting_down and self._pending_of(self.assigned_work[node]) < 2:
                self._reschedule(node)


@pytest.hookimpl(tryfirst=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log) -> LoadGroupScheduling | None:
    """pyproject.toml's ``--dist loadgroup``, with the crash fixes; any other ``--dist`` is xdist's own."""
    if config.getvalue("dist") == "loadgroup":
        return CrashTolerantGroupScheduling(config, log)
    return None
