"""The grpo generation server's manifests (grpo_generation_backend=vllm-server on a cluster; issue 30): a ConfigMap
carrying the weight-sync engine, a Deployment of vLLM's OpenAI server from the serving image, a Service. Each is a
valid object of its Kubernetes API (the client's models take every field and give back the same manifest), the pod
is admitted by the ``restricted`` Pod Security Standard, and the server's command is the one the real engine runs
in test_grpo_vllm_server.py (components.models.vllm_worker.server_args / server_env)."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
from kubernetes import client

from components.models.vllm_worker import engine_source
from components.train.launcher.generation_server import ENGINE_DIR, server_manifests, service_url
from tests.helpers.pod_security import violations

MODEL = "/mnt/models/runs/123/sft/final"


def _manifests(**over):
    kwargs = dict(
        name="llm-123-grpo-vllm",
        namespace="team-a",
        image="vllm/vllm-openai:v0.32.0",
        model_path=MODEL,
        model_pvc="models",
        gpus=4,
        image_pull_secrets=["regcred"],
        node_selector={"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"},
        tolerations=[{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
    )
    return server_manifests(**{**kwargs, **over})


def _round_trip(manifest: dict, model: str) -> dict:
    api = client.ApiClient()
    obj = api.deserialize(SimpleNamespace(data=json.dumps(manifest)), model)
    return api.sanitize_for_serialization(obj)


def test_each_manifest_is_a_valid_object_of_its_api():
    config_map, deployment, service = _manifests()
    assert [m["kind"] for m in (config_map, deployment, service)] == ["ConfigMap", "Deployment", "Service"]
    # A misspelt or misplaced field does not survive the client's models.
    assert _round_trip(config_map, "V1ConfigMap") == config_map
    assert _round_trip(deployment, "V1Deployment") == deployment
    assert _round_trip(service, "V1Service") == service


def test_the_server_runs_the_engine_from_the_config_map_on_the_models_claim():
    config_map, deployment, service = _manifests()
    assert config_map["data"] == {"kfp_weight_sync.py": engine_source()}
    pod = deployment["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    args = container["args"]
    assert args[args.index("--model") + 1] == MODEL
    assert args[args.index("--worker-extension-cls") + 1] == "kfp_weight_sync.WeightSyncExtension"
    assert json.loads(args[args.index("--weight-transfer-config") + 1]) == {"backend": "kfp_torch"}
    assert args[args.index("--tensor-parallel-size") + 1] == "4"
    env = {e["name"]: e["value"] for e in container["env"]}
    assert env["PYTHONPATH"] == ENGINE_DIR and env["VLLM_SERVER_DEV_MODE"] == "1"
    mounts = {m["name"]: m for m in container["volumeMounts"]}
    assert mounts["engine"]["mountPath"] == ENGINE_DIR
    assert mounts["models"] == {"name": "models", "mountPath": "/mnt/models", "readOnly": True}
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["engine"]["configMap"]["name"] == config_map["metadata"]["name"]
    assert volumes["models"]["persistentVolumeClaim"] == {"claimName": "models", "readOnly": True}
    assert container["resources"]["limits"]["nvidia.com/gpu"] == "4"
    assert pod["imagePullSecrets"] == [{"name": "regcred"}]
    assert service["spec"]["selector"] == deployment["spec"]["selector"]["matchLabels"]
    assert service_url("llm-123-grpo-vllm", "team-a") == "http://llm-123-grpo-vllm.team-a.svc:8000"


def test_the_server_pod_is_admitted_by_the_restricted_profile():
    _, deployment, _ = _manifests()
    template = deployment["spec"]["template"]
    assert violations({"metadata": template["metadata"], "spec": template["spec"]}) == []


def test_the_model_must_be_on_the_models_claim():
    with pytest.raises(ValueError, match="is not under /mnt/models"):
        _manifests(model_path="/home/me/model")
