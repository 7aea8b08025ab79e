"""The launcher: create (or re-attach to) the PyTorchJob or TrainJob, follow it to the end, report, re-run or raise.

    python -m components.train.launcher --run-id RUN --params my.yaml -p num_nodes=2 -p job_restarts=2 [--dry-run]

A launcher is never fire-and-forget: the job's name comes from the run id, so a retried launcher pod finds
the job it created instead of starting a second one; pods that cannot start (bad image, missing config,
no GPUs free) fail the step in minutes rather than hours; every pod's log lines are printed once, prefixed
with the pod name; cancelling the KFP run (SIGTERM) deletes the job. Transient API errors (5xx, 429, dropped
connections) are retried. Creating, re-attaching, following, deleting and SIGTERM are the one custom-resource
runner's (``components.kube.CustomResourceRunner``), shared with the Katib search and the deployer.

A failed job is sorted by ``classify_failure`` into retriable (re-run up to ``job_restarts`` times) or
deterministic (raised at once): the causes and their order are described once, in
components/jobs/failures.py. A re-run deletes the job (foreground: it is gone only once its pods are,
GPUs freed), waits until the API server answers 404, and creates it again under the same name, so the trainer
writes the same run folder and resumes from its latest complete checkpoint. Re-runs are counted in the job's
``RESTARTS_ANNOTATION``, so a retried launcher pod that re-attaches to a failed job re-runs it or raises exactly
as the first one would. The error names the pod to blame, its container's end and its last log lines (every
pod's log is drained first).

A job can also run without progressing: pods up, trainer hung (a collective under a long NCCL timeout, a reward
function). The operator sees nothing wrong, so the launcher watches the trainer's step itself
(components/jobs/progress.py: the step series each pod's trainer serves, the ones the Prometheus stall alert reads):
no optimizer step for ``stall_timeout_seconds`` ends the job as a retriable failure, re-run as above, and reported with
every pod's last lines. A hung rank ignores SIGTERM, so its pod goes only at the end of its grace period.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from contextlib import contextmanager

from kubernetes import client as k8s

from components.jobs.failures import classify_failure, failure_report, pod_tails, stall_report
from components.jobs.kinds import DELETION_TIMEOUT_SECONDS, job_kind
from components.jobs.progress import ProgressWatch
from components.kube import (
    RUN_ID_LABEL,
    CustomResourceRunner,
    PodLogFollower,
    call_api,
    egress_env,
    job_name_for,
    latest_state,
    true_condition,
    unstartable_pod_reason,
)
from components.settings import (
    JobSettings,
    NetworkSettings,
    ObservabilitySettings,
    SchedulingSettings,
    StorageSettings,
)
from components.train.launcher.spec import TRAINER_V2_2, TrainingJobSpec, trainjob_runtime_conflicts

CLEANUP_POLICIES = ("keep", "on-success", "always")
# What train_model can launch: the two job kinds, or torchrun on the step's own machine (launcher/local_torchrun.py).
TRAIN_BACKENDS = ("pytorchjob", "trainjob", "local")
# Re-runs of this job so far, on the job object: the count survives the launcher pod (a KFP retry reads it).
RESTARTS_ANNOTATION = "llm-post-training.kubeflow.org/restarts"


def _restarts(job: dict) -> int:
    value = ((job.get("metadata") or {}).get("annotations") or {}).get(RESTARTS_ANNOTATION, "0")
    return int(value) if value.isdigit() else 0


def check_limits(cleanup: str, job_restarts: int, pending_timeout_seconds: float, stall_timeout_seconds: float) -> None:
    """``run_training_job``'s own arguments checked, before anything is created: ValueError naming the bad one."""
    if cleanup not in CLEANUP_POLICIES:
        raise ValueError(f"cleanup {cleanup!r} must be one of {', '.join(CLEANUP_POLICIES)}")
    if job_restarts < 0:
        raise ValueError(f"job_restarts must be >= 0, got {job_restarts}")
    if pending_timeout_seconds < 0:
        raise ValueError(f"pending_timeout_seconds must be >= 0, got {pending_timeout_seconds}")
    if stall_timeout_seconds < 0:
        raise ValueError(f"stall_timeout_seconds must be >= 0, got {stall_timeout_seconds}")


def run_training_job(
    manifest: dict,
    *,
    poll_seconds: float = 10.0,
    timeout_seconds: float | None = None,
    pending_timeout_seconds: float = 900.0,
    cleanup: str = "keep",
    job_restarts: int = 2,
    stall_timeout_seconds: float = ObservabilitySettings.stall_timeout_seconds,
    on_created=None,
    api_client=None,
    watch=None,
) -> dict:
    """Create the PyTorchJob or TrainJob in ``manifest`` (or re-attach to it), follow it to the end and report;
    re-run it when it fails for a retriable cause.

    Args:
        manifest: from ``build_pytorchjob`` or ``build_trainjob``; its name and namespace identify the job.
        poll_seconds: interval between status, pod and log polls.
        timeout_seconds: give up (and delete the job) after this long, re-runs included; None waits for as
            long as it runs.
        pending_timeout_seconds: how long a pod may stay Unschedulable before the job is given up (0: at once).
        cleanup: delete the job when it ends: ``keep`` (never: the operator's TTL, if any, removes it),
            ``on-success`` (keep failed jobs and their pods for inspection) or ``always``.
        job_restarts: how many times a job that failed for a retriable cause (components/jobs/failures.py)
            is deleted and created again under the same name, to resume from its last checkpoint. Counted on the
            job (``RESTARTS_ANNOTATION``), so a retried launcher continues the count. 0: never.
        stall_timeout_seconds: a job whose trainer makes no optimizer step for this long (read from its pods'
            metrics, components/jobs/progress.py; model loading and the steps-done tail not counted) is ended as a
            retriable failure: re-run within ``job_restarts``, else deleted and raised. 0: not watched. The default
            is the setting's, which the Prometheus stall alert uses too.
        on_created: called with each job as the API server returned it, as soon as it exists (created,
            re-attached, or created again for a re-run), so the caller can record its identity before the
            long wait.
        api_client: a ``kubernetes.client.ApiClient``; default: in-cluster config, else kubeconfig.
        watch: called with the job's pods on every poll (``components.observe.gpu_watch.GpuWatch``: GPU
            utilisation beside the progress lines); it must never raise. None: nothing watched.

    Returns:
        ``{"name", "namespace", "kind", "state", "reason", "message"}`` from the job's final condition.

    Raises:
        ValueError: an unknown kind, cleanup policy or a negative limit, before anything is created.
        RuntimeError: the job failed for a deterministic cause, or for a retriable one after ``job_restarts``
            re-runs (the job's reason, the pod to blame, its container's end and its last log lines); it stalled
            after ``job_restarts`` re-runs (deleted; every pod's last lines); a pod
            cannot start (the container's or the scheduler's reason; the job is deleted to free what it
            holds); or a deletion for a re-run never finished.
        TimeoutError: ``timeout_seconds`` passed (the job is deleted).
        SystemExit: 143 after SIGTERM, once the job is deleted.
    """
    kind = job_kind(manifest.get("kind"))
    check_limits(cleanup, job_restarts, pending_timeout_seconds, stall_timeout_seconds)
    runner = CustomResourceRunner(
        manifest,
        kind.plural,
        api_client=api_client,
        poll_seconds=poll_seconds,
        timeout_seconds=timeout_seconds,
        deletion_timeout_seconds=DELETION_TIMEOUT_SECONDS,
        controller="the training operator",
    )
    follower = _JobFollower(
        runner,
        manifest,
        cleanup=cleanup,
        job_restarts=job_restarts,
        pending_timeout_seconds=pending_timeout_seconds,
        progress=ProgressWatch(stall_timeout_seconds),
        on_created=on_created,
        watch=watch,
    )
    with runner.cancel_on_sigterm():
        follower.create(0)
        return runner.follow(follower.poll)


class _JobFollower:
    """One training job followed, poll by poll (``poll``): its pods' logs printed, its state when it changes, and its
    end: reported when it succeeded, re-run (``rerun``) when it failed or stalled for a retriable cause within
    ``job_restarts``, else raised; a pod that cannot start deletes it."""

    def __init__(
        self,
        runner: CustomResourceRunner,
        manifest: dict,
        *,
        cleanup: str,
        job_restarts: int,
        pending_timeout_seconds: float,
        progress: ProgressWatch,
        on_created,
        watch,
    ):
        self.runner, self.manifest, self.cleanup, self.job_restarts = runner, manifest, cleanup, job_restarts
        self.pending_timeout_seconds, self.progress = pending_timeout_seconds, progress
        self.on_created, self.watch = on_created, watch
        self.kind = job_kind(manifest.get("kind"))
        self.core = k8s.CoreV1Api(runner.api_client)
        self.name, self.namespace, self.what = runner.name, runner.namespace, runner.what
        self.logs = PodLogFollower(
            self.core,
            self.namespace,
            self.kind.container,
            out=lambda s: print(s, flush=True),
            retry_delay=runner.retry_delay,
        )
        self.unschedulable_since: dict = {}
        self.announce = True
        self.state: str | None = None
        self.seen: dict = {}  # uid -> this job's pod as last seen: a pod deleted since still tells why it ended

    def list_pods(self) -> list:
        return call_api(
            self.core.list_namespaced_pod,
            self.namespace,
            label_selector=f"{self.kind.pod_label}={self.name}",
            retry_delay=self.runner.retry_delay,
        ).items

    def create(self, restarts: int) -> None:
        """The job created (or re-attached to), its re-runs so far ``restarts``."""

        def body(gone: dict | None) -> dict:
            # A job found being deleted carries its count over: its failure was counted when its re-run was decided.
            job = copy.deepcopy(self.manifest)
            job["metadata"]["annotations"] = {
                **(job["metadata"].get("annotations") or {}),
                RESTARTS_ANNOTATION: str(_restarts(gone) if gone else restarts),
            }
            return job

        def describe(job: dict) -> str:
            n = _restarts(job)
            return f" (restart {n}/{self.job_restarts})" if n else ""

        self.runner.create(body, describe=describe)

    def rerun(self, used: int, cause: str) -> None:
        """Delete the job (its pods first) and create it again under its name, counting the re-run."""
        print(f"re-running {self.what} (restart {used + 1}/{self.job_restarts}): {cause}", flush=True)
        self.runner.delete("to create it again once its pods are gone", foreground=True)
        self.runner.wait_until_gone()
        self.create(used + 1)
        self.announce, self.state, self.seen = True, None, {}
        self.progress.reset()

    def poll(self, job: dict) -> dict | None:
        """One look at ``job`` and its pods: the result once it succeeded, None while it runs (or was re-run)."""
        if self.announce and self.on_created is not None:
            self.on_created(job)
        self.announce = False
        # Status before logs: once the job reports an end, the logs fetched after it are complete.
        pods = self.list_pods()
        rank0 = self.kind.rank0(self.name, pods)

        def order(pod):
            return pod.metadata.name != rank0, pod.metadata.name

        pods.sort(key=order)
        self.seen.update((p.metadata.uid, p) for p in pods)
        self.logs.poll(pods)
        if self.watch is not None:
            self.watch(pods)
        if self.state != latest_state(job):
            self.state = latest_state(job)
            print(f"{self.what}: {self.state}", flush=True)
        if done := true_condition(job, self.kind.succeeded):
            if self.cleanup != "keep":
                self.runner.delete(f"it succeeded (cleanup={self.cleanup})")
            return {
                "name": self.name,
                "namespace": self.namespace,
                "kind": self.kind.kind,
                "state": self.kind.succeeded,
                "reason": done.get("reason", ""),
                "message": done.get("message", ""),
            }
        if failed := true_condition(job, self.kind.failed):
            self._failed(job, failed, order, rank0)
            return None
        if stall := self.progress(pods):
            self._stalled(job, pods, stall)
            return None
        if why := unstartable_pod_reason(pods, self.unschedulable_since, self.pending_timeout_seconds):
            self.runner.delete(why)
            raise RuntimeError(f"{self.what} cannot start: {why}")
        return None

    def _failed(self, job: dict, failed: dict, order, rank0: str | None) -> None:
        """The failed ``job`` re-run when its cause is retriable and re-runs are left, else its failure raised."""
        # Drain: one more poll, so the last lines of pods that ended meanwhile are printed too.
        pods = sorted(self.list_pods(), key=order)
        self.seen.update((p.metadata.uid, p) for p in pods)
        self.logs.poll(pods)
        failure = classify_failure(
            failed, sorted(self.seen.values(), key=order), self.kind.container, self.logs.last_lines
        )
        used = _restarts(job)
        if failure.retriable and used < self.job_restarts:
            self.rerun(used, failure.cause)
            return
        if self.cleanup == "always":
            self.runner.delete(f"it failed (cleanup={self.cleanup})")
        raise RuntimeError(
            failure_report(self.what, failed, failure, rank0, self.logs.last_lines, used, self.job_restarts)
        )

    def _stalled(self, job: dict, pods: list, stall: str) -> None:
        """The stalled ``job`` re-run while re-runs are left, else deleted (it holds its GPUs) and its stall raised."""
        # The logs were drained above: each pod's last lines are where its trainer went quiet.
        tails, used = pod_tails(pods, self.logs.last_lines), _restarts(job)
        if used < self.job_restarts:
            print(f"{self.what} is stalled: {stall}\n{tails}", flush=True)
            self.rerun(used, f"stalled: {stall}")
            return
        self.runner.delete(f"it is stalled (whatever cleanup says: it holds its GPUs): {stall}")
        raise RuntimeError(stall_report(self.what, stall, tails, used, self.job_restarts))


def trainjob_conflicts(job: JobSettings, scheduling: SchedulingSettings) -> list[str]:
    """One error per setting of ``spec.TRAINJOB_RUNTIME_SETTINGS`` (scheduling settings) set with
    ``train_backend=trainjob`` (validate_inputs lists them; ``build_trainjob`` refuses them rather than drop them)."""
    return trainjob_runtime_conflicts(scheduling) if job.train_backend == "trainjob" else []


def training_job_spec(
    job: JobSettings,
    scheduling: SchedulingSettings,
    network: NetworkSettings,
    storage: StorageSettings,
    observability: ObservabilitySettings,
    *,
    run_id: str,
    namespace: str,
    config_path: str,
    stage: str = "sft",
    trainer_version: str | None = None,
) -> TrainingJobSpec:
    """The training job of one run's stage from its job, scheduling, network, storage and observability settings
    (``components.settings``; the job's the stage's own nodes and GPUs over the run's: ``stages.job_groups``): named
    ``<stage>-<run id>`` (each stage of a run is its own job) and labelled by the run id.

    Pipeline parameters cannot be None, so 0 and {} mean "not set" in the settings. ``trainer_version`` is the
    Trainer release a TrainJob is rendered for (``trainjob.TRAINER_VERSIONS``): on a cluster the caller reads it
    once with ``trainjob.installed_trainer_version()``; None renders for v2.2 and later (``--render``).
    """
    return TrainingJobSpec(
        name=job_name_for(run_id, stage),
        namespace=namespace,
        labels={RUN_ID_LABEL: run_id},
        num_nodes=job.num_nodes,
        gpus_per_node=job.gpus_per_node,
        queue_name=scheduling.queue_name,
        active_deadline_seconds=scheduling.active_deadline_seconds or None,
        image=job.trainer_image,
        config_path=config_path,
        data_pvc=storage.data_pvc,
        model_pvc=storage.model_pvc,
        shm_size=job.trainer_shm_size,
        cpu=job.trainer_cpu_request,
        memory=job.trainer_memory_request,
        cpu_limit=job.trainer_cpu_limit,
        memory_limit=job.trainer_memory_limit,
        rdma_resource=network.rdma_resource,
        rdma_per_pod=network.rdma_per_pod,
        ipc_lock=network.ipc_lock,
        node_selector=job.node_selector,
        tolerations=job.tolerations,
        affinity=job.affinity or None,
        image_pull_secrets=list(job.image_pull_secrets) or None,
        hf_token_secret=storage.hf_token_secret,
        tracking_secret=observability.tracking_secret,
        langfuse_secret=observability.langfuse_secret,
        nccl_env=dict(network.nccl_env) or None,
        egress_env=egress_env(network) or None,
        metrics_port=observability.metrics_port,
        gang_scheduling=scheduling.gang_scheduling,
        priority_class=scheduling.priority_class,
        min_nodes=scheduling.min_nodes or None,
        max_restarts=scheduling.max_restarts,
        runtime=job.trainjob_runtime,
        trainer_version=trainer_version or TRAINER_V2_2,
    )


def training_job_for_run(
    job: JobSettings,
    scheduling: SchedulingSettings,
    network: NetworkSettings,
    storage: StorageSettings,
    observability: ObservabilitySettings,
    *,
    run_id: str,
    namespace: str,
    config_path: str,
    stage: str = "sft",
    trainer_version: str | None = None,
) -> dict:
    """The PyTorchJob or TrainJob (``train_backend``) of one run's stage, of ``training_job_spec`` (the train step,
    the launcher's command line and ``--render`` call this, so what is rendered is what runs).

    Raises:
        ValueError: naming the setting, for a job the operator would reject, or a setting a TrainJob cannot carry.
    """
    from components.train.launcher.pytorchjob import build_pytorchjob
    from components.train.launcher.trainjob import build_trainjob

    spec = training_job_spec(
        job,
        scheduling,
        network,
        storage,
        observability,
        run_id=run_id,
        namespace=namespace,
        config_path=config_path,
        stage=stage,
        trainer_version=trainer_version,
    )
    manifest = build_trainjob(spec) if job.train_backend == "trainjob" else build_pytorchjob(spec)
    if stage == "grpo":
        _add_weight_sync_token(manifest, run_id)
    return manifest


def _add_weight_sync_token(job: dict, run_id: str) -> None:
    """The grpo stage's pods send the run's weight-sync token to its generation server: ``TOKEN_ENV`` from the
    server's Secret (launcher/generation_server.py::weight_sync_secret), optional: a server the user started has
    none."""
    from components.models.vllm_worker import TOKEN_ENV, TOKEN_KEY
    from components.train.launcher.generation_server import weight_sync_secret_name

    ref = {"name": weight_sync_secret_name(run_id), "key": TOKEN_KEY, "optional": True}
    var = {"name": TOKEN_ENV, "valueFrom": {"secretKeyRef": ref}}
    spec = job["spec"]
    if "pytorchReplicaSpecs" in spec:
        for replica in spec["pytorchReplicaSpecs"].values():
            replica["template"]["spec"]["containers"][0].setdefault("env", []).append(dict(var))
    else:
        spec["trainer"].setdefault("env", []).append(dict(var))


@contextmanager
def trainer_network(manifest: dict, *, model_root: str | None, api_client=None) -> Iterator[dict]:
    """The job's NetworkPolicy (``pods.trainer_network_policy``) while the ``with`` block runs the job: recorded on the
    model claim (``model_root``; None, the launcher outside KFP: not recorded) before it is created (the run's exit
    handler deletes what a killed step left), created before the job (one already there, a retried step's, is kept:
    409) and deleted when the block ends, however it ends; a re-run of the job keeps it. Yields the policy."""
    from kubernetes.client.rest import ApiException

    from components.kube import load_api_client
    from components.observe.run_objects import TRAINER_POLICY_RECORD, delete_object, forget_objects, record_objects
    from components.train.launcher.pods import trainer_network_policy

    policy = trainer_network_policy(manifest)
    meta = policy["metadata"]
    run_id = meta["labels"][RUN_ID_LABEL]
    api_client = api_client or load_api_client()
    if model_root:
        record_objects(model_root, run_id, TRAINER_POLICY_RECORD, [policy])
    try:
        try:
            call_api(k8s.NetworkingV1Api(api_client).create_namespaced_network_policy, meta["namespace"], policy)
        except ApiException as exc:
            if exc.status != 409:
                raise
        yield policy
    finally:
        try:
            delete_object(api_client, "NetworkPolicy", meta["namespace"], meta["name"])
        except Exception as exc:  # the job's own outcome goes up; the exit handler tries again
            print(f"could not delete NetworkPolicy {meta['namespace']}/{meta['name']} ({exc!r}): the exit handler will")
        else:
            if model_root:
                forget_objects(model_root, run_id, TRAINER_POLICY_RECORD)
