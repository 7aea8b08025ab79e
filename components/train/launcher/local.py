"""The local training backend: ``torchrun --standalone --nproc_per_node N -m components.train.trainer``.

The same trainer entry point the cluster job's pods run, as N CPU processes talking over gloo.
"""

from __future__ import annotations

import importlib.metadata
import logging
import os
import socket
import subprocess
from collections import deque

from components import quick_exit


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
    """Run the trainer under torchrun and stream its output; raise with the last lines on failure."""
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
    print("running:", " ".join(cmd), flush=True)
    tail: deque[str] = deque(maxlen=40)
    with subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env) as proc:
        assert proc.stdout is not None
        for line in proc.stdout:
            tail.append(line.rstrip())
            print(line, end="", flush=True)
        code = proc.wait()
    if code != 0:
        raise RuntimeError(f"torchrun exited with code {code}; last lines:\n" + "\n".join(tail))


def metrics_port_here(port: int) -> int:
    """The port a local run's trainer serves its metrics on: ``port`` (the ``metrics_port`` setting; 0: none), or a
    free one when this machine already has ``port`` taken, such as by another local run or a variant beside this
    one (a warning names both). On a cluster each pod has its own network, and a taken port is an error there
    (components/train/trainer/metrics.py)."""
    if not port:
        return 0
    with socket.socket() as probe:
        try:
            probe.bind(("", port))
            return port
        except OSError:
            pass
    with socket.socket() as free:
        free.bind(("", 0))
        chosen = free.getsockname()[1]
    logging.getLogger("train_model").warning(
        "metrics_port %d is taken on this machine (another local run?): this run's metrics are on port %d", port, chosen
    )
    return chosen
