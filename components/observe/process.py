"""What every KFP step's process does first (``start_step``), called at the top of each component's body; and how
the processes a local run starts end with the run (``parent_death_signal``).

A step's process is the KFP executor running one component function: it is the process's entry point, so it, and
never an import, decides how the process exits.

How a local run's processes end with it, however it ends (SIGKILL included, which gives no process a chance to pass
anything on), each link of the chain on its own:

- each step ends with the run's CLI (pipelines/local_runner.py), whose pid is in ``PARENT_PID_ENV``: a thread waits on
  the CLI's pidfd (Linux: readable when the process ends; elsewhere it asks every second) and sends the step SIGTERM,
  which unwinds it. Not a parent-death signal: kfp.local starts each step as ``sh -ec '...; python3 -m
  kfp.dsl.executor_main ...'``, so the step's parent is that shell, which outlives the CLI;
- torchrun and the local server end with the step that started them: the kernel's parent-death signal (Linux
  ``prctl(PR_SET_PDEATHSIG)``, requested between fork and exec: ``parent_death_signal``), SIGTERM, which torchrun
  passes to its ranks; process groups cannot do it, as the server runs in a session of its own (a kept server
  outlives its step) and torchrun starts each rank in one of its own, out of reach of a signal to the run's group;
- each rank ends with torchrun (SIGKILL: the trainer's own request, components/train/trainer/process_exit.py).

Elsewhere than Linux there is no parent-death signal: torchrun and a server outlive a step that was SIGKILLed, while a
SIGTERM or SIGINT to the CLI, or its end, still stops every step and what it started.
"""

from __future__ import annotations

import logging
import os
import select
import signal
import threading
import time
from collections.abc import Callable

from components import parent_death
from components.quick_exit import freeze_heap_at_exit

LOG_FORMAT = "%(asctime)s %(name)s: %(message)s"
# Set by a local run's CLI (pipelines/local_runner.py) to its pid: a step started with it ends with the run.
PARENT_PID_ENV = "LLM_PIPELINE_LOCAL_RUN_PID"
# Seconds a stopped local step has to unwind (stop its torchrun or server, each with a grace of its own) before it is
# ended regardless; the CLI waits as long before it kills a step.
STOP_GRACE_SECONDS = 30


def start_step(name: str) -> logging.Logger:
    """Start step ``name``'s process: skip CPython's final garbage collection when it exits (1-3 s for a step that
    loaded torch, transformers or datasets: ``components.quick_exit.freeze_heap_at_exit``) and log INFO lines with
    their time and logger name. Returns the step's logger (``logging.getLogger(name)``).

    In a local run (``PARENT_PID_ENV`` set by the CLI) the step also ends with the run: SIGTERM when the CLI's
    process ends, and SIGTERM or SIGINT unwind it as ``SystemExit(143)``, a stopped step (what it started, torchrun or
    a server, is stopped on the way; components/observe/outcome.py records it as cancelled), ended by SIGALRM if that
    takes over ``STOP_GRACE_SECONDS``. On a cluster nothing of that changes: the pod's end is the step's."""
    freeze_heap_at_exit()
    logging.basicConfig(level=logging.INFO, format=LOG_FORMAT)
    # Popped: a process this step starts has this step, not the run's CLI, for a parent.
    run = os.environ.pop(PARENT_PID_ENV, None)
    if run:
        for signum in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, _unwind)
        end_with(int(run))
    return logging.getLogger(name)


def _unwind(signum, frame) -> None:
    # Once: a second signal must not interrupt the unwinding (stopping torchrun, a server) half-way.
    for each in (signal.SIGTERM, signal.SIGINT):
        signal.signal(each, signal.SIG_IGN)
    signal.alarm(STOP_GRACE_SECONDS)  # SIGALRM's default action ends the process: the unwinding cannot hang
    # 143 for SIGINT too (a terminal's Ctrl-C reaches the steps as well as the CLI): the step was stopped.
    raise SystemExit(128 + signal.SIGTERM)


def end_with(pid: int) -> None:
    """SIGTERM to this process when process ``pid`` ends (at once when it has ended already), from a daemon thread."""
    try:
        handle: int | None = os.pidfd_open(pid)  # Linux 5.3+
    except ProcessLookupError:
        os.kill(os.getpid(), signal.SIGTERM)
        return
    except (AttributeError, OSError):
        handle = None

    def wait() -> None:
        if handle is not None:
            select.select([handle], [], [])  # readable once the process has ended
        else:
            while _alive(pid):
                time.sleep(1)
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=wait, name=f"end-with-{pid}", daemon=True).start()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    return True


def parent_death_signal(sig: int) -> Callable[[], None] | None:
    """A ``preexec_fn`` for ``subprocess.Popen``: the child gets ``sig`` when this process ends (Linux; None
    elsewhere): components/parent_death.py."""
    return parent_death.preexec(sig)
