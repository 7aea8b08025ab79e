"""The network model of the plan (docs/plan.md): the byte and bandwidth constants, every collective of a layout's
optimizer step (ZeRO-3, hpZ, HSDP, HSDP + EP, ZeRO-2, DDP) as ring bytes on the link it crosses (NVLink within a node,
each GPU's share of the node's NICs between nodes: ``Collective``, ``collectives``, ``hsdp_collectives``,
``_link_seconds``), what NCCL uses between the training pods (``network_transport``), the layouts' names
(``zero_config``, ``HSDP_LAYOUTS``, ``layout_name``), and HSDP's memory per GPU and rank 0's host memory at the final
export (``hsdp_memory_gib``, ``hsdp_export_host_gib``). No torch, no cluster, no GPU; training_plan.py and grpo_plan.py
build the plan on it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from components.models.shape import ModelShape

GB = 1e9
GIB = 1024**3
PARAM_BYTES = 2  # bf16 parameters and gradients under DeepSpeed (bf16 on GPUs)
DDP_GRAD_BYTES = 4  # plain DDP and LoRA adapters keep fp32 gradients
# The optimizer update streams fp32 master weights, Adam's two moments and the fp32 gradient (read 16 bytes, write 12)
# and writes the bf16 weight (2): ~32 bytes per trainable parameter, at about 60% of an H100's 3.35 TB/s.
OPTIMIZER_BYTES_PER_PARAM = 32
HBM_BYTES_PER_S = 2.0e12
INTRA = "intra-node NVLink"
INTER = "inter-node link"
COMPUTE = "compute"


@dataclass(frozen=True)
class Collective:
    """One collective of the step: ``size`` bytes in all over a ring of ``ranks`` GPUs spanning ``nodes`` nodes with
    ``per_node`` of them in each; run in ``phase`` (forward, backward, after step) of the micro-steps ``when`` says
    (every, first, later, last, after)."""

    name: str
    kind: str  # all-gather, reduce-scatter, all-reduce
    size: float
    ranks: int
    nodes: int
    per_node: int
    phase: str
    when: str
    dtype_bytes: int = PARAM_BYTES  # bytes per element as it travels (a CPU run in fp32 rescales by 4 / this)

    @property
    def bytes_per_gpu(self) -> float:
        """B: what each GPU sends (and receives) in the ring: S (n - 1) / n, twice that for an all-reduce."""
        ring = self.size * (self.ranks - 1) / self.ranks if self.ranks > 1 else 0.0
        return 2 * ring if self.kind == "all-reduce" else ring

    @property
    def network_bytes_per_gpu(self) -> float:
        """What crosses this GPU's share of the network: B / G for a ring over several nodes (docs/plan.md)."""
        return self.bytes_per_gpu / self.per_node if self.nodes > 1 else 0.0

    @property
    def nvlink_bytes_per_gpu(self) -> float:
        return self.bytes_per_gpu - self.network_bytes_per_gpu

    @property
    def link(self) -> str:
        return INTER if self.nodes > 1 else INTRA

    def times_per_step(self, k: int) -> int:
        return {"every": k, "first": 1, "later": k - 1, "last": 1, "after": 1}[self.when]

    def applies(self, i: int, k: int) -> bool:
        """Whether micro-step ``i`` (0-based, of ``k``) runs it."""
        return {"every": True, "first": i == 0, "later": i > 0, "last": i == k - 1, "after": False}[self.when]


def zero_config(deepspeed_config: str) -> dict:
    """The ``zero_optimization`` section of a shipped DeepSpeed config name or JSON path (empty for ``none``)."""
    from components.train.config import load_deepspeed_config

    return load_deepspeed_config(deepspeed_config).get("zero_optimization", {})


HSDP_LAYOUTS = {
    "hsdp": "HSDP (FSDP2: sharded in a node, replicated over nodes)",
    "hsdp_ep": "HSDP + EP (FSDP2, experts parallel in a node)",
}
GRAD_REDUCE_BYTES = 4  # FSDP2's fsdp_mixed_precision reduces gradients in fp32


def layout_name(zero: dict, parallelism: str = "deepspeed") -> str:
    if parallelism in HSDP_LAYOUTS:
        return HSDP_LAYOUTS[parallelism]
    stage = zero.get("stage", 0)
    hpz = int(zero.get("zero_hpz_partition_size", 1) or 1)
    if stage == 3:
        return f"ZeRO++ hpZ (ZeRO-3, partition {hpz})" if hpz > 1 else "ZeRO-3"
    return f"ZeRO-{stage}" if stage else "DDP"


def collectives(
    shape: ModelShape,
    method: str,
    zero: dict,
    num_nodes: int,
    gpus_per_node: int,
    trainable: int,
    parallelism: str = "deepspeed",
    tokens: int = 0,
    recompute: bool = False,
) -> list[Collective]:
    """Every collective of one optimizer step (docs/plan.md's table). ``tokens`` per micro-step and GPU and
    ``recompute`` matter only to expert parallelism's all-to-alls."""
    n, m, g = num_nodes * gpus_per_node, num_nodes, gpus_per_node
    stage = zero.get("stage", 0)
    params, grads = PARAM_BYTES * shape.total, PARAM_BYTES * trainable
    out: list[Collective] = []
    if n == 1:
        return out
    if parallelism in HSDP_LAYOUTS:
        return hsdp_collectives(shape, m, g, trainable, parallelism == "hsdp_ep", tokens, recompute)
    if stage == 3:
        hpz = int(zero.get("zero_hpz_partition_size", 1) or 1)
        out.append(
            Collective("parameters, forward", "all-gather", params, n, m, g, "forward", "first" if hpz > 1 else "every")
        )
        if hpz > 1:
            h_nodes = max(1, math.ceil(hpz / g))
            inner = (hpz, h_nodes, min(hpz, g))
            if method == "full":
                out.append(
                    Collective(
                        "parameters, later forwards (secondary partition)",
                        "all-gather",
                        params,
                        *inner,
                        "forward",
                        "later",
                    )
                )
            else:
                # The frozen base keeps its secondary partition for the whole run (docs/plan.md); the adapters'
                # weights are gathered over all ranks after each step.
                out[-1] = Collective(
                    "frozen base, forward (from the secondary partition after the run's first step)",
                    "all-gather",
                    params,
                    *inner,
                    "forward",
                    "every",
                )
                out.append(Collective("adapters, forward", "all-gather", grads, n, m, g, "forward", "first"))
            out.append(
                Collective(
                    "parameters, backward (secondary partition)", "all-gather", params, *inner, "backward", "every"
                )
            )
        else:
            out.append(Collective("parameters, backward", "all-gather", params, n, m, g, "backward", "every"))
        out.append(Collective("gradients", "reduce-scatter", grads, n, m, g, "backward", "every"))
    elif stage == 2:
        out.append(Collective("gradients", "reduce-scatter", grads, n, m, g, "backward", "every"))
        out.append(Collective("updated parameters", "all-gather", grads, n, m, g, "after step", "after"))
    else:
        size = (DDP_GRAD_BYTES if not (stage == 1) else PARAM_BYTES) * trainable
        out.append(Collective("gradients", "all-reduce", size, n, m, g, "backward", "last"))
        if stage == 1:
            out.append(Collective("updated parameters", "all-gather", grads, n, m, g, "after step", "after"))
    return out


def hsdp_collectives(
    shape: ModelShape, num_nodes: int, gpus_per_node: int, trainable: int, ep: bool, tokens: int, recompute: bool
) -> list[Collective]:
    """HSDP's collectives per optimizer step, with expert parallelism within the node when ``ep`` (module
    docstring)."""
    m, g = num_nodes, gpus_per_node
    gathered = shape.total - (shape.expert_params if ep else 0)  # under EP the experts are never gathered
    out: list[Collective] = []
    if g > 1:
        what = "dense parameters" if ep else "parameters"
        out += [
            Collective(f"{what}, forward", "all-gather", PARAM_BYTES * gathered, g, 1, g, "forward", "every"),
            Collective(f"{what}, backward", "all-gather", PARAM_BYTES * gathered, g, 1, g, "backward", "every"),
            Collective(
                "gradients (fp32)",
                "reduce-scatter",
                GRAD_REDUCE_BYTES * gathered,
                g,
                1,
                g,
                "backward",
                "every",
                GRAD_REDUCE_BYTES,
            ),
        ]
        if ep and shape.is_moe:
            k = shape.intermediate // max(1, shape.moe_intermediate)
            per_pass = 2 * shape.sparse_layers * tokens * k * shape.hidden * PARAM_BYTES  # to the experts and back
            out.append(Collective("routed tokens, forward", "all-to-all", per_pass, g, 1, g, "forward", "every"))
            out.append(
                Collective(
                    "routed tokens, backward" + (" and recomputed forward" if recompute else ""),
                    "all-to-all",
                    per_pass * (2 if recompute else 1),
                    g,
                    1,
                    g,
                    "backward",
                    "every",
                )
            )
    if m > 1:
        shard = GRAD_REDUCE_BYTES * trainable / g
        out.append(
            Collective(
                "gradient shards across nodes (fp32, once per step)",
                "all-reduce",
                shard,
                m,
                m,
                1,
                "backward",
                "last",
                GRAD_REDUCE_BYTES,
            )
        )
    return out


# The shard size of the final export (components/train/trainer/export.py's MAX_SHARD_BYTES, which a test holds equal):
# with one layer, what the export keeps on rank 0's host at once.
EXPORT_SHARD_BYTES = 5 * 2**30


def hsdp_export_host_gib(shape: ModelShape, gpus_per_node: int) -> float:
    """Rank 0's pod at the final export under HSDP, in GiB: one decoder layer gathered in bf16 and one shard of the
    export buffered on rank 0's host (export.py's ``export_gathered``, one layer at a time) plus memory.py's per-rank
    process and /dev/shm figures."""
    from components.estimate.memory import HOST_PROCESS_BYTES, SHM_BYTES_PER_RANK

    layer = 2 * (shape.largest_layer or shape.largest_block)
    return (layer + EXPORT_SHARD_BYTES + (HOST_PROCESS_BYTES + SHM_BYTES_PER_RANK) * gpus_per_node) / GIB


def hsdp_memory_gib(
    shape: ModelShape,
    ep: bool,
    gpus_per_node: int,
    max_seq_length: int,
    rows: int,
    every_n_layers: int = 1,
    chunked_loss: bool = False,
) -> dict:
    """Memory per GPU under HSDP (docs/plan.md): memory.py's activations (with the recompute stride and the chunked
    loss, as for ZeRO-3) and overhead, model states sharded over one node."""
    from components.estimate.memory import estimate_gib

    est = estimate_gib(
        shape,
        "full",
        {"stage": 3},
        gpus_per_node,
        max_seq_length,
        rows,
        every_n_layers=every_n_layers,
        chunked_loss=chunked_loss,
    )
    embed = shape.vocab * shape.hidden
    dense_layer = (shape.total - shape.expert_params - 2 * embed) // max(1, shape.layers)
    block = max(embed, dense_layer) if ep else max(shape.largest_block, embed)
    states = (16 * shape.total / gpus_per_node + 10 * block) / GIB
    return {
        "model_states": states,
        "activations": est["activations"],
        "overhead": est["overhead"],
        "total": states + est["activations"] + est["overhead"],
    }


def _link_seconds(items: list[Collective], intra: float, inter: float) -> dict:
    """Seconds each link is busy with ``items`` (bandwidths in bytes/s)."""
    return {
        INTRA: sum(c.nvlink_bytes_per_gpu for c in items) / intra,
        INTER: sum(c.network_bytes_per_gpu for c in items) / inter,
    }


def network_transport(v: dict) -> str:
    """What NCCL uses between the training pods, as the settings request it: RDMA where the pods request the
    device plugin's resource (``rdma_resource``), else TCP sockets over the pod network. Without an RDMA device in
    the pod NCCL finds no InfiniBand/RoCE/EFA interface and falls back to its socket transport, whatever the
    node's NICs are."""
    if int(v.get("num_nodes", 1)) <= 1:
        return "no inter-node traffic (one node)"
    resource = str(v.get("rdma_resource") or "")
    if resource:
        return f"RDMA ({resource} x {int(v.get('rdma_per_pod', 1))} per pod; inter_node_gb_per_s)"
    return (
        f"TCP on the pod network (no rdma_resource requested; tcp_node_gb_per_s {float(v['tcp_node_gb_per_s']):g} "
        "GB/s per node)"
    )
