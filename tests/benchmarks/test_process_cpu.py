"""benchmarks/process_cpu.py: a venv's Python processes log their CPU at exit, a parent and its child each once, with
the test they ran under; the report sums them by kind and by test; uninstalling leaves the venv as it was."""

import os
import re
import subprocess
import sys
import venv

import pytest

from tests.helpers.repo import ROOT

sys.path.insert(0, str(ROOT / "benchmarks"))
import process_cpu  # noqa: E402

# A parent that spins for a while, then starts a child (a "trainer rank" by its arguments) and waits for it.
PARENT = """
import subprocess, sys, time
end = time.process_time() + 0.3
while time.process_time() < end:
    pass
subprocess.run([sys.executable, "-c", "pass", "components/train/trainer/__main__.py", "--config", "x.json"], check=True)
"""


def test_each_process_logs_its_cpu_once_and_the_report_sums_them_by_kind_and_test(tmp_path):
    env_dir, log = tmp_path / "venv", tmp_path / "procs.jsonl"
    venv.create(env_dir, with_pip=False)
    before = sorted(p.name for p in process_cpu.site_packages(env_dir).iterdir())
    process_cpu.install(env_dir, log)
    test = "tests/a_test.py::test_it@group (call)"
    # Bytecode written, as CI's processes write it (.ci/run): the hook's own is the hook's to remove.
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    subprocess.run(
        [str(env_dir / "bin" / "python"), "-c", PARENT], check=True, env={**env, "PYTEST_CURRENT_TEST": test}
    )
    (parent,) = [r for r in process_cpu.read(log) if r["argv"] == ["-c"]]
    (child,) = [r for r in process_cpu.read(log) if r["argv"] != ["-c"]]
    assert child["ppid"] == parent["pid"] and child["argv"] == [
        "-c",
        "components/train/trainer/__main__.py",
        "--config",
        "x.json",
    ]
    assert parent["cpu"] >= 0.3 and parent["children_cpu"] >= child["cpu"] > 0
    assert parent["test"] == child["test"] == test

    s = process_cpu.summary(process_cpu.read(log))
    assert s["processes"] == 2 and s["kinds"]["trainer rank"][0] == 1
    count, cpu, ranks, rank_cpu = s["tests"]["tests/a_test.py::test_it"]
    assert (count, ranks) == (2, 1) and cpu == parent["cpu"] + child["cpu"] and rank_cpu == child["cpu"]
    text = process_cpu.report(log, tests=5)
    assert text.startswith("2 processes") and "trainer rank" in text and "tests/a_test.py::test_it" in text

    process_cpu.uninstall(env_dir)
    assert sorted(p.name for p in process_cpu.site_packages(env_dir).iterdir()) == before
    subprocess.run([str(env_dir / "bin" / "python"), "-c", "pass"], check=True)
    assert len(log.read_text().splitlines()) == 2  # no hook: nothing more is logged


def test_a_folder_that_is_no_venv_is_one_error_naming_it(tmp_path):
    with pytest.raises(SystemExit, match=f"error: {re.escape(str(tmp_path))} has no lib/python3.* name a virtualenv"):
        process_cpu.install(tmp_path, tmp_path / "procs.jsonl")
    assert not list(tmp_path.iterdir())  # nothing written
