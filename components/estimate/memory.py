"""Will the training job fit? Per-GPU and per-pod (host) memory estimates, checked before any job is created.

Why: a job that cannot fit should fail in validate_inputs, naming the knob to turn, not as an OOM after its GPUs were
granted. Per GPU: the model states of the method and DeepSpeed stage (for full fine-tuning DeepSpeed's own
``estimate_zero{2,3}_model_states_mem_needs`` give the same numbers, and a test holds us to them), bf16 activations
with gradient checkpointing, the grpo stage's reference model and generations, and 3 GiB of overhead; per pod (host
memory, against the trainer pod's limit): each rank's process and /dev/shm, and what ZeRO's loading or offload holds.
docs/memory.md has every formula and the measurements behind them.
"""

from __future__ import annotations

from dataclasses import dataclass

from components.models.shape import ModelShape, load_architecture, lora_targets, model_shape
from components.names import quantity
from components.train.config import LOSS_CHUNK_TOKENS, job_zero_config

GIB = 1024**3
OVERHEAD_BYTES = 3 * GIB
NF4_BYTES_PER_PARAM = 4.127 / 8  # 4-bit codes + double-quantised fp8 absmax per 64 weights
# Host memory per rank: a CUDA PyTorch process with NCCL, DeepSpeed and two data-loader workers (typical RSS),
# and what NCCL and the workers write to /dev/shm.
HOST_PROCESS_BYTES = 3 * GIB
SHM_BYTES_PER_RANK = GIB // 2
# DeepSpeed's estimators multiply host-side states by this (``additional_buffer_factor``): pinned buffers are
# allocated in power-of-two blocks and the optimizer keeps staging copies.
HOST_BUFFER_FACTOR = 1.5
# The trainer pod's memory request and limit: the ``memory`` default ("128Gi") of the training job's spec
# (components/train/launcher/spec.py, ``TrainingJobSpec``), which the PyTorchJob and the TrainJob both take.
POD_MEMORY_GIB = 128.0
LORA_PRESET = "qwen3-30b-a3b-lora"


def base_weight_bytes(shape: ModelShape, method: str) -> int:
    """The frozen base's weights on one GPU once loaded (and, for qlora, prepared by PEFT), before any sharding.

    qlora: NF4 for the decoder's nn.Linear weights, fp32 for every other tensor (docs/memory.md); else bf16.
    """
    if method == "qlora":
        return int(NF4_BYTES_PER_PARAM * shape.linear) + 4 * (shape.total - shape.linear)
    return 2 * shape.total


def gathered_params(shape: ModelShape) -> int:
    """The most parameters ZeRO-3 holds gathered at once: a whole decoder layer (it prefetches layer by layer,
    components/train/config.py::zero3_sizes; a Qwen3-MoE block is one leaf of it) or the embedding, whichever is
    larger (DeepSpeed's estimators call it ``largest_layer_params``)."""
    return max(shape.largest_block, shape.largest_layer)


def model_states_bytes(shape: ModelShape, method: str, zero: dict, n_gpus: int, lora_params: int = 0) -> int:
    """Weights + gradients + optimizer states per GPU (docs/memory.md has the formulas)."""
    p, n, t = shape.total, n_gpus, lora_params
    stage = zero.get("stage", 0)
    offload_opt = zero.get("offload_optimizer", {}).get("device", "none") != "none"
    offload_param = zero.get("offload_param", {}).get("device", "none") != "none"
    # ZeRO-3's live bf16 parameters: the running layer (or the embedding) and the one prefetched, and the gradient
    # reduce bucket (components/train/config.py::zero3_sizes, where the config says "auto").
    largest = 4 * gathered_params(shape)
    if stage == 3 and isinstance(zero.get("reduce_bucket_size"), (int, float)):
        largest += 2 * int(zero["reduce_bucket_size"])
    hpz = int(zero.get("zero_hpz_partition_size", 1) or 1)
    secondary = int(2 * p / hpz) if stage == 3 and hpz > 1 else 0
    if method == "full":
        if stage == 3:
            if offload_param:
                return largest
            return largest + secondary + (int(2 * p / n) if offload_opt else int(18 * p / n))
        if stage in (1, 2):
            return 2 * p if offload_opt else 2 * p + int(18 * p / n)
        return 16 * p
    if method == "lora":
        if stage == 3:
            return largest + secondary + int(2 * p / n) + int(18 * t / n)
        return base_weight_bytes(shape, method) + 16 * t
    if method == "qlora":
        return base_weight_bytes(shape, method) + 16 * t
    raise ValueError(f"method {method!r} is not one of full, lora, qlora")


def recomputed_layers(layers: int, every_n_layers: int) -> int:
    """How many decoder layers activation checkpointing recomputes: transformers checkpoints layer i when
    i % every_n_layers == 0 (``_set_gradient_checkpointing``); 0 (no checkpointing) recomputes none."""
    return -(-layers // every_n_layers) if every_n_layers else 0


def activation_bytes(
    shape: ModelShape,
    max_seq_length: int,
    per_device_train_batch_size: int,
    expert_lora_bytes_per_param: int = 0,
    every_n_layers: int = 1,
    chunked_loss: bool = False,
) -> int:
    """Activation memory per GPU for one micro-batch (docs/memory.md): the checkpointed layers keep their input,
    the others (``every_n_layers`` > 1, or 0: no checkpointing) all their activations; the logits of every token,
    or with ``chunked_loss`` of ``LOSS_CHUNK_TOKENS`` at a time (trainer/chunked_loss.py).

    ``expert_lora_bytes_per_param``: 0 without LoRA on expert tensors, else the experts' bytes per parameter
    (2 in bf16, 4 under qlora), for the adapted expert weights PEFT builds per layer.
    """
    tokens = max_seq_length * per_device_train_batch_size
    recomputed = recomputed_layers(shape.layers, every_n_layers)
    checkpoints = 2 * tokens * shape.hidden * recomputed
    one_layer = 2 * tokens * (6 * shape.hidden + 2 * (shape.q_dim + 2 * shape.kv_dim) + 3 * shape.intermediate)
    kept = (shape.layers - recomputed) * one_layer
    logits = 10 * (min(tokens, LOSS_CHUNK_TOKENS) if chunked_loss else tokens) * shape.vocab
    layer_experts = shape.expert_params // shape.sparse_layers if shape.sparse_layers else 0
    return checkpoints + kept + one_layer + logits + 2 * expert_lora_bytes_per_param * layer_experts


def estimate_gib(
    shape: ModelShape,
    method: str,
    zero: dict,
    n_gpus: int,
    max_seq_length: int,
    per_device_train_batch_size: int,
    lora_params: int = 0,
    expert_lora: bool = False,
    every_n_layers: int = 1,
    chunked_loss: bool = False,
) -> dict:
    """The per-GPU estimate in GiB: ``model_states``, ``activations``, ``overhead`` and ``total``.

    ``expert_lora``: LoRA adapters on the fused expert tensors (lora.py's ``experts.*`` targets).
    ``every_n_layers``: the recomputed layers' stride (``recompute_every_n_layers``); 0: no checkpointing.
    ``chunked_loss``: the logits of ``LOSS_CHUNK_TOKENS`` tokens at a time (``chunked_cross_entropy``).
    """
    states = model_states_bytes(shape, method, zero, n_gpus, lora_params) / GIB
    expert_bytes = (4 if method == "qlora" else 2) if expert_lora else 0
    acts = (
        activation_bytes(shape, max_seq_length, per_device_train_batch_size, expert_bytes, every_n_layers, chunked_loss)
        / GIB
    )
    overhead = OVERHEAD_BYTES / GIB
    return {"model_states": states, "activations": acts, "overhead": overhead, "total": states + acts + overhead}


def host_bytes_per_pod(
    shape: ModelShape, method: str, zero: dict, num_nodes: int, gpus_per_node: int, lora_params: int = 0
) -> dict:
    """Host memory of one trainer pod in bytes: ``processes``, ``shm``, ``model`` and ``total`` (docs/memory.md).

    ``model`` is what the ranks hold of the model in host memory: while loading it, and offloaded states.
    For full fine-tuning under ZeRO-3 it equals DeepSpeed's ``estimate_zero3_model_states_mem_needs`` (cpu).
    """
    ranks, stage = gpus_per_node, zero.get("stage", 0)
    offload_opt = zero.get("offload_optimizer", {}).get("device", "none") != "none"
    offload_param = zero.get("offload_param", {}).get("device", "none") != "none"
    trainable = shape.total if method == "full" else lora_params
    # Offloaded states: each pod holds its ranks' partitions, 1/num_nodes of the whole.
    offloaded = HOST_BUFFER_FACTOR * (16 * trainable * offload_opt + 2 * shape.total * offload_param) / num_nodes
    model: float
    if method == "qlora":
        model = 2 * gathered_params(shape) * ranks
    elif stage == 3:
        model = offloaded if (offload_opt or offload_param) else HOST_BUFFER_FACTOR * 4 * gathered_params(shape) * ranks
    else:
        converted = 4 * shape.total if (method == "full" and stage == 0) else 2 * shape.expert_params
        model = converted * ranks + offloaded
    processes, shm = HOST_PROCESS_BYTES * ranks, SHM_BYTES_PER_RANK * ranks
    return {"processes": processes, "shm": shm, "model": int(model), "total": processes + shm + int(model)}


# TRL 1.16's GRPOConfig.vllm_gpu_memory_utilization: the share of each GPU its colocated vLLM engine reserves.
VLLM_GPU_MEMORY_UTILIZATION = 0.3
# Whether the trainer image installs vllm (images/trainer/Dockerfile, pyproject's ``train`` extra). It does not (no vllm
# release fits the package's transformers, docs/rl.md), so grpo_arguments.vllm_colocate picks transformers' ``generate``
# in the trainer pods too, and a request for vLLM colocate is counted as what runs instead.
TRAINER_IMAGE_HAS_VLLM = False
# The weight sync's send bucket on the trainer's rank 0 (components/train/trainer/vllm_client.py DEFAULT_BUCKET_BYTES;
# a test holds the two equal: this module imports nothing of the trainer's).
WEIGHT_SYNC_BUCKET_BYTES = 256 * 2**20


# vLLM's default --gpu-memory-utilization: the share of each GPU its server takes for weights, activations and KV cache.
VLLM_SERVER_MEMORY_SHARE = 0.9


def vllm_server_error(shape: ModelShape, server_gpus: int, gpu_memory_gib: float, kv_bytes: float) -> str | None:
    """The grpo generation server's fit (grpo_generation_backend vllm-server, the server the train step runs): its
    bf16 weights and the KV cache of a step's completions, split over its ``server_gpus`` (tensor parallel), within
    vLLM's share of each GPU; None when they fit, else the error naming grpo_vllm_server_gpus."""
    budget = VLLM_SERVER_MEMORY_SHARE * gpu_memory_gib * GIB
    need = (2 * shape.total + kv_bytes) / server_gpus  # bf16
    if need <= budget:
        return None
    gpus = server_gpus
    while (2 * shape.total + kv_bytes) / gpus > budget and gpus < 64:
        gpus *= 2
    return (
        f"the grpo generation server needs about {need / GIB:.1f} GiB per GPU (bf16 weights and a step's KV cache, "
        f"over grpo_vllm_server_gpus={server_gpus}) but vLLM takes {VLLM_SERVER_MEMORY_SHARE:.0%} of a GPU's "
        f"{gpu_memory_gib:g} GiB: raise grpo_vllm_server_gpus (to {gpus}: tensor parallel within one node)"
    )


def grpo_generation_gather_bytes(shape: ModelShape, zero: dict) -> int:
    """What transformers' ``generate`` under ZeRO-3 adds per GPU while the grpo stage generates: TRL 1.16 gathers the
    whole policy onto every GPU for it (GRPOConfig ``ds3_gather_for_generation``, default True: one
    ``GatheredParameters`` over every parameter), a bf16 copy of the model beside each rank's shard. Without ZeRO-3
    every GPU holds the whole model already (its model states)."""
    return 2 * shape.total if zero.get("stage", 0) == 3 else 0


def grpo_extra_bytes(
    shape: ModelShape,
    method: str,
    zero: dict,
    n_gpus: int,
    *,
    beta: float,
    completions: int,
    sequence_tokens: int,
    gpu_memory_gib: float,
    colocate: bool,
    server: bool = False,
) -> int:
    """What the grpo stage holds per GPU beyond the policy's training (docs/memory.md): the reference model and
    the generations (``completions`` sequences of ``sequence_tokens`` a rank generates at once, their KV cache, and
    under ZeRO-3 the whole gathered model, ``grpo_generation_gather_bytes``; ``colocate``: vLLM's reserved share of the
    GPU instead, where the trainer image has vllm, TRAINER_IMAGE_HAS_VLLM). ``server`` (grpo_generation_backend
    vllm-server): the completions come from a server on GPUs of its own; the trainer holds only what its weight sync
    does, one parameter gathered whole at a time and rank 0's send bucket (components/train/trainer/vllm_client.py)."""
    reference = 0
    if beta > 0 and method == "full":
        reference = int(2 * shape.total / n_gpus) if zero.get("stage", 0) == 3 else 2 * shape.total
    if server:
        gathered = 2 * shape.largest_block if zero.get("stage", 0) == 3 else 0
        return reference + gathered + WEIGHT_SYNC_BUCKET_BYTES
    if colocate and TRAINER_IMAGE_HAS_VLLM:
        generations = int(VLLM_GPU_MEMORY_UTILIZATION * gpu_memory_gib * GIB)
    else:
        kv_cache = 2 * 2 * shape.layers * shape.kv_dim * sequence_tokens * completions
        generations = kv_cache + grpo_generation_gather_bytes(shape, zero)
    return reference + generations


def _gpu_error(
    method: str,
    zero: dict,
    est: dict,
    shape: ModelShape,
    num_nodes: int,
    per_device_train_batch_size: int,
    max_seq_length: int,
    gpu_memory_gib: float,
    levers: tuple[str, ...] = (),
    prefix: str = "",
) -> str:
    rl = f" + {est['grpo']:.1f} grpo's reference model and generations" if "grpo" in est else ""
    summary = (
        f"needs about {est['total']:.1f} GiB per GPU ({est['model_states']:.1f} model states + "
        f"{est['activations']:.1f} activations + {est['overhead']:.0f} overhead{rl}) but a GPU has "
        f"{gpu_memory_gib:g} GiB"
    )
    gathered = grpo_generation_gather_bytes(shape, zero) / GIB if "grpo" in est and not est.get("server") else 0.0
    if gathered and est["total"] - gathered <= gpu_memory_gib:
        # What fills the GPU is the whole model gathered for generation, which neither more GPUs nor a smaller batch
        # shrink; LoRA's model states are the bf16 base's shard alone (its reference is the adapter off).
        fix = (
            f"its generation (transformers' generate: the trainer image has no vllm) gathers the whole model onto "
            f"every GPU ({gathered:.1f} GiB, TRL's ds3_gather_for_generation), which neither more GPUs nor a smaller "
            'batch shrink: train the grpo stage with LoRA (stage_settings={"grpo": {"method": "lora"}}) or use GPUs '
            "with more memory (gpu_memory_gib)"
        )
    elif est["model_states"] + est["overhead"] + est.get("grpo", 0) <= gpu_memory_gib:
        # Activations: first what costs memory only (recomputation, the logits), then the batch.
        fix = "".join(f"set {lever}, or " for lever in levers) + (
            f"lower per_device_train_batch_size (now {per_device_train_batch_size}) or max_seq_length "
            f"(now {max_seq_length}) and raise gradient_accumulation_steps to keep the global batch"
        )
    elif method == "qlora" and shape.is_moe:
        fix = (
            f"bitsandbytes quantises only nn.Linear layers, so the {shape.expert_params / 1e9:.1f}B parameters of "
            "the fused expert tensors stay unquantised and PEFT's k-bit preparation casts them to fp32; use method "
            f"'lora' with deepspeed_config 'zero3' (preset {LORA_PRESET}), which shards the bf16 base and trains "
            "the experts through adapters"
        )
    elif method == "full" and zero.get("stage", 0) != 3:
        fix = "set deepspeed_config to 'zero3' (shards weights, gradients and optimizer states over all GPUs)"
    elif method == "full" or (method == "lora" and zero.get("stage", 0) == 3):
        fix = f"raise {prefix}num_nodes (now {num_nodes}) or set deepspeed_config to 'zero3_offload'"
    elif method == "lora":
        fix = "set deepspeed_config to 'zero3' (shards the frozen base over all GPUs)"
    else:
        fix = "use method 'lora' with deepspeed_config 'zero3', or a GPU with more memory (gpu_memory_gib)"
    return f"{summary}: {fix}"


def pod_memory_limit_gib(trainer_memory_limit: str) -> float:
    """The trainer pod's memory limit in GiB (the ``trainer_memory_limit`` quantity), what every host-memory check
    holds a pod to; ``POD_MEMORY_GIB`` where it is not a quantity (validate_inputs reports that)."""
    limit = quantity(trainer_memory_limit)
    return limit / 2**30 if limit else POD_MEMORY_GIB


def _host_error(
    method: str, zero: dict, host: dict, num_nodes: int, gpus_per_node: int, pod_memory_gib: float, prefix: str = ""
) -> str:
    summary = (
        f"needs about {host['total'] / GIB:.0f} GiB of host memory per pod ({gpus_per_node} ranks: "
        f"{host['processes'] / GIB:.0f} processes + {host['shm'] / GIB:.0f} /dev/shm + "
        f"{host['model'] / GIB:.0f} model) but a pod has {pod_memory_gib:g} GiB (trainer_memory_limit)"
    )
    offload = any(zero.get(k, {}).get("device", "none") != "none" for k in ("offload_optimizer", "offload_param"))
    if offload:
        fix = (
            f"raise {prefix}num_nodes (now {num_nodes}; each pod holds 1/num_nodes of the offloaded states) or set "
            "deepspeed_config to 'zero3' (states stay on the GPUs)"
        )
    elif zero.get("stage", 0) != 3 and method != "qlora":
        fix = (
            "set deepspeed_config to 'zero3' (every rank otherwise holds its own converted copy of the weights "
            "in host memory until they move to its GPU)"
        )
    else:
        fix = (
            f"lower {prefix}gpus_per_node (now {gpus_per_node}) so fewer ranks share a pod, and raise {prefix}num_nodes"
        )
    return f"{summary}: {fix}, or raise trainer_memory_limit where the nodes have the memory"


@dataclass(frozen=True)
class StageFit:
    """What the training stage brings to ``check_memory_fit`` beyond the job's shape.

    ``grpo``: the grpo stage's ``grpo_extra_bytes`` keywords (beta, completions, sequence_tokens, colocate, server):
    its reference model and generations count too. ``every_n_layers``: the recomputed layers' stride
    (``recompute_every_n_layers``; 0: activation_checkpointing off). ``chunked_loss``: the stage computes its loss
    with ``chunked_cross_entropy``; ``loss_chunkable``: it could (cpt, sft), so a job that does not fit is told so.
    ``setting_prefix``: where the job's ``num_nodes`` and ``gpus_per_node`` come from, for the fix
    (``stage_settings.cpt.`` for a stage's own, components/stages.py).
    """

    grpo: dict | None = None
    every_n_layers: int = 1
    chunked_loss: bool = False
    loss_chunkable: bool = False
    setting_prefix: str = ""


def check_memory_fit(
    model: str | dict,
    method: str,
    deepspeed_config: str,
    num_nodes: int,
    gpus_per_node: int,
    max_seq_length: int,
    per_device_train_batch_size: int,
    gpu_memory_gib: float = 80.0,
    lora_r: int = 16,
    lora_target_modules: str = "",
    pod_memory_gib: float = POD_MEMORY_GIB,
    stage_fit: StageFit = StageFit(),
) -> str | None:
    """An error naming the knob to change when the job cannot fit, else None.

    Checks the per-GPU estimate against ``gpu_memory_gib`` and the per-pod host estimate against
    ``pod_memory_gib`` (the trainer pod's memory limit, /dev/shm included); both problems are reported
    together. ``model`` is a model name/folder (architecture looked up with :func:`load_architecture`; an
    unknown Hub id is not checked and returns None) or a config.json dict. ``deepspeed_config`` is a shipped
    name (``zero3``), a JSON path, or ``none``. ``lora_target_modules`` as the trainer takes it (empty: by
    model type, see components/train/trainer/lora.py). ``stage_fit``: the stage's own part (:class:`StageFit`).
    """
    grpo, every_n_layers, chunked_loss = stage_fit.grpo, stage_fit.every_n_layers, stage_fit.chunked_loss
    loss_chunkable, setting_prefix = stage_fit.loss_chunkable, stage_fit.setting_prefix
    config = model if isinstance(model, dict) else load_architecture(model)
    if config is None:
        return None
    shape = model_shape(config)
    zero = job_zero_config(deepspeed_config, num_nodes, gpus_per_node, shape.largest_layer)
    n_gpus = num_nodes * gpus_per_node
    lora, expert_lora = 0, False
    if method in ("lora", "qlora"):
        modules, parameters = lora_targets("qwen3_moe" if shape.is_moe else "qwen3", lora_target_modules)
        lora, expert_lora = shape.lora_params(lora_r, modules + parameters), bool(parameters)
    est = estimate_gib(
        shape,
        method,
        zero,
        n_gpus,
        max_seq_length,
        per_device_train_batch_size,
        lora,
        expert_lora,
        every_n_layers,
        chunked_loss,
    )
    if grpo:
        extra = grpo_extra_bytes(shape, method, zero, n_gpus, gpu_memory_gib=gpu_memory_gib, **grpo) / GIB
        est.update(total=est["total"] + extra, grpo=extra, server=bool(grpo.get("server")))
    host = host_bytes_per_pod(shape, method, zero, num_nodes, gpus_per_node, lora)
    problems = []
    if est["total"] > gpu_memory_gib:
        problems.append(
            _gpu_error(
                method,
                zero,
                est,
                shape,
                num_nodes,
                per_device_train_batch_size,
                max_seq_length,
                gpu_memory_gib,
                levers=(
                    *(["activation_checkpointing=true with recompute_every_n_layers=1"] if every_n_layers != 1 else []),
                    *(["chunked_cross_entropy=true"] if loss_chunkable and not chunked_loss else []),
                ),
                prefix=setting_prefix,
            )
        )
    if host["total"] / GIB > pod_memory_gib:
        problems.append(_host_error(method, zero, host, num_nodes, gpus_per_node, pod_memory_gib, setting_prefix))
    if not problems:
        return None
    name = model if isinstance(model, str) else "the model"
    return f"{method} fine-tuning of {name} " + "; and it ".join(problems)
