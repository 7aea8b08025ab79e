"""manifests/serving: the vLLM ServingRuntime against KServe's CRD, its kustomization, and its fit with the
InferenceService the deploy step builds."""

from __future__ import annotations

import re
import shutil
import subprocess

import pytest
import yaml

from components.deploy.manifest import RUNTIMES, InferenceServiceSpec, build_inference_service
from components.deploy.serving_runtime import (
    SERVING_RUNTIME_FILE,
    serving_runtime_manifest,
)
from tests.helpers.crd_schema import crd_errors
from tests.helpers.repo import REFERENCE

SERVING = SERVING_RUNTIME_FILE.parent


def test_serving_runtime_matches_the_crd():
    assert crd_errors(serving_runtime_manifest("team-llm"), "serving.kserve.io_servingruntimes.yaml") == []


def test_image_is_pinned_to_a_vllm_release_that_serves_qwen3_moe():
    (container,) = serving_runtime_manifest("ns")["spec"]["containers"]
    match = re.fullmatch(r"vllm/vllm-openai:v(\d+)\.(\d+)\.(\d+)", container["image"])
    assert match, f"{container['image']} must be pinned to a vLLM release tag"
    assert tuple(map(int, match.groups())) >= (0, 8, 5)  # Qwen3-MoE support landed in 0.8.5


def test_inference_service_resolves_to_it():
    """Same name and model format as KServe's runtime: the InferenceService needs no change to use it."""
    runtime = serving_runtime_manifest("team-llm")
    model = build_inference_service(
        InferenceServiceSpec(
            name="qwen3-sft",
            namespace="team-llm",
            storage_uri="pvc://llm-models/runs/r/train/final",
            runtime="kserve-vllm",
            gpus=4,
            max_model_len=8192,
            served_model_name="qwen3-sft",
            node_selector={},
            tolerations=[],
        )
    )["spec"]["predictor"]["model"]
    assert runtime["metadata"]["name"] == model["runtime"] == RUNTIMES["kserve-vllm"].runtime
    assert model["modelFormat"]["name"] in [f["name"] for f in runtime["spec"]["supportedModelFormats"]]
    (container,) = runtime["spec"]["containers"]
    assert container["name"] == "kserve-container" and "--model=/mnt/models" in container["args"]
    assert "vllm.entrypoints.openai.api_server" in container["command"]  # OpenAI routes under /v1
    assert RUNTIMES["kserve-vllm"].openai_route == "/v1"
    probe = container["startupProbe"]
    assert probe["failureThreshold"] * probe["periodSeconds"] >= 1800  # 60 GB of weights


def test_startup_probe_agrees_with_kserves_own_runtime():
    kserve = yaml.safe_load((REFERENCE / "runtimes" / "runtime_kserve-vllmserver.yaml").read_text())
    ours = serving_runtime_manifest("ns")["spec"]["containers"][0]
    assert ours["startupProbe"]["httpGet"] == kserve["spec"]["containers"][0]["startupProbe"]["httpGet"]


def test_kustomization_builds_the_runtime():
    kustomization = yaml.safe_load((SERVING / "kustomization.yaml").read_text())
    assert [SERVING / r for r in kustomization["resources"]] == [SERVING_RUNTIME_FILE]
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip("kubectl not installed: `kubectl kustomize` not checked")
    built = subprocess.run(
        [kubectl, "kustomize", str(SERVING)], capture_output=True, text=True, timeout=60, check=True
    ).stdout
    (doc,) = list(yaml.safe_load_all(built))
    assert doc["kind"] == "ServingRuntime" and doc["metadata"]["name"] == "kserve-vllmserver"
