"""The plan of a training job before it runs: seconds per optimizer step, tokens/s per GPU, the bottleneck, the run's
wall time and GPU-hours, and the memory per GPU, from the settings and the model's config.json alone (no torch, no
cluster, no GPU, no download). ``python -m pipelines.run ... --plan`` prints it; validate_inputs logs it.

Why: a sparse model's layout decides what crosses nodes, and a job that is network-bound or does not fit is cheaper
found out before GPUs are requested than after. The model, per optimizer step: compute from the model FLOPs (6 A +
12 L d T per token, components/models/mfu.py) plus recomputation, at ``achieved_tflops_per_gpu``; every collective of
the layout (ZeRO-3, hpZ, HSDP, HSDP + EP, ZeRO-2, DDP) as ring bytes on the link it crosses (NVLink within a node,
each GPU's share of the node's NICs between nodes); per phase max(compute, communication) plus what cannot overlap.
Memory per GPU is components/estimate/memory.py's estimate. docs/plan.md has the derivation, its notation and its
sources.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from components.estimate.data_prep import data_prep_text
from components.estimate.memory import pod_memory_limit_gib
from components.models.mfu import model_flops_per_token, recompute_flops_per_token
from components.models.shape import KNOWN_MODELS, ModelShape, load_architecture, lora_targets, model_shape
from components.settings import Settings
from components.train.config import job_zero_config

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


@dataclass
class Plan:
    """The figures of one plan (``plan()``); seconds per optimizer step unless named otherwise."""

    model: str
    method: str
    layout: str
    num_nodes: int
    gpus_per_node: int
    micro_batch: int
    accumulation: int
    max_seq_length: int
    tokens_per_micro_step: int  # per GPU, rows x max_seq_length
    real_token_fraction: float  # packing efficiency (1.0 when unknown)
    attention_length: float
    attention_source: str
    active_params: int
    total_params: int
    trainable_params: int
    flops_per_token_dense: float  # 6 A
    flops_per_token_attention: float  # 12 L d T
    flops_per_micro_step: float  # what the GPU executes (recomputation and LoRA included)
    recompute_flops_per_micro_step: float  # of which recomputation (hardware FLOPs, never in MFU)
    compute_s: float  # per micro-step
    forward_compute_s: float
    backward_compute_s: float
    collectives: list[Collective]
    intra_gb_per_s: float
    inter_gb_per_s: float
    transport: str  # what NCCL uses between nodes, as the pods request it (network_transport)
    achieved_tflops: float
    recompute: bool
    micro_step_s: list[float]
    exposed_s: float  # per optimizer step, nothing overlapping it (first gathers, last reduce-scatters)
    after_step_s: float  # optimizer update + post-step collectives
    step_s: float
    tokens_per_s_per_gpu: float
    bottleneck: str
    comm_s: dict  # per optimizer step: link -> seconds that link is busy
    memory_gib: dict
    gpu_memory_gib: float
    dataset_tokens: float
    dataset_source: str
    steps: int
    epochs: float
    wall_s: float
    gpu_hours: float
    parallelism: str = "deepspeed"
    blocked: str | None = None  # why this layout cannot run (validate_inputs refuses it), or None
    notes: list[str] = field(default_factory=list)

    @property
    def n_gpus(self) -> int:
        return self.num_nodes * self.gpus_per_node

    @property
    def fits(self) -> bool:
        return self.memory_gib["total"] <= self.gpu_memory_gib

    @property
    def runs(self) -> bool:
        """Fits in GPU memory and nothing else stops it (``blocked``)."""
        return self.fits and self.blocked is None

    def bytes_per_gpu(self, link: str | None = None, per: str = "step") -> float:
        """Bytes one GPU moves per optimizer step (``per="micro-step"``: divided by k), over ``link`` or any: the
        collectives' B for ``None``, the network share for INTER, the NVLink share for INTRA."""
        k = self.accumulation
        total = 0.0
        for c in self.collectives:
            b = {None: c.bytes_per_gpu, INTER: c.network_bytes_per_gpu, INTRA: c.nvlink_bytes_per_gpu}[link]
            total += b * c.times_per_step(k)
        return total / k if per == "micro-step" else total

    def summary(self) -> dict:
        """The headline figures, JSON-ready."""
        return {
            "layout": self.layout,
            "step_s": round(self.step_s, 3),
            "tokens_per_s_per_gpu": round(self.tokens_per_s_per_gpu),
            "bottleneck": self.bottleneck,
            "compute_s_per_micro_step": round(self.compute_s, 3),
            "gb_per_gpu_per_micro_step": round(self.bytes_per_gpu(per="micro-step") / GB, 1),
            "network_gb_per_gpu_per_step": round(self.bytes_per_gpu(INTER) / GB, 2),
            "memory_gib_per_gpu": round(self.memory_gib["total"], 1),
            "fits": self.fits,
            "steps": self.steps,
            "wall_hours": round(self.wall_s / 3600, 2),
            "gpu_hours": round(self.gpu_hours, 1),
        }


def architecture(model_name_or_path: str) -> dict:
    """The model's config.json as a dict: shipped (components/models/architectures), a local folder, or the Hugging
    Face cache (HF_HOME / HF_HUB_CACHE; nothing is downloaded). A ValueError naming the setting when none has it."""
    config = load_architecture(model_name_or_path)
    if config is not None:
        return config
    if model_name_or_path.startswith("builtin:"):
        raise ValueError(
            f"model_name_or_path={model_name_or_path!r} is the laptop model of a local CPU run: the plan "
            "is for GPU jobs; pass a cluster preset (e.g. --preset qwen3-30b-a3b-full)"
        )
    if not Path(model_name_or_path).is_absolute() and model_name_or_path.count("/") == 1:
        from huggingface_hub import try_to_load_from_cache

        cached = try_to_load_from_cache(model_name_or_path, "config.json")
        if isinstance(cached, str):
            return json.loads(Path(cached).read_text(encoding="utf-8"))
    shipped = ", ".join(p.pattern.strip("^$").split("(")[0] for p in KNOWN_MODELS)
    raise ValueError(
        f"model_name_or_path={model_name_or_path!r}: its config.json is neither shipped with the package (shipped: "
        f"{shipped} and their variants) nor a local folder's nor in the Hugging Face cache; fetch just the config "
        f"(hf download {model_name_or_path} config.json) or set model_name_or_path to a folder holding config.json"
    )


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


def attention_from_stats(stats: dict, max_seq_length: int) -> float | None:
    """T from a prepared dataset's length histogram (stats.json's ``length_histogram``: bucket midpoints, capped at
    the row length), or None when it has none."""
    buckets = [b for b in stats.get("length_histogram") or [] if b.get("count")]
    if not buckets:
        return None
    mids = [(min((b["from"] + b["to"]) / 2, max_seq_length), b["count"]) for b in buckets]
    return sum(c * n * (n + 1) / 2 for n, c in mids) / sum(c * n for n, c in mids)


def plan(settings: Settings | dict, config: dict, stats: dict | None = None, stage: str | None = None) -> Plan:
    """The plan for ``settings`` (``Settings``, or every setting by name as validate_inputs resolves them) and the
    model's ``config`` (config.json dict). ``stats``: the prepared dataset's statistics (prepare_dataset's
    stats.json), for the real row count, packing efficiency and document lengths; without it the run's size is the
    ``dataset_tokens_estimate`` setting. ``stage``: the training stage to plan (default: sft when it runs, else the
    first); its ``stage_settings`` apply, its own nodes and GPUs included."""
    from components.estimate.memory import estimate_gib, recomputed_layers
    from components.stages import stage_overrides, stage_resources

    typed = settings if isinstance(settings, Settings) else Settings.from_flat(settings)
    values = typed.flat()
    stage = stage or ("sft" if "sft" in values["stages"] else values["stages"][0])
    # The stage's own training settings, nodes and GPUs over the run's.
    v = {**values, **stage_overrides(typed, stage), **stage_resources(typed, stage)}
    shape = model_shape(config)
    method, zero = v["method"], zero_config(v["deepspeed_config"])
    parallelism = v.get("parallelism", "deepspeed")
    hsdp = parallelism in HSDP_LAYOUTS
    if hsdp:
        zero = {}  # validate_inputs refuses hsdp with a DeepSpeed config
    else:  # the shipped zero3_hpz's partition as the trainer sets it: the job's GPUs per node (1, off, on one node)
        zero = job_zero_config(v["deepspeed_config"], int(v["num_nodes"]), int(v["gpus_per_node"]), shape.largest_layer)
    zero_stage, hpz = zero.get("stage", 0), int(zero.get("zero_hpz_partition_size", 1) or 1)
    m, g = int(v["num_nodes"]), int(v["gpus_per_node"])
    n = m * g
    s, b, k = int(v["max_seq_length"]), int(v["per_device_train_batch_size"]), int(v["gradient_accumulation_steps"])
    rows = b * (2 if stage in ("dpo", "rm") else 1)  # DPO, rm: chosen and rejected of each pair in one forward
    notes: list[str] = []

    # Trainable parameters and the frozen nn.Linear weights whose weight gradients LoRA skips.
    lora, expert_lora, frozen_linear_active = 0, False, 0
    if method in ("lora", "qlora"):
        modules, parameters = lora_targets("qwen3_moe" if shape.is_moe else "qwen3", v["lora_target_modules"])
        lora, expert_lora = shape.lora_params(v["lora_r"], modules + parameters), bool(parameters)
        experts_active = shape.sparse_layers * 3 * shape.hidden * shape.intermediate if shape.is_moe else 0
        frozen_linear_active = shape.active - (experts_active if expert_lora else 0)
    trainable = shape.total if method == "full" else lora

    # Compute (docs/plan.md).
    tokens = s * rows
    real = 1.0
    if stats and stats.get("train", {}).get("packing_efficiency"):
        real = float(stats["train"]["packing_efficiency"])
    t_att = attention_from_stats(stats, s) if stats else None
    att_source = "the prepared dataset's length histogram"
    if t_att is None:
        t_att, att_source = (s + 1) / 2, "one document per row, (s + 1) / 2: an upper bound"
    model_flops = model_flops_per_token(shape, t_att)  # 6 A + 12 L d T: forward a third, backward two thirds
    dense, attention = 6 * shape.active, model_flops - 6 * shape.active
    recompute = bool(v["activation_checkpointing"])
    every_n = int(v.get("recompute_every_n_layers", 1)) if recompute else 0
    chunked = bool(v.get("chunked_cross_entropy")) and stage in ("cpt", "sft")
    recomputed = recomputed_layers(shape.layers, every_n)
    fwd_flops = tokens * model_flops / 3
    bwd_flops = tokens * (2 * model_flops / 3 - 2 * frozen_linear_active)
    recompute_flops = tokens * recompute_flops_per_token(shape, t_att, recomputed / shape.layers)
    bwd_flops += recompute_flops  # hardware work, reported apart from the model FLOPs
    speed = float(v["achieved_tflops_per_gpu"]) * 1e12
    fwd_s, bwd_s = fwd_flops / speed, bwd_flops / speed

    # Communication and overlap.
    intra, inter = float(v["intra_node_gb_per_s"]) * GB, float(v["inter_node_gb_per_s"]) * GB
    transport = network_transport(v)
    if transport.startswith("TCP"):  # NCCL's sockets over the pod network: the node's TCP bandwidth over its GPUs
        inter = min(inter, float(v["tcp_node_gb_per_s"]) * GB / g)
    steps_collectives = collectives(shape, method, zero, m, g, trainable, parallelism, tokens, recompute)
    blocked = None
    if hsdp:
        if method != "full":
            notes.append(f"parallelism {parallelism} trains method full only: validate_inputs refuses {method}")
        notes.append(
            "checkpoints under HSDP: every rank writes its own shards of the weights and the optimizer state (torch's "
            "distributed checkpoint, components/train/trainer/sharded_checkpoints.py); a re-run resumes on the same "
            "nodes x GPUs"
        )
        host, pod = hsdp_export_host_gib(shape, g), pod_memory_limit_gib(values.get("trainer_memory_limit", ""))
        if host > pod:
            blocked = (
                f"the final export holds one layer and one shard on rank 0's host: {host:.0f} GiB with its "
                f"pod's {g} processes, over the pod's {pod:g} GiB (trainer_memory_limit)"
            )
            notes.append(f"does not run: {blocked}")
    if zero_stage == 3 and hpz > 1 and hpz != g:
        notes.append(
            f"zero_hpz_partition_size is {hpz} but a node has {g} GPUs: the secondary partition "
            + ("spans nodes, so its gathers cross the network" if hpz > g else "is smaller than a node")
            + f"; set it to gpus_per_node ({g})"
        )
    if any(zero.get(key, {}).get("device", "none") != "none" for key in ("offload_optimizer", "offload_param")):
        notes.append(
            "offload: the optimizer steps on the host CPUs and states cross PCIe; neither is in this plan, "
            "so its step time is a lower bound"
        )
    if zero_stage == 3 and hpz > 1 and n % hpz:
        notes.append(f"zero_hpz_partition_size {hpz} does not divide the {n} GPUs: DeepSpeed refuses it")
    embed = PARAM_BYTES * shape.vocab * shape.hidden
    micro: list[float] = []
    busy = {INTRA: 0.0, INTER: 0.0}
    exposed_total, comm_bound = 0.0, False
    for i in range(k):
        fwd_items = [c for c in steps_collectives if c.phase == "forward" and c.applies(i, k)]
        bwd_items = [c for c in steps_collectives if c.phase == "backward" and c.applies(i, k)]
        fwd, bwd = _link_seconds(fwd_items, intra, inter), _link_seconds(bwd_items, intra, inter)
        # Exposed: the embedding's share of the forward's first gather, and of the backward's reduce-scatter when
        # the embedding is trained (its gradient comes last).
        exposed = [c for c in fwd_items if c.kind == "all-gather"][:1]
        exposed += [c for c in bwd_items if c.kind == "reduce-scatter" and method == "full"]
        exp = sum(min(1.0, embed / c.size) * max(_link_seconds([c], intra, inter).values()) for c in exposed)
        for link in busy:
            busy[link] += fwd[link] + bwd[link]
        comm_bound |= max(fwd.values()) > fwd_s or max(bwd.values()) > bwd_s
        micro.append(max(fwd_s, max(fwd.values())) + max(bwd_s, max(bwd.values())) + exp)
        exposed_total += exp
    after = [c for c in steps_collectives if c.when == "after"]
    after_links = _link_seconds(after, intra, inter)
    for link in busy:
        busy[link] += after_links[link]
    updated = trainable / g if hsdp else trainable / n if zero_stage in (1, 2, 3) else trainable
    after_s = OPTIMIZER_BYTES_PER_PARAM * updated / HBM_BYTES_PER_S + max(after_links.values())
    step_s = sum(micro) + after_s
    bottleneck = max(busy, key=lambda link: busy[link]) if comm_bound else COMPUTE
    tokens_per_s = tokens * real * k / step_s

    # Memory per GPU: memory.py's estimate, the one validate_inputs checks (hpZ's secondary partition included).
    est = (
        hsdp_memory_gib(shape, parallelism == "hsdp_ep", g, s, rows, every_n, chunked)
        if hsdp
        else estimate_gib(shape, method, zero, n, s, rows, lora, expert_lora, every_n, chunked)
    )

    # The run.
    epochs = float(v["num_train_epochs"])
    if stats and stats.get("train", {}).get("rows"):
        train_rows = float(stats["train"]["rows"])
        dataset_tokens = float(stats["train"].get("tokens") or train_rows * s * real)
        source = "the prepared dataset's statistics"
    else:
        dataset_tokens = float(v["dataset_tokens_estimate"])
        train_rows = dataset_tokens / (s * real)
        source = "the setting dataset_tokens_estimate"
    if int(v["max_steps"]) > 0:
        steps = int(v["max_steps"])
        source += f" (max_steps={steps} decides the length)"
    else:
        steps = max(1, math.ceil(train_rows * epochs / (b * k * n)))
    wall = steps * step_s
    return Plan(
        model=v["model_name_or_path"],
        method=method,
        layout=layout_name(zero, parallelism),
        num_nodes=m,
        gpus_per_node=g,
        parallelism=parallelism,
        blocked=blocked,
        micro_batch=b,
        accumulation=k,
        max_seq_length=s,
        tokens_per_micro_step=tokens,
        real_token_fraction=real,
        attention_length=t_att,
        attention_source=att_source,
        active_params=shape.active,
        total_params=shape.total,
        trainable_params=trainable,
        flops_per_token_dense=dense,
        flops_per_token_attention=attention,
        flops_per_micro_step=fwd_flops + bwd_flops,
        recompute_flops_per_micro_step=recompute_flops,
        compute_s=fwd_s + bwd_s,
        forward_compute_s=fwd_s,
        backward_compute_s=bwd_s,
        collectives=steps_collectives,
        intra_gb_per_s=intra / GB,
        inter_gb_per_s=inter / GB,
        transport=transport,
        achieved_tflops=speed / 1e12,
        recompute=recompute,
        micro_step_s=micro,
        exposed_s=exposed_total,
        after_step_s=after_s,
        step_s=step_s,
        tokens_per_s_per_gpu=tokens_per_s,
        bottleneck=bottleneck,
        comm_s=busy,
        memory_gib=est,
        gpu_memory_gib=float(v["gpu_memory_gib"]),
        dataset_tokens=dataset_tokens,
        dataset_source=source,
        steps=steps,
        epochs=epochs,
        wall_s=wall,
        gpu_hours=wall * n / 3600,
        notes=notes,
    )


# The ZeRO-3 layouts ``alternatives`` weighs against each other: shipped DeepSpeed configs.
ZERO3_LAYOUTS = ("zero3", "zero3_hpz")
# Every layout ``alternatives`` weighs, as the settings that choose it.
LAYOUTS: tuple[dict, ...] = (
    {"parallelism": "deepspeed", "deepspeed_config": "zero3"},
    {"parallelism": "deepspeed", "deepspeed_config": "zero3_hpz"},
    {"parallelism": "hsdp", "deepspeed_config": "none"},
    {"parallelism": "hsdp_ep", "deepspeed_config": "none"},
)


def alternatives(settings: Settings | dict, config: dict, stats: dict | None = None) -> list[tuple[dict, Plan]]:
    """Plans of the same run under each layout (``LAYOUTS``: ZeRO-3, ZeRO++ hpZ, HSDP, HSDP + EP for MoE models
    whose experts divide over a node; HSDP for full fine-tuning only) and each split of its rows per optimizer step
    into micro-batches (b 2^j rows, k / 2^j micro-steps: the same global batch), as ``(overrides, plan)``, the run's
    own first. Empty when the run is not on ZeRO-3 or HSDP over several nodes (nothing to weigh)."""
    s = settings if isinstance(settings, Settings) else Settings.from_flat(settings)
    own = plan(s, config, stats)
    if not own.layout.startswith(("ZeRO-3", "ZeRO++", "HSDP")) or own.num_nodes < 2:
        return []
    flat = s.flat()
    shape = model_shape(config)
    rows = own.micro_batch * own.accumulation
    out: list[tuple[dict, Plan]] = [({}, own)]
    for layout in LAYOUTS:
        if layout["parallelism"] != "deepspeed" and own.method != "full":
            continue
        if layout["parallelism"] == "hsdp_ep" and not (shape.is_moe and shape.experts % own.gpus_per_node == 0):
            continue
        b = 1
        while b <= rows:
            if rows % b == 0:
                over = {**layout, "per_device_train_batch_size": b, "gradient_accumulation_steps": rows // b}
                over = {key: value for key, value in over.items() if flat[key] != value}
                if over:
                    out.append((over, plan({**flat, **over}, config, stats)))
            b *= 2
    return out


def faster_layout(
    settings: Settings | dict, config: dict, stats: dict | None = None, margin: float = 1.1
) -> tuple[dict, Plan] | None:
    """The fastest alternative (``alternatives``) that fits in memory and beats the run's own plan by ``margin``,
    or None. Of alternatives equally fast (to the token per second), the one that needs the least memory."""
    options = alternatives(settings, config, stats)
    if not options:
        return None
    own = options[0][1]
    fitting = [(over, p) for over, p in options[1:] if p.runs]
    if not fitting:
        return None
    over, best = max(fitting, key=lambda item: (round(item[1].tokens_per_s_per_gpu), -item[1].memory_gib["total"]))
    return (over, best) if best.tokens_per_s_per_gpu > margin * own.tokens_per_s_per_gpu else None


def lighter_recompute(
    settings: Settings | dict, config: dict, stats: dict | None = None, margin: float = 1.03
) -> tuple[dict, Plan] | None:
    """The least recomputation that still fits (the memory fit's, as validate_inputs checks it) for the run's own
    layout and micro-batch, when it is faster by ``margin``: ``recompute_every_n_layers`` n (transformers recomputes
    layer i when i % n == 0, so 1/n of the layers) up to every layer's activations kept (``activation_checkpointing``
    false). ``(overrides, plan)`` or None: the run recomputes nothing, or nothing less fits, or it is not faster
    (the job waits on the network). Recomputation is hardware work the plan counts at ``achieved_tflops_per_gpu``."""
    s = settings if isinstance(settings, Settings) else Settings.from_flat(settings)
    flat = s.flat()
    if not flat["activation_checkpointing"]:
        return None
    own = plan(s, config, stats)
    layers = model_shape(config).layers
    strides = sorted({n for n in (2, 3, 4, 6, 8, 12, 16, 24, layers) if int(flat["recompute_every_n_layers"]) < n})
    options = [{"recompute_every_n_layers": n} for n in strides] + [{"activation_checkpointing": False}]
    best = None
    for over in options:  # less recomputation each; the memory only grows, so stop at the first that does not fit
        p = plan({**flat, **over}, config, stats)
        if not p.runs:
            break
        best = (over, p)
    if best and best[1].tokens_per_s_per_gpu > margin * own.tokens_per_s_per_gpu:
        return best
    return None


def _gb(x: float) -> str:
    return f"{x / GB:,.1f} GB"


def _duration(seconds: float) -> str:
    hours = seconds / 3600
    return f"{hours:,.1f} h" if hours >= 1 else f"{seconds / 60:,.1f} min"


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


def format_plan(p: Plan) -> str:
    """The plan as the CLI prints it and validate_inputs logs it."""
    k = p.accumulation
    lines = [
        f"plan: {p.method} fine-tuning of {p.model}, {p.num_nodes} x {p.gpus_per_node} GPUs, {p.layout}",
        f"  per GPU: micro-batch {p.micro_batch} x {p.max_seq_length} tokens, {k} micro-steps per optimizer step",
        f"  compute:  {p.compute_s:.3f} s per micro-step: {p.flops_per_micro_step / 1e12:,.1f} TFLOP at "
        f"{p.achieved_tflops:g} TFLOP/s per GPU (achieved_tflops_per_gpu)",
        f"            model FLOPs {(p.flops_per_token_dense + p.flops_per_token_attention) / 1e9:.1f} GFLOP per token: "
        f"6 x {p.active_params / 1e9:.2f}B active parameters (embedding lookup 0, lm_head counted) + attention "
        f"12 L d T, T = {p.attention_length:,.0f} keys per token ({p.attention_source})",
        *(
            [
                f"            + recomputation {p.recompute_flops_per_micro_step / 1e12:,.1f} TFLOP per micro-step "
                "(hardware FLOPs: the decoder layers' forward again; not model FLOPs)"
            ]
            if p.recompute
            else []
        ),
        f"  links:    {p.intra_gb_per_s:g} GB/s per GPU within a node (intra_node_gb_per_s), {p.inter_gb_per_s:g} "
        f"GB/s per GPU between nodes over {p.transport}",
    ]
    if p.collectives:
        lines.append("  collectives per optimizer step (bytes per GPU: all / over the network):")
        for c in p.collectives:
            times = c.times_per_step(k)
            lines.append(
                f"    {c.kind} of {c.name}: {_gb(c.size)} over {c.ranks} GPUs on {c.nodes} node"
                f"{'s' if c.nodes > 1 else ''}, {times}x ({c.phase}): {_gb(c.bytes_per_gpu * times)} / "
                f"{_gb(c.network_bytes_per_gpu * times)} ({c.link})"
            )
        lines.append(
            f"  per micro-step each GPU moves {_gb(p.bytes_per_gpu(per='micro-step'))}, "
            f"{_gb(p.bytes_per_gpu(INTER, per='micro-step'))} of it over the network; links busy per step: "
            f"NVLink {p.comm_s[INTRA]:.2f} s, network {p.comm_s[INTER]:.2f} s, against "
            f"{p.compute_s * k:.2f} s of compute"
        )
    else:
        lines.append("  collectives: none (one GPU)")
    lines += [
        f"  overlap:  each micro-step takes max(compute, communication) for its forward and for its backward; "
        f"not overlapped: {p.exposed_s:.3f} s of first gathers and last reduce-scatters, {p.after_step_s:.3f} s "
        "after the step (optimizer update, post-step gathers)",
        f"  step:     {p.step_s:.2f} s per optimizer step, {p.tokens_per_s_per_gpu:,.0f} tokens/s per GPU, "
        f"bottleneck: {p.bottleneck}",
        f"  memory:   {p.memory_gib['total']:.1f} GiB per GPU of {p.gpu_memory_gib:g} ("
        + " + ".join(f"{v:.1f} {name.replace('_', ' ')}" for name, v in p.memory_gib.items() if name != "total")
        + f"): {'fits' if p.fits else 'does NOT fit'}",
        f"  run:      {p.steps:,} optimizer steps ({p.dataset_tokens / 1e6:,.0f}M tokens x {p.epochs:g} epochs, from "
        f"{p.dataset_source}): {_duration(p.wall_s)} wall, {p.gpu_hours:,.0f} GPU-hours",
    ]
    if p.parallelism in HSDP_LAYOUTS:
        lines.insert(
            1,
            f"  layout:   parallelism={p.parallelism}: FSDP2 over the {p.gpus_per_node} GPUs of a node, "
            f"replicated over {p.num_nodes} nodes"
            + (", experts parallel within the node" if p.parallelism == "hsdp_ep" else ""),
        )
    lines += [f"  note:     {note}" for note in p.notes]
    return "\n".join(lines)


# The grpo stage (docs/plan.md, "The grpo stage"). Prompts are not tokenised before prepare_dataset: an assumed length
# (a chat template's header and a question of a few lines; builtin:arithmetic's are shorter).
GRPO_PROMPT_TOKENS = 128


@dataclass
class GRPOPlan:
    """The figures of the grpo stage's optimizer step and run (``grpo_plan``); seconds unless named otherwise."""

    backend: str
    num_generations: int
    completions_per_gpu: int  # per optimizer step: micro-batch x micro-steps, one generation batch
    prompts_per_step: int
    completion_tokens: int
    gather: Collective | None  # ZeRO-3: the whole model onto every GPU for generation
    gather_s: float
    decode_bytes: dict  # per decode step per GPU: what it reads from HBM
    experts_read: float  # distinct experts per MoE layer a decode step's tokens route to (0: dense)
    decode_step_s: float
    decode_tokens_per_s_per_gpu: float
    generation_s: float  # gather + decode (every completion as long as grpo_max_completion_length: an upper bound)
    reference_s: float  # the KL term's reference forward (0 with grpo_beta 0)
    reference_note: str
    train: Plan  # the policy's forward and backward over prompt + completion tokens
    step_s: float
    memory_gib: float
    memory_error: str | None  # validate_inputs' refusal (check_memory_fit), or None when it fits
    prompts: float | None  # training prompts, where the source says (builtin:arithmetic), else None
    prompts_source: str
    epochs: float
    per_thousand: bool  # the prompts are not known here: the run's figures are per 1,000 prompts
    steps: int
    wall_s: float
    gpu_hours: float
    server_gpus: int = 0  # grpo_generation_backend vllm-server: the server's GPUs (0: generation in the trainer pods)
    sync_s: float = 0.0  # one weight push to the server: the model gathered whole and sent from rank 0
    sync_every: int = 1  # grpo_weight_sync_steps
    server_memory_gib: float = 0.0  # per server GPU: its share of the bf16 weights and of a step's KV cache
    server_error: str | None = None  # the server does not fit its GPUs (memory.vllm_server_error), or None
    server_managed: bool = False  # the train step runs the server (no grpo_vllm_server_url): checked and counted


def _grpo_prompts(v: dict) -> tuple[float | None, str]:
    """The grpo stage's training prompts and where the count comes from: builtin:arithmetic's rows less eval_size's
    share; any other source is counted by prepare_dataset only (None)."""
    if v["grpo_dataset_source"] != "builtin:arithmetic":
        return None, f"{v['grpo_dataset_source']!r} is counted by prepare_dataset"
    from components.data.arithmetic import ROWS

    held = float(v["eval_size"])
    prompts = ROWS * (1 - held) if held < 1 else ROWS - held
    return prompts, f"builtin:arithmetic's {ROWS} rows less eval_size {held:g}"


def grpo_plan(settings: Settings | dict, config: dict) -> GRPOPlan:
    """The grpo stage's step as the trainer pods run it today: TRL 1.16's GRPOTrainer generating with transformers'
    ``generate`` (the trainer image has no vllm, memory.TRAINER_IMAGE_HAS_VLLM), then the reference's forward for the
    KL term, then the policy's forward and backward (``plan`` over prompt + completion tokens). Generation under ZeRO-3
    first gathers the whole model onto every GPU (GRPOConfig ``ds3_gather_for_generation``, default True); decoding is
    then memory-bandwidth bound: each decode step reads the weights its tokens use (for a MoE, the distinct experts
    the step's tokens route to) and the KV cache from HBM at ``HBM_BYTES_PER_S``."""
    from components.estimate.memory import GIB, check_memory_fit, estimate_gib, grpo_extra_bytes, vllm_server_error
    from components.stages import stage_overrides, stage_resources

    typed = settings if isinstance(settings, Settings) else Settings.from_flat(settings)
    values = typed.flat()
    v = {**values, **stage_overrides(typed, "grpo"), **stage_resources(typed, "grpo")}
    shape = model_shape(config)
    m, g = int(v["num_nodes"]), int(v["gpus_per_node"])
    n = m * g
    b, k = int(v["per_device_train_batch_size"]), int(v["gradient_accumulation_steps"])
    c, t_c, gens = b * k, int(v["grpo_max_completion_length"]), int(v["grpo_num_generations"])
    zero = job_zero_config(v["deepspeed_config"], m, g, shape.largest_layer) if v["parallelism"] == "deepspeed" else {}
    zero3 = zero.get("stage", 0) == 3
    intra, inter = float(v["intra_node_gb_per_s"]) * GB, float(v["inter_node_gb_per_s"]) * GB
    if network_transport(v).startswith("TCP"):
        inter = min(inter, float(v["tcp_node_gb_per_s"]) * GB / g)
    full_model = Collective("the whole model (generation)", "all-gather", PARAM_BYTES * shape.total, n, m, g, "", "")
    full_gather_s = max(_link_seconds([full_model], intra, inter).values()) if zero3 and n > 1 else 0.0
    # grpo_generation_backend vllm-server: a server on GPUs of its own decodes every completion of the step at once
    # (tensor parallel over its GPUs); the trainer gathers its weights whole and pushes them every sync_every steps.
    server = v.get("grpo_generation_backend") == "vllm-server"
    server_gpus = max(1, int(v.get("grpo_vllm_server_gpus", 1) or 1)) if server else 0
    sync_every = max(1, int(v.get("grpo_weight_sync_steps", 1) or 1))
    gather = full_model if zero3 and n > 1 and not server else None
    gather_s = full_gather_s if gather else 0.0
    batch = c * n if server else c  # sequences one decode step advances (per GPU in the trainer pods)

    # Decode: one token of each of the batch's sequences per step. Expected distinct experts per MoE layer that
    # ``batch`` tokens choosing top_k of E each route to: E (1 - (1 - top_k / E)^batch).
    experts, top_k = int(config.get("num_experts", 0) or 0), int(config.get("num_experts_per_tok", 0) or 0)
    experts_read = experts * (1 - (1 - top_k / experts) ** batch) if shape.is_moe and experts else 0.0
    embedding = shape.vocab * shape.hidden  # a lookup reads c rows of it, not the table
    dense_weights = PARAM_BYTES * (shape.total - shape.expert_params - embedding)
    expert_weights = PARAM_BYTES * shape.expert_params * (experts_read / experts if experts else 0.0)
    context = GRPO_PROMPT_TOKENS + t_c / 2  # keys per token on average over the completion
    kv = 2 * PARAM_BYTES * shape.layers * shape.kv_dim * context * batch
    decode_bytes = {"weights": dense_weights, "experts": expert_weights, "kv_cache": kv}
    decode_step_s = sum(decode_bytes.values()) / (HBM_BYTES_PER_S * (server_gpus or 1))
    # One push: the model gathered whole (ZeRO-3: an all-gather's worth over the job) and sent by rank 0 over its
    # GPU's share of the node's network to the server's node.
    sync_s = full_gather_s + PARAM_BYTES * shape.total / inter if server else 0.0
    # The server the train step runs (no grpo_vllm_server_url) is checked and counted; one at a URL is the user's.
    managed = server and not str(v.get("grpo_vllm_server_url", "")).strip()
    server_error = vllm_server_error(shape, server_gpus, float(v["gpu_memory_gib"]), kv) if managed else None
    server_memory_gib = (PARAM_BYTES * shape.total + kv) / (server_gpus or 1) / GIB if server else 0.0
    generation_s = gather_s + t_c * decode_step_s + sync_s / sync_every

    # The reference's forward: TRL 1.16 runs it in chunks of the micro-batch (k forwards), each gathering the
    # reference's layers under ZeRO-3 (its own engine in full; for LoRA the policy with its adapter off).
    sequence = GRPO_PROMPT_TOKENS + t_c
    beta = float(v["grpo_beta"])
    forward_s = 2 * shape.active * b * sequence / (float(v["achieved_tflops_per_gpu"]) * 1e12)
    chunk_gather_s = full_gather_s if zero3 else 0.0
    reference_s = k * max(forward_s, chunk_gather_s) if beta > 0 else 0.0
    reference_note = (
        f"KL to the reference (grpo_beta {beta:g}): {k} forwards of {b} x {sequence} tokens per GPU"
        + (f", each gathering the model's {_gb(full_model.size)} under ZeRO-3" if zero3 else "")
        if beta > 0
        else "none (grpo_beta 0 keeps no reference)"
    )

    # The policy's forward and backward: the plan of a step whose rows are prompt + completion tokens.
    train = plan({**values, "max_seq_length": sequence}, config, stage="grpo")
    step_s = generation_s + reference_s + train.step_s

    # Memory per GPU: what validate_inputs checks (components/validate/rules/train.py's arguments).
    grpo: dict[str, Any] = {
        "beta": beta,
        "completions": c,
        "sequence_tokens": int(v["max_seq_length"]),
        "colocate": True,
        "server": server,
    }
    memory_error = check_memory_fit(
        config,
        v["method"],
        v["deepspeed_config"],
        m,
        g,
        int(v["max_seq_length"]),
        b,
        gpu_memory_gib=float(v["gpu_memory_gib"]),
        lora_r=int(v["lora_r"]),
        lora_target_modules=v["lora_target_modules"],
        grpo=grpo,
        every_n_layers=int(v["recompute_every_n_layers"]) if v["activation_checkpointing"] else 0,
        setting_prefix="stage_settings.grpo." if stage_resources(typed, "grpo") else "",
        pod_memory_gib=pod_memory_limit_gib(v.get("trainer_memory_limit", "")),
    )
    lora = 0
    expert_lora = False
    if v["method"] in ("lora", "qlora"):
        modules, parameters = lora_targets("qwen3_moe" if shape.is_moe else "qwen3", v["lora_target_modules"])
        lora, expert_lora = shape.lora_params(v["lora_r"], modules + parameters), bool(parameters)
    every_n = int(v["recompute_every_n_layers"]) if v["activation_checkpointing"] else 0
    est = estimate_gib(shape, v["method"], zero, n, int(v["max_seq_length"]), b, lora, expert_lora, every_n, False)
    extra = grpo_extra_bytes(
        shape,
        v["method"],
        zero,
        n,
        beta=beta,
        completions=c,
        sequence_tokens=int(v["max_seq_length"]),
        gpu_memory_gib=float(v["gpu_memory_gib"]),
        colocate=True,
        server=server,
    )
    memory = est["total"] + extra / GIB

    prompts, prompts_source = _grpo_prompts(v)
    if int(v["max_steps"]) > 0:
        steps = int(v["max_steps"])
        prompts_source += f" (max_steps={steps} decides the length)"
    else:
        per_step = max(1, c * n // gens)
        steps = max(1, math.ceil((prompts if prompts is not None else 1000) * float(v["num_train_epochs"]) / per_step))
    wall = steps * step_s
    return GRPOPlan(
        backend=f"a vLLM server on {server_gpus} GPU(s) of its own"
        if server
        else "transformers generate" + (" under ZeRO-3" if zero3 else ""),
        num_generations=gens,
        completions_per_gpu=c,
        prompts_per_step=c * n // gens,
        completion_tokens=t_c,
        gather=gather,
        gather_s=gather_s,
        decode_bytes=decode_bytes,
        experts_read=experts_read,
        decode_step_s=decode_step_s,
        decode_tokens_per_s_per_gpu=batch / decode_step_s / (server_gpus or 1),
        generation_s=generation_s,
        reference_s=reference_s,
        reference_note=reference_note,
        train=train,
        step_s=step_s,
        memory_gib=memory,
        memory_error=memory_error,
        prompts=prompts,
        prompts_source=prompts_source,
        epochs=float(v["num_train_epochs"]),
        per_thousand=prompts is None and int(v["max_steps"]) <= 0,
        steps=steps,
        wall_s=wall,
        gpu_hours=wall * (n + (server_gpus if managed else 0)) / 3600,
        server_gpus=server_gpus,
        sync_s=sync_s,
        sync_every=sync_every,
        server_memory_gib=server_memory_gib,
        server_error=server_error,
        server_managed=managed,
    )


def format_grpo_plan(p: GRPOPlan) -> str:
    """The grpo stage's part of the plan, as the CLI prints it and validate_inputs logs it."""
    t = p.train
    share = {name: s / p.step_s for name, s in (("generation", p.generation_s), ("reference", p.reference_s))}
    gather = (
        f"gathers the whole policy onto every GPU first (TRL's ds3_gather_for_generation): {p.gather.kind} of "
        f"{_gb(p.gather.size)} over {p.gather.ranks} GPUs, {_gb(p.gather.network_bytes_per_gpu)} per GPU over the "
        f"network: {p.gather_s:.2f} s"
        if p.gather
        else "no gather (every GPU holds the whole model)"
    )
    experts = (
        f" + {_gb(p.decode_bytes['experts'])} of the {p.experts_read:.1f} experts per MoE layer its "
        f"{p.completions_per_gpu * (t.n_gpus if p.server_gpus else 1)} tokens route to"
        if p.experts_read
        else ""
    )
    if p.server_gpus:
        head = (
            f"plan of the grpo stage: {p.backend} generates (grpo_generation_backend vllm-server), the trainer pods "
            f"train on {t.num_nodes} x {t.gpus_per_node} GPUs"
        )
        gather = (
            f"the server decodes every completion of the step at once; the trainer pushes its weights every "
            f"{p.sync_every} step(s) (grpo_weight_sync_steps): the model gathered whole and sent by rank 0, "
            f"{p.sync_s:.1f} s a push"
        )
        reader, rate = f"the server's {p.server_gpus} GPU(s) read", "per server GPU"
        job_rate = p.decode_tokens_per_s_per_gpu * p.server_gpus
        caveat = "vLLM's batching and CUDA graphs come close to it"
    else:
        head = (
            f"plan of the grpo stage: {p.backend} in the trainer pods (the trainer image has no vllm), "
            f"{t.num_nodes} x {t.gpus_per_node} GPUs"
        )
        reader, rate = "a GPU reads", "per GPU"
        job_rate = p.decode_tokens_per_s_per_gpu * t.n_gpus
        caveat = "transformers' eager MoE launches kernels per expert and layer, which this does not count"
    lines = [
        head,
        f"  per step: {p.prompts_per_step} prompts x {p.num_generations} completions "
        f"({p.completions_per_gpu} per GPU: micro-batch {t.micro_batch} x {t.accumulation} micro-steps), up to "
        f"{p.completion_tokens} tokens each (grpo_max_completion_length), prompts ~{GRPO_PROMPT_TOKENS} tokens "
        "(assumed)",
        f"  generate: {gather}",
        f"            decode, memory-bandwidth bound: each step {reader} "
        f"{_gb(p.decode_bytes['weights'])} of non-expert weights{experts} + {_gb(p.decode_bytes['kv_cache'])} of KV "
        f"cache at {HBM_BYTES_PER_S / GB:,.0f} GB/s (HBM, achieved): {p.decode_step_s * 1e3:.1f} ms per step, "
        f"{p.decode_tokens_per_s_per_gpu:,.0f} tokens/s {rate}, {job_rate:,.0f} for the job",
        f"            {p.generation_s:.1f} s per step with every completion at the length limit; a lower bound on "
        f"time: {caveat}",
        f"  reference: {p.reference_note}: {p.reference_s:.1f} s",
        f"  training: {t.accumulation} micro-steps of {t.micro_batch} x {t.max_seq_length} tokens (prompt + "
        f"completion): {t.step_s:.1f} s, bottleneck: {t.bottleneck}",
        f"  step:     {p.step_s:.1f} s per optimizer step (generation {share['generation']:.0%}, reference "
        f"{share['reference']:.0%}, training {t.step_s / p.step_s:.0%})",
        f"  memory:   {p.memory_gib:.1f} GiB per GPU of {t.gpu_memory_gib:g} with generation's and the reference's "
        "share (what validate_inputs checks): " + (f"does NOT fit: {p.memory_error}" if p.memory_error else "fits"),
    ]
    if p.server_gpus and p.server_managed:
        lines.append(
            f"  server:   {p.server_memory_gib:.1f} GiB per server GPU (bf16 weights and a step's KV cache over "
            f"grpo_vllm_server_gpus={p.server_gpus}): "
            + (f"does NOT fit: {p.server_error}" if p.server_error else "fits")
        )
    if p.per_thousand:
        lines.append(
            f"  run:      {p.steps:,} optimizer steps per 1,000 prompts x {p.epochs:g} epochs "
            f"({p.prompts_source}): {_duration(p.wall_s)} wall, {p.gpu_hours:,.1f} GPU-hours per 1,000 prompts"
        )
    else:
        count = f"{p.prompts:,.0f} prompts x " if p.prompts is not None else ""
        lines.append(
            f"  run:      {p.steps:,} optimizer steps ({count}{p.epochs:g} epochs, from "
            f"{p.prompts_source}): {_duration(p.wall_s)} wall, {p.gpu_hours:,.1f} GPU-hours"
            + (f" (the server's {p.server_gpus} GPU(s) counted)" if p.server_gpus and p.server_managed else "")
        )
    return "\n".join(lines)


def read_stats(path: str) -> dict:
    """A prepared dataset's statistics from ``path``: prepare_dataset's stats.json, or its artifact's metadata
    (train_rows, train_tokens, packing_efficiency) saved as JSON. A ValueError says what is wrong."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except OSError as e:
        raise ValueError(f"--plan {path}: {e.strerror}; pass prepare_dataset's stats.json") from None
    except ValueError:
        raise ValueError(f"--plan {path}: not JSON; pass prepare_dataset's stats.json") from None
    if isinstance(data, dict) and isinstance(data.get("train"), dict) and data["train"].get("rows"):
        return data
    if isinstance(data, dict) and data.get("train_rows"):
        return {
            "train": {
                "rows": data["train_rows"],
                "tokens": data.get("train_tokens"),
                "packing_efficiency": data.get("packing_efficiency"),
            }
        }
    raise ValueError(
        f"--plan {path}: no training split's row count (train.rows in stats.json, or train_rows); pass "
        "prepare_dataset's stats.json"
    )


def memory_text(values: dict) -> str:
    """What ``--render`` prints after the manifests: each training stage's GPUs, how the grpo stage generates, and its
    memory per GPU by the fit validate_inputs applies; "" for a local run."""
    s = Settings.from_flat(values)
    if s.cluster.train_backend == "local":
        return ""
    try:
        config = architecture(s.train.model_name_or_path)
    except ValueError as e:
        return f"memory per GPU: not estimated ({e})"
    lines = []
    for stage in s.stages.stages:
        if stage == "grpo" and s.train.parallelism == "deepspeed":
            rl = grpo_plan(s, config)
            p, memory, fits, how = rl.train, rl.memory_gib, rl.memory_error is None, f", generation: {rl.backend}"
        else:
            p = plan(s, config, stage=stage)
            memory, fits, how = p.memory_gib["total"], p.fits, ""
        lines.append(
            f"stage {stage}: {p.num_nodes} x {p.gpus_per_node} GPUs{how}, {memory:.1f} GiB per GPU of "
            f"{p.gpu_memory_gib:g} (the fit validate_inputs checks): {'fits' if fits else 'does NOT fit'}"
        )
    return "\n".join(lines)


def plan_text(values: dict, stats_path: str | None = None) -> str:
    """What ``python -m pipelines.run ... --plan [STATS_JSON]`` prints for the resolved settings ``values``: the plan
    and, when another ZeRO-3 layout or micro-batch split is faster here by 10% or more and fits, that one. A
    ValueError names the setting when the model's config cannot be found without a download."""
    from components.stages import stage_resources

    s = Settings.from_flat(values)
    if s.cluster.train_backend == "local":
        return (
            "plan: this run trains on this machine's CPUs (train_backend=local); the plan is for GPU jobs: "
            "pass a cluster preset, e.g. --preset qwen3-30b-a3b-full --plan"
        )
    config = architecture(s.train.model_name_or_path)
    stats = read_stats(stats_path) if stats_path else None
    text = format_plan(plan(s, config, stats)) + "\n" + data_prep_text(s, stats)
    better = faster_layout(s, config, stats)
    if better:
        over, p = better
        own = plan(s, config, stats)
        args = " ".join(f"-p {key}={value}" for key, value in over.items())
        text += (
            f"\n  faster:   {args}: {p.tokens_per_s_per_gpu:,.0f} tokens/s per GPU "
            f"(x{p.tokens_per_s_per_gpu / own.tokens_per_s_per_gpu:.2f}), bottleneck {p.bottleneck}, "
            f"{p.memory_gib['total']:.1f} GiB per GPU"
        )
    lighter = lighter_recompute(s, config, stats)
    if lighter:
        over, p = lighter
        own = plan(s, config, stats)
        args = " ".join(f"-p {key}={str(value).lower()}" for key, value in over.items())
        text += (
            f"\n  recompute: only what memory needs, {args}: {p.tokens_per_s_per_gpu:,.0f} tokens/s per GPU "
            f"(x{p.tokens_per_s_per_gpu / own.tokens_per_s_per_gpu:.2f}), {p.memory_gib['total']:.1f} GiB per GPU "
            f"of {p.gpu_memory_gib:g}"
        )
    if "grpo" in s.stages.stages and s.train.parallelism == "deepspeed":
        text += "\n" + format_grpo_plan(grpo_plan(s, config))
    if len(s.stages.stages) > 1 or any(stage_resources(s, stage) for stage in s.stages.stages):
        text += "\n" + format_stage_plans(s, config, stats)
    return text


def format_stage_plans(s: Settings, config: dict, stats: dict | None = None) -> str:
    """One line per stage the run trains, each on its own job (``stage_settings`` may give a stage its own
    ``num_nodes`` and ``gpus_per_node``): GPUs, optimizer steps, wall time, GPU-hours and memory per GPU, and the
    run's total. ``stats`` (the prepared dataset's) sizes the stage the headline plans; the others are sized by
    ``dataset_tokens_estimate`` (the grpo stage: its prompts, ``grpo_plan``)."""
    from components.stages import stage_resources, stage_setting_name

    head = "sft" if "sft" in s.stages.stages else s.stages.stages[0]
    lines = ["stages: each its own job, on its own nodes and GPUs (stage_settings.<stage>.num_nodes, .gpus_per_node)"]
    total = 0.0
    for stage in s.stages.stages:
        if stage == "grpo" and s.train.parallelism == "deepspeed":
            rl = grpo_plan(s, config)
            p, memory, fits, wall, hours = rl.train, rl.memory_gib, rl.memory_error is None, rl.wall_s, rl.gpu_hours
            per = " per 1,000 prompts" if rl.per_thousand else ""
            steps = f"{rl.steps:,} optimizer steps{per}"
        else:
            p = plan(s, config, stats if stage == head else None, stage=stage)
            memory, fits, wall, hours = p.memory_gib["total"], p.fits, p.wall_s, p.gpu_hours
            steps = f"{p.steps:,} optimizer steps"
        total += hours
        own = stage_resources(s, stage)
        source = (
            ", ".join(f"{stage_setting_name(s, stage, name)}" for name in ("num_nodes", "gpus_per_node") if name in own)
            or "the run's num_nodes, gpus_per_node"
        )
        lines.append(
            f"  {stage + ':':<9} {p.num_nodes} x {p.gpus_per_node} GPUs ({source}), {steps}, {_duration(wall)} wall, "
            f"{hours:,.1f} GPU-hours, {memory:.1f} GiB per GPU: {'fits' if fits else 'does NOT fit'}"
        )
    lines.append(f"  {'total:':<9} {total:,.1f} GPU-hours over {len(s.stages.stages)} stages")
    return "\n".join(lines)
