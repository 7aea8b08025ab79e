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

from components.kube import DNS1035_LABEL, MAX_JOB_NAME, RUN_ID_LABEL, job_name_for
from components.train.launcher.pods import trainer_pod_template

# A failed rank fails the job at once (restartPolicy Never): with a static torchrun rendezvous the other
# ranks cannot carry on, and restarting one pod in place only leaves the rest hanging in NCCL. The failed
# pod stays, holding no GPU, with its log for the launcher's report. The operator counts backoffLimit
# only for OnFailure/Always; 0 records the same intent should the restart policy change. Recovery is the
# launcher's: for a retriable cause (eviction, preemption, lost node, rendezvous/NCCL) it deletes the whole
# job and creates it again under the same name, and the trainer resumes from its last complete checkpoint
# (components/train/launcher/job.py, ``job_restarts``).
RESTART_POLICY = "Never"
BACKOFF_LIMIT = 0
# Finished jobs (and their pods' logs) stay a day for inspection, then the operator removes them.
TTL_SECONDS_AFTER_FINISHED = 24 * 3600


CLEAN_POD_POLICIES = ("None", "Running", "All")


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


def _validate_run_policy(
    num_nodes: int,
    clean_pod_policy: str,
    ttl_seconds_after_finished: int | None,
    active_deadline_seconds: int | None,
    queue_name: str,
    gang_scheduling: bool,
    min_nodes: int | None,
    max_restarts: int,
) -> None:
    if clean_pod_policy not in CLEAN_POD_POLICIES:
        raise ValueError(f"clean_pod_policy {clean_pod_policy!r} must be one of {', '.join(CLEAN_POD_POLICIES)}")
    if ttl_seconds_after_finished is not None and ttl_seconds_after_finished < 0:
        raise ValueError(f"ttl_seconds_after_finished must be >= 0 (or None: keep), got {ttl_seconds_after_finished}")
    if active_deadline_seconds is not None and active_deadline_seconds < 1:
        raise ValueError(f"active_deadline_seconds must be >= 1 (or None: no limit), got {active_deadline_seconds}")
    if queue_name and gang_scheduling:
        raise ValueError(
            "queue_name and gang_scheduling are exclusive: Kueue already admits the whole job at once; "
            "gang_scheduling is for Volcano or scheduler-plugins without Kueue"
        )
    if min_nodes is not None and not 1 <= min_nodes <= num_nodes:
        raise ValueError(
            f"min_nodes must be between 1 and num_nodes={num_nodes} (or None: not elastic), got {min_nodes}"
        )
    if max_restarts < 0:
        raise ValueError(f"max_restarts must be >= 0, got {max_restarts}")


def build_pytorchjob(
    *,
    name: str,
    namespace: str,
    image: str,
    config_path: str,
    num_nodes: int,
    gpus_per_node: int,
    data_pvc: str,
    model_pvc: str,
    hf_token_secret: str,
    node_selector: dict,
    tolerations: list,
    labels: dict,
    affinity: dict | None = None,
    shm_size: str = "64Gi",
    cpu: str = "16",
    memory: str = "128Gi",
    cpu_limit: str = "",
    memory_limit: str = "",
    nccl_env: dict | None = None,
    clean_pod_policy: str = "Running",
    ttl_seconds_after_finished: int | None = TTL_SECONDS_AFTER_FINISHED,
    active_deadline_seconds: int | None = None,
    queue_name: str = "",
    gang_scheduling: bool = False,
    priority_class: str = "",
    min_nodes: int | None = None,
    max_restarts: int = 3,
    tracking_secret: str = "",
    metrics_port: int = 0,
    langfuse_secret: str = "",
    rdma_resource: str = "",
    rdma_per_pod: int = 1,
    ipc_lock: bool = False,
    egress_env: dict | None = None,
    image_pull_secrets: list | None = None,
) -> dict:
    """The PyTorchJob manifest (a plain dict, ready for CustomObjectsApi or ``yaml.safe_dump``).

    Args:
        name: job name, a DNS-1035 label of at most ``MAX_JOB_NAME`` characters (see ``job_name_for``).
        namespace: where the job runs (the pipeline's namespace: the claims and the Secret live there).
        image: the trainer image (CUDA PyTorch, DeepSpeed, this package).
        config_path: the trainer config as the pods see it (under ``MODEL_MOUNT``).
        num_nodes: pods; 1 is a lone Master, N adds N - 1 Workers (elastic: up to N Workers).
        gpus_per_node: GPUs per pod, also torchrun's processes per pod (``nprocPerNode``).
        data_pvc: ReadWriteMany claim mounted at ``DATA_MOUNT`` (datasets, Hugging Face cache).
        model_pvc: ReadWriteMany claim mounted at ``MODEL_MOUNT`` (config, checkpoints, final model).
        hf_token_secret: Secret holding key ``HF_TOKEN``; referenced (optional), never read.
        node_selector: node labels every pod must match (e.g. the H100 pool).
        tolerations: tolerations for GPU-node taints, as Kubernetes JSON.
        labels: put on the job and on every pod.
        affinity: pod affinity as Kubernetes JSON (e.g. keep the pods in one network block); None: none.
        shm_size: size of the memory-backed ``/dev/shm`` (NCCL and dataloader workers); counts toward ``memory``.
        cpu: CPU request per pod; cpu_limit: its limit (empty: the request).
        memory: memory request per pod; memory_limit: its limit (empty: the request), ``/dev/shm`` included.
        nccl_env: NCCL variables merged over ``pods.NCCL_DEFAULTS``.
        rdma_resource, rdma_per_pod, ipc_lock: the RDMA device each pod requests and the capability verbs need
            (``pods.trainer_pod_template``).
        tracking_secret: Secret with the experiment tracker's keys (``pods.TRACKING_KEYS``, each optional); empty:
            none referenced.
        clean_pod_policy: pods the operator deletes when the job ends: ``Running`` (the default: pods still
            running when the job fails, ranks hung on a peer that died, free their GPUs; finished and failed pods
            stay with their logs), ``None`` (keep all) or ``All``.
        ttl_seconds_after_finished: the operator deletes the finished job (and its pods) after this long;
            None keeps it until someone deletes it.
        active_deadline_seconds: the operator fails the job once it has run this long; None: no limit.
        queue_name: Kueue LocalQueue (label ``kueue.x-k8s.io/queue-name``): Kueue admits the job, all
            pods at once, when the queue's quota has room; empty: no Kueue.
        gang_scheduling: ``runPolicy.schedulingPolicy.minAvailable`` = all pods, for the operator's
            Volcano or scheduler-plugins gang scheduling (without Kueue): no pod holds GPUs while
            another one cannot be placed.
        priority_class: the pods' PriorityClass (Kueue and the scheduler preempt by it); empty: default.
        min_nodes: None is a static job (any failed pod fails it). A number makes it elastic: all pods
            are Workers, torchrun's c10d rendezvous runs with between ``min_nodes`` and ``num_nodes``
            pods, and a failed pod is restarted and rejoins, up to ``max_restarts`` times (the trainer
            resumes from its last checkpoint).
        max_restarts: restarts an elastic job may use before it fails; unused by a static job.
        metrics_port: the port local rank 0 of each pod serves Prometheus metrics on (``pods.METRICS_PORT_NAME``,
            scrape annotations); 0: none.
        langfuse_secret: Secret with Langfuse's keys (``secrets.LANGFUSE_KEYS``, optional refs); empty: none.
        egress_env: proxy and Hub-mirror variables of the trainer (``components.kube.egress_env``); None: none.
        image_pull_secrets: Secret names the pods pull the image with (the pod spec's ``imagePullSecrets``).

    Returns:
        The manifest, serialized with the Kubernetes client's own rules (camelCase keys, no nulls).

    Raises:
        ValueError: naming the field, for an invalid name, image, node or GPU count, or run policy.
    """
    validate_job(name, image, num_nodes, gpus_per_node)
    _validate_run_policy(
        num_nodes,
        clean_pod_policy,
        ttl_seconds_after_finished,
        active_deadline_seconds,
        queue_name,
        gang_scheduling,
        min_nodes,
        max_restarts,
    )
    elastic = min_nodes is not None
    # Elastic: torchrun waits for at least min_nodes pods at the c10d rendezvous the operator points
    # PET_RDZV_ENDPOINT at (Worker 0), and takes up to num_nodes.
    nnodes = f"{min_nodes}:{num_nodes}" if elastic else str(num_nodes)
    template = trainer_pod_template(
        container_name=kfc.PYTORCHJOB_CONTAINER,  # the operator's webhook and env injection look for "pytorch"
        image=image,
        nnodes=nnodes,
        gpus_per_node=gpus_per_node,
        config_path=config_path,
        hf_token_secret=hf_token_secret,
        nccl_env=nccl_env,
        cpu=cpu,
        memory=memory,
        cpu_limit=cpu_limit,
        memory_limit=memory_limit,
        data_pvc=data_pvc,
        model_pvc=model_pvc,
        shm_size=shm_size,
        labels=labels,
        node_selector=node_selector,
        tolerations=tolerations,
        affinity=affinity,
        priority_class=priority_class,
        tracking_secret=tracking_secret,
        metrics_port=metrics_port,
        job_name=name,
        langfuse_secret=langfuse_secret,
        rdma_resource=rdma_resource,
        rdma_per_pod=rdma_per_pod,
        ipc_lock=ipc_lock,
        egress_env=egress_env,
        image_pull_secrets=image_pull_secrets,
    )
    # Elastic pods restart in place and rejoin the rendezvous; static ones cannot (see RESTART_POLICY).
    restart_policy = "OnFailure" if elastic else RESTART_POLICY

    def replicas(n: int) -> kf.KubeflowOrgV1ReplicaSpec:
        return kf.KubeflowOrgV1ReplicaSpec(replicas=n, restart_policy=restart_policy, template=template)

    if elastic:
        # The webhook requires a Worker spec for an elastic policy; Worker 0 hosts the rendezvous.
        replica_specs = {kfc.REPLICA_TYPE_WORKER: replicas(num_nodes)}
        elastic_policy = kf.KubeflowOrgV1ElasticPolicy(
            min_replicas=min_nodes, max_replicas=num_nodes, max_restarts=max_restarts, rdzv_backend="c10d"
        )
    else:
        replica_specs = {kfc.REPLICA_TYPE_MASTER: replicas(1)}
        if num_nodes > 1:
            replica_specs[kfc.REPLICA_TYPE_WORKER] = replicas(num_nodes - 1)
        elastic_policy = None
    scheduling_policy = None
    if gang_scheduling:
        scheduling_policy = kf.KubeflowOrgV1SchedulingPolicy(
            min_available=min_nodes if elastic else num_nodes, priority_class=priority_class or None
        )
    job_labels = dict(labels)
    if queue_name:
        job_labels[kfc.LOCAL_QUEUE_LABEL] = queue_name
    job = kf.KubeflowOrgV1PyTorchJob(
        api_version=kfc.API_VERSION,
        kind=kfc.PYTORCHJOB_KIND,
        metadata=k8s.V1ObjectMeta(name=name, namespace=namespace, labels=job_labels),
        spec=kf.KubeflowOrgV1PyTorchJobSpec(
            # Explicit: the operator counts "auto" (its default) as 1 process per pod in WORLD_SIZE.
            nproc_per_node=str(gpus_per_node),
            pytorch_replica_specs=replica_specs,
            elastic_policy=elastic_policy,
            run_policy=kf.KubeflowOrgV1RunPolicy(
                # Only counted for OnFailure/Always: elastic restarts are bounded by max_restarts.
                backoff_limit=max_restarts if elastic else BACKOFF_LIMIT,
                clean_pod_policy=clean_pod_policy,
                ttl_seconds_after_finished=ttl_seconds_after_finished,
                active_deadline_seconds=active_deadline_seconds,
                scheduling_policy=scheduling_policy,
            ),
        ),
    )
    return k8s.ApiClient().sanitize_for_serialization(job)


def pytorchjob_for_run(
    *,
    run_id: str,
    namespace: str,
    config_path: str,
    trainer_image: str,
    num_nodes: int,
    gpus_per_node: int,
    data_pvc: str,
    model_pvc: str,
    hf_token_secret: str,
    node_selector: dict,
    tolerations: list,
    stage: str = "sft",
    **options,
) -> dict:
    """The PyTorchJob of one KFP run, from the pipeline's parameter names: named and labelled by the run id.

    ``options`` are ``build_pytorchjob``'s keyword parameters (affinity, resources, NCCL, run policy,
    Kueue queue, gang scheduling, priority class, elastic min_nodes/max_restarts). The train step,
    ``python -m components.train.launcher`` and ``python -m pipelines.run --render`` all build the job
    through here, so what is rendered is what runs. ``stage`` (cpt, sft, dpo) prefixes the name: each stage of a
    run is its own job.
    """
    return build_pytorchjob(
        name=job_name_for(run_id, stage),
        namespace=namespace,
        image=trainer_image,
        config_path=config_path,
        num_nodes=num_nodes,
        gpus_per_node=gpus_per_node,
        data_pvc=data_pvc,
        model_pvc=model_pvc,
        hf_token_secret=hf_token_secret,
        node_selector=node_selector,
        tolerations=tolerations,
        labels={RUN_ID_LABEL: run_id},
        **options,
    )
