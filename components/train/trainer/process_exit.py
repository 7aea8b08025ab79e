"""How a trainer process ends: ``leave(code)``, the last call of every rank; and ``die_with_parent``, its first.

The ranks wait for each other and tear the process group down; then the process runs what an exit runs in Python (the
atexit handlers: logging, TensorBoard, MLflow and W&B close there), flushes its output and ends with
``os._exit(code)``, without interpreter finalisation. Why: a collective backend's C++ thread can still be joinable
when finalisation destroys it, which aborts a rank that has finished its work ("terminate called without an active
exception") and fails the job.
"""

from __future__ import annotations

import atexit
import ctypes
import os
import signal
import sys
from typing import NoReturn

import torch.distributed as dist

PR_SET_PDEATHSIG = 1  # linux/prctl.h


def die_with_parent() -> None:
    """Have the kernel SIGKILL this process when the process that started it (torchrun's agent) dies; Linux only.

    torchrun starts every worker in a session of its own (torch's elastic ``SubprocessHandler``:
    ``start_new_session=True``), so a signal to the agent's process group never reaches the ranks: killed that way
    (a cancelled local run, ``kill -KILL -- -PGID``), the agent left them training on with parent pid 1, holding
    their ports and writing checkpoints for a run nobody waits for. SIGKILL, not SIGTERM: with the agent gone there
    is no one to restart or report the job, and a checkpoint on SIGTERM is the agent's to ask for (checkpoints.py).
    In a pod the container's end kills every process anyway; this is for the agent that dies alone.
    """
    if not sys.platform.startswith("linux"):
        return
    parent = os.getppid()
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent:  # the parent died before the request was made: nothing would ever send it
        os._exit(128 + signal.SIGKILL)


def leave(code: int) -> NoReturn:
    """End this rank with exit status ``code``, together with the others (module docstring)."""
    if dist.is_initialized():
        # Together: a rank that exits while the others' collectives still run leaves their threads mid-call.
        dist.barrier()
        dist.destroy_process_group()
    atexit._run_exitfuncs()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
