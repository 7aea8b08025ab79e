"""The PyTorchJob manifest (against the real CRD and the operator's webhook rules) and the launcher (against
a fake API server over real HTTP, through the real kubernetes client)."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import yaml

from components import kube
from components.kube import MAX_JOB_NAME, job_name_for
from components.paths import DATA_MOUNT, MODEL_MOUNT
from components.train.launcher.job import run_training_job
from components.train.launcher.pytorchjob import build_pytorchjob
from components.train.launcher.spec import TrainingJobSpec
from tests.fakes.k8s_api import FakeKubeAPI
from tests.helpers.crd_schema import crd_errors

ROOT = Path(__file__).resolve().parents[3]
CRD = "kubeflow.org_pytorchjobs.yaml"
NS = "team-llm"
RUN_ID = "8b0e3f2a-1c2d-4e5f-9a8b-7c6d5e4f3a2b"
NAME = job_name_for(RUN_ID)
MASTER = f"{NAME}-master-0"
JOB_LABELS = {"training.kubeflow.org/job-name": NAME}
DNS1035 = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
FAST = {"poll_seconds": 0.01}


def manifest(**overrides) -> dict:
    kwargs = dict(
        name=NAME,
        namespace=NS,
        image="registry.example/trainer:0.1.0",
        config_path=f"{MODEL_MOUNT}/runs/{RUN_ID}/train/train_config.json",
        num_nodes=2,
        gpus_per_node=8,
        data_pvc="llm-data",
        model_pvc="llm-models",
        hf_token_secret="hf-token",
        node_selector={"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"},
        tolerations=[{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
        labels={"pipelines.kubeflow.org/run-id": RUN_ID},
    )
    return build_pytorchjob(TrainingJobSpec(**{**kwargs, **overrides}))


def containers(job: dict):
    for rtype, spec in job["spec"]["pytorchReplicaSpecs"].items():
        for c in spec["template"]["spec"]["containers"]:
            yield rtype, c


# -- the manifest ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("num_nodes", [1, 2, 4])
def test_manifest_matches_the_crd(num_nodes):
    assert crd_errors(manifest(num_nodes=num_nodes), CRD) == []


def test_crd_check_catches_fields_the_api_server_would_prune():
    job = manifest()
    job["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["containers"][0]["cmd"] = ["torchrun"]
    job["spec"]["runPolicy"]["backoffLimit"] = "1"
    errors = crd_errors(job, CRD)
    assert any("'cmd' was unexpected" in e for e in errors) and any("backoffLimit" in e for e in errors)


@pytest.mark.parametrize("num_nodes", [1, 2])
def test_manifest_passes_the_operator_webhook_rules(num_nodes):
    job = manifest(num_nodes=num_nodes, gpus_per_node=8)
    assert DNS1035.match(job["metadata"]["name"]) and len(job["metadata"]["name"]) <= 63
    specs = job["spec"]["pytorchReplicaSpecs"]
    assert set(specs) <= {"Master", "Worker"} and specs["Master"]["replicas"] == 1
    for spec in specs.values():
        names = [c["name"] for c in spec["template"]["spec"]["containers"]]
        assert "pytorch" in names and all(c.get("image") for c in spec["template"]["spec"]["containers"])
    assert "elasticPolicy" not in job["spec"]  # it would require a Worker spec
    # The operator counts "auto" (its default) as 1 in WORLD_SIZE: must be explicit.
    assert job["spec"]["nprocPerNode"] == "8"


def test_one_node_is_a_lone_master_and_n_nodes_add_workers():
    assert set(manifest(num_nodes=1)["spec"]["pytorchReplicaSpecs"]) == {"Master"}
    assert manifest(num_nodes=4)["spec"]["pytorchReplicaSpecs"]["Worker"]["replicas"] == 3


def test_pods_run_torchrun_on_the_trainer_entry_point_without_a_shell():
    job = manifest(num_nodes=2, gpus_per_node=8)
    config = job["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["containers"][0]["args"][-1]
    for _, c in containers(job):
        assert c["command"] == ["torchrun"]
        assert c["args"] == [
            "--nnodes",
            "2",
            "--nproc_per_node",
            "8",
            "-m",
            "components.train.trainer",
            "--config",
            config,
        ]
        assert all(isinstance(a, str) for a in c["command"] + c["args"])
        assert not {"sh", "bash", "-c", "/bin/sh"} & set(c["command"] + c["args"])


def test_secret_is_referenced_never_inlined(monkeypatch):
    monkeypatch.setenv("HF_TOKEN", "hf_live_secret_value")
    job = manifest(hf_token_secret="my-hf")
    assert "hf_live_secret_value" not in json.dumps(job)
    for _, c in containers(job):
        (token,) = [e for e in c["env"] if e["name"] == "HF_TOKEN"]
        assert "value" not in token
        assert token["valueFrom"] == {"secretKeyRef": {"name": "my-hf", "key": "HF_TOKEN", "optional": True}}


def test_pods_get_gpus_volumes_shm_placement_and_labels():
    job = manifest(gpus_per_node=8, shm_size="32Gi", cpu="32", memory="256Gi")
    assert job["metadata"]["labels"] == {"pipelines.kubeflow.org/run-id": RUN_ID}
    for spec in job["spec"]["pytorchReplicaSpecs"].values():
        tmpl = spec["template"]
        assert tmpl["metadata"]["labels"] == {"pipelines.kubeflow.org/run-id": RUN_ID}
        assert tmpl["metadata"]["annotations"] == {"sidecar.istio.io/inject": "false"}
        pod = tmpl["spec"]
        assert pod["nodeSelector"] == {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}
        assert pod["tolerations"] == [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
        volumes = {v["name"]: v for v in pod["volumes"]}
        c = pod["containers"][0]
        mounts = {m["mountPath"]: volumes[m["name"]] for m in c["volumeMounts"]}
        assert mounts[DATA_MOUNT]["persistentVolumeClaim"] == {"claimName": "llm-data"}
        assert mounts[MODEL_MOUNT]["persistentVolumeClaim"] == {"claimName": "llm-models"}
        assert mounts["/dev/shm"]["emptyDir"] == {"medium": "Memory", "sizeLimit": "32Gi"}
        expected = {"cpu": "32", "memory": "256Gi", "nvidia.com/gpu": "8"}
        assert c["resources"] == {"requests": expected, "limits": expected}
    # When the job fails, pods still running (ranks hung in NCCL, or waiting for a rank that died) are deleted
    # and free their GPUs; the failed pods stay with their logs for the report.
    assert job["spec"]["runPolicy"]["cleanPodPolicy"] == "Running"
    assert {"backoffLimit", "ttlSecondsAfterFinished"} <= set(job["spec"]["runPolicy"])


def test_nccl_defaults_are_overridable():
    env = lambda job: {e["name"]: e.get("value") for e in next(containers(job))[1]["env"]}  # noqa: E731
    assert env(manifest())["NCCL_DEBUG"] == "WARN"
    tuned = env(manifest(nccl_env={"NCCL_DEBUG": "INFO", "NCCL_IB_HCA": "mlx5"}))
    assert tuned["NCCL_DEBUG"] == "INFO" and tuned["NCCL_IB_HCA"] == "mlx5"


def test_run_policy_and_scheduling_are_parameters():
    job = manifest(
        clean_pod_policy="All",
        ttl_seconds_after_finished=600,
        active_deadline_seconds=7200,
        priority_class="llm-training",
        queue_name="team-llm-h100",
    )
    assert crd_errors(job, CRD) == []
    assert job["spec"]["runPolicy"] == {
        "backoffLimit": 0,
        "cleanPodPolicy": "All",
        "ttlSecondsAfterFinished": 600,
        "activeDeadlineSeconds": 7200,
    }
    assert job["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "team-llm-h100"
    for spec in job["spec"]["pytorchReplicaSpecs"].values():
        assert spec["template"]["spec"]["priorityClassName"] == "llm-training"
        assert "kueue.x-k8s.io/queue-name" not in spec["template"]["metadata"]["labels"]  # Kueue reads the job's
    assert "ttlSecondsAfterFinished" not in manifest(ttl_seconds_after_finished=None)["spec"]["runPolicy"]


def test_gang_scheduling_asks_for_all_pods_at_once():
    job = manifest(num_nodes=4, gang_scheduling=True, priority_class="llm-training")
    assert crd_errors(job, CRD) == []
    assert job["spec"]["runPolicy"]["schedulingPolicy"] == {"minAvailable": 4, "priorityClass": "llm-training"}
    assert "schedulingPolicy" not in manifest()["spec"]["runPolicy"]


def test_affinity_is_passed_through():
    affinity = {
        "podAffinity": {
            "preferredDuringSchedulingIgnoredDuringExecution": [
                {
                    "weight": 100,
                    "podAffinityTerm": {
                        "topologyKey": "topology.kubernetes.io/zone",
                        "labelSelector": {"matchLabels": {"training.kubeflow.org/job-name": NAME}},
                    },
                }
            ]
        }
    }
    job = manifest(affinity=affinity)
    assert crd_errors(job, CRD) == []
    assert all(s["template"]["spec"]["affinity"] == affinity for s in job["spec"]["pytorchReplicaSpecs"].values())


def test_elastic_job_is_all_workers_with_a_c10d_rendezvous():
    job = manifest(num_nodes=4, min_nodes=2, max_restarts=5, gang_scheduling=True)
    assert crd_errors(job, CRD) == []
    specs = job["spec"]["pytorchReplicaSpecs"]
    # The webhook requires a Worker spec for an elastic policy.
    assert set(specs) == {"Worker"} and specs["Worker"]["replicas"] == 4
    assert specs["Worker"]["restartPolicy"] == "OnFailure"  # a failed pod restarts and rejoins
    assert job["spec"]["elasticPolicy"] == {"minReplicas": 2, "maxReplicas": 4, "maxRestarts": 5, "rdzvBackend": "c10d"}
    assert job["spec"]["runPolicy"]["backoffLimit"] == 5
    assert job["spec"]["runPolicy"]["schedulingPolicy"] == {"minAvailable": 2}
    assert specs["Worker"]["template"]["spec"]["containers"][0]["args"][:2] == ["--nnodes", "2:4"]


@pytest.mark.parametrize(
    "options,field",
    [
        ({"clean_pod_policy": "Never"}, "clean_pod_policy"),
        ({"ttl_seconds_after_finished": -1}, "ttl_seconds_after_finished"),
        ({"active_deadline_seconds": 0}, "active_deadline_seconds"),
        ({"queue_name": "q", "gang_scheduling": True}, "gang_scheduling"),
        ({"min_nodes": 3}, "min_nodes"),
        ({"min_nodes": 0}, "min_nodes"),
        ({"min_nodes": 1, "max_restarts": -1}, "max_restarts"),
    ],
)
def test_bad_run_policy_is_a_value_error_naming_the_field(options, field):
    with pytest.raises(ValueError, match=field):
        manifest(num_nodes=2, **options)


@pytest.mark.parametrize(
    "field,value",
    [
        ("name", "Bad_Name"),
        ("name", "1job"),
        ("name", "a" * (MAX_JOB_NAME + 1)),
        ("num_nodes", 0),
        ("gpus_per_node", 0),
        ("image", ""),
    ],
)
def test_bad_input_is_a_value_error_naming_the_field(field, value):
    with pytest.raises(ValueError, match=field):
        manifest(**{field: value})


def test_job_name_is_deterministic_and_a_valid_label():
    assert job_name_for(RUN_ID) == job_name_for(RUN_ID) == f"sft-{RUN_ID}"
    for run_id in [RUN_ID, "Run_With.Odd CHARS", "x" * 200, "123-abc", "-leading-"]:
        name = job_name_for(run_id)
        assert DNS1035.match(name) and len(name) <= MAX_JOB_NAME, name
    long_a, long_b = "a" * 100 + "1", "a" * 100 + "2"
    assert job_name_for(long_a) != job_name_for(long_b)  # truncation keeps a hash of the whole id
    assert job_name_for(RUN_ID, prefix="eval").startswith("eval-")
    with pytest.raises(ValueError, match="run_id"):
        job_name_for("///")


# -- the launcher against the fake API server ------------------------------------------------------------


@pytest.fixture(autouse=True)
def short_api_outages(monkeypatch):
    """A scenario mistake must fail in seconds, not after the launcher's five minutes of API retries."""
    monkeypatch.setattr(kube, "API_RETRY_WINDOW_SECONDS", 3.0)


def running_master(api, *lines):
    def step(job):
        if (NS, MASTER) not in api.pods:
            api.add_pod(NS, MASTER, JOB_LABELS)
        api.set_condition(job, "Running", reason="PyTorchJobRunning")
        api.log(NS, MASTER, *lines)

    return step


def logged(api, *lines, pod=MASTER):
    return lambda job: api.log(NS, pod, *lines)


def succeeded(api, *lines):
    def step(job):
        api.log(NS, MASTER, *lines)
        api.set_container_state(NS, MASTER, "terminated", exit_code=0)
        api.set_condition(
            job, "Succeeded", reason="PyTorchJobSucceeded", message=f"PyTorchJob {NAME} is successfully completed."
        )

    return step


def created(api):
    return lambda job: api.set_condition(job, "Created", reason="PyTorchJobCreated")


def stream_lines(out: str, pod: str = MASTER) -> list[str]:
    prefix = f"[{pod}] "
    return [line[len(prefix) :] for line in out.split("\n") if line.startswith(prefix)]


def test_success_streams_every_line_once_and_reports(capsys):
    with FakeKubeAPI() as api:
        api.on_get(
            "pytorchjobs",
            api.steps(
                created(api),
                running_master(api, "loading model", "step 1 loss 2.1"),
                logged(api, "step 2 loss 1.9"),
                lambda job: None,
                succeeded(api, "step 3 loss 1.7", "saved final/"),
            ),
        )
        result = run_training_job(manifest(num_nodes=1), api_client=api.client, **FAST)
        assert len(api.requests_for("POST", "/pytorchjobs")) == 1
    assert result == {
        "name": NAME,
        "namespace": NS,
        "kind": "PyTorchJob",
        "state": "Succeeded",
        "reason": "PyTorchJobSucceeded",
        "message": f"PyTorchJob {NAME} is successfully completed.",
    }
    assert stream_lines(capsys.readouterr().out) == [
        "loading model",
        "step 1 loss 2.1",
        "step 2 loss 1.9",
        "step 3 loss 1.7",
        "saved final/",
    ]


def test_every_pod_of_a_multi_node_job_is_streamed_with_its_name(capsys):
    worker = f"{NAME}-worker-0"

    def both_running(job):
        running_master(api, "rank 0 up")(job)
        api.add_pod(NS, worker, JOB_LABELS)
        api.log(NS, worker, "rank 8 up")

    with FakeKubeAPI() as api:
        api.on_get(
            "pytorchjobs",
            api.steps(
                created(api), both_running, logged(api, "rank 8 done", pod=worker), succeeded(api, "rank 0 done")
            ),
        )
        run_training_job(manifest(num_nodes=2), api_client=api.client, **FAST)
    out = capsys.readouterr().out
    assert stream_lines(out) == ["rank 0 up", "rank 0 done"]
    assert stream_lines(out, worker) == ["rank 8 up", "rank 8 done"]


def test_failed_job_raises_with_the_reason_and_the_master_log_tail():
    def failed(job):
        api.log(NS, MASTER, "Traceback (most recent call last):", "ValueError: dataset_path is not a prepared dataset")
        api.set_container_state(NS, MASTER, "terminated", exit_code=1, reason="Error")
        api.set_condition(
            job,
            "Failed",
            reason="PyTorchJobFailed",
            message=f"PyTorchJob {NAME} is failed because 1 Master replica(s) failed.",
        )

    with FakeKubeAPI() as api:
        api.on_get("pytorchjobs", api.steps(created(api), running_master(api, "loading model"), failed))
        with pytest.raises(RuntimeError) as err:
            run_training_job(manifest(num_nodes=1), api_client=api.client, **FAST)
        # The operator ended it: the job and its pods stay for inspection.
        assert api.requests_for("DELETE") == []
    message = str(err.value)
    assert "PyTorchJobFailed" in message and "1 Master replica(s) failed" in message
    assert "ValueError: dataset_path is not a prepared dataset" in message


def test_unschedulable_pods_fail_fast_with_the_schedulers_message():
    why = "0/4 nodes are available: 4 Insufficient nvidia.com/gpu. preemption: 0/4 nodes are available."
    with FakeKubeAPI() as api:
        api.on_get(
            "pytorchjobs", api.steps(lambda job: api.add_pod(NS, MASTER, JOB_LABELS, unschedulable=why), created(api))
        )
        with pytest.raises(RuntimeError, match="Insufficient nvidia.com/gpu") as err:
            run_training_job(manifest(num_nodes=1), api_client=api.client, pending_timeout_seconds=0.05, **FAST)
        assert len(api.requests_for("DELETE", f"/pytorchjobs/{NAME}")) == 1  # frees what the job holds
    assert MASTER in str(err.value)


def test_unschedulable_is_tolerated_within_the_pending_timeout():
    with FakeKubeAPI() as api:
        api.on_get(
            "pytorchjobs",
            api.steps(
                lambda job: api.add_pod(NS, MASTER, JOB_LABELS, unschedulable="0/4 nodes are available"),
                lambda job: None,
                lambda job: api.schedule_pod(NS, MASTER),  # the autoscaler added a GPU node
                running_master(api, "up"),
                succeeded(api),
            ),
        )
        assert run_training_job(manifest(num_nodes=1), api_client=api.client, **FAST)["state"] == "Succeeded"


@pytest.mark.parametrize("reason", ["ImagePullBackOff", "CreateContainerConfigError", "CrashLoopBackOff"])
def test_container_that_cannot_start_fails_fast(reason):
    message = 'Back-off pulling image "registry.example/trainer:typo"'
    with FakeKubeAPI() as api:
        api.on_get(
            "pytorchjobs",
            api.steps(
                lambda job: api.add_pod(NS, MASTER, JOB_LABELS, state="waiting", reason=reason, message=message),
                lambda job: None,
            ),
        )
        with pytest.raises(RuntimeError, match=reason) as err:
            run_training_job(manifest(num_nodes=1), api_client=api.client, **FAST)
        assert len(api.requests_for("DELETE", f"/pytorchjobs/{NAME}")) == 1
    assert message in str(err.value)


def test_existing_job_is_re_attached_not_duplicated(capsys):
    with FakeKubeAPI() as api:
        existing = api.put_object("kubeflow.org", "v1", "pytorchjobs", manifest(num_nodes=1))
        api.on_get("pytorchjobs", api.steps(running_master(api, "resumed watching"), succeeded(api)))
        result = run_training_job(manifest(num_nodes=1), api_client=api.client, **FAST)
        assert len(api.requests_for("POST", "/pytorchjobs")) == 1  # answered 409 AlreadyExists
        stored = api.get_object("kubeflow.org", "v1", "pytorchjobs", NS, NAME)
        assert stored["metadata"]["uid"] == existing["metadata"]["uid"]
    assert result["state"] == "Succeeded"
    assert "re-attaching" in capsys.readouterr().out


def test_transient_api_errors_are_retried():
    with FakeKubeAPI() as api:
        api.fail_next(2, status=503, method="POST")
        api.fail_next(3, status=500, method="GET", path_contains=f"/pytorchjobs/{NAME}")
        api.drop_next(4, method="GET", path_contains="/pods")
        api.fail_next(2, status=429, method="GET", path_contains="/log")
        api.on_get("pytorchjobs", api.steps(created(api), running_master(api, "a"), succeeded(api, "b")))
        result = run_training_job(manifest(num_nodes=1), api_client=api.client, **FAST)
        assert len(api.requests_for("POST", "/pytorchjobs")) == 3
        assert len(api.requests_for("GET", "/pods")) >= 4
    assert result["state"] == "Succeeded"


def test_a_dropped_create_response_re_attaches_to_the_job_it_created():
    with FakeKubeAPI() as api:
        api.on_get("pytorchjobs", api.steps(running_master(api, "a"), succeeded(api)))
        real_handle = api.handle

        def create_then_drop(method, path, query, body, content_type):
            answer = real_handle(method, path, query, body, content_type)
            first_post = method == "POST" and len(api.requests_for("POST")) == 1
            return None if first_post else answer  # the create happened, its response was lost

        api.handle = create_then_drop
        assert run_training_job(manifest(num_nodes=1), api_client=api.client, **FAST)["state"] == "Succeeded"
        assert len(api.requests_for("POST")) == 2 and len(api.objects) == 1


def test_sigterm_deletes_the_job_then_exits():
    before = signal.getsignal(signal.SIGTERM)
    with FakeKubeAPI() as api:
        api.on_get("pytorchjobs", api.steps(created(api), running_master(api, "training"), lambda job: None))
        timer = threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGTERM))
        timer.start()
        try:
            with pytest.raises(SystemExit) as exit_:
                run_training_job(manifest(num_nodes=1), api_client=api.client, **FAST)
        finally:
            timer.cancel()
        assert exit_.value.code == 128 + signal.SIGTERM
        assert len(api.requests_for("DELETE", f"/pytorchjobs/{NAME}")) == 1
        assert api.get_object("kubeflow.org", "v1", "pytorchjobs", NS, NAME) is None
    assert signal.getsignal(signal.SIGTERM) is before


def test_container_restart_mid_stream_prints_every_line_once(capsys):
    def crash_and_restart(job):
        api.log(NS, MASTER, "a3", "a4 NCCL error")  # written, never fetched before the restart
        api.restart_container(NS, MASTER)
        api.log(NS, MASTER, "b1 resuming from checkpoint-100")

    with FakeKubeAPI() as api:
        api.on_get(
            "pytorchjobs",
            api.steps(
                created(api),
                running_master(api, "a1", "a2"),
                crash_and_restart,
                logged(api, "b2"),
                succeeded(api, "b3"),
            ),
        )
        run_training_job(manifest(num_nodes=1), api_client=api.client, **FAST)
    assert stream_lines(capsys.readouterr().out) == [
        "a1",
        "a2",
        "a3",
        "a4 NCCL error",
        "b1 resuming from checkpoint-100",
        "b2",
        "b3",
    ]


def test_pod_recreated_under_the_same_name_is_followed_afresh(capsys):
    def recreate(job):
        api.add_pod(NS, MASTER, JOB_LABELS)  # new uid, empty log
        api.log(NS, MASTER, "b1")

    with FakeKubeAPI() as api:
        api.on_get("pytorchjobs", api.steps(running_master(api, "a1"), recreate, succeeded(api, "b2")))
        run_training_job(manifest(num_nodes=1), api_client=api.client, **FAST)
    assert stream_lines(capsys.readouterr().out) == ["a1", "b1", "b2"]


def test_timeout_deletes_the_job():
    with FakeKubeAPI() as api:
        api.on_get("pytorchjobs", api.steps(running_master(api, "slow"), lambda job: None))
        with pytest.raises(TimeoutError, match="did not finish"):
            run_training_job(manifest(num_nodes=1), api_client=api.client, timeout_seconds=0.2, **FAST)
        assert len(api.requests_for("DELETE", f"/pytorchjobs/{NAME}")) == 1


@pytest.mark.parametrize(
    "cleanup,deleted_on_success,deleted_on_failure",
    [
        ("keep", False, False),
        ("on-success", True, False),
        ("always", True, True),
    ],
)
def test_cleanup_deletes_finished_jobs_per_policy(cleanup, deleted_on_success, deleted_on_failure):
    def failed(job):
        api.set_container_state(NS, MASTER, "terminated", exit_code=1, reason="Error")
        api.set_condition(job, "Failed", reason="PyTorchJobFailed", message="1 Master replica(s) failed.")

    for end, expect_deleted in ((succeeded, deleted_on_success), (lambda api: failed, deleted_on_failure)):
        with FakeKubeAPI() as api:
            api.on_get("pytorchjobs", api.steps(running_master(api, "x"), end(api)))
            try:
                run_training_job(manifest(num_nodes=1), api_client=api.client, cleanup=cleanup, **FAST)
            except RuntimeError:
                assert end is not succeeded
            assert len(api.requests_for("DELETE", f"/pytorchjobs/{NAME}")) == int(expect_deleted)


def test_unknown_cleanup_policy_fails_before_anything_is_created():
    with FakeKubeAPI() as api:
        with pytest.raises(ValueError, match="cleanup"):
            run_training_job(manifest(num_nodes=1), api_client=api.client, cleanup="sometimes", **FAST)
        assert api.requests == []


@pytest.mark.parametrize("exists", [False, True])
def test_on_created_gets_the_job_once_as_soon_as_it_exists(exists):
    seen = []
    with FakeKubeAPI() as api:
        if exists:
            api.put_object("kubeflow.org", "v1", "pytorchjobs", manifest(num_nodes=1))
        api.on_get(
            "pytorchjobs",
            api.steps(
                lambda job: seen.append("first GET") if not seen else None,
                running_master(api, "a"),
                lambda job: None,
                succeeded(api),
            ),
        )
        run_training_job(manifest(num_nodes=1), api_client=api.client, on_created=seen.append, **FAST)
    assert len(seen) == 2 and seen[0] == "first GET"
    assert seen[1]["metadata"]["name"] == NAME and seen[1]["metadata"]["uid"]


def test_failure_report_shows_the_failing_workers_log_not_the_masters():
    worker = f"{NAME}-worker-0"

    def worker_dies(job):
        api.log(NS, MASTER, "rank 0 waiting in allreduce")
        api.log(NS, worker, "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB")
        api.set_container_state(NS, worker, "terminated", exit_code=1, reason="Error")
        api.set_condition(job, "Failed", reason="PyTorchJobFailed", message="1 Worker replica(s) failed.")

    with FakeKubeAPI() as api:

        def both(job):
            running_master(api, "up")(job)
            api.add_pod(NS, worker, JOB_LABELS)

        api.on_get("pytorchjobs", api.steps(both, worker_dies))
        with pytest.raises(RuntimeError) as err:
            run_training_job(manifest(num_nodes=2), api_client=api.client, **FAST)
    assert f"lines of {worker}" in str(err.value) and "CUDA out of memory" in str(err.value)


def test_failure_without_a_failed_pod_reports_rank_0_of_an_elastic_job():
    workers = [f"{NAME}-worker-{i}" for i in range(2)]

    def up(job):
        for w in workers:
            api.add_pod(NS, w, JOB_LABELS)
            api.log(NS, w, f"{w}: step 1200/5000")
        api.set_condition(job, "Running")

    def deadline(job):
        api.set_condition(
            job, "Failed", reason="DeadlineExceeded", message="Job was active longer than specified deadline"
        )

    with FakeKubeAPI() as api:
        api.on_get("pytorchjobs", api.steps(up, deadline))
        with pytest.raises(RuntimeError) as err:
            run_training_job(manifest(num_nodes=2, min_nodes=1), api_client=api.client, **FAST)
    assert "DeadlineExceeded" in str(err.value)
    assert f"lines of {workers[0]}:\n{workers[0]}: step 1200/5000" in str(err.value)


# -- the command line ------------------------------------------------------------------------------------


def run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "components.train.launcher", *args], cwd=ROOT, capture_output=True, text=True, timeout=60
    )


CLI = [
    "--run-id",
    RUN_ID,
    "--config-path",
    "/mnt/models/runs/x/train_config.json",
    *["-p", "gpus_per_node=8", "-p", "data_pvc=llm-data", "-p", "model_pvc=llm-models"],
    "--namespace",
    NS,
]


def test_dry_run_prints_the_manifest_and_touches_nothing():
    proc = run_cli(*CLI, "-p", "num_nodes=2", "-p", 'node_selector={"pool": "h100"}', "--dry-run")
    assert proc.returncode == 0, proc.stderr
    job = yaml.safe_load(proc.stdout)
    assert job["metadata"]["name"] == NAME and job["metadata"]["namespace"] == NS
    assert job["spec"]["pytorchReplicaSpecs"]["Worker"]["replicas"] == 1
    assert job["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["nodeSelector"] == {"pool": "h100"}
    assert crd_errors(job, CRD) == []


@pytest.mark.parametrize(
    "bad,field",
    [
        (["-p", "num_nodes=0"], "num_nodes"),
        (["-p", "num_nodes=1", "-p", "tolerations={not json"], "tolerations"),
        (["-p", "num_nodes=1", "-p", "node_selector=[]"], "node_selector"),
    ],
)
def test_bad_input_exits_2_with_one_error_line(bad, field):
    proc = run_cli(*CLI, *bad, "--dry-run")
    assert proc.returncode == 2
    assert proc.stdout == ""
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and field in lines[0]


def test_progress_bars_with_carriage_returns_are_printed_once(capsys):
    # tqdm redraws its bar with "\r" inside one log line; the kubelet timestamps only "\n"-terminated lines.
    # Split on "\r" too and the pieces lose their timestamp, escape de-duplication and repeat on every poll.
    bar = "  0%|          | 0/10 [00:00<?, ?it/s]\r 10%|#         | 1/10 [00:01<00:09]\r 20%|##        | 2/10"
    with FakeKubeAPI() as api:
        api.on_get(
            "pytorchjobs",
            api.steps(
                created(api),
                running_master(api, "loading model", bar),
                logged(api, "step 2 loss 1.9"),
                lambda job: None,
                lambda job: None,
                succeeded(api, "done"),
            ),
        )
        run_training_job(manifest(num_nodes=1), api_client=api.client, **FAST)
    assert stream_lines(capsys.readouterr().out) == ["loading model", bar, "step 2 loss 1.9", "done"]


def test_pods_have_time_to_save_a_checkpoint_when_evicted():
    # On eviction or preemption the kubelet sends SIGTERM, then SIGKILL after the grace period (30 s by
    # default); the trainer saves a complete checkpoint on SIGTERM, which for Qwen3-30B-A3B takes minutes.
    # torchrun kills its ranks 30 s after forwarding SIGTERM unless told otherwise: it must wait longer,
    # but end before the kubelet's SIGKILL.
    job = manifest(num_nodes=2)
    for rtype, spec in job["spec"]["pytorchReplicaSpecs"].items():
        grace = spec["template"]["spec"]["terminationGracePeriodSeconds"]
        (container,) = spec["template"]["spec"]["containers"]
        env = {e["name"]: e.get("value") for e in container["env"]}
        assert grace >= 600, rtype
        assert 300 <= int(env["TORCH_ELASTIC_SHUTDOWN_TIMEOUT"]) < grace, rtype
