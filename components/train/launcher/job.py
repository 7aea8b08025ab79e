"""The launcher: create (or re-attach to) the PyTorchJob or TrainJob, follow it to the end, report, re-run or raise.

    python -m components.train.launcher --run-id RUN --config-path /mnt/models/runs/RUN/train/train_config.json \\
        --num-nodes 2 --gpus-per-node 8 --data-pvc llm-data --model-pvc llm-models [--backend trainjob] \\
        [--job-restarts 2] [--pending-timeout 900] [--dry-run]

A launcher is never fire-and-forget: the job's name comes from the run id, so a retried launcher pod finds
the job it created instead of starting a second one; pods that cannot start (bad image, missing config,
no GPUs free) fail the step in minutes rather than hours; every pod's log lines are printed once, prefixed
with the pod name; cancelling the KFP run (SIGTERM) deletes the job. Transient API errors (5xx, 429, dropped
connections) are retried.

A failed job is sorted by ``classify_failure`` (the one list of causes):

- retriable, re-run up to ``job_restarts`` times: the pod was evicted, preempted or lost with its node
  (pod reason Evicted/Preempting/Terminated/Shutdown/NodeLost, or a ``DisruptionTarget`` condition), its
  torchrun was stopped by SIGTERM (the pod was deleted; the trainer saved a checkpoint first), or the
  ranks failed to reach each other (rendezvous/NCCL errors in the failing pods' last log lines);
- deterministic, raised at once: OOMKilled, exit code 2 (the trainer's configuration errors), an image or
  container config that cannot start, the job's own activeDeadlineSeconds, and anything unknown. One
  deterministic pod makes the whole failure deterministic, even beside pods that died of NCCL errors because
  of it.

A re-run deletes the job (foreground: it is gone only once its pods are, GPUs freed), waits until the API
server answers 404 (until then a create under the name answers 409), and creates it again under the same
name, so the trainer writes the same run folder and resumes from its latest complete checkpoint. Re-runs are
counted in the job's ``RESTARTS_ANNOTATION``, so a retried launcher pod that re-attaches to a failed job
re-runs it or raises exactly as the first one would. The error names the pod to blame, its container's
terminated reason and exit code, and its last log lines (every pod's log is drained first).

The API retries, pod start checks and log following live in components/kube.py, shared with the deployer.
"""

from __future__ import annotations

import argparse
import copy
import json
import re
import signal
import sys
import time
from dataclasses import dataclass

from kubeflow.training.constants import constants as kfc
from kubernetes import client as k8s
from kubernetes.client.rest import ApiException

from components.kube import (
    FATAL_WAITING_REASONS,
    Cancelled,
    PodLogFollower,
    call_api,
    load_api_client,
    sigterm_cancels,
    unstartable_pod_reason,
)
from components.train.launcher import trainjob
from components.train.launcher.pods import TERMINATION_GRACE_PERIOD_SECONDS

FAILURE_TAIL_LINES = 20
CLEANUP_POLICIES = ("keep", "on-success", "always")
# What train_model can launch: the two job kinds, or torchrun on the step's own machine (components/train/launcher/local.py).
TRAIN_BACKENDS = ("pytorchjob", "trainjob", "local")
# Re-runs of this job so far, on the job object: the count survives the launcher pod (a KFP retry reads it).
RESTARTS_ANNOTATION = "llm-post-training.kubeflow.org/restarts"
# A foreground deletion waits for the pods' graceful termination: up to their grace period (a rank hung in NCCL
# never acts on SIGTERM and is killed only then), plus time for the operator and the garbage collector. A job
# still there after that is held by a finalizer nobody removes (an operator that is down): waiting won't help.
DELETION_TIMEOUT_SECONDS = TERMINATION_GRACE_PERIOD_SECONDS + 300.0


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


def _restarts(job: dict) -> int:
    value = ((job.get("metadata") or {}).get("annotations") or {}).get(RESTARTS_ANNOTATION, "0")
    return int(value) if value.isdigit() else 0


# -- why a job failed ---------------------------------------------------------------------------------------

# Pod status reasons of a pod that something outside the trainer ended: the kubelet's eviction under node
# pressure and its preemption for a critical pod, a graceful node shutdown (Terminated; Shutdown in the
# feature's first releases), and the node controller's mark on pods of an unreachable node (NodeLost).
NODE_REASONS = frozenset({"Evicted", "Preempting", "Terminated", "Shutdown", "NodeLost"})
# The DisruptionTarget condition's reasons (Kubernetes >= 1.26): the scheduler's preemption, the taint manager
# (node not ready/unreachable), the Eviction API (drains, autoscaler scale-down), pod GC of a deleted node,
# and the kubelet (eviction, node shutdown).
DISRUPTION_REASONS = frozenset({"PreemptionByScheduler", "DeletionByTaintManager", "EvictionByEvictionAPI",
                                "DeletionByPodGC", "TerminationByKubelet"})
# What torch prints when a rendezvous or a collective fails: torchrun's rendezvous errors, the c10d store and
# sockets (static rendezvous: DistStoreError/DistNetworkError), NCCL's errors and its watchdog's timeout.
COMMUNICATION_ERRORS = re.compile(
    r"RendezvousTimeoutError|RendezvousClosedError|DistNetworkError|DistStoreError|NCCL error|ncclRemoteError|"
    r"ncclSystemError|Watchdog caught collective operation timeout|c10d.*Connection reset by peer")
# The job's own time limit (activeDeadlineSeconds) ended it: the operator's message, JobSet's/Job's reason.
_PAST_DEADLINE = re.compile(r"DeadlineExceeded|active longer than specified deadline")
# torchrun got SIGTERM: the pod was deleted (kubectl delete, a drain, an eviction on a cluster that sets no
# DisruptionTarget condition). The trainer saved a checkpoint first; torchrun itself then exits 1, not 143.
_STOPPED_BY_SIGTERM = re.compile(r"Received (Signals\.)?SIGTERM death signal|got signal: 15\b")
# torchrun's report of its first failed process: the trainer exits 2 on a configuration error, but the
# container exits with torchrun's 1, so the 2 is only in the log.
_TORCHRUN_EXIT_2 = re.compile(r"^\s*exitcode\s*:\s*2\b")

# Classes of pod failure, most telling first: the first class any pod shows decides the job's failure.
_DETERMINISTIC, _INFRASTRUCTURE, _UNEXPLAINED, _COMMUNICATION = range(4)
_RETRIABLE = {_INFRASTRUCTURE, _COMMUNICATION}
_NOT_RE_RUN = {_DETERMINISTIC: "a re-run would fail the same way",
               _UNEXPLAINED: "no pod shows a retriable cause (eviction, preemption, lost node, rendezvous/NCCL)"}


@dataclass(frozen=True)
class Failure:
    """Why a training job failed: the pod to blame (None: no pod shows why) and whether a re-run can succeed."""

    pod: str | None
    retriable: bool
    cause: str  # one line: "pod X was Evicted: The node was low on resource: memory. ..."
    ended: str = ""  # the pod's trainer container end: "container pytorch terminated Error (exit code 137)"
    not_re_run: str = ""  # why a non-retriable failure is final


def _terminated(pod, container: str):
    """The trainer container's latest termination (now, or before a restart), or None."""
    cs = next((c for c in pod.status.container_statuses or [] if c.name == container), None)
    if cs is None:
        return None
    return next((s.terminated for s in (cs.state, cs.last_state) if s and s.terminated), None)


def _ended(pod, container: str) -> str:
    """How the trainer container ended, as the failure report says it, or ""."""
    ended = _terminated(pod, container)
    return f"container {container} terminated {ended.reason} (exit code {ended.exit_code})" if ended else ""


def _pod_failure(pod, container: str, lines: list[str]) -> tuple[int, str] | None:
    """The class and one-line cause of one pod's failure, or None if the pod did not fail."""
    name, status = pod.metadata.name, pod.status
    ended = _terminated(pod, container)
    waiting = next((c.state.waiting for c in status.container_statuses or [] if c.name == container and c.state),
                   None)
    failed = status.phase == "Failed" or bool(ended and ended.exit_code)
    if ended and ended.reason == "OOMKilled":
        return _DETERMINISTIC, f"pod {name}: container {container} was OOMKilled (exit code {ended.exit_code})"
    if ended and ended.exit_code == 2:
        return _DETERMINISTIC, f"pod {name}: container {container} exited with code 2 (a configuration error)"
    if failed and any(_TORCHRUN_EXIT_2.match(line) for line in lines):
        return _DETERMINISTIC, f"pod {name}: a trainer process exited with code 2 (a configuration error)"
    if waiting and waiting.reason in FATAL_WAITING_REASONS:
        return _DETERMINISTIC, f"pod {name}: container {container} is {waiting.reason}: {waiting.message or ''}"
    if status.reason in NODE_REASONS:
        return _INFRASTRUCTURE, f"pod {name} was {status.reason}: {(status.message or '').strip()}"
    disruption = next((c for c in status.conditions or [] if c.type == "DisruptionTarget" and c.status == "True"
                       and c.reason in DISRUPTION_REASONS), None)
    if disruption is not None:
        return _INFRASTRUCTURE, f"pod {name} was disrupted ({disruption.reason}): {(disruption.message or '').strip()}"
    if not failed:
        return None
    if stopped := next((line for line in lines if _STOPPED_BY_SIGTERM.search(line)), None):
        return _INFRASTRUCTURE, f"pod {name} was stopped by SIGTERM (deleted or drained): {stopped.strip()}"
    if comms := next((line for line in lines if COMMUNICATION_ERRORS.search(line)), None):
        return _COMMUNICATION, f"pod {name} lost contact with its peers: {comms.strip()}"
    return _UNEXPLAINED, f"pod {name}: {_ended(pod, container) or 'failed, with no container termination recorded'}"


def classify_failure(condition: dict, pods: list, container: str, last_lines) -> Failure:
    """Sort a failed job's failure into retriable (re-run the job) or deterministic (raise), and name the pod.

    ``condition`` is the job's Failed condition; ``pods`` are the job's pods as last seen, in report order (a
    pod deleted since is still evidence); ``last_lines(pod_name)`` gives the end of a pod's log. A job that
    ran past its ``activeDeadlineSeconds`` is deterministic whatever its pods show (they were stopped). Else
    each pod that failed or was taken falls in one class, and the first class any pod shows decides, in this
    order, so that a bystander never hides the cause:

    1. deterministic: the trainer container was OOMKilled (whatever its exit code); it exited with code 2, or
       torchrun reports a process that did (``exitcode  : 2``: the trainer's configuration errors); it is
       waiting on one of ``FATAL_WAITING_REASONS`` (ErrImagePull, CreateContainerConfigError, ...).
    2. retriable, the infrastructure took the pod: its status reason is one of ``NODE_REASONS`` (Evicted,
       Preempting, Terminated/Shutdown by a node shutdown, NodeLost) or it has a ``DisruptionTarget``
       condition with one of ``DISRUPTION_REASONS`` (PreemptionByScheduler, DeletionByTaintManager,
       EvictionByEvictionAPI, DeletionByPodGC, TerminationByKubelet), or its torchrun was stopped by SIGTERM
       (the pod was deleted; the trainer saved a checkpoint on the signal).
    3. deterministic, unexplained: the pod failed and shows none of these. An unknown cause is not re-run.
    4. retriable, communication: the pod's last lines match ``COMMUNICATION_ERRORS`` (RendezvousTimeoutError,
       RendezvousClosedError, DistNetworkError, DistStoreError, "NCCL error", ncclRemoteError, ncclSystemError,
       "Watchdog caught collective operation timeout", c10d's "Connection reset by peer"). Every rank prints
       these once one rank is gone, so they count only when nothing else explains the failure.

    A job that failed with no failed pod (its pods were removed) is unexplained.
    """
    if _PAST_DEADLINE.search(f"{condition.get('reason', '')} {condition.get('message', '')}"):
        return Failure(None, False, "the job ran longer than its activeDeadlineSeconds",
                       not_re_run="the deadline bounds the job's whole run")
    found = [(verdict, pod) for pod in pods
             if (verdict := _pod_failure(pod, container, last_lines(pod.metadata.name))) is not None]
    if not found:
        return Failure(None, False, "no pod shows why", not_re_run=_NOT_RE_RUN[_UNEXPLAINED])
    (klass, cause), pod = min(found, key=lambda f: f[0][0])  # min keeps the first pod of the first class
    return Failure(pod.metadata.name, klass in _RETRIABLE, cause, ended=_ended(pod, container),
                   not_re_run=_NOT_RE_RUN.get(klass, ""))


# -- the launcher -------------------------------------------------------------------------------------------

def run_training_job(manifest: dict, *, poll_seconds: float = 10.0, timeout_seconds: float | None = None,
                     pending_timeout_seconds: float = 900.0, cleanup: str = "keep", job_restarts: int = 2,
                     on_created=None, api_client=None) -> dict:
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
        job_restarts: how many times a job that failed for a retriable cause (eviction, preemption, lost node,
            rendezvous/NCCL; see ``classify_failure``) is deleted and created again under the same name, to
            resume from its last checkpoint. Counted on the job (``RESTARTS_ANNOTATION``), so a retried
            launcher continues the count. 0: never.
        on_created: called with each job as the API server returned it, as soon as it exists (created,
            re-attached, or created again for a re-run), so the caller can record its identity before the
            long wait.
        api_client: a ``kubernetes.client.ApiClient``; default: in-cluster config, else kubeconfig.

    Returns:
        ``{"name", "namespace", "kind", "state", "reason", "message"}`` from the job's final condition.

    Raises:
        ValueError: an unknown kind, cleanup policy or a negative limit, before anything is created.
        RuntimeError: the job failed for a deterministic cause, or for a retriable one after ``job_restarts``
            re-runs (the job's reason, the pod to blame, its container's end and its last log lines); a pod
            cannot start (the container's or the scheduler's reason; the job is deleted to free what it
            holds); or a deletion for a re-run never finished.
        TimeoutError: ``timeout_seconds`` passed (the job is deleted).
        SystemExit: 143 after SIGTERM, once the job is deleted.
    """
    if manifest.get("kind") not in KINDS:
        raise ValueError(f"manifest kind {manifest.get('kind')!r} is not one of {', '.join(KINDS)}")
    if cleanup not in CLEANUP_POLICIES:
        raise ValueError(f"cleanup {cleanup!r} must be one of {', '.join(CLEANUP_POLICIES)}")
    if job_restarts < 0:
        raise ValueError(f"job_restarts must be >= 0, got {job_restarts}")
    if pending_timeout_seconds < 0:
        raise ValueError(f"pending_timeout_seconds must be >= 0, got {pending_timeout_seconds}")
    kind = KINDS[manifest["kind"]]
    api_client = api_client or load_api_client()
    custom, core = k8s.CustomObjectsApi(api_client), k8s.CoreV1Api(api_client)
    name, namespace = manifest["metadata"]["name"], manifest["metadata"]["namespace"]
    what = f"{kind.kind} {namespace}/{name}"
    retry_delay = min(1.0, poll_seconds)
    ref = (kind.group, kind.version, namespace, kind.plural)
    deadline = None if timeout_seconds is None else time.monotonic() + timeout_seconds

    def get_job() -> dict:
        return call_api(custom.get_namespaced_custom_object, *ref, name, retry_delay=retry_delay)

    def delete_job(why: str, policy: str = "Background") -> None:
        print(f"deleting {what}: {why}", flush=True)
        try:
            call_api(custom.delete_namespaced_custom_object, *ref, name, retry_delay=retry_delay,
                     body=k8s.V1DeleteOptions(propagation_policy=policy))
        except ApiException as exc:
            if exc.status != 404:
                raise

    def wait_until_gone() -> None:
        # Until the API server answers 404 the name is taken: a create answers 409 AlreadyExists.
        print(f"waiting for {what} to be deleted", flush=True)
        give_up = time.monotonic() + DELETION_TIMEOUT_SECONDS
        while True:
            try:
                job = get_job()
            except ApiException as exc:
                if exc.status == 404:
                    return
                raise
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError(f"{what} did not finish within {timeout_seconds:.0f}s (it was being deleted "
                                   "for a re-run)")
            if time.monotonic() > give_up:
                finalizers = ", ".join(job["metadata"].get("finalizers") or []) or "none"
                raise RuntimeError(f"{what} is still being deleted after {DELETION_TIMEOUT_SECONDS:.0f}s "
                                   f"(finalizers: {finalizers}): check that the training operator is running, "
                                   "then delete the job's pods or its finalizers")
            time.sleep(poll_seconds)

    def create_job(restarts: int) -> None:
        body = copy.deepcopy(manifest)
        while True:
            body["metadata"]["annotations"] = {**(body["metadata"].get("annotations") or {}),
                                               RESTARTS_ANNOTATION: str(restarts)}
            try:
                call_api(custom.create_namespaced_custom_object, *ref, body, retry_delay=retry_delay)
                print(f"created {what}" + (f" (restart {restarts}/{job_restarts})" if restarts else ""), flush=True)
                return
            except ApiException as exc:
                if exc.status != 409:
                    raise
            try:
                existing = get_job()
            except ApiException as exc:
                if exc.status == 404:
                    continue  # deleted in between: the name is free now
                raise
            if not existing["metadata"].get("deletionTimestamp"):
                # The launcher pod was retried (or a dropped response hid our own create): same run, same job.
                print(f"{what} already exists: re-attaching to it", flush=True)
                return
            # A previous launcher deleted it for a re-run (or a clean-up) and stopped before creating it again.
            # Its count carries over: its failure was counted when that re-run was decided.
            restarts = _restarts(existing)
            print(f"{what} is being deleted: creating it again once it is gone", flush=True)
            wait_until_gone()

    logs = PodLogFollower(core, namespace, kind.container, out=lambda s: print(s, flush=True),
                          retry_delay=retry_delay)
    selector = f"{kind.pod_label}={name}"

    def list_pods() -> list:
        return call_api(core.list_namespaced_pod, namespace, label_selector=selector, retry_delay=retry_delay).items

    unschedulable_since: dict = {}
    with sigterm_cancels():
        try:
            create_job(0)
            announce, state = True, None
            seen: dict = {}  # uid -> this job's pod as last seen: a pod deleted since still tells why it ended
            while True:
                try:
                    job = get_job()
                except ApiException as exc:
                    if exc.status == 404:
                        raise RuntimeError(f"{what} was deleted while it ran") from None
                    raise
                if announce and on_created is not None:
                    on_created(job)
                announce = False
                # Status before logs: once the job reports an end, the logs fetched after it are complete.
                pods = list_pods()
                rank0 = kind.rank0(name, pods)
                order = lambda p: (p.metadata.name != rank0, p.metadata.name)  # noqa: E731
                pods.sort(key=order)
                seen.update((p.metadata.uid, p) for p in pods)
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
                    # Drain: one more poll, so the last lines of pods that ended meanwhile are printed too.
                    pods = sorted(list_pods(), key=order)
                    seen.update((p.metadata.uid, p) for p in pods)
                    logs.poll(pods)
                    failure = classify_failure(failed, sorted(seen.values(), key=order), kind.container,
                                               logs.last_lines)
                    used = _restarts(job)
                    if failure.retriable and used < job_restarts:
                        print(f"re-running {what} (restart {used + 1}/{job_restarts}): {failure.cause}", flush=True)
                        delete_job("to create it again once its pods are gone", policy="Foreground")
                        wait_until_gone()
                        create_job(used + 1)
                        announce, state, seen = True, None, {}
                        continue
                    if cleanup == "always":
                        delete_job(f"it failed (cleanup={cleanup})")
                    raise RuntimeError(_failure_report(what, failed, failure, rank0, logs, used, job_restarts))
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


def _failure_report(what: str, failed: dict, failure: Failure, rank0: str | None, logs: PodLogFollower,
                    used: int, job_restarts: int) -> str:
    """The error for a failed job that is not re-run: the job's reason, the cause, the pod's last lines."""
    cause = failure.cause + (f"; {failure.ended}" if failure.ended and failure.ended not in failure.cause else "")
    final = (f"a retriable cause, but the job was already re-run {used} times (job_restarts={job_restarts})"
             if failure.retriable else failure.not_re_run)
    culprit = failure.pod or rank0  # no pod to blame (a deadline): rank 0's log tells how far it got
    tail = "\n".join(logs.last_lines(culprit)[-FAILURE_TAIL_LINES:]) if culprit else ""
    return (f"{what} failed: {failed.get('reason', '')}: {failed.get('message', '')}\n"
            f"cause: {cause}\nnot re-run: {final}"
            + (f"\nlast {FAILURE_TAIL_LINES} lines of {culprit}:\n{tail}" if tail else ""))


def training_job_for_run(cluster, *, run_id: str, namespace: str, config_path: str, stage: str = "sft") -> dict:
    """The PyTorchJob or TrainJob of one run from its cluster settings (``components.settings.ClusterSettings``;
    the train step and ``--render`` call this).

    Pipeline parameters cannot be None, so 0 and {} mean "not set" in the settings.
    """
    from components.train.launcher.pytorchjob import pytorchjob_for_run
    from components.train.launcher.trainjob import trainjob_for_run

    c = cluster
    common = dict(
        run_id=run_id, namespace=namespace, config_path=config_path, trainer_image=c.trainer_image,
        num_nodes=c.num_nodes, gpus_per_node=c.gpus_per_node, data_pvc=c.data_pvc, model_pvc=c.model_pvc,
        hf_token_secret=c.hf_token_secret, node_selector=c.node_selector, tolerations=c.tolerations,
        affinity=c.affinity or None, active_deadline_seconds=c.active_deadline_seconds or None,
        queue_name=c.queue_name, stage=stage, tracking_secret=c.tracking_secret,
    )
    if c.train_backend == "trainjob":
        # Priority, gang scheduling and restarts belong to the ClusterTrainingRuntime in Trainer v2.
        return trainjob_for_run(**common)
    return pytorchjob_for_run(**common, priority_class=c.priority_class, gang_scheduling=c.gang_scheduling,
                              min_nodes=c.min_nodes or None, max_restarts=c.max_restarts)
