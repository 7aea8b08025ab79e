"""Where things live on the shared volumes, and how they are named for users.

Two long-lived ReadWriteMany claims are mounted at fixed paths on every step that needs them: one for
data and caches, one for models and checkpoints (KServe serves from it after the run ends). Every run
writes under ``runs/<KFP run id>/`` so concurrent and recurring runs never collide. Locally the same
layout lives under a workspace folder instead of the mounts.
"""

from __future__ import annotations

import os

DATA_MOUNT = "/mnt/data"
MODEL_MOUNT = "/mnt/models"
# The data volume's shared cache (the Hugging Face cache, bf16 copies of FP8 checkpoints): the one folder on it the
# training pods may write (components/train/launcher/pods.py trainer_volume_mounts).
DATA_CACHE = "cache"


def run_dir(root: str, run_id: str) -> str:
    """The run-scoped folder under a volume root (``<root>/runs/<run_id>``)."""
    if not run_id or "/" in run_id or run_id in (".", ".."):
        raise ValueError(f"run_id {run_id!r} is not a valid folder name; pass the KFP run id")
    return os.path.join(root, "runs", run_id)


def pvc_uri(claim: str, root: str, path: str) -> str:
    """``pvc://<claim>/<path relative to the claim's mount>``, the form KServe's storageUri takes."""
    rel = os.path.relpath(path, root)
    if rel.startswith(".."):
        raise ValueError(f"{path} is not under the volume mounted at {root}")
    return f"pvc://{claim}/{rel}"


EVALUATION_FILE = "evaluation.json"


def evaluation_path(model_path: str) -> str:
    """Where evaluate_model records its result for ``model_path`` (metrics, the gate's decision, the answers): beside
    the model folder, in its stage's folder, where the variants' comparison reads it."""
    return os.path.join(os.path.dirname(os.path.normpath(model_path)), EVALUATION_FILE)
