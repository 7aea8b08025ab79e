"""Preflight (components/validate/preflight.py) of the cluster's capacity: enough schedulable nodes match the node
selector, tolerate their taints and have the GPUs (and the RDMA devices) each training job asks for, per stage and
per variant. Nodes are cluster-scoped: without a ClusterRole to list them these checks are skipped with a warning."""

from __future__ import annotations

import logging

from kubernetes import client as k8s
from kubernetes.client.rest import ApiException

from components.kube import call_api
from components.settings import JobSettings, NetworkSettings, Settings
from components.stages import stage_job, stage_setting_name
from components.variants import variant_names, variant_values

# One logger for the whole preflight, whichever of its modules warns: what a logging configuration names.
log = logging.getLogger("components.validate.preflight")

GPU = "nvidia.com/gpu"


def _tolerates(tolerations: list, taint: dict) -> bool:
    for tol in tolerations:
        if tol.get("effect") and tol["effect"] != taint.get("effect"):
            continue
        if tol.get("operator") == "Exists":
            if not tol.get("key") or tol["key"] == taint.get("key"):
                return True
        elif tol.get("key") == taint.get("key") and tol.get("value", "") == taint.get("value", ""):
            return True
    return False


def _usable_nodes(
    core: k8s.CoreV1Api, node_selector: dict, tolerations: list, gpus_per_node: int, also: dict | None = None
) -> tuple[dict[str, int], int] | None:
    """The schedulable nodes matching ``node_selector`` whose taints ``tolerations`` tolerate and that have
    ``gpus_per_node`` allocatable GPUs (and ``also``: resource -> count), with those GPUs, and how many nodes
    matched; None when Nodes may not be listed (a warning is logged)."""
    selector = ",".join(f"{k}={v}" for k, v in sorted(node_selector.items()))
    try:
        nodes = call_api(core.list_node, label_selector=selector or None).items
    except ApiException as exc:
        if exc.status != 403:
            raise
        log.warning(
            "may not list Nodes (cluster-scoped): GPU capacity not checked; a cluster admin can "
            "grant it with kubectl apply -k manifests/cluster"
        )
        return None
    usable = {}
    for node in nodes:
        taints = [t.to_dict() for t in node.spec.taints or [] if t.effect in ("NoSchedule", "NoExecute")]
        allocatable = node.status.allocatable or {}
        gpus = int(allocatable.get(GPU, "0"))
        offers = all(int(allocatable.get(name, "0")) >= count for name, count in (also or {}).items())
        if (
            not node.spec.unschedulable
            and gpus >= gpus_per_node
            and offers
            and all(_tolerates(tolerations, t) for t in taints)
        ):
            usable[node.metadata.name] = gpus
    return usable, len(nodes)


def _gpu_node_problem(
    core: k8s.CoreV1Api,
    node_selector: dict,
    tolerations: list,
    num_nodes: int,
    gpus_per_node: int,
    names: tuple[str, str] = ("num_nodes", "gpus_per_node"),
) -> str | None:
    """Whether ``num_nodes`` of the nodes the job may use offer ``gpus_per_node`` allocatable GPUs each; ``names``:
    the settings that give the job its nodes and GPUs (a stage's own: ``stage_settings.<stage>.gpus_per_node``)."""
    found = _usable_nodes(core, node_selector, tolerations, gpus_per_node)
    if found is None or len(found[0]) >= num_nodes:
        return None
    usable, matched = found
    where = f"matching node_selector {node_selector}" if node_selector else "in the cluster"
    nodes_name, gpus_name = names
    return (
        f"{nodes_name}={num_nodes} x {gpus_name}={gpus_per_node}: only {len(usable)} of {matched} nodes "
        f"{where} are schedulable, tolerated and have >= {gpus_per_node} allocatable {GPU}; "
        f"check node_selector, tolerations and {gpus_name} against kubectl get nodes -L nvidia.com/gpu.product"
    )


def _job_shapes(s: Settings) -> list[tuple[int, int, tuple[str, str]]]:
    """The training jobs the run creates, once per shape: ``(num_nodes, gpus_per_node, the settings that give
    them)``, each stage with its own nodes and GPUs (``stage_settings``) over the run's."""
    shapes: dict = {}
    for stage in s.stages.stages or ["sft"]:
        c = stage_job(s, stage)
        names = (stage_setting_name(s, stage, "num_nodes"), stage_setting_name(s, stage, "gpus_per_node"))
        shapes.setdefault((c.num_nodes, c.gpus_per_node, names), None)
    return list(shapes)


def training_gpu_problems(core: k8s.CoreV1Api, s: Settings) -> list[str | None]:
    """Each training job's nodes (``_job_shapes``) against the GPU nodes the job may use."""
    return [
        _gpu_node_problem(core, s.job.node_selector, s.job.tolerations, m, g, names) for m, g, names in _job_shapes(s)
    ]


def rdma_node_problem(core: k8s.CoreV1Api, job: JobSettings, network: NetworkSettings) -> str | None:
    """Whether ``num_nodes`` of the GPU nodes the job may use offer ``rdma_per_pod`` of ``rdma_resource``: a pod
    requesting a resource no node advertises stays Pending for ever."""
    gpu_nodes = _usable_nodes(core, job.node_selector, job.tolerations, job.gpus_per_node)
    found = _usable_nodes(
        core, job.node_selector, job.tolerations, job.gpus_per_node, {network.rdma_resource: network.rdma_per_pod}
    )
    if gpu_nodes is None or found is None or len(found[0]) >= job.num_nodes or len(gpu_nodes[0]) < job.num_nodes:
        return None  # Nodes unreadable (warned), or too few GPU nodes at all (that problem is named on its own)
    return (
        f"rdma_resource={network.rdma_resource} x rdma_per_pod={network.rdma_per_pod}: only {len(found[0])} of the "
        f"{len(gpu_nodes[0])} GPU nodes the job may use offer it (allocatable), and num_nodes={job.num_nodes}; "
        "install the cluster's RDMA device plugin, correct the name (kubectl get nodes -o "
        "jsonpath='{.items[*].status.allocatable}'), or leave rdma_resource empty to run NCCL over TCP"
    )


def variant_gpu_problems(core: k8s.CoreV1Api, params: dict) -> list[str | None]:
    """Each variant's nodes, as for a run, and the GPUs of the ``variants_parallel`` largest variants together
    against the allocatable GPUs of the nodes the variants may use (components/variants.py)."""
    variants = params.get("variants") or []
    names = variant_names(variants)
    problems: list[str | None] = []
    nodes: dict[str, int] = {}
    sizes = []
    for i, name in enumerate(names):
        own = Settings.from_flat(variant_values(params, i))
        c, shapes = own.job, _job_shapes(own)
        problems += [p and f"variants[{i}] ({name!r}): {p}" for p in training_gpu_problems(core, own)]
        found = _usable_nodes(core, c.node_selector, c.tolerations, min(g for _, g, _ in shapes))
        if found is None:
            return problems
        nodes.update(found[0])
        sizes.append((max(m * g for m, g, _ in shapes), name))  # its largest stage's job
    at_once = Settings.from_flat(params).variants.variants_parallel
    largest = sorted(sizes, reverse=True)[:at_once]
    wanted, have = sum(g for g, _ in largest), sum(nodes.values())
    if at_once > 1 and wanted > have:
        who = ", ".join(f"{n!r} ({g})" for g, n in largest)
        problems.append(
            f"variants_parallel={at_once} trains up to {at_once} variants at once, and {who} hold "
            f"{wanted} {GPU} together; the nodes they may use have {have} allocatable: lower "
            "variants_parallel, or num_nodes / gpus_per_node of the largest variants"
        )
    return problems
