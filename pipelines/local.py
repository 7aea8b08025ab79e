"""Run the pipeline on this machine with kfp.local: same components, workspace folders for volumes."""

from __future__ import annotations

import time
from pathlib import Path


def run_locally(params: dict, workspace: Path) -> dict:
    """Run every step in subprocesses of this Python (kfp.local SubprocessRunner); return the summary.

    The summary has ``status``, ``model_uri``, ``metrics``, ``passed``, ``reason``, ``endpoint``,
    ``smoke_reply`` and ``wall_seconds``; a failed step gives ``status: failed`` and ``error``.
    """
    from kfp import local

    from pipelines.llm_finetune import build_pipeline

    started = time.time()
    workspace.mkdir(parents=True, exist_ok=True)
    # use_venv=False: the steps import this package from the current environment instead of pip-installing it.
    local.init(runner=local.SubprocessRunner(use_venv=False), pipeline_root=str(workspace / "kfp"), raise_on_error=True)
    pipeline = build_pipeline("local", str(workspace))
    try:
        outputs = pipeline(**params).outputs
    except RuntimeError as e:
        return {"status": "failed", "error": str(e), "wall_seconds": round(time.time() - started, 1)}
    return {
        "status": "succeeded",
        "model_uri": outputs["model_uri"],
        "metrics": dict(outputs["metrics"].metadata),
        "passed": outputs["passed"],
        "reason": outputs["reason"],
        "endpoint": outputs["endpoint"],
        "smoke_reply": outputs["smoke_reply"],
        "wall_seconds": round(time.time() - started, 1),
    }
