"""The training pods' network as the settings render it: the RDMA device requested with the GPUs, IPC_LOCK added to
the trainer container, NCCL variables in its environment; checked against the real PyTorchJob and TrainJob CRDs
(tests/reference/crds) through the path the train step and --render take (``training_job_for_run``)."""

from __future__ import annotations

import pytest

from components.settings import Settings, defaults
from components.stages import job_groups
from components.train.launcher.job import training_job_for_run
from components.train.launcher.trainjob import TRAINER_V2_1, TRAINER_V2_2
from tests.helpers.crd_schema import crd_errors

RUN_ID = "8b0e3f2a-1c2d-4e5f-9a8b-7c6d5e4f3a2b"
CRDS = {"pytorchjob": "kubeflow.org_pytorchjobs.yaml", "trainjob": "trainer.kubeflow.org_trainjobs.yaml"}
IB = {
    "rdma_resource": "rdma/ib",
    "rdma_per_pod": 8,
    "ipc_lock": True,
    "nccl_env": {"NCCL_IB_HCA": "mlx5", "NCCL_NSOCKS_PERTHREAD": 4.0},
}


def _job(backend: str, trainer_version: str | None = None, **settings) -> dict:
    s = Settings.from_flat({**defaults(), "train_backend": backend, **settings})
    return training_job_for_run(
        *job_groups(s, "sft"),
        run_id=RUN_ID,
        namespace="team-llm",
        config_path="/mnt/models/runs/r1/train/c.json",
        trainer_version=trainer_version,
    )


def _trainer_containers(job: dict) -> list[dict]:
    if job["kind"] == "PyTorchJob":
        return [
            c for spec in job["spec"]["pytorchReplicaSpecs"].values() for c in spec["template"]["spec"]["containers"]
        ]
    patch = job["spec"]["runtimePatches"][0]["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"][0]
    (container,) = patch["template"]["spec"]["template"]["spec"]["containers"]
    trainer = job["spec"]["trainer"]
    return [{**container, "resources": trainer["resourcesPerNode"], "env": trainer["env"]}]


@pytest.mark.parametrize("backend", ["pytorchjob", "trainjob"])
def test_an_rdma_network_is_requested_with_the_gpus_and_allowed_to_pin_memory(backend):
    job = _job(backend, **IB)
    assert crd_errors(job, CRDS[backend]) == []
    for c in _trainer_containers(job):
        assert c["resources"]["requests"]["rdma/ib"] == "8" and c["resources"]["limits"]["rdma/ib"] == "8"
        assert c["resources"]["limits"]["nvidia.com/gpu"] == "8"
        assert c["securityContext"]["capabilities"] == {"drop": ["ALL"], "add": ["IPC_LOCK"]}
        assert c["securityContext"]["allowPrivilegeEscalation"] is False
        env = {e["name"]: e.get("value") for e in c["env"]}
        # Whole numbers come back from KFP as doubles: the pods see NCCL's integer.
        assert env["NCCL_IB_HCA"] == "mlx5" and env["NCCL_NSOCKS_PERTHREAD"] == "4" and env["NCCL_DEBUG"] == "WARN"


@pytest.mark.parametrize("backend", ["pytorchjob", "trainjob"])
def test_by_default_the_pods_request_no_device_and_keep_every_capability_dropped(backend):
    job = _job(backend)
    assert crd_errors(job, CRDS[backend]) == []
    for c in _trainer_containers(job):
        assert set(c["resources"]["limits"]) == {"cpu", "memory", "nvidia.com/gpu"}
        assert c["securityContext"]["capabilities"] == {"drop": ["ALL"]}


def test_trainer_v2_1_cannot_add_ipc_lock_and_says_what_to_do():
    assert crd_errors(_job("trainjob", TRAINER_V2_2, **IB), CRDS["trainjob"]) == []
    with pytest.raises(ValueError, match=r"^ipc_lock=true: Trainer v2.1's podTemplateOverrides cannot set"):
        _job("trainjob", TRAINER_V2_1, **IB)
    job = _job("trainjob", TRAINER_V2_1, **{**IB, "ipc_lock": False})  # the device alone renders for v2.1
    assert job["spec"]["trainer"]["resourcesPerNode"]["limits"]["rdma/ib"] == "8"
