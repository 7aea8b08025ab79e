"""Under ``python -m pytest -n 2`` (README, .ci/run) a module's module-scoped fixture is built once, by one worker,
and the one-at-a-time modules run on one worker (tests/helpers/worker_groups.py): real pytest-xdist on a small
project. With pytest 9.2 the grouping silently stopped (pytest-dev/pytest-xdist#1386): the GRPO engine server's
2-minute fixture was built on both workers in CI."""

import os
import subprocess
import sys
from pathlib import Path

from tests.helpers.repo import ROOT

CONFTEST = """
import pytest
from tests.helpers.worker_groups import group_and_order

pytest_plugins = ["tests.helpers.time_limits"]

@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    group_and_order(items, one_at_a_time=("test_netns_a.py", "test_netns_b.py"))
"""

# Each test records the worker it ran on; the module fixture records each build.
MODULE = """
import os, time, pytest

def _record(what):
    with open({log!r}, "a") as f:
        f.write(f"{{what}} {{os.environ['PYTEST_XDIST_WORKER']}}\\n")

@pytest.fixture(scope="module")
def server():
    _record("build")

@pytest.mark.parametrize("i", range(6))
def test_it(i, {fixture}):
    time.sleep(0.05)
    _record(__name__)
"""


def _pytest_n2(project: Path, timeout: float) -> subprocess.CompletedProcess:
    """Real pytest with two xdist workers and ``--dist loadgroup`` (as pyproject.toml) on the small ``project``."""
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-n", "2", "--dist", "loadgroup", "-p", "no:cacheprovider"],
        cwd=project,
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )


def test_a_module_fixture_is_built_once_and_the_one_at_a_time_modules_share_a_worker(tmp_path):
    log = tmp_path / "log"
    (tmp_path / "conftest.py").write_text(CONFTEST)
    (tmp_path / "test_server.py").write_text(MODULE.format(log=str(log), fixture="server"))
    for name in ("test_netns_a", "test_netns_b", "test_plain"):
        (tmp_path / f"{name}.py").write_text(MODULE.format(log=str(log), fixture="tmp_path"))
    out = _pytest_n2(tmp_path, timeout=120)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    lines = [line.split() for line in log.read_text().splitlines()]
    assert [w for what, w in lines if what == "build"] in (["gw0"], ["gw1"]), "the module fixture was built twice"
    workers = {what: {w for m, w in lines if m == what} for what in ("test_server", "test_netns_a")}
    assert len(workers["test_server"]) == 1
    assert {w for m, w in lines if m.startswith("test_netns")} == workers["test_netns_a"], "one-at-a-time split"
    assert len(workers["test_netns_a"]) == 1


HANGS = """
import signal, time, pytest

@pytest.mark.timeout(1)
def test_hangs_where_the_alarm_cannot_reach():
    # A hang pytest-timeout's SIGALRM never interrupts (as a C call holding the GIL would): the alarm is blocked.
    signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGALRM])
    time.sleep(120)

@pytest.mark.parametrize("i", range(4))
def test_the_rest_goes_on(i):
    time.sleep(0.05)
"""


def test_a_hang_the_timeout_cannot_interrupt_ends_its_worker_and_the_run_goes_on(tmp_path):
    """CI at 9bae7c2 ran past its 90 minutes with the tests at 97%: a test held its worker longer than
    pytest-timeout's limit. The hard limit (tests/helpers/time_limits.py) ends that worker with the threads' stacks;
    xdist reports the test as crashed and a fresh worker runs the rest."""
    (tmp_path / "conftest.py").write_text(CONFTEST)
    (tmp_path / "test_hangs.py").write_text(HANGS)
    out = _pytest_n2(tmp_path, timeout=60)
    report = out.stdout + out.stderr
    assert out.returncode == 1, report[-3000:]
    assert "4 passed" in report and "1 failed" in report, report[-3000:]
    assert "crashed while running 'test_hangs.py::test_hangs_where_the_alarm_cannot_reach'" in report, report[-3000:]
    assert "time.sleep(120)" in report or "in test_hangs_where_the_alarm_cannot_reach" in report, report[-3000:]


def test_each_tier_gets_its_own_time_limit(request):
    """A hung fast test costs CI 4 minutes, not the whole runs' 20 (tests/helpers/time_limits.py)."""
    from tests.helpers.time_limits import limit_for

    assert request.node.get_closest_marker("timeout").args == (240,)  # this test's own, a fast one

    assert limit_for("tests/validate/test_settings.py", slow=False) == 240
    assert limit_for("tests/train/trainer/test_hpz.py", slow=True) == 600
    assert limit_for("tests/pipelines/test_local_run_rl.py", slow=True) == 1200
    assert limit_for("tests/deploy/test_serving_rehearsal.py", slow=True) == 1200
    assert limit_for("tests/train/trainer/test_grpo_vllm_server.py", slow=True) == 1200  # may build the engine's venv


def test_the_first_tests_of_each_worker_need_no_serving_image():
    """CI builds vLLM's CPU build beside the first tests (.ci/run): the machine group and the whole local runs start
    with the modules that do not serve on it, so that neither worker begins by waiting for the build."""
    from types import SimpleNamespace

    from tests.helpers.worker_groups import group_and_order

    def item(module: str, slow: bool = True):
        marks = {"slow": object()} if slow else {}
        return SimpleNamespace(
            nodeid=f"{module}::test_it",
            get_closest_marker=marks.get,
            add_marker=lambda mark: None,
            _fixtureinfo=SimpleNamespace(name2fixturedefs={}),
        )

    collected = [  # pytest's collection order: by path
        "tests/deploy/test_local_lora_variants_run.py",
        "tests/deploy/test_lora_serving_rehearsal.py",
        "tests/deploy/test_serving_rehearsal.py",
        "tests/pipelines/test_local_run.py",
        "tests/pipelines/test_local_variants.py",
        "tests/train/launcher/test_rehearsal.py",
        "tests/train/trainer/test_cross_pod_bytes.py",
        "tests/train/trainer/test_hpz.py",
    ]
    items = [item(m) for m in collected] + [item("tests/test_fast.py", slow=False)]
    group_and_order(items)
    assert [i.nodeid.split("::")[0] for i in items] == [
        "tests/train/launcher/test_rehearsal.py",
        "tests/train/trainer/test_cross_pod_bytes.py",
        "tests/deploy/test_serving_rehearsal.py",
        "tests/deploy/test_lora_serving_rehearsal.py",
        "tests/pipelines/test_local_run.py",
        "tests/pipelines/test_local_variants.py",
        "tests/deploy/test_local_lora_variants_run.py",
        "tests/train/trainer/test_hpz.py",
        "tests/test_fast.py",
    ]
