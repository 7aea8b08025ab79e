"""Where the job runs: Kubernetes names, scheduling options and what each training backend supports."""

from __future__ import annotations

import re
from urllib.parse import urlsplit

from components.names import (
    DNS1123_SUBDOMAIN,
    image_error,
    label_key_error,
    label_value_error,
    name_error,
    quantity,
)
from components.settings import Settings
from components.stages import resource_settings

# The GPUs one node of a product holds, by the nodes' nvidia.com/gpu.product label (GPU feature discovery names it
# after nvidia-smi's product name): an HGX/DGX board's 8 SXM GPUs, a GB200/GB300 NVL72 compute tray's 4. A count
# above it never schedules; other products are left to the preflight, which reads the nodes' allocatable GPUs.
GPU_PRODUCT = "nvidia.com/gpu.product"
GPUS_PER_NODE = (
    (re.compile(r"GB[23]00"), 4, "a GB200/GB300 NVL72 compute tray"),
    (re.compile(r"-SXM|-HBM3|^NVIDIA-(H200|B200|B300)$"), 8, "an HGX/DGX board"),
)
TOLERATION_OPERATORS = ("Exists", "Equal")
TAINT_EFFECTS = ("", "NoSchedule", "PreferNoSchedule", "NoExecute")

# Ports a training pod already listens on, which its metrics server would clash with: the training operator's
# PyTorchJob master port (PytorchJobDefaultPort), the c10d rendezvous of elastic jobs and torchrun's default.
RENDEZVOUS_PORTS = {
    23456: "the PyTorchJob's master port",
    29400: "the elastic c10d rendezvous",
    29500: "torchrun's default master port",
}


# An extended resource's name (a device plugin's, e.g. rdma/ib): a DNS subdomain prefix, a slash, a qualified name
# (Kubernetes validation: IsQualifiedName, and extended resources outside kubernetes.io must carry a prefix).
EXTENDED_RESOURCE = re.compile(
    r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$"
)
NCCL_VARIABLE = re.compile(r"^NCCL_[A-Z0-9_]+$")


# Host memory of one trainer pod while it writes a checkpoint, per rank (components/train/trainer/export.py and
# docs/memory.md#the-trainer-pod: the reference job's 8 ranks, Qwen3-30B-A3B under ZeRO-3 on 2 x 8 H100, hold ~110 GB:
# ~40-48 GB of runtime and data loaders plus one ~7.6 GB fp32 partition staged per rank). A memory limit below it is
# an OOM kill at the first checkpoint, hours into the run; smaller models need less, the reference's figure is the
# budget this package documents and holds pods to.
CHECKPOINT_HOST_BYTES_PER_RANK = 110e9 / 8


def trainer_pod_errors(s: Settings) -> list[str | None]:
    """The trainer pod's CPU, memory and ``/dev/shm``: quantities the API server takes, requests within limits,
    ``/dev/shm`` within the memory limit (it is memory-backed), and a memory limit that holds a checkpoint's
    ``CHECKPOINT_HOST_BYTES_PER_RANK`` for each of the pod's ranks."""
    fields = {
        "trainer_cpu_request": (s.job.trainer_cpu_request, "16"),
        "trainer_cpu_limit": (s.job.trainer_cpu_limit, "16"),
        "trainer_memory_request": (s.job.trainer_memory_request, "96Gi"),
        "trainer_memory_limit": (s.job.trainer_memory_limit, "128Gi"),
        "trainer_shm_size": (s.job.trainer_shm_size, "64Gi"),
    }
    parsed = {name: quantity(value) for name, (value, _) in fields.items()}
    errors: list[str | None] = [
        f"{name}={fields[name][0]!r} is not a positive Kubernetes quantity, e.g. {fields[name][1]!r}"
        for name, amount in parsed.items()
        if not amount
    ]
    if errors:
        return errors
    values = {name: amount or 0.0 for name, amount in parsed.items()}
    for kind in ("cpu", "memory"):
        request, limit = f"trainer_{kind}_request", f"trainer_{kind}_limit"
        if values[request] > values[limit]:
            errors.append(
                f"{request}={fields[request][0]} is above {limit}={fields[limit][0]}: the API server refuses a "
                f"request above its limit; lower {request} or raise {limit}"
            )
    memory_limit = fields["trainer_memory_limit"][0]
    if values["trainer_shm_size"] > values["trainer_memory_limit"]:
        errors.append(
            f"trainer_shm_size={s.job.trainer_shm_size} is above trainer_memory_limit={memory_limit}: /dev/shm is "
            "memory-backed and what is written there counts toward the limit; lower trainer_shm_size"
        )
    # The pod of the most ranks: the run's gpus_per_node, or a stage's own (stage_settings) above it.
    gpus_name, gpus = max(resource_settings(s, "gpus_per_node"), key=lambda named: named[1])
    budget = CHECKPOINT_HOST_BYTES_PER_RANK * gpus
    if s.job.train_backend != "local" and values["trainer_memory_limit"] < budget:
        gib = -(-budget // 1024**3)
        errors.append(
            f"trainer_memory_limit={memory_limit} is below the ~{budget / 1e9:.0f} GB ({gib:.0f}Gi) a trainer pod of "
            f"{gpus} ranks ({gpus_name}) holds while it writes a checkpoint "
            "(docs/memory.md#the-trainer-pod): it would be OOM-killed at the first checkpoint; set "
            f"trainer_memory_limit to at least {gib:.0f}Gi"
        )
    return errors


def check_network_settings(s: Settings) -> list[str | None]:
    """The training pods' network: an RDMA resource name the API server accepts, NCCL variables only."""
    errors: list[str | None] = []
    if s.network.rdma_resource:
        prefix = s.network.rdma_resource.partition("/")[0]
        if not EXTENDED_RESOURCE.match(s.network.rdma_resource) or len(prefix) > 253:
            errors.append(
                f"rdma_resource={s.network.rdma_resource!r} is not an extended resource name (<domain>/<name>, as the "
                "device plugin advertises it in kubectl get node -o jsonpath='{.status.allocatable}'), e.g. rdma/ib"
            )
        elif s.network.rdma_resource in ("nvidia.com/gpu", "cpu", "memory"):
            errors.append(
                f"rdma_resource={s.network.rdma_resource!r} is not a network device; e.g. rdma/ib, or leave it empty"
            )
    for key, value in (s.network.nccl_env or {}).items():
        if not NCCL_VARIABLE.match(str(key)):
            errors.append(f"nccl_env key {key!r} is not an NCCL variable (NCCL_ and capitals), e.g. NCCL_IB_HCA")
        elif not isinstance(value, (str, int, float, bool)):
            errors.append(f"nccl_env {key}={value!r}: give a string or a number")
    return errors


def network_warnings(s: Settings) -> list[str]:
    """What runs, but not over RDMA: verbs without IPC_LOCK. (No RDMA resource at all is no warning: the plan that
    validate_inputs logs names the TCP transport and its speed.)"""
    out = []
    net = s.network
    if net.rdma_resource and not net.ipc_lock and "efa" not in net.rdma_resource:
        out.append(
            f"rdma_resource={net.rdma_resource} without ipc_lock: InfiniBand/RoCE verbs pin the memory they register, "
            "and without IPC_LOCK (or an unlimited memlock limit from the runtime) NCCL's IB transport fails to "
            "register it and falls back to TCP; set ipc_lock=true"
        )
    return out


def placement_errors(s: Settings) -> list[str | None]:
    """The GPU pods' image and placement as the API server and the scheduler take them: the trainer image in the
    image reference grammar, node selector and toleration keys and values by the label rules, and (on a cluster)
    no pod asking for more GPUs than a node of the selected product holds."""
    errors = [image_error("trainer_image", s.job.trainer_image)]
    for key, value in s.job.node_selector.items():
        errors.append(label_key_error("node_selector", key) or label_value_error("node_selector", key, value))
    for i, tol in enumerate(s.job.tolerations):
        field = f"tolerations[{i}]"
        if not isinstance(tol, dict):
            errors.append(f'{field}={tol!r} is not an object, e.g. {{"key": "nvidia.com/gpu", "operator": "Exists"}}')
            continue
        operator = tol.get("operator", "Equal")
        if operator not in TOLERATION_OPERATORS:
            errors.append(f"{field}: operator {operator!r} is not one of {', '.join(TOLERATION_OPERATORS)}")
        if tol.get("effect", "") not in TAINT_EFFECTS:
            errors.append(f"{field}: effect {tol['effect']!r} is not one of {', '.join(TAINT_EFFECTS[1:])} (or empty)")
        if tol.get("key", ""):  # an empty key with Exists tolerates every taint
            errors.append(label_key_error(field, tol["key"]))
        if operator == "Exists" and tol.get("value", ""):
            errors.append(f"{field}: operator Exists takes no value (it is {tol['value']!r}); use Equal")
        elif tol.get("value", "") and (problem := label_value_error(field, tol.get("key"), tol["value"])):
            errors.append(problem)
    if s.job.train_backend != "local":
        errors += gpus_per_node_errors(s)
    return errors


def gpus_per_node_errors(s: Settings) -> list[str | None]:
    """The GPU pods (training, evaluation, serving) that ask for more GPUs than a node of the product the node
    selector names holds (``GPUS_PER_NODE``): such a pod stays Pending."""
    product = s.job.node_selector.get(GPU_PRODUCT)
    limit = next(((n, what) for pattern, n, what in GPUS_PER_NODE if pattern.search(str(product))), None)
    if product is None or limit is None:
        return []
    most, what = limit
    asked = [
        (name, count, f"use more {name.removesuffix('gpus_per_node')}num_nodes")
        for name, count in resource_settings(s, "gpus_per_node")  # the run's, and each stage's own
    ] + [("eval_gpus", s.evaluate.eval_gpus, "")]
    if s.deploy.deploy_backend.startswith("kserve"):
        asked.append(("serving_gpus", s.deploy.serving_gpus, ""))
    return [
        f"{name}={count}: a node with {GPU_PRODUCT}={product} holds at most {most} GPUs ({what}), and a pod that asks "
        f"for more never schedules; use {name} <= {most}" + (f" ({hint})" if hint else "")
        for name, count, hint in asked
        if count > most
    ]


def _http_url(value: str) -> bool:
    try:
        parts = urlsplit(value)
    except ValueError:  # e.g. an unclosed IPv6 bracket
        return False
    return parts.scheme in ("http", "https") and bool(parts.hostname)


def egress_errors(s: Settings) -> list[str | None]:
    """The pods' pull Secrets (Kubernetes names), proxies and Hub mirror (URLs); whether the Secrets exist and hold
    registry credentials is preflight's to check."""
    errors: list[str | None] = [
        name_error("image_pull_secrets", str(name), DNS1123_SUBDOMAIN, 253, "Secret name")
        for name in s.job.image_pull_secrets
    ]
    for name, value, example in (
        ("http_proxy", s.network.http_proxy, "http://proxy.example.com:3128"),
        ("https_proxy", s.network.https_proxy, "http://proxy.example.com:3128"),
        ("hf_endpoint", s.network.hf_endpoint, "https://hf-mirror.example.com"),
    ):
        if value and not _http_url(value):
            errors.append(f"{name}={value!r} is not an http(s) URL; e.g. {example!r}, or leave it empty")
    return errors


def store_errors(s: Settings) -> list[str | None]:
    """The object store's settings: a bucket URI that parses, an http(s) endpoint, a Secret name; whether the store
    takes the Secret's keys is preflight's to check (components/validate/preflight.py: store_problem)."""
    from components.storage import is_store_uri, parse_store_uri

    store = s.storage
    errors: list[str | None] = []
    if is_store_uri(s.model.model_name_or_path):
        errors.append(
            f"model_name_or_path={s.model.model_name_or_path!r}: the steps do not read object storage themselves; put "
            "the uploaded model on the model volume first (python -m components.storage download URI "
            "/mnt/models/base/NAME, resumable and checked against its MANIFEST.json) and name that folder"
        )
    if store.model_store_uri:
        try:
            parse_store_uri(store.model_store_uri)
        except ValueError as exc:
            errors.append(str(exc))
    else:
        for name, value in (
            ("upload_checkpoints", store.upload_checkpoints),
            ("model_store_endpoint", store.model_store_endpoint),
            ("model_store_secret", store.model_store_secret),
            ("serving_service_account", s.deploy.serving_service_account),
        ):
            if value:
                errors.append(f"{name} is set but model_store_uri is empty: name the bucket, e.g. 's3://my-bucket/llm'")
    if store.model_store_endpoint and not _http_url(store.model_store_endpoint):
        errors.append(
            f"model_store_endpoint={store.model_store_endpoint!r} is not an http(s) URL; e.g. "
            "'http://minio.storage:9000', or leave it empty for AWS S3"
        )
    if store.model_store_secret:
        errors.append(name_error("model_store_secret", store.model_store_secret, DNS1123_SUBDOMAIN, 253, "Secret name"))
    if s.deploy.serving_service_account:
        errors.append(
            name_error(
                "serving_service_account",
                s.deploy.serving_service_account,
                DNS1123_SUBDOMAIN,
                253,
                "ServiceAccount name",
            )
        )
    return errors


def check_cluster_settings(s: Settings) -> list[str | None]:
    """Claim, Secret, queue and priority-class names; scheduling options that go together; backend limits; the GPU
    pods' image and placement."""
    job, sched, store, obs = s.job, s.scheduling, s.storage, s.observability
    errors = [
        name_error("data_pvc", store.data_pvc, DNS1123_SUBDOMAIN, 253, "claim name"),
        name_error("model_pvc", store.model_pvc, DNS1123_SUBDOMAIN, 253, "claim name"),
        *check_network_settings(s),
        *placement_errors(s),
        *trainer_pod_errors(s),
    ]
    if store.hf_token_secret:
        errors.append(name_error("hf_token_secret", store.hf_token_secret, DNS1123_SUBDOMAIN, 253, "Secret name"))
    else:
        # Pods get an optional secretKeyRef: a missing Secret is fine, an empty name is rejected by Kubernetes.
        errors.append(
            "hf_token_secret is empty; name a Secret with key HF_TOKEN (it may be absent: the reference "
            "is optional), e.g. 'hf-token'"
        )
    if obs.tracking_secret:
        errors.append(name_error("tracking_secret", obs.tracking_secret, DNS1123_SUBDOMAIN, 253, "Secret name"))
    if obs.alert_webhook_secret:
        errors.append(
            name_error("alert_webhook_secret", obs.alert_webhook_secret, DNS1123_SUBDOMAIN, 253, "Secret name")
        )
    else:
        errors.append(
            "alert_webhook_secret is empty; name a Secret with key ALERT_WEBHOOK_URL (it may be absent: "
            "the reference is optional), e.g. 'llm-alerts'"
        )
    if obs.langfuse_secret:
        errors.append(name_error("langfuse_secret", obs.langfuse_secret, DNS1123_SUBDOMAIN, 253, "Secret name"))
    else:
        errors.append(
            "langfuse_secret is empty; name a Secret with keys LANGFUSE_PUBLIC_KEY, LANGFUSE_SECRET_KEY and "
            "LANGFUSE_HOST (it may be absent: the references are optional), e.g. 'llm-langfuse'"
        )
    if obs.metrics_port in RENDEZVOUS_PORTS:
        errors.append(
            f"metrics_port={obs.metrics_port} is a port the training pods' rendezvous uses "
            f"({RENDEZVOUS_PORTS[obs.metrics_port]}); use another, e.g. 9410, or 0 for no metrics"
        )
    if obs.prometheus_url:
        parts = urlsplit(obs.prometheus_url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            errors.append(
                f"prometheus_url={obs.prometheus_url!r} is not an http(s) URL; name Prometheus's address, "
                "e.g. http://prometheus-operated.monitoring:9090, or leave it empty"
            )
    errors += egress_errors(s)
    errors += store_errors(s)
    if sched.queue_name:
        errors.append(name_error("queue_name", sched.queue_name, DNS1123_SUBDOMAIN, 253, "LocalQueue name"))
    if sched.priority_class:
        errors.append(name_error("priority_class", sched.priority_class, DNS1123_SUBDOMAIN, 253, "PriorityClass name"))
    if sched.queue_name and sched.gang_scheduling:
        errors.append("queue_name and gang_scheduling both set: Kueue admits the job as a whole already; use one")
    for nodes_name, nodes in resource_settings(s, "num_nodes"):  # the run's, and each stage's own
        if sched.min_nodes > nodes:
            errors.append(f"min_nodes={sched.min_nodes} is more than {nodes_name}={nodes}; use 0 for a fixed-size job")
        if job.train_backend == "local" and nodes != 1:
            errors.append(
                f"{nodes_name}={nodes} with train_backend=local: a local run has one node; set {nodes_name}=1"
            )
    if job.train_backend == "trainjob":
        errors.append(
            name_error("trainjob_runtime", job.trainjob_runtime, DNS1123_SUBDOMAIN, 253, "ClusterTrainingRuntime name")
        )
        from components.train.launcher.job import trainjob_conflicts  # the builder's own rule

        errors += trainjob_conflicts(job, sched)
    return errors
