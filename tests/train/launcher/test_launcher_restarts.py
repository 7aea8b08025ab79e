"""The launcher re-runs a job that failed for a retriable cause and fails at once on a deterministic one,
against the fake API server (which fails the way clusters do) through the real kubernetes client.

Every scenario is a 2-node PyTorchJob (Master + Worker 0) unless it says otherwise; the pods are the
operator's (owned by the job, so deleting the job removes them) and come back under the same names.
"""

from __future__ import annotations

import pytest
from kubernetes import client as k8s

from components import kube
from components.kube import job_name_for
from components.train.launcher import job as launch
from components.train.launcher.job import RESTARTS_ANNOTATION, run_training_job
from components.train.launcher.pytorchjob import build_pytorchjob
from components.train.launcher.spec import TrainingJobSpec
from components.train.launcher.trainjob import trainjob_for_run
from tests.fakes.k8s_api import FakeKubeAPI

NS = "team-llm"
RUN_ID = "8b0e3f2a-1c2d-4e5f-9a8b-7c6d5e4f3a2b"
NAME = job_name_for(RUN_ID)
MASTER, WORKER = f"{NAME}-master-0", f"{NAME}-worker-0"
JOB_LABELS = {"training.kubeflow.org/job-name": NAME}
WHAT = f"PyTorchJob {NS}/{NAME}"
FAST = {"poll_seconds": 0.01}

# What the ranks print when a peer is gone: torch's own lines (ProcessGroupNCCL, c10d, torchrun).
WATCHDOG = (
    "[rank0]:[E1218 20:27:21.426415540 ProcessGroupNCCL.cpp:629] [Rank 0] Watchdog caught collective "
    "operation timeout: WorkNCCL(SeqNum=2201, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, "
    "Timeout(ms)=600000) ran for 600081 milliseconds before timing out."
)
NCCL_REMOTE = [
    "torch.distributed.DistBackendError: NCCL error in: ../torch/csrc/distributed/c10d/"
    "ProcessGroupNCCL.cpp:1970, remote process exited or there was a network error, NCCL version 2.21.5",
    "ncclRemoteError: A call failed possibly due to a network error or a remote process exiting prematurely.",
]
STORE_RESET = (
    "[rank8]: torch.distributed.DistBackendError: [8] is setting up NCCL communicator and retrieving "
    "ncclUniqueId from [0] via c10d key-value store by key '0', but store->get('0') got error: "
    "Connection reset by peer"
)
CLIENT_TIMEOUT = (
    f"torch.distributed.DistNetworkError: The client socket has timed out after 900000ms while "
    f"trying to connect to ({MASTER}, 23456)."
)


def torchrun_summary(exitcode: str) -> list[str]:
    """The end of torchrun's log when a local rank failed (its ChildFailedError report)."""
    return [
        "Traceback (most recent call last):",
        '  File "/usr/local/bin/torchrun", line 8, in <module>',
        "torch.distributed.elastic.multiprocessing.errors.ChildFailedError: ",
        "============================================================",
        "components.train.trainer FAILED",
        "Root Cause (first observed failure):",
        "[0]:",
        "  rank      : 0 (local_rank: 0)",
        f"  exitcode  : {exitcode} (pid: 311)",
        "  error_file: <N/A>",
        "============================================================",
    ]


DATALOADER_OOM = [
    "Traceback (most recent call last):",
    '  File "/usr/local/lib/python3.11/site-packages/components/train/trainer/sft.py", line 212, in main',
    "    for step, batch in enumerate(loader):",
    "RuntimeError: DataLoader worker (pid 2351) is killed by signal: Killed.",
]


@pytest.fixture(autouse=True)
def short_api_outages(monkeypatch):
    monkeypatch.setattr(kube, "API_RETRY_WINDOW_SECONDS", 3.0)


def manifest(**overrides) -> dict:
    kwargs = dict(
        name=NAME,
        namespace=NS,
        image="registry.example/trainer:0.1.0",
        config_path=f"/mnt/models/runs/{RUN_ID}/train/train_config.json",
        num_nodes=2,
        gpus_per_node=8,
        data_pvc="llm-data",
        model_pvc="llm-models",
        hf_token_secret="hf-token",
        node_selector={},
        tolerations=[],
        labels={},
    )
    return build_pytorchjob(TrainingJobSpec(**{**kwargs, **overrides}))


# -- the operator and the cluster, as scenario steps ----------------------------------------------------------


def pods_up(api, *lines):
    """The operator creates the job's pods (same names every time, new uids), they run and log ``lines``."""

    def step(job):
        for pod in (MASTER, WORKER):
            api.add_pod(NS, pod, JOB_LABELS, owner=job)
            api.log(NS, pod, *lines)
        api.set_condition(job, "Created", reason="PyTorchJobCreated")
        api.set_condition(job, "Running", reason="PyTorchJobRunning", message=f"PyTorchJob {NAME} is running.")

    return step


def operator_fails(job, replica_type: str = "Worker"):
    """The operator's Failed condition for a static job (restartPolicy Never) whose pod failed."""
    FakeKubeAPI.set_condition(
        job,
        "Failed",
        reason="PyTorchJobFailed",
        message=f"PyTorchJob {NAME} is failed because 1 {replica_type} replica(s) failed.",
    )


def rank_died(api, pod, *lines, exit_code=1, reason="Error"):
    api.log(NS, pod, *lines)
    api.set_container_state(NS, pod, "terminated", exit_code=exit_code, reason=reason)


def succeeded(api, *lines):
    def step(job):
        for pod in (MASTER, WORKER):
            api.log(NS, pod, *lines)
            api.set_container_state(NS, pod, "terminated", exit_code=0)
        api.set_condition(
            job, "Succeeded", reason="PyTorchJobSucceeded", message=f"PyTorchJob {NAME} is successfully completed."
        )

    return step


def evicted(api):
    def step(job):
        api.evict_pod(NS, WORKER)
        rank_died(api, MASTER, WATCHDOG, *torchrun_summary("-6"))  # a bystander: its peer vanished
        operator_fails(job)

    return step


# A scenario: ``scenario(api)`` gives the steps from running pods to the job's Failed condition.


def evicted_scenario(api):
    return [evicted(api)]


def preempted_then_gone(api):
    """The scheduler preempts Worker 0; by the time the job reads Failed, the pod object is gone."""
    return [
        lambda job: api.preempt_pod(NS, WORKER),
        lambda job: (api.remove_pod(NS, WORKER), rank_died(api, MASTER, *NCCL_REMOTE), operator_fails(job)),
    ]


def disrupted(condition_reason, message, pod_reason=""):
    def scenario(api):
        def step(job):
            api.disrupt_pod(NS, WORKER, condition_reason, message, pod_reason=pod_reason)
            rank_died(api, MASTER, WATCHDOG)
            operator_fails(job)

        return [step]

    return scenario


def all_ranks_log(*lines):
    def scenario(api):
        def step(job):
            for pod in (WORKER, MASTER):
                rank_died(api, pod, *lines, *torchrun_summary("1"))
            operator_fails(job, "Master")

        return [step]

    return scenario


def stopped_by_sigterm(api):
    """Worker 0 was deleted without a DisruptionTarget condition (kubectl delete pod, a drain on an older cluster):
    torchrun got SIGTERM, the trainer saved a checkpoint, and torchrun exited 1, as torch 2.13's does."""

    def step(job):
        rank_died(
            api,
            WORKER,
            "stopped by SIGTERM at step 120 of 400; checkpoint-120 is complete",
            "W1123 05:31:02.123000 1 torch/distributed/elastic/agent/server/api.py:753] Received "
            "Signals.SIGTERM death signal, shutting down workers",
            "torch.distributed.elastic.multiprocessing.api.SignalException: Process 1 got signal: 15",
        )
        rank_died(api, MASTER, WATCHDOG, *torchrun_summary("1"))
        operator_fails(job)

    return [step]


def master_stopped_first(api):
    """Worker 0 got SIGTERM (a soft eviction or a drain); the ranks agreed to save at the next step end and stop, and
    the Master's pod ended first: the operator fails the job on the Master while the Worker still runs, and the
    Master's log ends with torchrun's report of a rank that exited 143 (the trainer's exit status after a SIGTERM
    save, trainer/checkpoints.py), its "stopped by SIGTERM" warning further up than the tail (seen in the soft-eviction
    rehearsal: tests/train/launcher/test_rehearsal.py)."""

    def step(job):
        rank_died(api, MASTER, *torchrun_summary("143"))
        operator_fails(job, "Master")

    return [step]


def restarts_of(job: dict | None) -> str | None:
    return ((job or {}).get("metadata", {}).get("annotations") or {}).get(RESTARTS_ANNOTATION)


# -- retriable: the job is deleted, gone, created again under its name, and resumes -----------------------------

RETRIABLE = {
    "evicted": (evicted_scenario, f"pod {WORKER} was Evicted: The node was low on resource: memory."),
    "preempted": (
        preempted_then_gone,
        f"pod {WORKER} was disrupted (PreemptionByScheduler): default-scheduler: preempting to "
        "accommodate a higher priority pod",
    ),
    "node shutdown": (
        disrupted(
            "TerminationByKubelet", "Pod was terminated in response to imminent node shutdown.", pod_reason="Terminated"
        ),
        f"pod {WORKER} was Terminated: Pod was terminated in response to imminent node shutdown.",
    ),
    "node lost, no disruption condition": (
        disrupted(None, f"Node gpu-7 which was running pod {WORKER} is unresponsive", pod_reason="NodeLost"),
        f"pod {WORKER} was NodeLost: Node gpu-7 which was running pod {WORKER} is unresponsive",
    ),
    "node deleted": (
        disrupted("DeletionByPodGC", "PodGC: node no longer exists"),
        f"pod {WORKER} was disrupted (DeletionByPodGC): PodGC: node no longer exists",
    ),
    "node tainted": (
        disrupted("DeletionByTaintManager", "Taint manager: deleting due to NoExecute taint"),
        f"pod {WORKER} was disrupted (DeletionByTaintManager)",
    ),
    "NCCL error": (
        all_ranks_log(*NCCL_REMOTE),
        f"pod {MASTER} lost contact with its peers: torch.distributed.DistBackendError: NCCL error in:",
    ),
    "watchdog timeout": (all_ranks_log(WATCHDOG), "Watchdog caught collective operation timeout"),
    "c10d store reset": (all_ranks_log(STORE_RESET), "got error: Connection reset by peer"),
    "rendezvous": (all_ranks_log(CLIENT_TIMEOUT), "DistNetworkError: The client socket has timed out"),
    "stopped by SIGTERM": (stopped_by_sigterm, f"pod {WORKER} was stopped by SIGTERM (deleted or drained)"),
    "a rank stopped on a peer's SIGTERM": (
        master_stopped_first,
        f"pod {MASTER} was stopped by SIGTERM (deleted or drained): exitcode  : 143",
    ),
}


@pytest.mark.parametrize("cause", RETRIABLE)
def test_retriable_failure_re_runs_the_job_under_its_name_and_it_resumes(cause, capsys):
    failure, why = RETRIABLE[cause]
    with FakeKubeAPI() as api:
        api.on_get(
            "pytorchjobs",
            api.steps(
                pods_up(api, "step 100/400 loss 1.52", "saved checkpoint-100"),
                *failure(api),
                pods_up(api, "resuming from checkpoint-100"),
                succeeded(api, "step 400/400 loss 1.21"),
            ),
        )
        result = run_training_job(manifest(), api_client=api.client, **FAST)
        posts = api.requests_for("POST", "/pytorchjobs")
        (delete,) = api.requests_for("DELETE", f"/pytorchjobs/{NAME}")
        stored = api.get_object("kubeflow.org", "v1", "pytorchjobs", NS, NAME)
    assert result["state"] == "Succeeded"
    # Same name, so the trainer finds its run folder; the restart is counted on the job itself.
    assert [p.body["metadata"]["name"] for p in posts] == [NAME, NAME]
    assert [restarts_of(p.body) for p in posts] == ["0", "1"] and restarts_of(stored) == "1"
    # Foreground: the job is gone only once its pods are, so their GPUs are free for the new pods.
    assert delete.body["propagationPolicy"] == "Foreground"
    out = capsys.readouterr().out
    (line,) = [ln for ln in out.splitlines() if ln.startswith("re-running")]
    assert line.startswith(f"re-running {WHAT} (restart 1/2): ") and why in line, line
    assert f"[{MASTER}] resuming from checkpoint-100" in out


def test_re_run_waits_until_the_api_server_reports_the_old_job_gone(capsys):
    with FakeKubeAPI() as api:
        api.deletion_gets = 5
        api.on_get("pytorchjobs", api.steps(pods_up(api, "up"), evicted(api), pods_up(api, "again"), succeeded(api)))
        run_training_job(manifest(), api_client=api.client, **FAST)
        log = [(r.method, r.path) for r in api.requests if "/pytorchjobs" in r.path]
    delete_at = log.index(("DELETE", f"/apis/kubeflow.org/v1/namespaces/{NS}/pytorchjobs/{NAME}"))
    create_at = [i for i, (m, _) in enumerate(log) if m == "POST"][1]
    # Five GETs see it still there (deletionTimestamp set), the sixth a 404; only then the create, and only one.
    assert [m for m, _ in log[delete_at + 1 : create_at]] == ["GET"] * 6
    assert len([m for m, _ in log if m == "POST"]) == 2
    assert f"waiting for {WHAT} to be deleted" in capsys.readouterr().out


def test_a_retriable_failure_is_re_run_job_restarts_times_then_raised(capsys):
    with FakeKubeAPI() as api:
        api.on_get("pytorchjobs", api.steps(*[pods_up(api, "up"), evicted(api)] * 3))
        with pytest.raises(RuntimeError) as err:
            run_training_job(manifest(), api_client=api.client, **FAST)
        assert len(api.requests_for("POST", "/pytorchjobs")) == 3
        assert restarts_of(api.get_object("kubeflow.org", "v1", "pytorchjobs", NS, NAME)) == "2"
    out = capsys.readouterr().out
    assert "(restart 1/2)" in out and "(restart 2/2)" in out and "(restart 3/2)" not in out
    message = str(err.value)
    assert message.startswith(f"{WHAT} failed: PyTorchJobFailed: PyTorchJob {NAME} is failed because 1 Worker")
    assert f"pod {WORKER} was Evicted" in message and "already re-run 2 times (job_restarts=2)" in message


def test_job_restarts_0_never_re_runs():
    with FakeKubeAPI() as api:
        api.on_get("pytorchjobs", api.steps(pods_up(api, "up"), evicted(api)))
        with pytest.raises(RuntimeError, match=r"already re-run 0 times \(job_restarts=0\)"):
            run_training_job(manifest(), api_client=api.client, job_restarts=0, **FAST)
        assert len(api.requests_for("POST")) == 1 and api.requests_for("DELETE") == []


def test_on_created_sees_every_job_created():
    seen = []
    with FakeKubeAPI() as api:
        api.on_get("pytorchjobs", api.steps(pods_up(api, "up"), evicted(api), pods_up(api, "up"), succeeded(api)))
        run_training_job(manifest(), api_client=api.client, on_created=seen.append, **FAST)
    assert [restarts_of(job) for job in seen] == ["0", "1"]
    assert seen[0]["metadata"]["uid"] != seen[1]["metadata"]["uid"]


def test_trainjob_is_re_run_the_same_way(capsys):
    pod = f"{NAME}-node-0-1-x1k9z"
    labels = {"jobset.sigs.k8s.io/jobset-name": NAME, "batch.kubernetes.io/job-completion-index": "1"}

    def up(job):
        api.add_pod(NS, pod, labels, container="node", owner=job)
        api.log(NS, pod, "step 10")

    def preempted(job):
        api.preempt_pod(NS, pod)
        api.set_condition(job, "Failed", reason="JobSetFailed", message="jobset failed: node-0 failed")

    job = trainjob_for_run(
        run_id=RUN_ID,
        namespace=NS,
        config_path="/mnt/models/runs/r1/train/c.json",
        trainer_image="t:1",
        num_nodes=2,
        gpus_per_node=8,
        data_pvc="d",
        model_pvc="m",
        hf_token_secret="hf",
        node_selector={},
        tolerations=[],
    )
    with FakeKubeAPI() as api:
        api.on_get("trainjobs", api.steps(up, preempted, up, lambda job: api.set_condition(job, "Complete")))
        assert run_training_job(job, api_client=api.client, **FAST)["state"] == "Complete"
        assert len(api.requests_for("POST", "/trainjobs")) == 2
    assert (
        f"re-running TrainJob {NS}/{NAME} (restart 1/2): pod {pod} was disrupted (PreemptionByScheduler)"
        in capsys.readouterr().out
    )


# -- deterministic: raised at once, naming the pod that caused it ----------------------------------------------


def oom_killed_worker(api):
    def step(job):
        rank_died(api, WORKER, *DATALOADER_OOM, exit_code=137, reason="OOMKilled")
        rank_died(api, MASTER, WATCHDOG, *torchrun_summary("-6"))  # died of the worker's death
        operator_fails(job)

    return step


def test_oom_killed_worker_is_reported_with_its_reason_exit_code_and_log_not_the_masters(capsys):
    with FakeKubeAPI() as api:
        api.on_get("pytorchjobs", api.steps(pods_up(api, "step 7"), oom_killed_worker(api)))
        with pytest.raises(RuntimeError) as err:
            run_training_job(manifest(), api_client=api.client, **FAST)
        assert len(api.requests_for("POST")) == 1 and api.requests_for("DELETE") == []  # kept for inspection
    message = str(err.value)
    assert f"pod {WORKER}: container pytorch was OOMKilled (exit code 137)" in message
    assert message.endswith(f"last 20 lines of {WORKER}:\n" + "\n".join(["step 7", *DATALOADER_OOM]))
    assert "Watchdog" not in message  # the master was a bystander
    # Every pod's last lines were printed once before the report.
    out = capsys.readouterr().out
    assert out.count(f"[{WORKER}] {DATALOADER_OOM[-1]}") == 1
    assert out.count(f"[{MASTER}]   exitcode  : -6 (pid: 311)") == 1


DETERMINISTIC = {
    "config error, container exit code 2": (
        lambda api: (
            lambda job: (rank_died(api, WORKER, "error: learning_rate must be > 0", exit_code=2), operator_fails(job))
        ),
        f"pod {WORKER}: container pytorch exited with code 2",
    ),
    "config error, under torchrun": (
        lambda api: (
            lambda job: (
                rank_died(api, WORKER, "error: learning_rate must be > 0", *torchrun_summary("2")),
                rank_died(api, MASTER, *NCCL_REMOTE),
                operator_fails(job),
            )
        ),
        f"pod {WORKER}: a trainer process exited with code 2",
    ),
    "unexplained error beside NCCL bystanders": (
        lambda api: (
            lambda job: (
                rank_died(api, WORKER, "ValueError: bad shard 17"),
                rank_died(api, MASTER, *NCCL_REMOTE),
                operator_fails(job),
            )
        ),
        f"pod {WORKER}: container pytorch terminated Error (exit code 1)",
    ),
    "past the job's deadline, its ranks stopped mid-collective": (
        lambda api: (
            lambda job: (
                rank_died(api, WORKER, *NCCL_REMOTE, exit_code=143),
                rank_died(api, MASTER, WATCHDOG, exit_code=143),
                api.set_condition(
                    job,
                    "Failed",
                    reason="PyTorchJobFailed",
                    message=(f"Job {NAME} has failed because it was active longer than specified deadline"),
                ),
            )
        ),
        "cause: the job ran longer than its activeDeadlineSeconds",
    ),
    "OOM beside an evicted pod": (
        lambda api: (
            lambda job: (
                rank_died(api, WORKER, exit_code=137, reason="OOMKilled"),
                api.evict_pod(NS, MASTER),
                operator_fails(job),
            )
        ),
        f"pod {WORKER}: container pytorch was OOMKilled",
    ),
}


@pytest.mark.parametrize("cause", DETERMINISTIC)
def test_deterministic_failure_is_raised_at_once(cause):
    failure, why = DETERMINISTIC[cause]
    with FakeKubeAPI() as api:
        api.on_get("pytorchjobs", api.steps(pods_up(api, "up"), failure(api)))
        with pytest.raises(RuntimeError) as err:
            run_training_job(manifest(), api_client=api.client, **FAST)
        assert len(api.requests_for("POST")) == 1 and api.requests_for("DELETE") == []
    assert why in str(err.value) and "not re-run" in str(err.value)


# -- a retried launcher (KFP retry of the launcher pod) behaves the same ------------------------------------------


def failed_job_exists(api, restarts: str, failure) -> dict:
    """What a launcher pod that died mid-run leaves: the Failed job, its pods and their logs."""
    job = manifest()
    job["metadata"]["annotations"] = {RESTARTS_ANNOTATION: restarts}
    job = api.put_object("kubeflow.org", "v1", "pytorchjobs", job)
    pods_up(api, "step 100/400")(job)
    failure(api)(job)
    return api.put_object("kubeflow.org", "v1", "pytorchjobs", job)


def once_created_again(old: dict, controller):
    """The operator's work on the job created again; the failed one stays as it is, however often it is read."""
    return lambda job: controller(job) if job["metadata"]["uid"] != old["metadata"]["uid"] else None


def test_retried_launcher_re_runs_a_job_that_failed_retriably(capsys):
    with FakeKubeAPI() as api:
        old = failed_job_exists(api, "1", evicted)
        api.on_get("pytorchjobs", once_created_again(old, api.steps(pods_up(api, "resuming"), succeeded(api))))
        assert run_training_job(manifest(), api_client=api.client, **FAST)["state"] == "Succeeded"
        posts = api.requests_for("POST", "/pytorchjobs")
        assert len(posts) == 2 and restarts_of(posts[1].body) == "2"  # the first answered 409
    out = capsys.readouterr().out
    assert "re-attaching" in out and f"re-running {WHAT} (restart 2/2): pod {WORKER} was Evicted" in out


def test_retried_launcher_raises_when_the_restarts_are_used():
    with FakeKubeAPI() as api:
        failed_job_exists(api, "2", evicted)
        api.on_get("pytorchjobs", lambda job: None)
        with pytest.raises(RuntimeError, match=r"already re-run 2 times \(job_restarts=2\)"):
            run_training_job(manifest(), api_client=api.client, **FAST)
        assert len(api.requests_for("POST")) == 1 and api.requests_for("DELETE") == []


def test_retried_launcher_raises_the_same_error_for_a_deterministic_failure():
    with FakeKubeAPI() as api:
        api.on_get("pytorchjobs", api.steps(pods_up(api, "step 100/400"), oom_killed_worker(api)))
        with pytest.raises(RuntimeError) as first:
            run_training_job(manifest(), api_client=api.client, **FAST)
    with FakeKubeAPI() as api:
        failed_job_exists(api, "0", oom_killed_worker)
        with pytest.raises(RuntimeError) as retried:
            run_training_job(manifest(), api_client=api.client, **FAST)
        assert api.requests_for("DELETE") == []
    assert str(retried.value) == str(first.value)


def test_retried_launcher_waits_out_a_deletion_in_progress_then_creates(capsys):
    with FakeKubeAPI() as api:
        old = failed_job_exists(api, "1", evicted)
        # The previous launcher pod deleted the job for a re-run and died before creating it again.
        k8s.CustomObjectsApi(api.client).delete_namespaced_custom_object(
            "kubeflow.org", "v1", NS, "pytorchjobs", NAME, body=k8s.V1DeleteOptions(propagation_policy="Foreground")
        )
        api.on_get("pytorchjobs", once_created_again(old, api.steps(pods_up(api, "resuming"), succeeded(api))))
        assert run_training_job(manifest(), api_client=api.client, **FAST)["state"] == "Succeeded"
        posts = api.requests_for("POST", "/pytorchjobs")
        # The count carries over: the deleted job's failure was already counted when it was re-run.
        assert len(posts) == 2 and restarts_of(posts[1].body) == "1"
    assert "is being deleted" in capsys.readouterr().out


def test_a_deletion_that_never_finishes_is_an_error(monkeypatch):
    monkeypatch.setattr(launch, "DELETION_TIMEOUT_SECONDS", 0.2)
    with FakeKubeAPI() as api:
        api.deletion_gets = 10**6  # a finalizer nobody removes
        api.on_get("pytorchjobs", api.steps(pods_up(api, "up"), evicted(api)))
        with pytest.raises(RuntimeError, match="still being deleted after 0s.*foregroundDeletion"):
            run_training_job(manifest(), api_client=api.client, **FAST)


@pytest.mark.parametrize(
    "kwargs,field",
    [({"job_restarts": -1}, "job_restarts"), ({"pending_timeout_seconds": -1}, "pending_timeout_seconds")],
)
def test_bad_restart_settings_fail_before_anything_is_created(kwargs, field):
    with FakeKubeAPI() as api:
        with pytest.raises(ValueError, match=field):
            run_training_job(manifest(), api_client=api.client, **kwargs, **FAST)
        assert api.requests == []


def test_a_re_run_waits_out_the_pods_grace_period_before_calling_the_deletion_stuck():
    # Survivors of a failed job hang in NCCL and ignore SIGTERM: the kubelet kills them only at the end of their
    # grace period, so a foreground deletion legitimately takes that long.
    from components.train.launcher.pods import TERMINATION_GRACE_PERIOD_SECONDS

    assert launch.DELETION_TIMEOUT_SECONDS >= TERMINATION_GRACE_PERIOD_SECONDS + 60
