"""The trainer program: what every pod (or local process) of a training job runs, for every stage.

    torchrun --nproc_per_node 8 --nnodes 2 ... -m components.train.trainer \\
        --config /mnt/models/runs/<id>/train/train_config.json

It reads the config file (config_file.py), serves the live metrics (metrics.py), trains the config's ``stage`` with
that stage's module (``STAGE_MODULES``; what the stages share is common.py) and leaves (process_exit.py). Exit
status: 0 for a finished run, 2 for a config error (one ``error:`` line, before any model loads), 143 when SIGTERM
stopped the run at a complete checkpoint that a re-run resumes from (checkpoints.py).
"""

from __future__ import annotations

# ruff: noqa: E402  (the parent-death request comes before the imports below: they load torch, which takes seconds)
import os
import signal
import sys

from components import parent_death, quick_exit
from components.train.trainer.unused_trackers import hide_unreported_trackers

# torchrun starts every worker in a session of its own (torch's elastic SubprocessHandler: start_new_session=True),
# so a signal to the agent's process group never reaches the ranks: killed that way (a cancelled local run,
# kill -KILL -- -PGID), the agent left them training on with parent pid 1, holding their ports and writing
# checkpoints for a run nobody waits for. SIGKILL, not SIGTERM: with the agent gone no one restarts or reports the
# job, and a checkpoint on SIGTERM is the agent's to ask for (checkpoints.py). In a pod the container's end kills
# every process anyway; this is for the agent that dies alone. Asked before anything else, so no window is left.
if __name__ == "__main__":
    parent_death.request(signal.SIGKILL, os.getppid())
    # Before the imports below too: three of them would import MLflow for a run that does not report to it.
    hide_unreported_trackers(sys.argv[1:])
    quick_exit.pause_collection()  # until the libraries are loaded, below and in train()

import argparse
import importlib
import logging

from components.distributed import global_rank
from components.train.trainer.checkpoints import EXIT_SIGTERM
from components.train.trainer.common import TrainingInterrupted
from components.train.trainer.config_file import parse_config
from components.train.trainer.metrics import serve as serve_metrics
from components.train.trainer.process_exit import leave

if __name__ == "__main__":
    quick_exit.resume_collection()

log = logging.getLogger("sft")

# The module of this package that trains each stage (components/stages.py). Imported for the run's stage only: dpo,
# rm and grpo import their part of TRL, which would cost every other stage seconds on every rank.
STAGE_MODULES = {"cpt": "sft", "sft": "sft", "dpo": "dpo", "rm": "rm", "grpo": "grpo"}


def train(cfg) -> dict:
    """Train ``cfg.stage`` according to ``cfg``; return the final metrics (also written to metrics.json)."""
    quick_exit.pause_collection()  # the stage's module loads TRL's part for dpo, rm and grpo
    try:
        stage = importlib.import_module(f"components.train.trainer.{STAGE_MODULES[cfg.stage]}")
    finally:
        quick_exit.resume_collection()
    return stage.main(cfg)


def make_parser() -> argparse.ArgumentParser:
    """The command line: one ``--config`` file (JSON or YAML)."""
    p = argparse.ArgumentParser(prog="torchrun ... -m components.train.trainer", description=__doc__.split("\n")[0])
    p.add_argument("--config", required=True, help="trainer config (JSON or YAML): its stage's config class's fields")
    return p


def main(argv: list[str] | None = None) -> None:
    """Parse, train, exit: the process ends here (process_exit.leave), with the status the module docstring says."""
    quick_exit.freeze_heap_at_exit()
    args = make_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format=f"%(asctime)s rank{global_rank()} %(name)s: %(message)s")
    try:
        cfg = parse_config(args.config)
        # Before the model loads: a metrics port another process holds is an error in the first second.
        serve_metrics(cfg)
    except (ValueError, RuntimeError) as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
    code = 0
    try:
        train(cfg)
    except TrainingInterrupted as stop:
        if global_rank() == 0:
            log.warning("%s", stop)
        code = EXIT_SIGTERM  # non-zero: the job was interrupted, not finished
    leave(code)


if __name__ == "__main__":
    main()
