"""The local training backend: ``torchrun --standalone --nproc_per_node N -m components.train.trainer``.

The same trainer entry point the cluster job's pods run, as N CPU processes talking over gloo.
"""

from __future__ import annotations

import importlib.metadata
import os
import shutil
import signal
import subprocess
from collections import deque

from components import quick_exit
from components.observe.process import parent_death_signal

# components/train/trainer/metrics.py's ANY_PORT_ENV (the launcher imports nothing of the trainer program).
METRICS_ANY_PORT_ENV = "TRAINER_METRICS_ANY_PORT"
# Seconds torchrun has to stop its ranks (they save a checkpoint first) when the train step stops, before SIGKILL.
TORCHRUN_STOP_SECONDS = 20
# Below this and a twentieth of the disk, a failed trainer's error names the disk's free bytes as the likely cause.
LOW_DISK_BYTES = 64 * 2**20


def cuda_available() -> bool:
    """Whether torch sees a CUDA GPU on this machine (the trainer then trains on it, not on CPU processes).

    A CPU-only build of torch (PyTorch's ``+cpu`` wheels, what a laptop installs) never does, whatever the
    machine has: that is read from the package's version, without importing torch (a second or more, which the
    train step would pay before torchrun imports it again). Any other build is asked.
    """
    try:
        if importlib.metadata.version("torch").endswith("+cpu"):
            return False
    except importlib.metadata.PackageNotFoundError:
        return False
    import torch

    return torch.cuda.is_available()


def run_torchrun(config_path: str, nproc_per_node: int, env: dict | None = None) -> None:
    """Run the trainer under torchrun and stream its output; raise with the last lines on failure.

    torchrun ends with this process (below; components/observe/process.py); an exception here, SystemExit from a
    stopped step's SIGTERM included, stops torchrun before it goes on (``TORCHRUN_STOP_SECONDS``, then SIGKILL).
    """
    # torchrun itself (torch.distributed.run), in a process that skips the final garbage collection at exit.
    cmd = quick_exit.command(
        "torch.distributed.run",
        "--standalone",  # single node, free rendezvous port: concurrent local runs do not collide
        "--nproc_per_node",
        str(nproc_per_node),
        "-m",
        "components.train.trainer",
        "--config",
        config_path,
    )
    # torchrun sets OMP_NUM_THREADS=1 with a three-line banner when it is unset; say it ourselves, sized so
    # the processes share the cores instead of each taking one.
    env = dict(os.environ if env is None else env)
    env.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // nproc_per_node)))
    # Here a taken metrics port is not an error: the trainer takes a free one itself (components/train/trainer/
    # metrics.py, ANY_PORT_ENV), since a port found free now may be taken by the time the trainer binds it.
    env.setdefault(METRICS_ANY_PORT_ENV, "1")
    print("running:", " ".join(cmd), flush=True)
    tail: deque[str] = deque(maxlen=40)
    # torchrun ends with this step, never with it: SIGTERM when the step ends, however it ends, and then torchrun stops
    # its ranks itself (SIGTERM to each, SIGKILL after its own timeout). In a session of its own, so that a SIGKILL to
    # the run's process group (kill -KILL -- -PGID) leaves it to do that: ranks killed with no torchrun left to ask
    # them, while still importing, say, would outlive it (torchrun starts each in a session of its own).
    with subprocess.Popen(
        cmd,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
        start_new_session=True,
        preexec_fn=parent_death_signal(signal.SIGTERM),
    ) as proc:
        assert proc.stdout is not None
        try:
            for line in proc.stdout:
                tail.append(line.rstrip())
                print(line, end="", flush=True)
        except BaseException:
            _stop(proc)
            raise
        code = proc.wait()
    if code != 0:
        raise RuntimeError(
            f"torchrun exited with code {code}; last lines:\n" + "\n".join(tail) + _disk_note(config_path, tail)
        )


def _stop(proc: subprocess.Popen) -> None:
    """SIGTERM to torchrun (it passes it to the ranks, which save a checkpoint and stop: components/train/trainer/
    checkpoints.py), its output read meanwhile so that no one blocks writing it and shown (the checkpoint saved)
    while this step can still show it; SIGKILL after ``TORCHRUN_STOP_SECONDS``."""
    proc.terminate()
    try:
        last, _ = proc.communicate(timeout=TORCHRUN_STOP_SECONDS)
    except subprocess.TimeoutExpired:
        proc.kill()
        last, _ = proc.communicate()
    # torchrun's own traceback of the signal it was stopped with says nothing the step's line does not.
    cut = last.rfind("Traceback (most recent call last):")
    if cut != -1 and "SignalException" in last[cut:]:
        last = last[:cut]
    try:
        print(last, end="", flush=True)
    except OSError:  # the run's CLI is gone, and the pipe to it closed
        pass


def _disk_note(config_path: str, tail) -> str:
    """A line on the disk when it is what failed: nearly full, or the trainer's words for a failed write (torch
    reports ENOSPC as ``basic_ios::clear: iostream error``); empty otherwise."""
    folder = os.path.dirname(os.path.abspath(config_path))
    try:
        total, _, free = shutil.disk_usage(folder)
    except OSError:
        return ""
    said = any(words in line for line in tail for words in ("iostream error", "No space left", "ENOSPC"))
    if free >= min(LOW_DISK_BYTES, total // 20) and not said:
        return ""
    return (
        f"\n{folder} is on a filesystem with {free} bytes free: No space left on device (ENOSPC) is the likely cause; "
        "free space there or move the run's folders (local runs: --workspace DIR)"
    )


def metrics_port_here(port: int) -> int:
    """The port a local run's trainer serves its metrics on: ``port`` (the ``metrics_port`` setting; 0: none). Where
    this machine has it taken (another local run, a variant beside this one), the trainer serves them on a free port
    it takes itself and logs both (``METRICS_ANY_PORT_ENV``, which ``run_torchrun`` sets): a check here would leave
    15-30 s until the trainer binds the port, for another run to take it. On a cluster each pod has its own network,
    and a taken port is an error there (components/train/trainer/metrics.py)."""
    return port
