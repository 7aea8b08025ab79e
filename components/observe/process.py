"""What every KFP step's process does first (``start_step``), called at the top of each component's body.

A step's process is the KFP executor running one component function: it is the process's entry point, so it, and
never an import, decides how the process exits.
"""

from __future__ import annotations

import logging

from components.quick_exit import freeze_heap_at_exit

LOG_FORMAT = "%(asctime)s %(name)s: %(message)s"


def start_step(name: str) -> logging.Logger:
    """Start step ``name``'s process: skip CPython's final garbage collection when it exits (1-3 s for a step that
    loaded torch, transformers or datasets: ``components.quick_exit.freeze_heap_at_exit``) and log INFO lines with
    their time and logger name. Returns the step's logger (``logging.getLogger(name)``)."""
    freeze_heap_at_exit()
    logging.basicConfig(level=logging.INFO, format=LOG_FORMAT)
    return logging.getLogger(name)
