"""A cluster ready for the reference run, set up in the fake API server, and the run settings it is ready for."""

from __future__ import annotations

from tests.fakes.k8s_api import FakeKubeAPI

NS = "team-llm"
H100 = {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}
GPU_TAINT = {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}
PARAMS = {
    "train_backend": "pytorchjob",
    "deploy_backend": "kserve-vllm",
    "data_pvc": "llm-data",
    "model_pvc": "llm-models",
    "hf_token_secret": "hf-token",
    "num_nodes": 2,
    "gpus_per_node": 8,
    "node_selector": H100,
    "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
    "tensorboard": True,
    "hpo_trials": 0,
    "alert_webhook_secret": "llm-alerts",
}
# Trainer v2.2's TrainJob schema as the API server publishes it, cut down to the spec fields (what the launcher and
# preflight read to tell the release apart; tests/train/launcher/test_trainjob_versions.py publishes the whole CRDs).
TRAINJOB_SCHEMA = {
    "type": "object",
    "properties": {
        "spec": {
            "type": "object",
            "properties": {
                field: {}
                for field in (
                    "activeDeadlineSeconds",
                    "initializer",
                    "managedBy",
                    "runtimePatches",
                    "runtimeRef",
                    "suspend",
                    "trainer",
                )
            },
        }
    },
}


def ready_cluster(api: FakeKubeAPI) -> FakeKubeAPI:
    """Everything the reference run needs: operator, Trainer v2.2, KServe, claims, token, two H100 nodes."""
    api.install_crd("kubeflow.org", "v1", "pytorchjobs", "PyTorchJob")
    api.install_crd("trainer.kubeflow.org", "v1alpha1", "trainjobs", "TrainJob")
    api.publish_schema("trainer.kubeflow.org", "v1alpha1", "TrainJob", TRAINJOB_SCHEMA)
    api.install_crd("serving.kserve.io", "v1beta1", "inferenceservices", "InferenceService")
    api.add_pvc(NS, "llm-data")
    api.add_pvc(NS, "llm-models")
    api.add_secret(NS, "hf-token", {"HF_TOKEN": "hf_abc"})
    for i in range(2):
        api.add_node(f"gpu-{i}", {**H100, "kubernetes.io/hostname": f"gpu-{i}"}, gpus=8, taints=[GPU_TAINT])
    api.add_node("cpu-0", {"kubernetes.io/hostname": "cpu-0"}, gpus=0)
    return api
