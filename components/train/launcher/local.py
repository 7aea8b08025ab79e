"""The local training backend: ``torchrun --standalone --nproc_per_node N -m components.train.trainer.sft``.

The same trainer entry point the cluster job's pods run, as N CPU processes talking over gloo.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections import deque


def run_torchrun(config_path: str, nproc_per_node: int, env: dict | None = None) -> None:
    """Run the trainer under torchrun and stream its output; raise with the last lines on failure."""
    cmd = [
        sys.executable, "-m", "torch.distributed.run",
        "--standalone",  # single node, free rendezvous port: concurrent local runs do not collide
        "--nproc_per_node", str(nproc_per_node),
        "-m", "components.train.trainer.sft", "--config", config_path,
    ]
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
