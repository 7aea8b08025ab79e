"""The trainer's checkpoint folders on disk: ``checkpoint-<step>/`` under the output folder counts once rank 0 has
written the ``COMPLETE`` marker into it (checkpoints.py writes it after every rank has saved); the newest complete one
is resumed from, and older ones are pruned.

Plain files only, no torch: the evaluate step reads the run's log from the newest complete checkpoint too
(components/evaluate/curves.py).
"""

from __future__ import annotations

import logging
import re
import shutil
from pathlib import Path

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
    complete = [(step, p) for step, p in found if is_complete(p)]
    doomed = [p for _, p in complete[:-keep]] if keep > 0 else []
    if complete:
        newest = complete[-1][0]
        doomed += [p for step, p in found if not is_complete(p) and step < newest]
    for path in doomed:
        shutil.rmtree(path, ignore_errors=True)
    return [str(p) for p in doomed]
