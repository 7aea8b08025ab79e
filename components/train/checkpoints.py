"""Checkpoints that survive a killed pod: complete-marker written last, partial ones skipped, last K kept.

The Trainer writes ``checkpoint-<step>/`` (weights or DeepSpeed shards, optimizer, scheduler, RNG state
per rank, trainer_state.json with the step). A pod can die half-way through that, leaving a folder that
looks like a checkpoint but cannot be resumed from. So a checkpoint counts only once every rank has
finished writing and rank 0 has written ``COMPLETE`` into it; resuming picks the newest complete one.
"""

from __future__ import annotations

import logging
import re
import shutil
from pathlib import Path

from transformers import TrainerCallback

log = logging.getLogger("sft.checkpoints")

MARKER = "COMPLETE"
_CHECKPOINT = re.compile(r"^checkpoint-(\d+)$")


def _checkpoints(output_dir: str) -> list[tuple[int, Path]]:
    root = Path(output_dir)
    if not root.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in root.iterdir() if p.is_dir() and (m := _CHECKPOINT.match(p.name))]
    return sorted(found)


def is_complete(checkpoint: Path) -> bool:
    """Whether every rank finished writing ``checkpoint`` (its marker exists)."""
    return (checkpoint / MARKER).exists()


def latest_complete_checkpoint(output_dir: str) -> str | None:
    """The newest complete ``checkpoint-<step>`` under ``output_dir``; newer partial ones are skipped with a warning."""
    for _, path in reversed(_checkpoints(output_dir)):
        if is_complete(path):
            return str(path)
        log.warning("skipping %s: no %s marker (the run stopped while writing it)", path, MARKER)
    return None


def prune_checkpoints(output_dir: str, keep: int) -> list[str]:
    """Delete all but the newest ``keep`` complete checkpoints, and partial ones older than the newest complete.

    A partial checkpoint newer than every complete one is left alone: it may be the one being written.
    Returns the deleted paths.
    """
    found = _checkpoints(output_dir)
    complete = [p for _, p in found if is_complete(p)]
    doomed = complete[:-keep] if keep > 0 else []
    if complete:
        newest = int(_CHECKPOINT.match(complete[-1].name).group(1))
        doomed += [p for step, p in found if not is_complete(p) and step < newest]
    for path in doomed:
        shutil.rmtree(path, ignore_errors=True)
    return [str(p) for p in doomed]


class CompleteMarkerCallback(TrainerCallback):
    """After each save: wait for every rank, then rank 0 writes the marker and prunes to the last ``keep``.

    The Trainer's own rotation (``save_total_limit``) cannot tell complete from partial, so sft.py turns it
    off and hands the limit to this callback.
    """

    def __init__(self, keep: int):
        self.keep = keep

    def on_save(self, args, state, control, **kwargs):
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            dist.barrier()  # every rank's shards, optimizer and RNG files are on disk
        if state.is_world_process_zero:
            checkpoint = Path(args.output_dir, f"checkpoint-{state.global_step}")
            (checkpoint / MARKER).write_text(f"step {state.global_step}\n")
            deleted = prune_checkpoints(args.output_dir, self.keep)
            log.info("checkpoint %s complete%s", checkpoint, f"; deleted {deleted}" if deleted else "")
        return control
