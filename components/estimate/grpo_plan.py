"""The grpo stage's plan (docs/plan.md, "The grpo stage"): ``GRPOPlan`` and ``grpo_plan``, its optimizer step as the
trainer pods run it (generation, the reference's forward for the KL term, then the policy's forward and backward as
training_plan.py's ``plan``), its memory per GPU by the fit validate_inputs checks, its run's steps and GPU-hours, and
``format_grpo_plan``, the text of it. It builds on network.py and training_plan.py, which import nothing of it;
plan_text.py and validate_inputs' rules call it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from components.estimate.memory import pod_memory_limit_gib
from components.estimate.network import (
    GB,
    HBM_BYTES_PER_S,
    PARAM_BYTES,
    Collective,
    _link_seconds,
    network_transport,
)
from components.estimate.training_plan import Plan, _duration, _gb, plan
from components.models.shape import lora_targets, model_shape
from components.settings import Settings
from components.train.config import job_zero_config

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
    from components.estimate.memory import GIB, vllm_server_error
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

    experts_read, decode_bytes = _decode_bytes(config, shape, batch, t_c)
    kv = decode_bytes["kv_cache"]
    decode_step_s = sum(decode_bytes.values()) / (HBM_BYTES_PER_S * (server_gpus or 1))
    # One push: the model gathered whole (ZeRO-3: an all-gather's worth over the job) and sent by rank 0 over its
    # GPU's share of the node's network to the server's node.
    sync_s = full_gather_s + PARAM_BYTES * shape.total / inter if server else 0.0
    # The server the train step runs (no grpo_vllm_server_url) is checked and counted; one at a URL is the user's.
    managed = server and not str(v.get("grpo_vllm_server_url", "")).strip()
    server_error = vllm_server_error(shape, server_gpus, float(v["gpu_memory_gib"]), kv) if managed else None
    server_memory_gib = (PARAM_BYTES * shape.total + kv) / (server_gpus or 1) / GIB if server else 0.0
    generation_s = gather_s + t_c * decode_step_s + sync_s / sync_every

    sequence = GRPO_PROMPT_TOKENS + t_c
    beta = float(v["grpo_beta"])
    reference_s, reference_note = _reference(v, shape, sequence, full_model, full_gather_s, zero3)

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
    setting_prefix = "stage_settings.grpo." if stage_resources(typed, "grpo") else ""
    memory_error, memory = _memory(v, config, shape, zero, grpo, setting_prefix)

    prompts, prompts_source, steps = _grpo_steps(v, c * n // gens)
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


def _decode_bytes(config: dict, shape, batch: int, t_c: int) -> tuple[float, dict]:
    """The distinct experts per MoE layer a decode step's ``batch`` tokens route to (0: dense), and what the step reads
    from HBM: the non-expert weights, those experts' weights, and the KV cache over a completion of ``t_c`` tokens."""
    # Decode: one token of each of the batch's sequences per step. Expected distinct experts per MoE layer that
    # ``batch`` tokens choosing top_k of E each route to: E (1 - (1 - top_k / E)^batch).
    experts, top_k = int(config.get("num_experts", 0) or 0), int(config.get("num_experts_per_tok", 0) or 0)
    experts_read = experts * (1 - (1 - top_k / experts) ** batch) if shape.is_moe and experts else 0.0
    embedding = shape.vocab * shape.hidden  # a lookup reads c rows of it, not the table
    dense_weights = PARAM_BYTES * (shape.total - shape.expert_params - embedding)
    expert_weights = PARAM_BYTES * shape.expert_params * (experts_read / experts if experts else 0.0)
    context = GRPO_PROMPT_TOKENS + t_c / 2  # keys per token on average over the completion
    kv = 2 * PARAM_BYTES * shape.layers * shape.kv_dim * context * batch
    return experts_read, {"weights": dense_weights, "experts": expert_weights, "kv_cache": kv}


def _reference(
    v: dict, shape, sequence: int, full_model: Collective, full_gather_s: float, zero3: bool
) -> tuple[float, str]:
    """The reference's forward for the KL term: its seconds per optimizer step and the plan's line on it. Under
    ZeRO-3 each forward gathers ``full_model`` (``full_gather_s``)."""
    # TRL 1.16 runs it in chunks of the micro-batch (k forwards), each gathering the reference's layers under ZeRO-3
    # (its own engine in full; for LoRA the policy with its adapter off).
    b, k = int(v["per_device_train_batch_size"]), int(v["gradient_accumulation_steps"])
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
    return reference_s, reference_note


def _memory(v: dict, config: dict, shape, zero: dict, grpo: dict, setting_prefix: str) -> tuple[str | None, float]:
    """The grpo stage's fit as validate_inputs checks it (its error, or None), and its GiB per GPU: the policy's
    training and ``grpo``'s reference model and generations (memory.py's ``grpo_extra_bytes`` keywords)."""
    from components.estimate.memory import GIB, StageFit, check_memory_fit, estimate_gib, grpo_extra_bytes

    m, g = int(v["num_nodes"]), int(v["gpus_per_node"])
    b = int(v["per_device_train_batch_size"])
    every_n = int(v["recompute_every_n_layers"]) if v["activation_checkpointing"] else 0
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
        pod_memory_gib=pod_memory_limit_gib(v.get("trainer_memory_limit", "")),
        stage_fit=StageFit(grpo=grpo, every_n_layers=every_n, setting_prefix=setting_prefix),
    )
    lora = 0
    expert_lora = False
    if v["method"] in ("lora", "qlora"):
        modules, parameters = lora_targets("qwen3_moe" if shape.is_moe else "qwen3", v["lora_target_modules"])
        lora, expert_lora = shape.lora_params(v["lora_r"], modules + parameters), bool(parameters)
    n = m * g
    est = estimate_gib(shape, v["method"], zero, n, int(v["max_seq_length"]), b, lora, expert_lora, every_n, False)
    extra = grpo_extra_bytes(shape, v["method"], zero, n, gpu_memory_gib=float(v["gpu_memory_gib"]), **grpo)
    return memory_error, est["total"] + extra / GIB


def _grpo_steps(v: dict, prompts_per_step: int) -> tuple[float | None, str, int]:
    """The training prompts (None where the source does not say), where that count comes from, and the run's
    optimizer steps: ``max_steps``, else the prompts' epochs (1,000 prompts where they are not known)."""
    prompts, prompts_source = _grpo_prompts(v)
    if int(v["max_steps"]) > 0:
        steps = int(v["max_steps"])
        prompts_source += f" (max_steps={steps} decides the length)"
    else:
        per_step = max(1, prompts_per_step)
        steps = max(1, math.ceil((prompts if prompts is not None else 1000) * float(v["num_train_epochs"]) / per_step))
    return prompts, prompts_source, steps


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
