"""What the trainer's garbage-collector policy saves: its ranks load their libraries with CPython's cyclic collector
paused and then freeze those objects (components/quick_exit.py ``pause_collection`` / ``resume_collection``, called by
components/train/trainer/__main__.py), against the same runs with both calls made no-ops (CPython's default: the
collector on from the start, and every full collection walking the millions of objects torch, transformers and
DeepSpeed created at import).

    python benchmarks/gc_freeze.py [--steps 16] [--repeats 2]

Each layout (the tiny Qwen3 under DDP, the tiny Qwen3-MoE under ZeRO-3: tests/helpers/trainer.py's fixtures, 2 CPU
ranks over gloo) runs ``--repeats`` times with each policy, alternating; a run prints its wall time (torchrun's start
to its end) and the trainer's own ``train_runtime_seconds`` (the training loop: the steps, checkpoints excluded
from neither). Run as ``torchrun ... benchmarks/gc_freeze.py --rank-without-freeze --config FILE`` it is one rank of
the baseline.
"""

from __future__ import annotations

import argparse
import json
import os
import runpy
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def rank_without_freeze(config: str) -> None:
    """One rank of the baseline: the trainer's entry point with the collector policy's two calls made no-ops."""
    from components import quick_exit

    quick_exit.pause_collection = lambda: None
    quick_exit.resume_collection = lambda: None
    sys.argv = ["components.train.trainer", "--config", config]
    runpy.run_module("components.train.trainer", run_name="__main__", alter_sys=True)


def run(config: str, freeze: bool) -> dict:
    """One 2-rank run of ``config`` (its output folder emptied first): wall seconds and the trainer's metrics."""
    out = Path(json.loads(Path(config).read_text())["output_dir"])
    shutil.rmtree(out, ignore_errors=True)
    program = ["-m", "components.train.trainer"] if freeze else [str(Path(__file__).resolve()), "--rank-without-freeze"]
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", *program]
    cmd += ["--config", config]
    started = time.monotonic()
    subprocess.run(cmd, check=True, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wall = time.monotonic() - started
    metrics = json.loads((out / "metrics.json").read_text())
    return {"wall_s": round(wall, 2), "train_runtime_s": metrics["train_runtime_seconds"]}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--steps", type=int, default=16)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--rank-without-freeze", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--config", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.rank_without_freeze:
        rank_without_freeze(args.config)
        return
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import netns_bytes

    from components.train.config import deepspeed_config_path
    from tests.helpers.trainer import trainer_config

    os.environ.setdefault("OMP_NUM_THREADS", "1")
    root = Path(tempfile.mkdtemp(prefix="gc-freeze-"))
    moe = netns_bytes.make_moe(root)  # also root/base (the tiny Qwen3) and root/data
    sizes = dict(max_steps=args.steps, save_steps=10_000, logging_steps=1, per_device_train_batch_size=1)
    layouts = {
        "qwen3 ddp": trainer_config(root, "ddp", **sizes),
        "qwen3-moe zero3": trainer_config(
            root, "zero3", model_name_or_path=str(moe), deepspeed=deepspeed_config_path("zero3"), **sizes
        ),
    }
    print(f"{'layout':18s} {'policy':10s} {'wall s':>8s} {'train loop s':>13s}")
    for name, config in layouts.items():
        for _ in range(args.repeats):
            for freeze in (False, True):
                r = run(config, freeze)
                policy = "freeze" if freeze else "default"
                print(f"{name:18s} {policy:10s} {r['wall_s']:8.2f} {r['train_runtime_s']:13.2f}", flush=True)
    shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
