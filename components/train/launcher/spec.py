"""The training job of one run's stage, as one frozen spec, whichever operator runs it.

``build_pytorchjob`` (pytorchjob.py) and ``build_trainjob`` (trainjob.py) each take a ``TrainingJobSpec``, and
``pods.trainer_pod_template`` builds from it the pod both run. ``job.training_job_spec`` makes it once from a run's
settings and stage: the train step, ``python -m components.train.launcher`` and ``python -m pipelines.run --render``
all build the job through there, so what is rendered is what runs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kubeflow.training.constants import constants as kfc

from components.kube import DNS1035_LABEL, MAX_JOB_NAME, RUN_ID_LABEL, job_name_for

# Finished PyTorchJobs (and their pods' logs) stay a day for inspection, then the operator removes them.
TTL_SECONDS_AFTER_FINISHED = 24 * 3600
# The ClusterTrainingRuntime a TrainJob runs on unless the settings name another (``trainjob_runtime``).
RUNTIME = "torch-distributed"
# The Trainer releases whose TrainJob this package renders (trainjob.py, ``TRAINER_VERSIONS``); "v2.2" stands for v2.2
# and later.
TRAINER_V2_1, TRAINER_V2_2 = "v2.1", "v2.2"
# Settings a TrainJob cannot carry: Trainer v2 keeps them in the ClusterTrainingRuntime (gang scheduling too, through
# the runtime's podGroupPolicy, which preflight checks).
TRAINJOB_RUNTIME_SETTINGS = ("priority_class", "min_nodes")


@dataclass(frozen=True, kw_only=True)
class TrainingJobSpec:
    """A training job: ``num_nodes`` pods, each running ``torchrun`` over ``gpus_per_node`` GPUs with the trainer.

    The job:
        name: a DNS-1035 label of at most ``MAX_JOB_NAME`` characters (``job_name_for``).
        namespace: where the job runs (the pipeline's namespace: the claims and the Secrets live there).
        labels: put on the job and on every pod (the run id, ``RUN_ID_LABEL``, labels the trainer's metrics too).
        num_nodes: pods (PyTorchJob: one Master and ``num_nodes - 1`` Workers; elastic: up to ``num_nodes``
            Workers). gpus_per_node: GPUs per pod, also torchrun's processes per pod.
        queue_name: Kueue LocalQueue (label ``kueue.x-k8s.io/queue-name``): Kueue admits the job, all pods at once,
            when the queue's quota has room; empty: no Kueue.
        active_deadline_seconds: the operator fails the job once it has run this long; None: no limit.

    What every pod runs and mounts (``pods.trainer_pod_template``):
        image: the trainer image (CUDA PyTorch, DeepSpeed, this package).
        config_path: the trainer config as the pods see it, in its run's folder under ``MODEL_MOUNT``.
        data_pvc: ReadWriteMany claim mounted at ``DATA_MOUNT`` (datasets, the Hugging Face cache).
        model_pvc: ReadWriteMany claim mounted at ``MODEL_MOUNT`` (config, checkpoints, final model).
        shm_size: size of the memory-backed ``/dev/shm`` (NCCL and dataloader workers); counts toward the memory
            limit.

    Each pod's resources:
        cpu, memory: the container's requests; cpu_limit, memory_limit: its limits (empty: equal to the request,
            the Guaranteed QoS class), ``/dev/shm`` included in memory.
        rdma_resource: the device plugin's RDMA resource (e.g. ``rdma/ib``), ``rdma_per_pod`` of it requested with
            the GPUs; empty: none (NCCL then uses TCP between nodes). ipc_lock: add the IPC_LOCK capability verbs
            need.

    Where the pods run:
        node_selector: node labels every pod must match (e.g. the H100 pool).
        tolerations: tolerations for GPU-node taints, as Kubernetes JSON.
        affinity: pod affinity as Kubernetes JSON (e.g. keep the pods in one network block); None: none.
        image_pull_secrets: names of the Secrets the pods pull the image with; None: none.

    What the trainer reads from its environment:
        hf_token_secret: Secret holding key ``HF_TOKEN``; referenced (optional), never read.
        tracking_secret: Secret with the experiment tracker's keys (``secrets.TRACKING_KEYS``, each optional); empty:
            none referenced. langfuse_secret: Langfuse's keys (``secrets.LANGFUSE_KEYS``, optional refs); empty: none.
        nccl_env: NCCL variables merged over ``pods.NCCL_DEFAULTS``.
        egress_env: the proxy and Hub-mirror variables (``components.kube.egress_env``); None: none.
        metrics_port: where local rank 0 of each pod serves Prometheus metrics (``pods.METRICS_PORT_NAME``, the
            scrape annotations); 0: none.

    The PyTorchJob's own (Trainer v2 keeps these in the ClusterTrainingRuntime; ``TRAINJOB_RUNTIME_SETTINGS``):
        clean_pod_policy: pods the operator deletes when the job ends: ``Running`` (the default: pods still running
            when the job fails, ranks hung on a peer that died, free their GPUs; finished and failed pods stay with
            their logs), ``None`` (keep all) or ``All``.
        ttl_seconds_after_finished: the operator deletes the finished job (and its pods) after this long; None keeps
            it until someone deletes it.
        gang_scheduling: ``runPolicy.schedulingPolicy.minAvailable`` = all pods, for the operator's Volcano or
            scheduler-plugins gang scheduling (without Kueue): no pod holds GPUs while another one cannot be placed.
        priority_class: the pods' PriorityClass (Kueue and the scheduler preempt by it); empty: default.
        min_nodes: None is a static job (any failed pod fails it). A number makes it elastic: all pods are Workers,
            torchrun's c10d rendezvous runs with between ``min_nodes`` and ``num_nodes`` pods, and a failed pod is
            restarted and rejoins, up to ``max_restarts`` times (the trainer resumes from its last checkpoint).
        max_restarts: restarts an elastic job may use before it fails; unused by a static job.

    The TrainJob's own:
        runtime: the ClusterTrainingRuntime to run on (its replicated job and container must be ``node``).
        trainer_version: the installed Trainer's TrainJob (``trainjob.TRAINER_VERSIONS``).
    """

    name: str
    namespace: str
    labels: dict[str, str]
    num_nodes: int
    gpus_per_node: int
    queue_name: str = ""
    active_deadline_seconds: int | None = None

    image: str
    config_path: str
    data_pvc: str
    model_pvc: str
    shm_size: str = "64Gi"

    cpu: str = "16"
    memory: str = "128Gi"
    cpu_limit: str = ""
    memory_limit: str = ""
    rdma_resource: str = ""
    rdma_per_pod: int = 1
    ipc_lock: bool = False

    node_selector: dict[str, str]
    tolerations: list[dict]
    affinity: dict | None = None
    image_pull_secrets: list[str] | None = None

    hf_token_secret: str
    tracking_secret: str = ""
    langfuse_secret: str = ""
    nccl_env: dict[str, Any] | None = None
    egress_env: dict[str, str] | None = None
    metrics_port: int = 0

    clean_pod_policy: str = "Running"
    ttl_seconds_after_finished: int | None = TTL_SECONDS_AFTER_FINISHED
    gang_scheduling: bool = False
    priority_class: str = ""
    min_nodes: int | None = None
    max_restarts: int = 3

    runtime: str = RUNTIME
    trainer_version: str = TRAINER_V2_2

    def validate(self) -> None:
        """Raise ValueError, naming the field, for what either operator would reject: the name, image, node or GPU
        count, or the deadline."""
        validate_job(self.name, self.image, self.num_nodes, self.gpus_per_node)
        if self.active_deadline_seconds is not None and self.active_deadline_seconds < 1:
            raise ValueError(
                f"active_deadline_seconds must be >= 1 (or None: no limit), got {self.active_deadline_seconds}"
            )

    def job_labels(self) -> dict[str, str]:
        """The job's own labels: the pods' and, with ``queue_name``, the Kueue queue's."""
        return {**self.labels, kfc.LOCAL_QUEUE_LABEL: self.queue_name} if self.queue_name else dict(self.labels)


def validate_job(name: str, image: str, num_nodes: int, gpus_per_node: int) -> None:
    """Raise ValueError, naming the field, for a job name, image, node or GPU count the cluster would reject."""
    if not DNS1035_LABEL.match(name) or len(name) > MAX_JOB_NAME:
        raise ValueError(
            f"name {name!r} must be a DNS-1035 label of at most {MAX_JOB_NAME} characters (lowercase letters, "
            "digits, '-'; starts with a letter); use job_name_for(run_id)"
        )
    if not image:
        raise ValueError("image must name the trainer image")
    if num_nodes < 1:
        raise ValueError(f"num_nodes must be >= 1 (one Master plus num_nodes - 1 Workers), got {num_nodes}")
    if gpus_per_node < 1:
        raise ValueError(f"gpus_per_node must be >= 1, got {gpus_per_node}")


def trainjob_runtime_conflicts(values) -> list[str]:
    """One error per setting of ``TRAINJOB_RUNTIME_SETTINGS`` that ``values`` (a ``TrainingJobSpec`` or the cluster
    settings) sets: a TrainJob refuses them rather than drop them."""
    return [
        f"{name} with train_backend=trainjob: set it in the ClusterTrainingRuntime (Trainer v2 keeps it there), or "
        "use train_backend=pytorchjob"
        for name in TRAINJOB_RUNTIME_SETTINGS
        if getattr(values, name)
    ]


def spec_for_run(*, run_id: str, trainer_image: str, stage: str = "sft", **fields: Any) -> TrainingJobSpec:
    """The spec of one KFP run's stage from the pipeline's parameter names: named ``<stage>-<run id>`` (each stage of
    a run is its own job) and labelled by the run id; ``fields`` are the spec's other fields."""
    return TrainingJobSpec(
        name=job_name_for(run_id, stage), labels={RUN_ID_LABEL: run_id}, image=trainer_image, **fields
    )
