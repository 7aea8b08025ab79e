"""A trainer rank lives no longer than the torchrun agent that started it.

torchrun starts each worker in a session of its own (torch/distributed/elastic/multiprocessing/subprocess_handler/
subprocess_handler.py: ``start_new_session=True``), so a signal to the agent's process group (a lost node, a cancelled
local run: ``kill -KILL -- -PGID``) never reaches the ranks: they trained on to the end with parent pid 1, holding
their port and writing checkpoints and ``final/`` for a run nobody waits for (issue 31). Each rank now asks the kernel
for SIGKILL when its parent dies (components/parent_death.py, asked first thing in the trainer's __main__).
"""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.helpers.trainer import make_workdir, trainer_config

pytestmark = pytest.mark.slow


def _ranks_of(config: str) -> list[int]:
    """The pids of the processes whose command line names ``config`` and are not torchrun (the workers)."""
    pids = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmd = (proc / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if config.encode() in cmd and b"torch.distributed.run" not in cmd:
            pids.append(int(proc.name))
    return pids


def test_ranks_end_when_the_agent_is_killed(tmp_path):
    root = make_workdir(tmp_path)
    config = trainer_config(root, "run", max_steps=10_000, save_steps=10_000, logging_steps=1)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"]
    cmd += ["-m", "components.train.trainer", "--config", config]
    agent = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True, text=True)
    assert agent.stdout is not None
    for line in agent.stdout:  # training has started on both ranks: step lines come after the process group exists
        if "step 1/" in line:
            break
    else:
        pytest.fail("the run ended before its first step")
    ranks = _ranks_of(config)
    assert len(ranks) == 2, ranks
    os.killpg(agent.pid, signal.SIGKILL)  # the agent's group only: the ranks are in sessions of their own
    agent.wait()
    deadline = time.time() + 10
    while _ranks_of(config) and time.time() < deadline:
        time.sleep(0.1)
    left = _ranks_of(config)
    for pid in left:
        os.kill(pid, signal.SIGKILL)
    assert not left, f"ranks {left} outlived their torchrun agent"
