"""Linux's parent-death signal (``prctl(PR_SET_PDEATHSIG)``): a process asks the kernel for a signal when the process
that started it ends, so that no process a run starts outlives it. Standard library only: the trainer asks for it
before it loads torch, and the launcher side between a child's fork and its exec.

The signal comes when the *thread* that started the process ends: start such children from a thread that outlives
them (the main thread). Elsewhere than on Linux there is no such signal and these do nothing.
"""

from __future__ import annotations

import ctypes
import os
import sys
from collections.abc import Callable

PR_SET_PDEATHSIG = 1  # linux/prctl.h


def request(sig: int, parent: int) -> None:
    """Have the kernel send ``sig`` to this process when its parent ends; ``parent`` is the parent's pid as the caller
    knew it before asking. When the parent has gone since (between the caller's read and the request), end at once
    with status 128 + ``sig``, as the signal would have: nothing would ever send it now.

    Never "parent pid 1 means orphaned": in a container the entrypoint is PID 1 of its PID namespace, so torchrun,
    the trainer pods' entrypoint, is every rank's parent *and* pid 1 (the training rehearsal's pods caught it).
    """
    if not sys.platform.startswith("linux"):
        return
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0)
    if os.getppid() != parent:
        os._exit(128 + int(sig))


def preexec(sig: int) -> Callable[[], None] | None:
    """A ``preexec_fn`` for ``subprocess.Popen``: the child gets ``sig`` when this process ends (None off Linux).
    Resolved before the fork, so the child makes only this request before its exec."""
    if not sys.platform.startswith("linux"):
        return None
    parent = os.getpid()
    return lambda: request(sig, parent)
