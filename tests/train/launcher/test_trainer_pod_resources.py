"""The trainer pod's CPU, memory and /dev/shm (requests and limits) as the PyTorchJob and the TrainJob render them,
each manifest checked against the vendored CRD of its release (Training Operator v1; Trainer v2.1 and v2.2)."""

from __future__ import annotations

import pytest

from components.paths import MODEL_MOUNT
from components.settings import Settings, defaults
from components.stages import job_groups
from components.train.launcher.job import training_job_for_run
from components.train.launcher.pytorchjob import pytorchjob_for_run
from components.train.launcher.trainjob import TRAINER_V2_1, TRAINER_V2_2, trainjob_for_run
from tests.helpers.crd_schema import crd_errors

RUN_ID = "8b0e3f2a-1c2d-4e5f-9a8b-7c6d5e4f3a2b"
RUN_ARGS = {
    "run_id": RUN_ID,
    "namespace": "team-llm",
    "config_path": f"{MODEL_MOUNT}/runs/{RUN_ID}/train/train_config.json",
    "trainer_image": "registry.example/trainer:0.1.0",
    "num_nodes": 2,
    "gpus_per_node": 8,
    "data_pvc": "llm-data",
    "model_pvc": "llm-models",
    "hf_token_secret": "hf-token",
    "node_selector": {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"},
    "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
}
PYTORCHJOB_CRD = "kubeflow.org_pytorchjobs.yaml"
TRAINJOB_CRDS = {
    TRAINER_V2_2: "trainer.kubeflow.org_trainjobs.yaml",
    TRAINER_V2_1: "v2.1.0/trainer.kubeflow.org_trainjobs.yaml",
}
# The user's guide's pod: 8 CPUs and 96Gi asked, 16 and 128Gi allowed; a 32Gi /dev/shm.
GUIDE = {"cpu": "8", "cpu_limit": "16", "memory": "96Gi", "memory_limit": "128Gi", "shm_size": "32Gi"}
GUIDE_REQUESTS = {"cpu": "8", "memory": "96Gi", "nvidia.com/gpu": "8"}
GUIDE_LIMITS = {"cpu": "16", "memory": "128Gi", "nvidia.com/gpu": "8"}
TODAY = {"cpu": "16", "memory": "128Gi", "nvidia.com/gpu": "8"}


def pytorchjob_pods(job: dict) -> list[dict]:
    return [spec["template"]["spec"] for spec in job["spec"]["pytorchReplicaSpecs"].values()]


def shm(pod: dict) -> dict:
    (volume,) = [v for v in pod["volumes"] if v["name"] == "dshm"]
    return volume["emptyDir"]


def trainjob_pod(job: dict) -> dict:
    spec = job["spec"]
    if "runtimePatches" in spec:
        (patch,) = spec["runtimePatches"]
        (node,) = patch["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"]
        return node["template"]["spec"]["template"]["spec"]
    (override,) = spec["podTemplateOverrides"]
    return override["spec"]


def test_the_pytorchjob_pods_get_the_requests_limits_and_shm_asked_for():
    job = pytorchjob_for_run(**RUN_ARGS, **GUIDE)
    assert crd_errors(job, PYTORCHJOB_CRD) == []
    for pod in pytorchjob_pods(job):
        (container,) = pod["containers"]
        assert container["resources"] == {"requests": GUIDE_REQUESTS, "limits": GUIDE_LIMITS}
        assert shm(pod) == {"medium": "Memory", "sizeLimit": "32Gi"}


@pytest.mark.parametrize("version", [TRAINER_V2_2, TRAINER_V2_1])
def test_the_trainjob_pods_get_the_requests_limits_and_shm_asked_for(version):
    job = trainjob_for_run(**RUN_ARGS, **GUIDE, rdma_resource="rdma/ib", trainer_version=version)
    assert crd_errors(job, TRAINJOB_CRDS[version]) == []
    # Trainer v2 sets the node container's resources from resourcesPerNode; devices stay requests = limits.
    devices = {"rdma/ib": "1"}
    assert job["spec"]["trainer"]["resourcesPerNode"] == {
        "requests": {**GUIDE_REQUESTS, **devices},
        "limits": {**GUIDE_LIMITS, **devices},
    }
    assert shm(trainjob_pod(job)) == {"medium": "Memory", "sizeLimit": "32Gi"}


@pytest.mark.parametrize("version", [TRAINER_V2_2, TRAINER_V2_1])
def test_by_default_nothing_changes_requests_equal_limits(version):
    for pod in pytorchjob_pods(pytorchjob_for_run(**RUN_ARGS)):
        assert pod["containers"][0]["resources"] == {"requests": TODAY, "limits": TODAY}
        assert shm(pod)["sizeLimit"] == "64Gi"
    job = trainjob_for_run(**RUN_ARGS, trainer_version=version)
    assert job["spec"]["trainer"]["resourcesPerNode"] == {"requests": TODAY, "limits": TODAY}
    assert shm(trainjob_pod(job))["sizeLimit"] == "64Gi"


def test_the_settings_defaults_are_todays_pod():
    c = Settings.from_flat(defaults()).job
    assert (c.trainer_cpu_request, c.trainer_cpu_limit) == ("16", "16")
    assert (c.trainer_memory_request, c.trainer_memory_limit, c.trainer_shm_size) == ("128Gi", "128Gi", "64Gi")
    assert c.trainjob_runtime == "torch-distributed"


@pytest.mark.parametrize("backend", ["pytorchjob", "trainjob"])
def test_the_run_renders_the_pod_settings(backend):
    settings = Settings.from_flat(
        {
            **defaults(),
            "train_backend": backend,
            "trainer_cpu_request": "8",
            "trainer_memory_request": "96Gi",
            "trainer_shm_size": "32Gi",
            "trainjob_runtime": "torch-distributed-h100",
        }
    )
    job = training_job_for_run(
        *job_groups(settings, "sft"), run_id=RUN_ID, namespace="team-llm", config_path=RUN_ARGS["config_path"]
    )
    if backend == "pytorchjob":
        (pod, *_) = pytorchjob_pods(job)
        resources = pod["containers"][0]["resources"]
    else:
        pod, resources = trainjob_pod(job), job["spec"]["trainer"]["resourcesPerNode"]
        assert job["spec"]["runtimeRef"]["name"] == "torch-distributed-h100"
    assert resources["requests"]["cpu"] == "8" and resources["limits"]["cpu"] == "16"
    assert resources["requests"]["memory"] == "96Gi" and resources["limits"]["memory"] == "128Gi"
    assert shm(pod)["sizeLimit"] == "32Gi"
