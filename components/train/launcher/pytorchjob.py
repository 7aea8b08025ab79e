"""The PyTorchJob (kubeflow.org/v1) that runs the trainer entry point on ``num_nodes`` x ``gpus_per_node`` GPUs.

One Master pod plus ``num_nodes - 1`` Worker pods, each running::

    torchrun --nnodes N --nproc_per_node G -m components.train.trainer --config FILE

The training operator (release-1.9) injects the rendezvous into every ``pytorch`` container as
``PET_MASTER_ADDR``/``PET_MASTER_PORT`` (``localhost`` on the Master, the Master's Service elsewhere),
``PET_NODE_RANK``, ``PET_NNODES`` and ``PET_NPROC_PER_NODE`` (from ``spec.nprocPerNode``), plus
``MASTER_ADDR``/``MASTER_PORT``/``WORLD_SIZE``/``RANK``. torchrun reads any ``PET_<ARG>`` variable as the
default of ``--<arg>``, so the command line above needs no shell to fill in addresses or ranks.
"""

from __future__ import annotations

from kubeflow.training import models as kf
from kubeflow.training.constants import constants as kfc
from kubernetes import client as k8s

from components.train.launcher.pods import trainer_pod_template
from components.train.launcher.spec import TrainingJobSpec, spec_for_run

# A failed rank fails the job at once (restartPolicy Never): with a static torchrun rendezvous the other
# ranks cannot carry on, and restarting one pod in place only leaves the rest hanging in NCCL. The failed
# pod stays, holding no GPU, with its log for the launcher's report. The operator counts backoffLimit
# only for OnFailure/Always; 0 records the same intent should the restart policy change. Recovery is the
# launcher's: for a retriable cause (eviction, preemption, lost node, rendezvous/NCCL) it deletes the whole
# job and creates it again under the same name, and the trainer resumes from its last complete checkpoint
# (components/train/launcher/job.py, ``job_restarts``).
RESTART_POLICY = "Never"
BACKOFF_LIMIT = 0


CLEAN_POD_POLICIES = ("None", "Running", "All")


def _validate_run_policy(job: TrainingJobSpec) -> None:
    """Raise ValueError, naming the field, for a run policy the operator would reject or that contradicts itself."""
    if job.clean_pod_policy not in CLEAN_POD_POLICIES:
        raise ValueError(f"clean_pod_policy {job.clean_pod_policy!r} must be one of {', '.join(CLEAN_POD_POLICIES)}")
    ttl = job.ttl_seconds_after_finished
    if ttl is not None and ttl < 0:
        raise ValueError(f"ttl_seconds_after_finished must be >= 0 (or None: keep), got {ttl}")
    if job.queue_name and job.gang_scheduling:
        raise ValueError(
            "queue_name and gang_scheduling are exclusive: Kueue already admits the whole job at once; "
            "gang_scheduling is for Volcano or scheduler-plugins without Kueue"
        )
    if job.min_nodes is not None and not 1 <= job.min_nodes <= job.num_nodes:
        raise ValueError(
            f"min_nodes must be between 1 and num_nodes={job.num_nodes} (or None: not elastic), got {job.min_nodes}"
        )
    if job.max_restarts < 0:
        raise ValueError(f"max_restarts must be >= 0, got {job.max_restarts}")


def build_pytorchjob(job: TrainingJobSpec) -> dict:
    """The PyTorchJob manifest of ``job`` (a plain dict, ready for CustomObjectsApi or ``yaml.safe_dump``): a Master
    and ``num_nodes - 1`` Workers, or, with ``min_nodes``, ``num_nodes`` elastic Workers, each the pod of
    ``pods.trainer_pod_template``, with the spec's run policy (clean-pod policy, TTL, deadline, gang scheduling).

    Returns:
        The manifest, serialized with the Kubernetes client's own rules (camelCase keys, no nulls).

    Raises:
        ValueError: naming the field, for an invalid name, image, node or GPU count, or run policy.
    """
    job.validate()
    _validate_run_policy(job)
    elastic = job.min_nodes is not None
    # Elastic: torchrun waits for at least min_nodes pods at the c10d rendezvous the operator points
    # PET_RDZV_ENDPOINT at (Worker 0), and takes up to num_nodes.
    nnodes = f"{job.min_nodes}:{job.num_nodes}" if elastic else str(job.num_nodes)
    # The operator's webhook and env injection look for the container "pytorch".
    template = trainer_pod_template(job, container_name=kfc.PYTORCHJOB_CONTAINER, nnodes=nnodes)
    # Elastic pods restart in place and rejoin the rendezvous; static ones cannot (see RESTART_POLICY).
    restart_policy = "OnFailure" if elastic else RESTART_POLICY

    def replicas(n: int) -> kf.KubeflowOrgV1ReplicaSpec:
        return kf.KubeflowOrgV1ReplicaSpec(replicas=n, restart_policy=restart_policy, template=template)

    if elastic:
        # The webhook requires a Worker spec for an elastic policy; Worker 0 hosts the rendezvous.
        replica_specs = {kfc.REPLICA_TYPE_WORKER: replicas(job.num_nodes)}
        elastic_policy = kf.KubeflowOrgV1ElasticPolicy(
            min_replicas=job.min_nodes, max_replicas=job.num_nodes, max_restarts=job.max_restarts, rdzv_backend="c10d"
        )
    else:
        replica_specs = {kfc.REPLICA_TYPE_MASTER: replicas(1)}
        if job.num_nodes > 1:
            replica_specs[kfc.REPLICA_TYPE_WORKER] = replicas(job.num_nodes - 1)
        elastic_policy = None
    scheduling_policy = None
    if job.gang_scheduling:
        scheduling_policy = kf.KubeflowOrgV1SchedulingPolicy(
            min_available=job.min_nodes if elastic else job.num_nodes, priority_class=job.priority_class or None
        )
    manifest = kf.KubeflowOrgV1PyTorchJob(
        api_version=kfc.API_VERSION,
        kind=kfc.PYTORCHJOB_KIND,
        metadata=k8s.V1ObjectMeta(name=job.name, namespace=job.namespace, labels=job.job_labels()),
        spec=kf.KubeflowOrgV1PyTorchJobSpec(
            # Explicit: the operator counts "auto" (its default) as 1 process per pod in WORLD_SIZE.
            nproc_per_node=str(job.gpus_per_node),
            pytorch_replica_specs=replica_specs,
            elastic_policy=elastic_policy,
            run_policy=kf.KubeflowOrgV1RunPolicy(
                # Only counted for OnFailure/Always: elastic restarts are bounded by max_restarts.
                backoff_limit=job.max_restarts if elastic else BACKOFF_LIMIT,
                clean_pod_policy=job.clean_pod_policy,
                ttl_seconds_after_finished=job.ttl_seconds_after_finished,
                active_deadline_seconds=job.active_deadline_seconds,
                scheduling_policy=scheduling_policy,
            ),
        ),
    )
    return k8s.ApiClient().sanitize_for_serialization(manifest)


def pytorchjob_for_run(**run) -> dict:
    """The PyTorchJob of one KFP run's stage, from the pipeline's parameter names (``spec.spec_for_run``: ``run_id``,
    ``trainer_image``, ``stage`` and the spec's other fields), named and labelled by the run id."""
    return build_pytorchjob(spec_for_run(**run))
