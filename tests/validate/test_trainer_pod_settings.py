"""The trainer pod's resource settings and the TrainJob's runtime, as validate_inputs' rules check them before any
GPU is requested: each bad value is one error naming the setting (and, for the memory limit, the checkpoint budget
of docs/memory.md#the-trainer-pod)."""

from __future__ import annotations

import pytest

from components.validate.rules import check
from pipelines import params as P


def cluster(**over) -> dict:
    return {**P.resolve("qwen3-30b-a3b-full"), **over}


def test_todays_pod_and_the_user_guides_pod_pass():
    assert check(cluster()) == []
    guide = dict(trainer_cpu_request="8", trainer_memory_request="96Gi", trainer_shm_size="32Gi")
    assert check(cluster(**guide)) == []
    assert check(cluster(train_backend="trainjob", trainjob_runtime="torch-distributed-h100", **guide)) == []


def test_a_memory_limit_below_the_checkpoint_budget_is_one_error_naming_the_setting_and_the_figure():
    (error,) = check(cluster(trainer_memory_request="96Gi", trainer_memory_limit="96Gi"))
    assert error.startswith("trainer_memory_limit=96Gi is below the ~110 GB (103Gi) a trainer pod of 8 ranks")
    assert "set trainer_memory_limit to at least 103Gi" in error
    assert check(cluster(trainer_memory_request="103Gi", trainer_memory_limit="103Gi")) == []


def test_the_budget_is_per_rank():
    # 4 ranks hold half of what 8 do (~55 GB): 64Gi is enough for them, not for 8.
    small = dict(gpus_per_node=4, trainer_memory_request="64Gi", trainer_memory_limit="64Gi", trainer_shm_size="16Gi")
    assert "trainer_memory_limit=64Gi" not in " ".join(check(cluster(**small)))
    assert "trainer_memory_limit=64Gi" in " ".join(check(cluster(**{**small, "gpus_per_node": 8})))


@pytest.mark.parametrize(
    "over,setting,says",
    [
        ({"trainer_cpu_request": "32"}, "trainer_cpu_request", "trainer_cpu_request=32 is above trainer_cpu_limit=16"),
        (
            {"trainer_memory_request": "160Gi"},
            "trainer_memory_request",
            "trainer_memory_request=160Gi is above trainer_memory_limit=128Gi",
        ),
        ({"trainer_shm_size": "200Gi"}, "trainer_shm_size", "trainer_shm_size=200Gi is above trainer_memory_limit"),
        ({"trainer_memory_limit": "lots"}, "trainer_memory_limit", "is not a positive Kubernetes quantity"),
        ({"trainer_cpu_limit": "0"}, "trainer_cpu_limit", "is not a positive Kubernetes quantity"),
        (
            {"train_backend": "trainjob", "trainjob_runtime": "Torch_Distributed"},
            "trainjob_runtime",
            "not a valid Kubernetes ClusterTrainingRuntime name",
        ),
    ],
)
def test_each_bad_value_is_one_error_naming_the_setting(over, setting, says):
    (error,) = check(cluster(**over))
    assert error.startswith(setting) and says in error


def test_gang_scheduling_with_the_trainjob_backend_is_left_to_preflight():
    # Trainer v2 gang-schedules through the runtime's podGroupPolicy, which only the cluster can tell
    # (tests/validate/test_preflight_runtime.py); Kueue and gang scheduling still exclude each other.
    assert check(cluster(train_backend="trainjob", gang_scheduling=True)) == []
    (error,) = check(cluster(train_backend="trainjob", gang_scheduling=True, queue_name="team-llm"))
    assert "queue_name and gang_scheduling" in error
