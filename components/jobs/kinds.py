"""The training job kinds the package runs, described once: where each lives in the API, how it ends, its pods.

    kind = job_kind("TrainJob")
    pods = core.list_namespaced_pod(ns, label_selector=f"{kind.pod_label}={job_name}")

The launcher (components/train/launcher/job.py) follows a job with it; the Katib search (components/hpo/follow.py)
finds its trials' jobs and pods with it, since Katib names each trial's job after the trial. A module of its own
(rather than the launcher's internals) so that both read the same description without the search depending on how
the launcher creates, follows and re-runs a job.
"""

from __future__ import annotations

from dataclasses import dataclass

from kubeflow.training.constants import constants as kfc

# The TrainJob's API identity (trainer.kubeflow.org/v1alpha1; components/train/launcher/trainjob.py renders it):
# the cluster's torch runtimes name their replicated job and container ``node``. JobSet labels every pod with its
# JobSet's name, which is the TrainJob's; the Job controller labels each pod with its completion index, which the
# torch runtime makes the node rank.
TRAINJOB_GROUP, TRAINJOB_VERSION, TRAINJOB_PLURAL, TRAINJOB_KIND = (
    "trainer.kubeflow.org",
    "v1alpha1",
    "trainjobs",
    "TrainJob",
)
TRAINJOB_NODE = "node"
TRAINJOB_POD_SELECTOR_LABEL = "jobset.sigs.k8s.io/jobset-name"
TRAINJOB_NODE_RANK_LABEL = "batch.kubernetes.io/job-completion-index"

# An evicted or preempted pod gets SIGTERM, then SIGKILL after the grace period (30 s by default). The trainer
# saves a complete checkpoint on SIGTERM (components/train/trainer/checkpoints.py): for Qwen3-30B-A3B each pod writes
# ~183 GB of ZeRO-3 shards, 3-6 minutes at 0.5-1 GB/s to a shared volume. The launcher's pods
# (components/train/launcher/pods.py) carry it.
TERMINATION_GRACE_PERIOD_SECONDS = 600

# A foreground deletion waits for the pods' graceful termination: up to their grace period (a rank hung in NCCL
# never acts on SIGTERM and is killed only then), plus time for the operator and the garbage collector. A job
# still there after that is held by a finalizer nobody removes (an operator that is down): waiting won't help.
DELETION_TIMEOUT_SECONDS = TERMINATION_GRACE_PERIOD_SECONDS + 300.0


@dataclass(frozen=True)
class JobKind:
    """What following one training job kind takes: where it lives, how it ends, its pods."""

    kind: str
    group: str
    version: str
    plural: str
    container: str  # the trainer container, whose log is streamed
    succeeded: str  # condition types that end the job
    failed: str
    pod_label: str  # pods carry ``pod_label=<job name>``

    def rank0(self, name: str, pods: list) -> str | None:
        """The node-rank-0 pod's name among ``pods`` of the job ``name`` (its log is printed first and is the
        failure tail's fallback)."""
        if self.kind == kfc.PYTORCHJOB_KIND:
            # The operator's naming; an elastic job has no Master, and Worker 0 hosts its rendezvous.
            names = {p.metadata.name for p in pods}
            master = f"{name}-{kfc.REPLICA_TYPE_MASTER.lower()}-0"
            worker = f"{name}-{kfc.REPLICA_TYPE_WORKER.lower()}-0"
            return worker if worker in names and master not in names else master
        # JobSet pods have generated names; the node rank is the Job completion index.
        return next(
            (p.metadata.name for p in pods if (p.metadata.labels or {}).get(TRAINJOB_NODE_RANK_LABEL) == "0"), None
        )

    def suspended(self, job: dict) -> bool:
        """Whether the job is held back on purpose (Kueue suspends a job until its queue admits it): no pods yet."""
        spec = job.get("spec") or {}
        return bool(spec.get("suspend") or (spec.get("runPolicy") or {}).get("suspend"))


JOB_KINDS = {
    kfc.PYTORCHJOB_KIND: JobKind(
        kfc.PYTORCHJOB_KIND,
        kfc.GROUP,
        kfc.VERSION,
        kfc.PYTORCHJOB_PLURAL,
        kfc.PYTORCHJOB_CONTAINER,
        kfc.JOB_CONDITION_SUCCEEDED,
        kfc.JOB_CONDITION_FAILED,
        kfc.JOB_NAME_LABEL,
    ),
    TRAINJOB_KIND: JobKind(
        TRAINJOB_KIND,
        TRAINJOB_GROUP,
        TRAINJOB_VERSION,
        TRAINJOB_PLURAL,
        TRAINJOB_NODE,
        "Complete",
        "Failed",
        TRAINJOB_POD_SELECTOR_LABEL,
    ),
}


def job_kind(kind: str | None) -> JobKind:
    """The description of a training job kind (``PyTorchJob`` or ``TrainJob``); ValueError names the kinds."""
    if kind not in JOB_KINDS:
        raise ValueError(f"manifest kind {kind!r} is not one of {', '.join(JOB_KINDS)}")
    return JOB_KINDS[kind]


def pod_label_for(kind: str) -> str:
    """The label whose value is the job's name on every pod of a job of this kind."""
    return job_kind(kind).pod_label
