"""The plan of a training stage before it runs: seconds per optimizer step, tokens/s per GPU, the bottleneck, the
run's wall time and GPU-hours, and the memory per GPU, from the settings and the model's config.json alone (no torch,
no cluster, no GPU, no download): ``Plan``, ``plan`` and ``architecture``, the layouts and micro-batch splits weighed
against the run's own (``alternatives``, ``faster_layout``, ``lighter_recompute``) and the plan as text
(``format_plan``). Why: a sparse model's layout decides what crosses nodes, and a job that is network-bound or does not
fit is cheaper found out before GPUs are requested than after. The model, per optimizer step: compute from the model
FLOPs (6 A + 12 L d T per token, components/models/mfu.py) plus recomputation, at ``achieved_tflops_per_gpu``; every
collective of the layout on the link it crosses (network.py); per phase max(compute, communication) plus what cannot
overlap. Memory per GPU is components/estimate/memory.py's estimate. The grpo stage's plan is grpo_plan.py's, the text
``--plan`` prints plan_text.py's; docs/plan.md has the derivation, its notation and its sources.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path

from components.estimate.memory import pod_memory_limit_gib
from components.estimate.network import (
    COMPUTE,
    GB,
    HBM_BYTES_PER_S,
    HSDP_LAYOUTS,
    INTER,
    INTRA,
    OPTIMIZER_BYTES_PER_PARAM,
    PARAM_BYTES,
    Collective,
    _link_seconds,
    collectives,
    hsdp_export_host_gib,
    hsdp_memory_gib,
    layout_name,
    network_transport,
    zero_config,
)
from components.models.mfu import model_flops_per_token, recompute_flops_per_token
from components.models.shape import KNOWN_MODELS, load_architecture, lora_targets, model_shape
from components.settings import Settings
from components.train.config import job_zero_config


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
    method, parallelism = v["method"], v.get("parallelism", "deepspeed")
    hsdp = parallelism in HSDP_LAYOUTS
    zero = _zero_layout(v, shape, hsdp)
    zero_stage = zero.get("stage", 0)
    m, g = int(v["num_nodes"]), int(v["gpus_per_node"])
    n = m * g
    s, b, k = int(v["max_seq_length"]), int(v["per_device_train_batch_size"]), int(v["gradient_accumulation_steps"])
    rows = b * (2 if stage in ("dpo", "rm") else 1)  # DPO, rm: chosen and rejected of each pair in one forward
    lora, expert_lora, frozen_linear_active = _lora_params(shape, method, v)
    trainable = shape.total if method == "full" else lora

    # Compute (docs/plan.md).
    tokens = s * rows
    real = _packing_efficiency(stats)
    t_att, att_source = _attention_length(stats, s)
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
    intra, inter, transport = _links(v, g)
    steps_collectives = collectives(shape, method, zero, m, g, trainable, parallelism, tokens, recompute)
    blocked, notes = _layout_notes(v, shape, zero, hsdp, values.get("trainer_memory_limit", ""))
    embed = PARAM_BYTES * shape.vocab * shape.hidden
    micro, busy, exposed_total, comm_bound = _micro_steps(
        steps_collectives, k, intra, inter, fwd_s, bwd_s, trains_embedding=method == "full", embed_bytes=embed
    )
    updated = trainable / g if hsdp else trainable / n if zero_stage in (1, 2, 3) else trainable
    after_links, after_s = _after_step(steps_collectives, intra, inter, updated)
    for link in busy:
        busy[link] += after_links[link]
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
    dataset_tokens, source, steps = _run_length(v, stats, s, real, epochs, b * k * n)
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


def _zero_layout(v: dict, shape, hsdp: bool) -> dict:
    """The DeepSpeed config the trainer runs with: none under HSDP (validate_inputs refuses hsdp with one), else the
    shipped config with zero3_hpz's partition as the trainer sets it: the job's GPUs per node (1, off, on one node)."""
    if hsdp:
        zero_config(v["deepspeed_config"])  # still read: a deepspeed_config that does not load fails every layout
        return {}
    return job_zero_config(v["deepspeed_config"], int(v["num_nodes"]), int(v["gpus_per_node"]), shape.largest_layer)


def _links(v: dict, g: int) -> tuple[float, float, str]:
    """Bytes per second per GPU within a node and between nodes, and the transport between them."""
    intra, inter = float(v["intra_node_gb_per_s"]) * GB, float(v["inter_node_gb_per_s"]) * GB
    transport = network_transport(v)
    if transport.startswith("TCP"):  # NCCL's sockets over the pod network: the node's TCP bandwidth over its GPUs
        inter = min(inter, float(v["tcp_node_gb_per_s"]) * GB / g)
    return intra, inter, transport


def _lora_params(shape, method: str, v: dict) -> tuple[int, bool, int]:
    """LoRA's trainable parameters, whether they adapt the experts' fused parameters, and the frozen nn.Linear weights
    whose weight gradients LoRA skips (active per token); ``(0, False, 0)`` for full fine-tuning."""
    lora, expert_lora, frozen_linear_active = 0, False, 0
    if method in ("lora", "qlora"):
        modules, parameters = lora_targets("qwen3_moe" if shape.is_moe else "qwen3", v["lora_target_modules"])
        lora, expert_lora = shape.lora_params(v["lora_r"], modules + parameters), bool(parameters)
        experts_active = shape.sparse_layers * 3 * shape.hidden * shape.intermediate if shape.is_moe else 0
        frozen_linear_active = shape.active - (experts_active if expert_lora else 0)
    return lora, expert_lora, frozen_linear_active


def _attention_length(stats: dict | None, s: int) -> tuple[float, str]:
    """T, the keys a token attends to on average, and where it comes from: the prepared dataset's length histogram,
    else one document per row of ``s`` tokens."""
    t_att = attention_from_stats(stats, s) if stats else None
    if t_att is None:
        return (s + 1) / 2, "one document per row, (s + 1) / 2: an upper bound"
    return t_att, "the prepared dataset's length histogram"


def _layout_notes(v: dict, shape, zero: dict, hsdp: bool, trainer_memory_limit: str) -> tuple[str | None, list[str]]:
    """What stops the layout (HSDP's final export over the pod's memory), or None, and the plan's notes on it: HSDP's
    method and checkpoints, a ZeRO++ hpZ partition that does not fit the nodes, offload."""
    method, parallelism = v["method"], v.get("parallelism", "deepspeed")
    g = int(v["gpus_per_node"])
    n = int(v["num_nodes"]) * g
    zero_stage, hpz = zero.get("stage", 0), int(zero.get("zero_hpz_partition_size", 1) or 1)
    notes: list[str] = []
    blocked = None
    if hsdp:
        if method != "full":
            notes.append(f"parallelism {parallelism} trains method full only: validate_inputs refuses {method}")
        notes.append(
            "checkpoints under HSDP: every rank writes its own shards of the weights and the optimizer state (torch's "
            "distributed checkpoint, components/train/trainer/sharded_checkpoints.py); a re-run resumes on the same "
            "nodes x GPUs"
        )
        host, pod = hsdp_export_host_gib(shape, g), pod_memory_limit_gib(trainer_memory_limit)
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
    return blocked, notes


def _micro_steps(
    steps_collectives: list,
    k: int,
    intra: float,
    inter: float,
    fwd_s: float,
    bwd_s: float,
    *,
    trains_embedding: bool,
    embed_bytes: float,
) -> tuple[list[float], dict[str, float], float, bool]:
    """Each of the ``k`` micro-steps' seconds (max(compute, communication) for its forward and for its backward,
    plus what is not overlapped), each link's busy seconds over them, the seconds not overlapped, and whether
    communication outlasts compute anywhere."""
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
        exposed += [c for c in bwd_items if c.kind == "reduce-scatter" and trains_embedding]
        exp = sum(min(1.0, embed_bytes / c.size) * max(_link_seconds([c], intra, inter).values()) for c in exposed)
        for link in busy:
            busy[link] += fwd[link] + bwd[link]
        comm_bound |= max(fwd.values()) > fwd_s or max(bwd.values()) > bwd_s
        micro.append(max(fwd_s, max(fwd.values())) + max(bwd_s, max(bwd.values())) + exp)
        exposed_total += exp
    return micro, busy, exposed_total, comm_bound


def _after_step(steps_collectives: list, intra: float, inter: float, updated: float) -> tuple[dict[str, float], float]:
    """What follows the last micro-step: each link's busy seconds (the post-step collectives), and the seconds it takes
    (the optimizer's update of its ``updated`` parameters per GPU at HBM bandwidth, and those collectives)."""
    after_links = _link_seconds([c for c in steps_collectives if c.when == "after"], intra, inter)
    return after_links, OPTIMIZER_BYTES_PER_PARAM * updated / HBM_BYTES_PER_S + max(after_links.values())


def _packing_efficiency(stats: dict | None) -> float:
    """The fraction of a packed row that is real tokens: the prepared dataset's, else 1."""
    if stats and stats.get("train", {}).get("packing_efficiency"):
        return float(stats["train"]["packing_efficiency"])
    return 1.0


def _run_length(
    v: dict, stats: dict | None, s: int, real: float, epochs: float, rows_per_step: int
) -> tuple[float, str, int]:
    """The training data's tokens, where that figure comes from, and the run's optimizer steps: ``max_steps``, else
    ``epochs`` over the rows, ``rows_per_step`` rows an optimizer step."""
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
        steps = max(1, math.ceil(train_rows * epochs / rows_per_step))
    return dataset_tokens, source, steps


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
