"""This process's place in a torchrun job, read from the environment torchrun sets (no torch import).

Used by the trainer (rank-0 logging, LoRA, speed hooks) and by model resolution (rank 0 resolves the base model,
the other ranks wait for its record).
"""

from __future__ import annotations

import os


def global_rank() -> int:
    """This process's global rank in a torchrun job (env ``RANK``); 0 outside one."""
    return int(os.environ.get("RANK", "0"))
