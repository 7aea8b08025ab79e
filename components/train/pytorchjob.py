"""The PyTorchJob (kubeflow.org/v1) that runs the trainer entry point on ``num_nodes`` x ``gpus_per_node`` GPUs.

One Master pod plus ``num_nodes - 1`` Worker pods, each running::

    torchrun --nnodes N --nproc_per_node G -m components.train.sft --config FILE

The training operator (release-1.9) injects the rendezvous into every ``pytorch`` container as
``PET_MASTER_ADDR``/``PET_MASTER_PORT`` (``localhost`` on the Master, the Master's Service elsewhere),
``PET_NODE_RANK``, ``PET_NNODES`` and ``PET_NPROC_PER_NODE`` (from ``spec.nprocPerNode``), plus
``MASTER_ADDR``/``MASTER_PORT``/``WORLD_SIZE``/``RANK``. torchrun reads any ``PET_<ARG>`` variable as the
default of ``--<arg>``, so the command line above needs no shell to fill in addresses or ranks.
"""

from __future__ import annotations

import hashlib
import re

from kubeflow.training import models as kf
from kubeflow.training.constants import constants as kfc
from kubernetes import client as k8s

from components.paths import DATA_MOUNT, MODEL_MOUNT

# The operator names pods and their headless Services ``<job>-worker-<index>``; Service names must be
# DNS-1035 labels (<= 63 characters), which leaves 52 for the job with three-digit worker indexes.
MAX_JOB_NAME = 52
_DNS1035 = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")

# NCCL's defaults are right on InfiniBand/RoCE clusters; WARN keeps transport problems visible without
# the per-rank INFO flood. Callers override or add (NCCL_SOCKET_IFNAME, NCCL_IB_HCA, ...) per cluster.
NCCL_DEFAULTS = {"NCCL_DEBUG": "WARN"}

# A failed rank fails the job at once (restartPolicy Never): with a static torchrun rendezvous the other
# ranks cannot carry on, and restarting one pod in place only leaves the rest hanging in NCCL. The failed
# pod stays, holding no GPU, with its log for the launcher's report. The operator counts backoffLimit
# only for OnFailure/Always; 0 records the same intent should the restart policy change.
RESTART_POLICY = "Never"
BACKOFF_LIMIT = 0
# Finished jobs (and their pods' logs) stay a day for inspection, then the operator removes them.
TTL_SECONDS_AFTER_FINISHED = 24 * 3600


def job_name_for(run_id: str, prefix: str = "sft") -> str:
    """Deterministic, valid DNS-1035 label (<= 63 chars, lowercase, starts with a letter) from the KFP run id.

    The same run id always gives the same name, so a retried launcher finds the job it created. Names
    longer than ``MAX_JOB_NAME`` keep their start and end in an 8-character hash of the full run id.
    """
    if not _DNS1035.match(prefix):
        raise ValueError(f"prefix {prefix!r} must be a DNS-1035 label (lowercase letters, digits, '-'; "
                         "starts with a letter)")
    slug = re.sub(r"[^a-z0-9]+", "-", run_id.lower()).strip("-")
    if not slug:
        raise ValueError(f"run_id {run_id!r} has no letters or digits; pass the KFP run id")
    name = f"{prefix}-{slug}"
    if len(name) > MAX_JOB_NAME:
        digest = hashlib.sha256(run_id.encode()).hexdigest()[:8]
        name = f"{name[:MAX_JOB_NAME - len(digest) - 1].rstrip('-')}-{digest}"
    return name


def _validate(name: str, image: str, num_nodes: int, gpus_per_node: int) -> None:
    if not _DNS1035.match(name) or len(name) > MAX_JOB_NAME:
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


def _claim(name: str) -> k8s.V1PersistentVolumeClaimVolumeSource:
    return k8s.V1PersistentVolumeClaimVolumeSource(claim_name=name)


def build_pytorchjob(*, name: str, namespace: str, image: str, config_path: str, num_nodes: int,
                     gpus_per_node: int, data_pvc: str, model_pvc: str, hf_token_secret: str,
                     node_selector: dict, tolerations: list, labels: dict,
                     shm_size: str = "64Gi", cpu: str = "16", memory: str = "128Gi",
                     nccl_env: dict | None = None) -> dict:
    """The PyTorchJob manifest (a plain dict, ready for CustomObjectsApi or ``yaml.safe_dump``).

    Args:
        name: job name, a DNS-1035 label of at most ``MAX_JOB_NAME`` characters (see ``job_name_for``).
        namespace: where the job runs (the pipeline's namespace: the claims and the Secret live there).
        image: the trainer image (CUDA PyTorch, DeepSpeed, this package).
        config_path: the trainer config as the pods see it (under ``MODEL_MOUNT``).
        num_nodes: pods; 1 is a lone Master, N adds N - 1 Workers.
        gpus_per_node: GPUs per pod, also torchrun's processes per pod (``nprocPerNode``).
        data_pvc: ReadWriteMany claim mounted at ``DATA_MOUNT`` (datasets, Hugging Face cache).
        model_pvc: ReadWriteMany claim mounted at ``MODEL_MOUNT`` (config, checkpoints, final model).
        hf_token_secret: Secret holding key ``HF_TOKEN``; referenced (optional), never read.
        node_selector: node labels every pod must match (e.g. the H100 pool).
        tolerations: tolerations for GPU-node taints, as Kubernetes JSON.
        labels: put on the job and on every pod.
        shm_size: size of the memory-backed ``/dev/shm`` (NCCL and dataloader workers); counts toward ``memory``.
        cpu: CPU request and limit per pod.
        memory: memory request and limit per pod.
        nccl_env: NCCL variables merged over ``NCCL_DEFAULTS``.

    Returns:
        The manifest, serialized with the Kubernetes client's own rules (camelCase keys, no nulls).

    Raises:
        ValueError: naming the field, for an invalid name, image, node count or GPU count.
    """
    _validate(name, image, num_nodes, gpus_per_node)
    resources = {"cpu": cpu, "memory": memory, "nvidia.com/gpu": str(gpus_per_node)}
    env = [
        # optional: public models need no token, and a missing Secret must not block the pod.
        k8s.V1EnvVar(name="HF_TOKEN", value_from=k8s.V1EnvVarSource(
            secret_key_ref=k8s.V1SecretKeySelector(name=hf_token_secret, key="HF_TOKEN", optional=True))),
        # Base-model downloads (60 GB for Qwen3-30B-A3B) go to the shared data claim once, not to each
        # node's ephemeral storage, where they would risk eviction.
        k8s.V1EnvVar(name="HF_HOME", value=f"{DATA_MOUNT}/cache/huggingface"),
    ]
    env += [k8s.V1EnvVar(name=k, value=str(v)) for k, v in sorted({**NCCL_DEFAULTS, **(nccl_env or {})}.items())]
    container = k8s.V1Container(
        name=kfc.PYTORCHJOB_CONTAINER,  # the operator's webhook and env injection look for "pytorch"
        image=image,
        command=["torchrun"],
        args=["--nnodes", str(num_nodes), "--nproc_per_node", str(gpus_per_node),
              "-m", "components.train.sft", "--config", config_path],
        env=env,
        resources=k8s.V1ResourceRequirements(requests=resources, limits=resources),
        volume_mounts=[
            k8s.V1VolumeMount(name="data", mount_path=DATA_MOUNT),
            k8s.V1VolumeMount(name="models", mount_path=MODEL_MOUNT),
            k8s.V1VolumeMount(name="dshm", mount_path="/dev/shm"),
        ],
    )
    template = k8s.V1PodTemplateSpec(
        metadata=k8s.V1ObjectMeta(
            labels=dict(labels),
            # An Istio sidecar never exits, so a finished pod would never complete, and it races the
            # trainer for the rendezvous port at start-up.
            annotations={kfc.ISTIO_SIDECAR_INJECTION: "false"},
        ),
        spec=k8s.V1PodSpec(
            containers=[container],
            node_selector=dict(node_selector) or None,
            tolerations=list(tolerations) or None,
            volumes=[
                k8s.V1Volume(name="data", persistent_volume_claim=_claim(data_pvc)),
                k8s.V1Volume(name="models", persistent_volume_claim=_claim(model_pvc)),
                k8s.V1Volume(name="dshm", empty_dir=k8s.V1EmptyDirVolumeSource(medium="Memory", size_limit=shm_size)),
            ],
        ),
    )
    def replicas(n: int) -> kf.KubeflowOrgV1ReplicaSpec:
        return kf.KubeflowOrgV1ReplicaSpec(replicas=n, restart_policy=RESTART_POLICY, template=template)

    replica_specs = {kfc.REPLICA_TYPE_MASTER: replicas(1)}
    if num_nodes > 1:
        replica_specs[kfc.REPLICA_TYPE_WORKER] = replicas(num_nodes - 1)
    job = kf.KubeflowOrgV1PyTorchJob(
        api_version=kfc.API_VERSION,
        kind=kfc.PYTORCHJOB_KIND,
        metadata=k8s.V1ObjectMeta(name=name, namespace=namespace, labels=dict(labels)),
        spec=kf.KubeflowOrgV1PyTorchJobSpec(
            # Explicit: the operator counts "auto" (its default) as 1 process per pod in WORLD_SIZE.
            nproc_per_node=str(gpus_per_node),
            pytorch_replica_specs=replica_specs,
            run_policy=kf.KubeflowOrgV1RunPolicy(
                backoff_limit=BACKOFF_LIMIT,
                # Keep finished pods (they hold no GPUs) so their logs can be read; TTL removes them with the job.
                clean_pod_policy="None",
                ttl_seconds_after_finished=TTL_SECONDS_AFTER_FINISHED,
            ),
        ),
    )
    return k8s.ApiClient().sanitize_for_serialization(job)


RUN_ID_LABEL = "pipelines.kubeflow.org/run-id"


def pytorchjob_for_run(*, run_id: str, namespace: str, config_path: str, trainer_image: str, num_nodes: int,
                       gpus_per_node: int, data_pvc: str, model_pvc: str, hf_token_secret: str,
                       node_selector: dict, tolerations: list) -> dict:
    """The PyTorchJob of one KFP run, from the pipeline's parameter names: named and labelled by the run id.

    The train step, ``python -m components.train.launch`` and ``python -m pipelines.run --render`` all
    build the job through here, so what is rendered is what runs.
    """
    return build_pytorchjob(
        name=job_name_for(run_id), namespace=namespace, image=trainer_image, config_path=config_path,
        num_nodes=num_nodes, gpus_per_node=gpus_per_node, data_pvc=data_pvc, model_pvc=model_pvc,
        hf_token_secret=hf_token_secret, node_selector=node_selector, tolerations=tolerations,
        labels={RUN_ID_LABEL: run_id},
    )
