"""Why a training job failed, and whether running it again can help: the one description of the causes.

    failure = classify_failure(failed_condition, pods, "pytorch", follower.last_lines)
    if failure.retriable: ...                      # re-run the job (components/train/launcher/job.py)
    raise RuntimeError(failure_report(what, failed_condition, failure, ...))

A job that ran past its ``activeDeadlineSeconds`` (the operator's message "active longer than specified deadline",
JobSet's/Job's reason ``DeadlineExceeded``) is deterministic whatever its pods show: they were stopped. Otherwise
each pod that failed or was taken falls in one class, and the first class any pod shows decides the job's failure,
in this order, so that a bystander never hides the cause:

1. deterministic: the trainer container was OOMKilled (whatever its exit code); it exited with code 2, or
   torchrun reports a process that did (``exitcode  : 2``: the trainer's configuration errors; torchrun itself
   exits 1, so the 2 is only in the log); it is waiting on one of ``kube.FATAL_WAITING_REASONS`` (ErrImagePull,
   CreateContainerConfigError, ...).
2. retriable, the infrastructure took the pod: its status reason is one of ``NODE_REASONS`` (the kubelet's
   eviction under node pressure and its preemption for a critical pod: Evicted, Preempting; a graceful node
   shutdown: Terminated, Shutdown in the feature's first releases; the node controller's mark on pods of an
   unreachable node: NodeLost), or it has a ``DisruptionTarget`` condition (Kubernetes >= 1.26) with one of
   ``DISRUPTION_REASONS`` (the scheduler's preemption, the taint manager, the Eviction API of drains and
   autoscaler scale-downs, pod GC of a deleted node, the kubelet), or its torchrun was stopped by SIGTERM (the pod
   was deleted, by kubectl or a drain on a cluster that sets no DisruptionTarget condition; the trainer saved a
   checkpoint on the signal), or torchrun reports a rank that exited 143 (``exitcode  : 143``: the ranks of every
   pod stop together after one pod's SIGTERM save, and the pod that ends first need not be the one signalled).
3. deterministic, unexplained: the pod failed and shows none of these. An unknown cause is not re-run.
4. retriable, communication: the pod's last lines match ``COMMUNICATION_ERRORS`` (torchrun's rendezvous errors,
   the c10d store and its sockets, NCCL's errors and its watchdog's timeout). Every rank prints these once one
   rank is gone, so they count only when nothing else explains the failure.

A job that failed with no failed pod (its pods were removed) is unexplained. The report names the pod to blame,
its trainer container's terminated reason and exit code, and its last log lines.

A job whose pods run but whose trainer makes no optimizer step for ``stall_timeout_seconds`` (components/jobs/
progress.py: a hung collective under a long NCCL timeout, a stuck data loader or reward function) has not failed in
the operator's eyes and would hold its GPUs for ever: the launcher ends it as retriable (a hang is most often a node's
or a network's), re-runs it from its last complete checkpoint up to ``job_restarts`` times, and reports every pod's
last lines (``stall_report``), since no pod is to blame more than another.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from components.kube import FATAL_WAITING_REASONS

FAILURE_TAIL_LINES = 20
STALL_TAIL_LINES = 10  # per pod: a stall blames no pod, so each one's end is shown

NODE_REASONS = frozenset({"Evicted", "Preempting", "Terminated", "Shutdown", "NodeLost"})
DISRUPTION_REASONS = frozenset(
    {
        "PreemptionByScheduler",
        "DeletionByTaintManager",
        "EvictionByEvictionAPI",
        "DeletionByPodGC",
        "TerminationByKubelet",
    }
)
# Static rendezvous fails with DistStoreError/DistNetworkError, dynamic with the Rendezvous* errors.
COMMUNICATION_ERRORS = re.compile(
    r"RendezvousTimeoutError|RendezvousClosedError|DistNetworkError|DistStoreError|NCCL error|ncclRemoteError|"
    r"ncclSystemError|Watchdog caught collective operation timeout|c10d.*Connection reset by peer"
)
_PAST_DEADLINE = re.compile(r"DeadlineExceeded|active longer than specified deadline")
# torchrun's own lines on SIGTERM (torch 2.x), after which it exits 1, not 143; or its report of a rank that exited
# 143, the trainer's status after a SIGTERM save (trainer/checkpoints.py), which every rank takes when one pod's
# torchrun got the signal: the pod that ends first may be one that never got it.
_STOPPED_BY_SIGTERM = re.compile(r"Received (Signals\.)?SIGTERM death signal|got signal: 15\b|^\s*exitcode\s*:\s*143\b")
# torchrun's report of its first failed process.
_TORCHRUN_EXIT_2 = re.compile(r"^\s*exitcode\s*:\s*2\b")

# The classes, most telling first (the module docstring): the first class any pod shows decides.
_DETERMINISTIC, _INFRASTRUCTURE, _UNEXPLAINED, _COMMUNICATION = range(4)
_RETRIABLE = {_INFRASTRUCTURE, _COMMUNICATION}
_NOT_RE_RUN = {
    _DETERMINISTIC: "a re-run would fail the same way",
    _UNEXPLAINED: "no pod shows a retriable cause (eviction, preemption, lost node, rendezvous/NCCL)",
}


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
    waiting = next((c.state.waiting for c in status.container_statuses or [] if c.name == container and c.state), None)
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
    disruption = next(
        (
            c
            for c in status.conditions or []
            if c.type == "DisruptionTarget" and c.status == "True" and c.reason in DISRUPTION_REASONS
        ),
        None,
    )
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
    """Sort a failed job's failure into retriable or deterministic, and name the pod to blame (module docstring).

    Args:
        condition: the job's Failed condition (its reason and message tell a deadline).
        pods: the job's pods as last seen, in report order (a pod deleted since is still evidence).
        container: the trainer container's name.
        last_lines: ``last_lines(pod_name)`` gives the end of a pod's log.
    """
    if _PAST_DEADLINE.search(f"{condition.get('reason', '')} {condition.get('message', '')}"):
        return Failure(
            None,
            False,
            "the job ran longer than its activeDeadlineSeconds",
            not_re_run="the deadline bounds the job's whole run",
        )
    found = [
        (verdict, pod)
        for pod in pods
        if (verdict := _pod_failure(pod, container, last_lines(pod.metadata.name))) is not None
    ]
    if not found:
        return Failure(None, False, "no pod shows why", not_re_run=_NOT_RE_RUN[_UNEXPLAINED])
    (klass, cause), pod = min(found, key=lambda f: f[0][0])  # min keeps the first pod of the first class
    return Failure(
        pod.metadata.name,
        klass in _RETRIABLE,
        cause,
        ended=_ended(pod, container),
        not_re_run=_NOT_RE_RUN.get(klass, ""),
    )


def failure_report(
    what: str, failed: dict, failure: Failure, rank0: str | None, last_lines, used: int, job_restarts: int
) -> str:
    """The error for a failed job that is not re-run: the job's reason, the cause, the pod's last lines."""
    cause = failure.cause + (f"; {failure.ended}" if failure.ended and failure.ended not in failure.cause else "")
    final = (
        f"a retriable cause, but the job was already re-run {used} times (job_restarts={job_restarts})"
        if failure.retriable
        else failure.not_re_run
    )
    culprit = failure.pod or rank0  # no pod to blame (a deadline): rank 0's log tells how far it got
    tail = "\n".join(last_lines(culprit)[-FAILURE_TAIL_LINES:]) if culprit else ""
    return (
        f"{what} failed: {failed.get('reason', '')}: {failed.get('message', '')}\n"
        f"cause: {cause}\nnot re-run: {final}"
        + (f"\nlast {FAILURE_TAIL_LINES} lines of {culprit}:\n{tail}" if tail else "")
    )


def pod_tails(pods: list, last_lines, lines: int = STALL_TAIL_LINES) -> str:
    """The last ``lines`` log lines of each of ``pods``, under a heading per pod (what a stalled job's pods said)."""
    return "\n".join(
        f"last lines of {pod.metadata.name}:\n" + ("\n".join(last_lines(pod.metadata.name)[-lines:]) or "(none)")
        for pod in pods
    )


def stall_report(what: str, why: str, tails: str, used: int, job_restarts: int) -> str:
    """The error for a stalled job that is not re-run: why it is stalled, every pod's last lines (``pod_tails``)."""
    return (
        f"{what} stalled: {why}\n"
        f"not re-run: a retriable cause, but the job was already re-run {used} times (job_restarts={job_restarts})"
        + (f"\n{tails}" if tails else "")
    )
