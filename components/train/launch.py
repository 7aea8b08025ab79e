"""The launcher: create (or re-attach to) the PyTorchJob or TrainJob, follow it to the end, report or raise.

    python -m components.train.launch --run-id RUN --config-path /mnt/models/runs/RUN/train/train_config.json \\
        --num-nodes 2 --gpus-per-node 8 --data-pvc llm-data --model-pvc llm-models [--backend trainjob] [--dry-run]

A launcher is never fire-and-forget: the job's name comes from the run id, so a retried launcher pod finds
the job it created instead of starting a second one; pods that cannot start (bad image, missing config,
no GPUs free) fail the step in minutes rather than hours; every pod's log lines are printed once, prefixed
with the pod name; a failure raises with the job's reason and the end of the failing pod's log; cancelling the
KFP run (SIGTERM) deletes the job. Transient API errors (5xx, 429, dropped connections) are retried.

The API retries, pod start checks and log following live in components/kube.py, shared with the deployer.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import time
from dataclasses import dataclass

from kubeflow.training.constants import constants as kfc
from kubernetes import client as k8s
from kubernetes.client.rest import ApiException

from components.kube import (
    Cancelled,
    PodLogFollower,
    call_api,
    load_api_client,
    sigterm_cancels,
    unstartable_pod_reason,
)
from components.train import trainjob

FAILURE_TAIL_LINES = 20
CLEANUP_POLICIES = ("keep", "on-success", "always")


@dataclass(frozen=True)
class _Kind:
    """What the launcher needs to know about one training job kind: where it lives, how it ends, its pods."""

    kind: str
    group: str
    version: str
    plural: str
    container: str  # the trainer container, whose log is streamed
    succeeded: str  # condition types that end the job
    failed: str
    pod_label: str  # pods carry ``pod_label=<job name>``

    def rank0(self, name: str, pods: list) -> str | None:
        """The node-rank-0 pod's name (its log is printed first and is the failure tail's fallback)."""
        if self.kind == kfc.PYTORCHJOB_KIND:
            # The operator's naming; an elastic job has no Master, and Worker 0 hosts its rendezvous.
            names = {p.metadata.name for p in pods}
            master = f"{name}-{kfc.REPLICA_TYPE_MASTER.lower()}-0"
            worker = f"{name}-{kfc.REPLICA_TYPE_WORKER.lower()}-0"
            return worker if worker in names and master not in names else master
        # JobSet pods have generated names; the node rank is the Job completion index.
        return next((p.metadata.name for p in pods
                     if (p.metadata.labels or {}).get(trainjob.NODE_RANK_LABEL) == "0"), None)


KINDS = {
    kfc.PYTORCHJOB_KIND: _Kind(kfc.PYTORCHJOB_KIND, kfc.GROUP, kfc.VERSION, kfc.PYTORCHJOB_PLURAL,
                               kfc.PYTORCHJOB_CONTAINER, kfc.JOB_CONDITION_SUCCEEDED, kfc.JOB_CONDITION_FAILED,
                               kfc.JOB_NAME_LABEL),
    trainjob.KIND: _Kind(trainjob.KIND, trainjob.GROUP, trainjob.VERSION, trainjob.PLURAL, trainjob.NODE,
                         "Complete", "Failed", trainjob.POD_SELECTOR_LABEL),
}


def _condition(job: dict, kind: str) -> dict | None:
    for cond in (job.get("status") or {}).get("conditions") or []:
        if cond.get("type") == kind and cond.get("status") == "True":
            return cond
    return None


def _latest_state(job: dict) -> str:
    true = [c for c in (job.get("status") or {}).get("conditions") or [] if c.get("status") == "True"]
    return true[-1]["type"] if true else "Pending"


def _failed_pod(pods: list, container: str) -> str | None:
    """The first pod whose trainer container exited non-zero (now or before a restart)."""
    for pod in pods:
        for cs in pod.status.container_statuses or []:
            ended = [s.terminated for s in (cs.state, cs.last_state) if s and s.terminated]
            if cs.name == container and any(t.exit_code for t in ended):
                return pod.metadata.name
    return None


def run_training_job(manifest: dict, *, poll_seconds: float = 10.0, timeout_seconds: float | None = None,
                     pending_timeout_seconds: float = 900.0, cleanup: str = "keep", on_created=None,
                     api_client=None) -> dict:
    """Create the PyTorchJob or TrainJob in ``manifest`` (or re-attach to it), follow it to the end and report.

    Args:
        manifest: from ``build_pytorchjob`` or ``build_trainjob``; its name and namespace identify the job.
        poll_seconds: interval between status, pod and log polls.
        timeout_seconds: give up (and delete the job) after this long; None waits for as long as it runs.
        pending_timeout_seconds: how long a pod may stay Unschedulable before the job is given up.
        cleanup: delete the job when it ends: ``keep`` (never: the operator's TTL, if any, removes it),
            ``on-success`` (keep failed jobs and their pods for inspection) or ``always``.
        on_created: called once with the job as the API server returned it, as soon as it exists
            (created or re-attached), so the caller can record its identity before the long wait.
        api_client: a ``kubernetes.client.ApiClient``; default: in-cluster config, else kubeconfig.

    Returns:
        ``{"name", "namespace", "kind", "state", "reason", "message"}`` from the job's final condition.

    Raises:
        ValueError: an unknown kind or cleanup policy, before anything is created.
        RuntimeError: the job failed (its reason, message and the failing pod's last log lines), or a pod
            cannot start (the container's or the scheduler's reason; the job is deleted to free what it holds).
        TimeoutError: ``timeout_seconds`` passed (the job is deleted).
        SystemExit: 143 after SIGTERM, once the job is deleted.
    """
    if manifest.get("kind") not in KINDS:
        raise ValueError(f"manifest kind {manifest.get('kind')!r} is not one of {', '.join(KINDS)}")
    if cleanup not in CLEANUP_POLICIES:
        raise ValueError(f"cleanup {cleanup!r} must be one of {', '.join(CLEANUP_POLICIES)}")
    kind = KINDS[manifest["kind"]]
    api_client = api_client or load_api_client()
    custom, core = k8s.CustomObjectsApi(api_client), k8s.CoreV1Api(api_client)
    name, namespace = manifest["metadata"]["name"], manifest["metadata"]["namespace"]
    what = f"{kind.kind} {namespace}/{name}"
    retry_delay = min(1.0, poll_seconds)
    ref = (kind.group, kind.version, namespace, kind.plural)

    def delete_job(why: str) -> None:
        print(f"deleting {what}: {why}", flush=True)
        try:
            call_api(custom.delete_namespaced_custom_object, *ref, name, retry_delay=retry_delay,
                     body=k8s.V1DeleteOptions(propagation_policy="Background"))
        except ApiException as exc:
            if exc.status != 404:
                raise

    logs = PodLogFollower(core, namespace, kind.container, out=lambda s: print(s, flush=True),
                          retry_delay=retry_delay)
    selector = f"{kind.pod_label}={name}"
    unschedulable_since: dict = {}
    deadline = None if timeout_seconds is None else time.monotonic() + timeout_seconds
    state = None
    with sigterm_cancels():
        try:
            try:
                call_api(custom.create_namespaced_custom_object, *ref, manifest, retry_delay=retry_delay)
                print(f"created {what}", flush=True)
            except ApiException as exc:
                if exc.status != 409:
                    raise
                # The launcher pod was retried (or a dropped response hid our own create): same run, same job.
                print(f"{what} already exists: re-attaching to it", flush=True)
            while True:
                try:
                    job = call_api(custom.get_namespaced_custom_object, *ref, name, retry_delay=retry_delay)
                except ApiException as exc:
                    if exc.status == 404:
                        raise RuntimeError(f"{what} was deleted while it ran") from None
                    raise
                if on_created is not None:
                    on_created(job)
                    on_created = None
                # Status before logs: once the job reports an end, the logs fetched after it are complete.
                pods = call_api(core.list_namespaced_pod, namespace, label_selector=selector,
                                retry_delay=retry_delay).items
                rank0 = kind.rank0(name, pods)
                pods.sort(key=lambda p: (p.metadata.name != rank0, p.metadata.name))
                logs.poll(pods)
                if state != _latest_state(job):
                    state = _latest_state(job)
                    print(f"{what}: {state}", flush=True)
                if done := _condition(job, kind.succeeded):
                    if cleanup != "keep":
                        delete_job(f"it succeeded (cleanup={cleanup})")
                    return {"name": name, "namespace": namespace, "kind": kind.kind, "state": kind.succeeded,
                            "reason": done.get("reason", ""), "message": done.get("message", "")}
                if failed := _condition(job, kind.failed):
                    culprit = _failed_pod(pods, kind.container) or rank0
                    tail = logs.tail(culprit, FAILURE_TAIL_LINES) if culprit else ""
                    if cleanup == "always":
                        delete_job(f"it failed (cleanup={cleanup})")
                    raise RuntimeError(
                        f"{what} failed: {failed.get('reason', '')}: {failed.get('message', '')}"
                        + (f"\nlast {FAILURE_TAIL_LINES} lines of {culprit}:\n{tail}" if tail else "")
                    )
                if why := unstartable_pod_reason(pods, unschedulable_since, pending_timeout_seconds):
                    delete_job(why)
                    raise RuntimeError(f"{what} cannot start: {why}")
                if deadline is not None and time.monotonic() > deadline:
                    delete_job(f"still {state} after {timeout_seconds:.0f}s")
                    raise TimeoutError(f"{what} did not finish within {timeout_seconds:.0f}s (last state {state})")
                time.sleep(poll_seconds)
        except Cancelled:
            delete_job("the run was cancelled (SIGTERM)")
            raise SystemExit(128 + signal.SIGTERM) from None


def run_pytorchjob(manifest: dict, **kwargs) -> dict:
    """``run_training_job`` for a PyTorchJob manifest (the train component's call; same arguments)."""
    if manifest.get("kind") != kfc.PYTORCHJOB_KIND:
        raise ValueError(f"run_pytorchjob needs a PyTorchJob manifest, got kind {manifest.get('kind')!r}; "
                         "use run_training_job")
    return run_training_job(manifest, **kwargs)


def training_job_for_run(*, train_backend: str, affinity: dict, active_deadline_seconds: int, queue_name: str,
                         priority_class: str, gang_scheduling: bool, min_nodes: int, max_restarts: int,
                         **common) -> dict:
    """The PyTorchJob or TrainJob of one run from the pipeline's parameters (the train step and ``--render``).

    Pipeline parameters cannot be None, so 0 and {} mean "not set" here. ``common`` are the keyword
    arguments ``pytorchjob_for_run`` and ``trainjob_for_run`` share (run_id, namespace, config_path, ...).
    """
    from components.train.pytorchjob import pytorchjob_for_run
    from components.train.trainjob import trainjob_for_run

    if train_backend == "trainjob":
        # Priority, gang scheduling and restarts belong to the ClusterTrainingRuntime in Trainer v2.
        return trainjob_for_run(**common, affinity=affinity or None,
                                active_deadline_seconds=active_deadline_seconds or None, queue_name=queue_name)
    return pytorchjob_for_run(**common, affinity=affinity or None,
                              active_deadline_seconds=active_deadline_seconds or None, queue_name=queue_name,
                              priority_class=priority_class, gang_scheduling=gang_scheduling,
                              min_nodes=min_nodes or None, max_restarts=max_restarts)


def _json_arg(text: str, kind: type, flag: str):
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{flag} is not valid JSON ({exc.msg}): {text!r}") from None
    if not isinstance(value, kind):
        raise ValueError(f"{flag} must be a JSON {'object' if kind is dict else 'list'}, got {text!r}")
    return value


def make_parser() -> argparse.ArgumentParser:
    """The launcher's command line."""
    from components.version import TRAINER_IMAGE

    p = argparse.ArgumentParser(prog="python -m components.train.launch", description=__doc__.split("\n\n")[0])
    p.add_argument("--run-id", required=True, help="KFP run id; names the job (sft-<run id>)")
    p.add_argument("--config-path", required=True, help="trainer config as the pods see it (under /mnt/models)")
    p.add_argument("--num-nodes", type=int, required=True, help="pods: 1 Master + N-1 Workers")
    p.add_argument("--gpus-per-node", type=int, required=True, help="GPUs and torchrun processes per pod")
    p.add_argument("--data-pvc", required=True, help="data claim, mounted at /mnt/data")
    p.add_argument("--model-pvc", required=True, help="model claim, mounted at /mnt/models")
    p.add_argument("--backend", choices=("pytorchjob", "trainjob"), default="pytorchjob",
                   help="PyTorchJob (Training Operator v1) or TrainJob (Trainer v2, runtime torch-distributed)")
    p.add_argument("--namespace", help="default: this pod's namespace, else 'default'")
    p.add_argument("--image", default=TRAINER_IMAGE, help=f"trainer image (default {TRAINER_IMAGE})")
    p.add_argument("--hf-token-secret", default="hf-token", help="Secret with key HF_TOKEN (optional)")
    p.add_argument("--node-selector", default="{}",
                   help='JSON object, e.g. \'{"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}\'')
    p.add_argument("--tolerations", default="[]", help="JSON list of Kubernetes tolerations")
    p.add_argument("--affinity", default="{}", help="JSON object: Kubernetes pod affinity")
    p.add_argument("--active-deadline-seconds", type=int, help="fail the job after running this long")
    p.add_argument("--queue-name", default="", help="Kueue LocalQueue to submit the job to")
    p.add_argument("--priority-class", default="", help="pods' PriorityClass (pytorchjob)")
    p.add_argument("--gang-scheduling", action="store_true",
                   help="schedulingPolicy.minAvailable = all pods, for Volcano/scheduler-plugins (pytorchjob)")
    p.add_argument("--min-nodes", type=int, help="elastic job: run with min-nodes..num-nodes pods (pytorchjob)")
    p.add_argument("--max-restarts", type=int, default=3, help="restarts of an elastic job (pytorchjob)")
    p.add_argument("--cleanup", choices=CLEANUP_POLICIES, default="keep", help="delete the job when it ends")
    p.add_argument("--dry-run", action="store_true", help="print the manifest as YAML and touch nothing")
    return p


def main(argv: list[str] | None = None) -> None:
    """Build the job from the command line; print it (``--dry-run``) or run it to the end."""
    import yaml

    from components.kube import current_namespace
    from components.train.pytorchjob import pytorchjob_for_run
    from components.train.trainjob import trainjob_for_run

    args = make_parser().parse_args(argv)
    try:
        common = dict(
            run_id=args.run_id,
            namespace=args.namespace or current_namespace(),
            config_path=args.config_path,
            trainer_image=args.image,
            num_nodes=args.num_nodes,
            gpus_per_node=args.gpus_per_node,
            data_pvc=args.data_pvc,
            model_pvc=args.model_pvc,
            hf_token_secret=args.hf_token_secret,
            node_selector=_json_arg(args.node_selector, dict, "--node-selector"),
            tolerations=_json_arg(args.tolerations, list, "--tolerations"),
            affinity=_json_arg(args.affinity, dict, "--affinity"),
            active_deadline_seconds=args.active_deadline_seconds,
            queue_name=args.queue_name,
        )
        if args.backend == "pytorchjob":
            manifest = pytorchjob_for_run(**common, priority_class=args.priority_class,
                                          gang_scheduling=args.gang_scheduling, min_nodes=args.min_nodes,
                                          max_restarts=args.max_restarts)
        else:
            v1_only = [flag for flag, used in [("--priority-class", args.priority_class),
                                               ("--gang-scheduling", args.gang_scheduling),
                                               ("--min-nodes", args.min_nodes is not None)] if used]
            if v1_only:
                raise ValueError(f"{', '.join(v1_only)}: PyTorchJob only; with --backend trainjob the "
                                 "ClusterTrainingRuntime sets scheduling and restart policy")
            manifest = trainjob_for_run(**common)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
    if args.dry_run:
        print(yaml.safe_dump(manifest, sort_keys=False), end="")
        return
    try:
        result = run_training_job(manifest, cleanup=args.cleanup)
    except (RuntimeError, TimeoutError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        raise SystemExit(1) from None
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
