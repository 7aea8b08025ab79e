"""The trainer's pod, whichever operator runs it: the PyTorchJob (pytorchjob.py) and the TrainJob (trainjob.py).

Every pod of a training job is the same: ``torchrun`` with the trainer entry point, the HF token by Secret
reference, the two claims and a memory-backed ``/dev/shm``, placed on the GPU nodes, without an Istio sidecar.
``trainer_pod_template`` builds it once from the job's spec (spec.py); the PyTorchJob uses it as it is, the TrainJob
splits it between the fields Trainer v2 gives the trainer and the patch it applies to the runtime's pod.
"""

from __future__ import annotations

import os

from kubeflow.training.constants import constants as kfc
from kubernetes import client as k8s

from components.jobs.kinds import TERMINATION_GRACE_PERIOD_SECONDS
from components.kube import RUN_ID_LABEL
from components.paths import DATA_CACHE, DATA_MOUNT, MODEL_MOUNT, run_dir
from components.secrets import HF_TOKEN_KEY, LANGFUSE_KEYS, TRACKING_KEYS, TRACKING_NAMES
from components.security import container_security_context, pod_security_context
from components.train.launcher.spec import TrainingJobSpec

# NCCL's defaults are right on InfiniBand/RoCE clusters; WARN keeps transport problems visible without
# the per-rank INFO flood. Callers override or add (NCCL_SOCKET_IFNAME, NCCL_IB_HCA, ...) per cluster.
NCCL_DEFAULTS = {"NCCL_DEBUG": "WARN"}
# The grace period (components/jobs/kinds.py) covers the checkpoint on SIGTERM. torchrun SIGKILLs its ranks 30 s
# after forwarding SIGTERM unless TORCH_ELASTIC_SHUTDOWN_TIMEOUT says otherwise; it must end before the
# kubelet's SIGKILL. Spot reclaims and hard evictions give less notice: the save_steps checkpoints cover those.
TORCHRUN_SHUTDOWN_TIMEOUT_SECONDS = TERMINATION_GRACE_PERIOD_SECONDS - 30


def trainer_volume_mounts(config_path: str) -> list[k8s.V1VolumeMount]:
    """Where the trainer's pods mount their volumes: by need, since user code runs there (reward functions, a user's
    DeepSpeed JSON) and one run's pods must not reach another run's models.

    The models claim read-only at ``MODEL_MOUNT`` (a base model may be an earlier run's ``final/``), and the run's own
    folder (``runs/<run id>``, the one ``config_path`` is in: its config, checkpoints, exports, logs) read-write over
    it, as the claim's ``subPath``. The train step writes the config there before the job exists, so the folder is
    there when the kubelet mounts it (the container runtime creates no mount point inside a read-only mount), owned
    by the same non-root user. The data claim read-only too (the prepared datasets: this run's and others'), but for
    its ``cache/`` folder (``DATA_CACHE``): the shared Hugging Face cache (``HF_HOME``) and the bf16 copies rank 0
    downloads or builds a base model into when the data step has not. The data step creates that folder; the train
    step makes sure of it before the job exists. Listed parent first: a nested mount follows the one it is inside.
    """
    parts = os.path.relpath(config_path, MODEL_MOUNT).split(os.sep)
    if len(parts) < 3 or parts[0] != "runs" or parts[1] in ("", ".", ".."):
        raise ValueError(
            f"config_path {config_path!r}: the trainer's config lives in its run's folder on the models claim "
            f"({MODEL_MOUNT}/runs/<run id>/...), the only folder its pods may write"
        )
    own = run_dir(MODEL_MOUNT, parts[1])
    return [
        k8s.V1VolumeMount(name="data", mount_path=DATA_MOUNT, read_only=True),
        k8s.V1VolumeMount(name="data", mount_path=f"{DATA_MOUNT}/{DATA_CACHE}", sub_path=DATA_CACHE),
        k8s.V1VolumeMount(name="models", mount_path=MODEL_MOUNT, read_only=True),
        k8s.V1VolumeMount(name="models", mount_path=own, sub_path=f"runs/{parts[1]}"),
        k8s.V1VolumeMount(name="dshm", mount_path="/dev/shm"),
    ]


def trainer_volumes(data_pvc: str, model_pvc: str, shm_size: str) -> list[k8s.V1Volume]:
    """The two claims and the memory-backed ``/dev/shm`` the trainer's pods mount (``trainer_volume_mounts``)."""
    return [
        k8s.V1Volume(name="data", persistent_volume_claim=k8s.V1PersistentVolumeClaimVolumeSource(claim_name=data_pvc)),
        k8s.V1Volume(
            name="models", persistent_volume_claim=k8s.V1PersistentVolumeClaimVolumeSource(claim_name=model_pvc)
        ),
        k8s.V1Volume(name="dshm", empty_dir=k8s.V1EmptyDirVolumeSource(medium="Memory", size_limit=shm_size)),
    ]


def trainer_env(hf_token_secret: str, nccl_env: dict | None, tracking_secret: str = "") -> list[k8s.V1EnvVar]:
    """The trainer container's environment: the HF token and the tracker's keys by Secret reference, the cache on
    the data claim, NCCL."""
    tracking = (
        []
        if not tracking_secret
        else [
            k8s.V1EnvVar(
                name=key,
                value_from=k8s.V1EnvVarSource(
                    secret_key_ref=k8s.V1SecretKeySelector(name=tracking_secret, key=key, optional=True)
                ),
            )
            for key in TRACKING_KEYS
        ]
        + [k8s.V1EnvVar(name=k, value=v) for k, v in TRACKING_NAMES.items()]
    )
    env = [
        *tracking,
        # optional: public models need no token, and a missing Secret must not block the pod.
        k8s.V1EnvVar(
            name="HF_TOKEN",
            value_from=k8s.V1EnvVarSource(
                secret_key_ref=k8s.V1SecretKeySelector(name=hf_token_secret, key=HF_TOKEN_KEY, optional=True)
            ),
        ),
        # Base-model downloads (60 GB for Qwen3-30B-A3B) go to the shared data claim once, not to each
        # node's ephemeral storage, where they would risk eviction.
        k8s.V1EnvVar(name="HF_HOME", value=f"{DATA_MOUNT}/{DATA_CACHE}/huggingface"),
        k8s.V1EnvVar(name="TORCH_ELASTIC_SHUTDOWN_TIMEOUT", value=str(TORCHRUN_SHUTDOWN_TIMEOUT_SECONDS)),
    ]
    nccl = {**NCCL_DEFAULTS, **(nccl_env or {})}
    return env + [k8s.V1EnvVar(name=k, value=_env_value(v)) for k, v in sorted(nccl.items())]


def _env_value(value) -> str:
    """An environment variable's text for a setting's value: KFP hands integers over as doubles (4.0 -> "4"), and
    NCCL reads booleans as 0/1."""
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


# The trainer's Prometheus endpoint (components/train/trainer/metrics.py): the container port's name, which the
# PodMonitor in manifests/monitoring/ scrapes, and the annotations annotation-based scrape configs read.
METRICS_PORT_NAME = "metrics"


def observe_env(metrics_port: int, run_id: str, job_name: str, langfuse_secret: str) -> list[k8s.V1EnvVar]:
    """What the trainer's metrics and Langfuse record read: the port, the series' labels, Langfuse's keys by
    (optional) Secret reference."""
    env = [k8s.V1EnvVar(name="TRAINER_METRICS_PORT", value=str(metrics_port))]
    env += [k8s.V1EnvVar(name=k, value=v) for k, v in (("TRAINER_RUN_ID", run_id), ("TRAINER_JOB_NAME", job_name)) if v]
    env += [
        k8s.V1EnvVar(
            name=key,
            value_from=k8s.V1EnvVarSource(
                secret_key_ref=k8s.V1SecretKeySelector(name=langfuse_secret, key=key, optional=True)
            ),
        )
        for key in (LANGFUSE_KEYS if langfuse_secret else ())
    ]
    return env


def metrics_annotations(metrics_port: int) -> dict:
    """The ``prometheus.io/*`` scrape annotations of a pod serving the trainer's metrics on ``metrics_port``."""
    if not metrics_port:
        return {}
    return {"prometheus.io/scrape": "true", "prometheus.io/port": str(metrics_port), "prometheus.io/path": "/metrics"}


def torchrun_args(nnodes: str, gpus_per_node: int, config_path: str) -> list[str]:
    """torchrun's arguments (no shell): the operators inject the rendezvous as ``PET_*`` variables."""
    return [
        "--nnodes",
        nnodes,
        "--nproc_per_node",
        str(gpus_per_node),
        "-m",
        "components.train.trainer",
        "--config",
        config_path,
    ]


def trainer_resources(job: TrainingJobSpec) -> k8s.V1ResourceRequirements:
    """The trainer container's CPU and memory requests and limits (a limit left empty is its request: the Guaranteed
    QoS class), and its GPUs and RDMA devices, requests equal to limits."""
    devices = {"nvidia.com/gpu": str(job.gpus_per_node)}
    if job.rdma_resource:  # extended resources are requested as whole units, requests equal to limits
        devices[job.rdma_resource] = str(job.rdma_per_pod)
    requests = {"cpu": job.cpu, "memory": job.memory, **devices}
    limits = {"cpu": job.cpu_limit or job.cpu, "memory": job.memory_limit or job.memory, **devices}
    return k8s.V1ResourceRequirements(requests=requests, limits=limits)


def trainer_pod_template(job: TrainingJobSpec, *, container_name: str, nnodes: str) -> k8s.V1PodTemplateSpec:
    """The pod every node of ``job`` runs.

    Args:
        job: the training job (``spec.TrainingJobSpec``: image, config, resources, placement, Secrets, NCCL, egress,
            metrics).
        container_name: where the operator injects the ``PET_*`` rendezvous (``pytorch``; ``node`` for Trainer v2).
        nnodes: torchrun's ``--nnodes``: a count, or ``min:max`` for an elastic job.

    Returns:
        The template: one container (``torchrun`` command and args, env, ``trainer_resources``, the volume mounts, the
        named ``metrics`` port where ``job.metrics_port`` is set) in a pod with the volumes, node placement,
        priority, labels, the Istio opt-out and the scrape annotations, running as the non-root user under the
        ``restricted`` security context, without a service-account token. Empty selectors, tolerations, affinity,
        priority and pull secrets are left out.
    """
    port = job.metrics_port
    container = k8s.V1Container(
        name=container_name,
        image=job.image,
        command=["torchrun"],
        args=torchrun_args(nnodes, job.gpus_per_node, job.config_path),
        env=trainer_env(job.hf_token_secret, job.nccl_env, job.tracking_secret)
        + observe_env(port, job.labels.get(RUN_ID_LABEL, ""), job.name, job.langfuse_secret)
        + [k8s.V1EnvVar(name=k, value=v) for k, v in (job.egress_env or {}).items()],
        ports=[k8s.V1ContainerPort(name=METRICS_PORT_NAME, container_port=port)] if port else None,
        resources=trainer_resources(job),
        volume_mounts=trainer_volume_mounts(job.config_path),
        security_context=container_security_context(ipc_lock=job.ipc_lock),
    )
    return k8s.V1PodTemplateSpec(
        metadata=k8s.V1ObjectMeta(
            labels=dict(job.labels),
            # An Istio sidecar never exits, so a finished pod would never complete, and it races the
            # trainer for the rendezvous port at start-up.
            annotations={kfc.ISTIO_SIDECAR_INJECTION: "false", **metrics_annotations(port)},
        ),
        spec=k8s.V1PodSpec(
            containers=[container],
            node_selector=dict(job.node_selector) or None,
            tolerations=list(job.tolerations) or None,
            affinity=job.affinity or None,
            priority_class_name=job.priority_class or None,
            image_pull_secrets=[k8s.V1LocalObjectReference(name=n) for n in job.image_pull_secrets or ()] or None,
            termination_grace_period_seconds=TERMINATION_GRACE_PERIOD_SECONDS,
            volumes=trainer_volumes(job.data_pvc, job.model_pvc, job.shm_size),
            # The Pod Security Standards' `restricted` profile (components/security.py); the trainer never calls
            # the Kubernetes API, so no service-account token is mounted.
            security_context=pod_security_context(fs_group=True),
            automount_service_account_token=False,
        ),
    )


def trainer_network_policy(job: dict) -> dict:
    """The NetworkPolicy of a rendered training job (``build_pytorchjob`` / ``build_trainjob``): its pods (selected by
    the label their operator gives them, ``<pod label>=<job name>``) admit traffic only from pods of the same
    namespace labelled with the job's run id (the run's trainer pods, of every stage, and its grpo generation server),
    on every port (the rendezvous, torch's TCPStore, NCCL's sockets, the weight transfer), and from anywhere on the
    metrics port where the pods serve one (the launcher's stall watch and Prometheus scrape it). torch's TCPStore and
    the rendezvous take no credential: without this, any pod of the cluster could join or disturb the run's process
    group. Enforced where the cluster's CNI implements NetworkPolicy (docs/security.md); RDMA traffic (InfiniBand,
    RoCE) never passes the CNI."""
    from components.jobs.kinds import job_kind

    meta = job["metadata"]
    run_id = (meta.get("labels") or {}).get(RUN_ID_LABEL)
    if not run_id:
        raise ValueError(f"job {meta['name']}: no {RUN_ID_LABEL} label, so no run whose pods may reach it")
    ports = {int(port) for port in _values(job, "prometheus.io/port")}  # metrics_annotations, either kind
    ingress: list[dict] = [{"from": [{"podSelector": {"matchLabels": {RUN_ID_LABEL: run_id}}}]}]
    ingress += [{"ports": [{"protocol": "TCP", "port": port}]} for port in sorted(ports)]
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": {"name": meta["name"], "namespace": meta["namespace"], "labels": {RUN_ID_LABEL: run_id}},
        "spec": {
            "podSelector": {"matchLabels": {job_kind(job.get("kind")).pod_label: meta["name"]}},
            "policyTypes": ["Ingress"],
            "ingress": ingress,
        },
    }


def _values(tree, key: str) -> list:
    """Every value of ``key`` anywhere in a manifest (the pod templates' annotations sit at different depths in a
    PyTorchJob, a TrainJob's runtime patch and its v2.1 override)."""
    if isinstance(tree, dict):
        return [v for k, v in tree.items() if k == key] + [x for v in tree.values() for x in _values(v, key)]
    if isinstance(tree, list):
        return [x for v in tree for x in _values(v, key)]
    return []
