"""components/parent_death.py: a child asks for a signal on its parent's death, also when that parent is PID 1.

In a container the entrypoint is PID 1 of the pod's PID namespace: torchrun, the trainer pods' entrypoint, is every
rank's parent and pid 1. Treating "parent pid 1" as "orphaned" ended every rank at start (found by the training
rehearsal, whose pods run in PID namespaces of their own).
"""

import os
import shutil
import subprocess
import sys

import pytest

from tests.helpers.repo import ROOT

CHILD = (
    "import os, signal; from components import parent_death; "
    "parent_death.request(signal.SIGKILL, os.getppid()); print('alive')"
)
PARENT = f"import subprocess, sys; r = subprocess.run([sys.executable, '-c', {CHILD!r}]); sys.exit(r.returncode)"


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("unshare") is None, reason="needs root and unshare")
def test_a_child_of_pid_1_keeps_running_after_asking():
    result = subprocess.run(
        ["unshare", "--pid", "--fork", "--mount-proc", sys.executable, "-c", PARENT],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=60,
    )
    assert result.returncode == 0 and result.stdout.strip() == "alive", (result.returncode, result.stderr[-2000:])


def test_a_child_whose_parent_is_gone_before_it_asks_ends_at_once():
    code = "import os, signal; from components import parent_death; parent_death.request(signal.SIGKILL, -1)"
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, timeout=60)
    assert result.returncode == 128 + 9
