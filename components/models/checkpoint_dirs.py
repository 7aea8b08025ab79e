"""The trainer's checkpoint folders on disk: ``checkpoint-<step>/`` under the output folder counts once rank 0 has
written the ``COMPLETE`` marker into it (checkpoints.py writes it after every rank has saved); the newest complete one
that is readable is resumed from, and older ones are pruned.

The marker's first line is ``step <N>``; its second, since sizes are recorded, a JSON object
``{"sizes": {"<path under the checkpoint>": <bytes>, ...}}`` of every file the checkpoint held when it was marked.
Markers without it (an earlier release's, or empty) still count. A complete checkpoint is readable when every
recorded file is there with its recorded size, every safetensors file's header parses and covers its data, and every
torch file (``.pt``, ``.pth``, ``.bin``: zip archives since torch 1.6) ends with its zip central directory: a file
cut short (a volume that filled up, a copy that stopped) fails one of these, and loading it would crash every rank
with a ``SafetensorError`` or ``PytorchStreamReader`` error on each re-run. The checks read headers and tails only:
a few KB per file, not the ~366 GB of a Qwen3-30B-A3B checkpoint.

Plain files only, no torch: the evaluate step reads the run's log from the newest complete checkpoint too
(components/evaluate/curves.py).
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import struct
from pathlib import Path

log = logging.getLogger("sft.checkpoints")

MARKER = "COMPLETE"
_CHECKPOINT = re.compile(r"^checkpoint-(\d+)$")
_TORCH_SUFFIXES = (".pt", ".pth", ".bin")
_ZIP_LOCAL_HEADER, _ZIP_END, _ZIP64_LOCATOR = b"PK\x03\x04", b"PK\x05\x06", b"PK\x06\x07"
_ZIP_END_SIZE, _ZIP_MAX_COMMENT = 22, 0xFFFF


def _checkpoints(output_dir: str) -> list[tuple[int, Path]]:
    root = Path(output_dir)
    if not root.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in root.iterdir() if p.is_dir() and (m := _CHECKPOINT.match(p.name))]
    return sorted(found)


def is_complete(checkpoint: Path) -> bool:
    """Whether every rank finished writing ``checkpoint`` (its marker exists)."""
    return (checkpoint / MARKER).exists()


def _files(checkpoint: Path) -> dict[str, int]:
    return {
        p.relative_to(checkpoint).as_posix(): p.stat().st_size
        for p in sorted(checkpoint.rglob("*"))
        if p.is_file() and p.name != MARKER and not p.name.startswith(f"{MARKER}.")
    }


def write_marker(checkpoint: Path, step: int) -> dict[str, int]:
    """Mark ``checkpoint`` complete, recording the size of every file under it; returns the sizes.

    Call once every rank has finished writing (checkpoints.py's callback, after its barrier): the sizes are the
    files' as this process sees them then, on a shared volume too (NFS shows a file closed by another node with its
    final size to a later lookup). Written to a temporary file and renamed, so a marker is never seen half-written.
    """
    sizes = _files(checkpoint)
    tmp = checkpoint / f"{MARKER}.tmp"
    tmp.write_text(f"step {step}\n" + json.dumps({"sizes": sizes}, separators=(",", ":")) + "\n")
    os.replace(tmp, checkpoint / MARKER)
    return sizes


def recorded_sizes(checkpoint: Path) -> dict[str, int]:
    """The file sizes ``checkpoint``'s marker recorded; {} for a marker that records none (or no marker)."""
    try:
        _, _, rest = (checkpoint / MARKER).read_text().partition("\n")
        sizes = json.loads(rest)["sizes"] if rest.strip() else {}
    except FileNotFoundError:
        return {}
    except (ValueError, KeyError, TypeError):
        return {}  # unparseable: fall back to the header checks, as for an old marker
    return {str(k): int(v) for k, v in sizes.items()} if isinstance(sizes, dict) else {}


def _safetensors_problem(path: Path, size: int) -> str | None:
    """Why a safetensors file is unreadable, or None: it needs its header's length, a JSON header, and every
    tensor within the file."""
    with open(path, "rb") as f:
        head = f.read(8)
        if len(head) < 8:
            return f"{size} bytes, shorter than a safetensors header"
        (length,) = struct.unpack("<Q", head)
        if 8 + length > size:
            return f"its header says {length} bytes of metadata, but the file has {size} bytes"
        try:
            header = json.loads(f.read(length))
        except (ValueError, UnicodeDecodeError) as exc:
            return f"its header is not JSON ({exc})"
    if not isinstance(header, dict):
        return "its header is not a JSON object"
    try:
        end = max((int(t["data_offsets"][1]) for k, t in header.items() if k != "__metadata__"), default=0)
    except (TypeError, KeyError, IndexError, ValueError):
        return "its header has a tensor without data_offsets"
    if 8 + length + end > size:
        return f"its tensors end at byte {8 + length + end}, but the file has {size} bytes (cut short)"
    return None


def _torch_zip_problem(path: Path, size: int) -> str | None:
    """Why a torch file is unreadable, or None: a zip archive must end with its end-of-central-directory record.

    A file that is not a zip archive at all (torch's legacy pickle format) is not checked, except for being empty.
    """
    if size == 0:
        return "empty"
    with open(path, "rb") as f:
        if f.read(4) != _ZIP_LOCAL_HEADER:
            return None
        tail_size = min(size, _ZIP_END_SIZE + _ZIP_MAX_COMMENT)
        f.seek(size - tail_size)
        tail = f.read(tail_size)
    at = tail.rfind(_ZIP_END)
    if at < 0 or len(tail) - at < _ZIP_END_SIZE:
        return f"a zip archive ({size} bytes) without its end-of-central-directory record (cut short)"
    cd_size, cd_offset = struct.unpack("<II", tail[at + 12 : at + 20])
    zip64 = cd_offset == 0xFFFFFFFF or cd_size == 0xFFFFFFFF or tail[max(0, at - 20) : at - 16] == _ZIP64_LOCATOR
    if not zip64 and cd_offset + cd_size != size - tail_size + at:
        return f"a zip archive ({size} bytes) whose central directory is not where its end record says (damaged)"
    return None


def unreadable(checkpoint: Path) -> str | None:
    """Why the complete ``checkpoint`` cannot be resumed from (its first problem, naming the file), or None."""
    for name, size in recorded_sizes(checkpoint).items():
        path = checkpoint / name
        if not path.is_file():
            return f"{name} is missing"
        if (found := path.stat().st_size) != size:
            return f"{name} has {found} bytes, {size} recorded when it was saved"
    for name, size in _files(checkpoint).items():
        path = checkpoint / name
        try:
            if name.endswith(".safetensors"):
                problem = _safetensors_problem(path, size)
            elif name.endswith(_TORCH_SUFFIXES):
                problem = _torch_zip_problem(path, size)
            else:
                continue
        except OSError as exc:  # a file that cannot be read is no better than a cut one
            problem = f"cannot be read ({exc.strerror or exc})"
        if problem:
            return f"{name}: {problem}"
    return None


def latest_complete_checkpoint(output_dir: str) -> str | None:
    """The newest complete, readable ``checkpoint-<step>`` under ``output_dir``; newer partial or unreadable ones are
    skipped with a warning naming them."""
    for _, path in reversed(_checkpoints(output_dir)):
        if not is_complete(path):
            log.warning("skipping %s: no %s marker (the run stopped while writing it)", path, MARKER)
            continue
        if problem := unreadable(path):
            log.warning("skipping %s: marked %s but unreadable: %s", path, MARKER, problem)
            continue
        return str(path)
    return None


def unmark_newer(output_dir: str, step: int) -> list[str]:
    """Remove the marker of every complete checkpoint newer than ``step`` (the step a run resumed from: newer ones
    were skipped as unreadable), so none counts as complete while its step is written again. Returns their paths."""
    unmarked = [p for s, p in _checkpoints(output_dir) if s > step and is_complete(p)]
    for path in unmarked:
        (path / MARKER).unlink(missing_ok=True)
    return [str(p) for p in unmarked]


def best_checkpoint_name(checkpoint: Path) -> str | None:
    """The folder name of the best checkpoint that ``checkpoint``'s trainer_state.json records (early stopping:
    the Trainer's ``best_model_checkpoint``), or None."""
    try:
        best = json.loads((checkpoint / "trainer_state.json").read_text()).get("best_model_checkpoint")
    except (OSError, ValueError, AttributeError):
        return None
    return Path(best).name if isinstance(best, str) and best else None


def prune_checkpoints(output_dir: str, keep: int) -> list[str]:
    """Delete all but the newest ``keep`` complete checkpoints, and partial ones older than the newest complete.

    A partial checkpoint newer than every complete one is left alone: it may be the one being written. The best
    checkpoint the newest complete one records (early stopping loads its weights at the end) is kept too, beyond
    ``keep``. Returns the deleted paths.
    """
    found = _checkpoints(output_dir)
    complete = [(step, p) for step, p in found if is_complete(p)]
    best = best_checkpoint_name(complete[-1][1]) if complete else None
    doomed = [p for _, p in complete[:-keep] if p.name != best] if keep > 0 else []
    if complete:
        newest = complete[-1][0]
        doomed += [p for step, p in found if not is_complete(p) and step < newest]
    for path in doomed:
        shutil.rmtree(path, ignore_errors=True)
    return [str(p) for p in doomed]
