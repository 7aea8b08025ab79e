"""The InferenceService the deploy tests render: one run's model on KServe, as the deploy step would ask for it."""

from __future__ import annotations

from components.deploy.manifest import InferenceServiceSpec, build_inference_service

CRD = "serving.kserve.io_inferenceservices.yaml"
GVP = ("serving.kserve.io", "v1beta1", "inferenceservices")
NS, NAME = "team-llm", "qwen3-30b-a3b-sft"
STORAGE = "pvc://llm-models/runs/8b0e3f2a/train/final"


def isvc(runtime="kserve-vllm", **overrides) -> dict:
    """``build_inference_service`` for the reference run's model, with ``overrides``."""
    kwargs = dict(
        name=NAME,
        namespace=NS,
        storage_uri=STORAGE,
        runtime=runtime,
        gpus=2,
        max_model_len=8192,
        served_model_name="qwen3-sft",
        node_selector={"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"},
        tolerations=[{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
        labels={"pipelines.kubeflow.org/run-id": "8b0e3f2a"},
    )
    return build_inference_service(InferenceServiceSpec(**{**kwargs, **overrides}))
