"""The Trainer v2 TrainJob (against the real CRD and the torch-distributed runtime) and the launcher following
it (against the fake API server, through the real kubernetes client)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import yaml

from components import kube
from components.kube import job_name_for
from components.paths import DATA_MOUNT, MODEL_MOUNT
from components.train.launcher.job import run_training_job
from components.train.launcher.pytorchjob import pytorchjob_for_run
from components.train.launcher.spec import TrainingJobSpec
from components.train.launcher.trainjob import build_trainjob, trainjob_for_run
from tests.fakes.k8s_api import FakeKubeAPI
from tests.helpers.crd_schema import crd_errors
from tests.helpers.repo import REFERENCE

ROOT = Path(__file__).resolve().parents[3]
CRD = "trainer.kubeflow.org_trainjobs.yaml"
NS = "team-llm"
RUN_ID = "8b0e3f2a-1c2d-4e5f-9a8b-7c6d5e4f3a2b"
NAME = job_name_for(RUN_ID)
GROUP, VERSION, PLURAL = "trainer.kubeflow.org", "v1alpha1", "trainjobs"
FAST = {"poll_seconds": 0.01}
RUN_ARGS = dict(
    run_id=RUN_ID,
    namespace=NS,
    config_path=f"{MODEL_MOUNT}/runs/{RUN_ID}/train/train_config.json",
    trainer_image="registry.example/trainer:0.1.0",
    num_nodes=2,
    gpus_per_node=8,
    data_pvc="llm-data",
    model_pvc="llm-models",
    hf_token_secret="hf-token",
    node_selector={"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"},
    tolerations=[{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
)


def manifest(**overrides) -> dict:
    return trainjob_for_run(**{**RUN_ARGS, **overrides})


def pod_patch(job: dict) -> dict:
    (patch,) = job["spec"]["runtimePatches"]
    (node,) = patch["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"]
    assert node["name"] == "node"
    return node["template"]["spec"]["template"]


# -- the manifest ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("num_nodes", [1, 2, 4])
def test_manifest_matches_the_crd(num_nodes):
    assert crd_errors(manifest(num_nodes=num_nodes), CRD) == []


def test_options_match_the_crd():
    job = manifest(
        active_deadline_seconds=7200,
        queue_name="team-llm-h100",
        affinity={"nodeAffinity": {}},
        nccl_env={"NCCL_IB_HCA": "mlx5"},
        shm_size="32Gi",
    )
    assert crd_errors(job, CRD) == []
    assert job["spec"]["activeDeadlineSeconds"] == 7200
    assert job["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "team-llm-h100"


def test_crd_check_catches_a_field_the_trainjob_does_not_have():
    job = manifest()
    job["spec"]["podTemplateOverrides"] = [{"targetJobs": [{"name": "node"}]}]  # not in this CRD version
    assert any("podTemplateOverrides" in e for e in crd_errors(job, CRD))


def test_trainjob_runs_the_same_command_and_pods_as_the_pytorchjob():
    trainjob, pytorchjob = manifest(), pytorchjob_for_run(**RUN_ARGS)
    master = pytorchjob["spec"]["pytorchReplicaSpecs"]["Master"]["template"]
    (container,) = master["spec"]["containers"]
    trainer = trainjob["spec"]["trainer"]
    assert trainjob["spec"]["runtimeRef"] == {"name": "torch-distributed"}
    assert trainer["numNodes"] == 2 and trainer["numProcPerNode"] == 8
    for key in ("image", "command", "args", "env"):
        assert trainer[key] == container[key], key
    assert trainer["resourcesPerNode"] == container["resources"]
    pod = pod_patch(trainjob)
    assert pod["metadata"] == master["metadata"]  # run-id label, Istio off
    for key in ("nodeSelector", "tolerations", "volumes", "securityContext"):
        assert pod["spec"][key] == master["spec"][key], key
    (node,) = pod["spec"]["containers"]
    assert node == {
        "name": "node",
        "volumeMounts": container["volumeMounts"],
        "securityContext": container["securityContext"],
    }
    mounts = {m["mountPath"] for m in node["volumeMounts"]}
    assert {DATA_MOUNT, MODEL_MOUNT, "/dev/shm"} <= mounts
    assert not {"sh", "bash", "-c"} & set(trainer["command"] + trainer["args"])


def test_patches_target_the_runtimes_replicated_job_and_container():
    """runtimePatches merge by name: they must name what torch-distributed really has."""
    text = (REFERENCE / "runtimes" / "runtime_torch_distributed.yaml").read_text()
    runtime = yaml.safe_load("\n".join(line for line in text.splitlines() if "{{" not in line))
    assert runtime["metadata"]["name"] == manifest()["spec"]["runtimeRef"]["name"]
    (rjob,) = runtime["spec"]["template"]["spec"]["replicatedJobs"]
    containers = [c["name"] for c in rjob["template"]["spec"]["template"]["spec"]["containers"]]
    pod = pod_patch(manifest())
    assert rjob["name"] == "node" and [c["name"] for c in pod["spec"]["containers"]] == containers == ["node"]


def test_secret_is_referenced_never_inlined(monkeypatch):
    monkeypatch.setenv("HF_TOKEN", "hf_live_secret_value")
    job = manifest(hf_token_secret="my-hf")
    assert "hf_live_secret_value" not in json.dumps(job)
    (token,) = [e for e in job["spec"]["trainer"]["env"] if e["name"] == "HF_TOKEN"]
    assert token == {
        "name": "HF_TOKEN",
        "valueFrom": {"secretKeyRef": {"name": "my-hf", "key": "HF_TOKEN", "optional": True}},
    }


@pytest.mark.parametrize(
    "field,value",
    [
        ("num_nodes", 0),
        ("gpus_per_node", 0),
        ("trainer_image", ""),
        ("runtime", ""),
        ("active_deadline_seconds", 0),
    ],
)
def test_bad_input_is_a_value_error_naming_the_field(field, value):
    with pytest.raises(ValueError, match=field.replace("trainer_", "")):
        manifest(**{field: value})


def test_bad_name_is_a_value_error():
    with pytest.raises(ValueError, match="name"):
        build_trainjob(
            TrainingJobSpec(
                **{k: v for k, v in RUN_ARGS.items() if k not in ("run_id", "trainer_image")},
                name="Bad_Name",
                image="x",
                labels={},
            )
        )


# -- the launcher ----------------------------------------------------------------------------------------


@pytest.fixture(autouse=True)
def short_api_outages(monkeypatch):
    monkeypatch.setattr(kube, "API_RETRY_WINDOW_SECONDS", 3.0)


def node_pod(api, rank: int, *lines, **kwargs) -> str:
    """A JobSet pod: generated name, the JobSet's labels, container ``node``."""
    name = f"{NAME}-node-0-{rank}-x{rank}k9z"
    api.add_pod(
        NS,
        name,
        {
            "jobset.sigs.k8s.io/jobset-name": NAME,
            "jobset.sigs.k8s.io/replicatedjob-name": "node",
            "batch.kubernetes.io/job-completion-index": str(rank),
        },
        container="node",
        **kwargs,
    )
    if lines:
        api.log(NS, name, *lines)
    return name


def test_success_streams_rank_0_first_and_reports(capsys):
    def running(job):
        node_pod(api, 1, "rank 8 up")
        node_pod(api, 0, "rank 0 up")
        api.set_condition(job, "Created", reason="JobsCreationSucceeded")

    def complete(job):
        api.set_container_state(NS, f"{NAME}-node-0-0-x0k9z", "terminated", exit_code=0)
        api.set_condition(job, "Complete", reason="JobSetCompleted", message="jobset completed successfully")

    with FakeKubeAPI() as api:
        api.on_get(PLURAL, api.steps(running, complete))
        result = run_training_job(manifest(), api_client=api.client, **FAST)
        assert len(api.requests_for("POST", f"/{PLURAL}")) == 1
        assert api.requests_for("GET", "/pods")[0].query["labelSelector"] == [f"jobset.sigs.k8s.io/jobset-name={NAME}"]
    assert result == {
        "name": NAME,
        "namespace": NS,
        "kind": "TrainJob",
        "state": "Complete",
        "reason": "JobSetCompleted",
        "message": "jobset completed successfully",
    }
    streamed = [line for line in capsys.readouterr().out.splitlines() if line.startswith("[")]
    assert streamed == [f"[{NAME}-node-0-0-x0k9z] rank 0 up", f"[{NAME}-node-0-1-x1k9z] rank 8 up"]


def test_failure_raises_with_the_reason_and_the_failing_pods_log():
    def failed(job):
        pod = node_pod(api, 1, "Traceback (most recent call last):", "RuntimeError: NCCL timeout")
        api.set_container_state(NS, pod, "terminated", exit_code=1, reason="Error")
        api.set_condition(job, "Failed", reason="JobSetFailed", message="jobset failed: node-0 failed")

    with FakeKubeAPI() as api:
        api.on_get(PLURAL, api.steps(lambda job: node_pod(api, 0, "up"), failed))
        with pytest.raises(RuntimeError) as err:
            run_training_job(manifest(), api_client=api.client, cleanup="on-success", **FAST)
        assert api.requests_for("DELETE") == []  # kept for inspection
    assert "TrainJob team-llm/" in str(err.value) and "JobSetFailed" in str(err.value)
    assert "RuntimeError: NCCL timeout" in str(err.value) and "node-0-1" in str(err.value)


def test_image_pull_error_fails_fast_and_deletes_the_job():
    with FakeKubeAPI() as api:
        api.on_get(
            PLURAL,
            api.steps(lambda job: node_pod(api, 0, state="waiting", reason="ErrImagePull", message="manifest unknown")),
        )
        with pytest.raises(RuntimeError, match="ErrImagePull: manifest unknown"):
            run_training_job(manifest(), api_client=api.client, **FAST)
        assert len(api.requests_for("DELETE", f"/{PLURAL}/{NAME}")) == 1


def test_existing_trainjob_is_re_attached_and_cleaned_up_after_success(capsys):
    with FakeKubeAPI() as api:
        existing = api.put_object(GROUP, VERSION, PLURAL, manifest())
        api.on_get(PLURAL, api.steps(lambda job: api.set_condition(job, "Complete")))
        run_training_job(manifest(), api_client=api.client, cleanup="on-success", **FAST)
        # 409, then a read of the existing job (live, or being deleted?), the poll that sees it Complete, the clean-up.
        assert [r.method for r in api.requests if PLURAL in r.path] == ["POST", "GET", "GET", "DELETE"]
        assert api.get_object(GROUP, VERSION, PLURAL, NS, NAME) is None
    assert existing["metadata"]["uid"] and "re-attaching" in capsys.readouterr().out


def test_sigterm_deletes_the_trainjob():
    with FakeKubeAPI() as api:
        api.on_get(PLURAL, api.steps(lambda job: node_pod(api, 0, "training"), lambda job: None))
        timer = threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGTERM))
        timer.start()
        try:
            with pytest.raises(SystemExit):
                run_training_job(manifest(), api_client=api.client, **FAST)
        finally:
            timer.cancel()
        assert api.get_object(GROUP, VERSION, PLURAL, NS, NAME) is None


def test_unknown_kind_is_refused_before_any_request():
    with FakeKubeAPI() as api:
        with pytest.raises(ValueError, match="MPIJob"):
            run_training_job({**manifest(), "kind": "MPIJob"}, api_client=api.client, **FAST)
        assert api.requests == []


# -- the command line ------------------------------------------------------------------------------------

CLI = [
    "--run-id",
    RUN_ID,
    "--config-path",
    "/mnt/models/runs/x/train_config.json",
    *["-p", "gpus_per_node=8", "-p", "data_pvc=llm-data", "-p", "model_pvc=llm-models"],
    "--namespace",
    NS,
    *["-p", "num_nodes=2"],
]


def run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "components.train.launcher", *args], cwd=ROOT, capture_output=True, text=True, timeout=60
    )


def test_dry_run_prints_the_trainjob():
    proc = run_cli(*CLI, "-p", "train_backend=trainjob", "-p", "queue_name=h100", "--dry-run")
    assert proc.returncode == 0, proc.stderr
    job = yaml.safe_load(proc.stdout)
    assert job["kind"] == "TrainJob" and job["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "h100"
    assert crd_errors(job, CRD) == []


def test_pytorchjob_only_settings_are_refused_for_a_trainjob():
    proc = run_cli(*CLI, "-p", "train_backend=trainjob", "-p", "min_nodes=1", "--dry-run")
    assert proc.returncode == 2 and proc.stderr.startswith("error: min_nodes with train_backend=trainjob")


def test_pods_have_time_to_save_a_checkpoint_when_evicted():
    # As for the PyTorchJob (tests/test_pytorchjob.py): the grace period goes into the runtime patch.
    job = manifest(num_nodes=2)
    grace = pod_patch(job)["spec"]["terminationGracePeriodSeconds"]
    env = {e["name"]: e.get("value") for e in job["spec"]["trainer"]["env"]}
    assert grace >= 600 and 300 <= int(env["TORCH_ELASTIC_SHUTDOWN_TIMEOUT"]) < grace
    assert crd_errors(job, CRD) == []
