"""How a trainer process ends: ``leave(code)``, the last call of every rank.

The ranks wait for each other and tear the process group down; then the process runs what an exit runs in Python (the
atexit handlers: logging, TensorBoard, MLflow and W&B close there), flushes its output and ends with
``os._exit(code)``, without interpreter finalisation. Why: a collective backend's C++ thread can still be joinable
when finalisation destroys it, which aborts a rank that has finished its work ("terminate called without an active
exception") and fails the job.
"""

from __future__ import annotations

import atexit
import os
import sys
from typing import NoReturn

import torch.distributed as dist


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
