"""The vLLM ServingRuntime in ``manifests/serving`` (for clusters without KServe's own), as a manifest to render."""

from __future__ import annotations

from pathlib import Path

import yaml

SERVING_RUNTIME_FILE = Path(__file__).resolve().parents[2] / "manifests" / "serving" / "servingruntime-vllm.yaml"


def serving_runtime_manifest(namespace: str) -> dict:
    """The ServingRuntime from ``manifests/serving``, placed in ``namespace`` (beside the InferenceService).

    Raises:
        FileNotFoundError: outside a source checkout (the manifests are not part of the installed package).
    """
    if not SERVING_RUNTIME_FILE.is_file():
        raise FileNotFoundError(
            f"{SERVING_RUNTIME_FILE} not found: the ServingRuntime ships with the source "
            "checkout (manifests/serving), not with the installed package"
        )
    runtime = yaml.safe_load(SERVING_RUNTIME_FILE.read_text())
    runtime["metadata"]["namespace"] = namespace
    return runtime
