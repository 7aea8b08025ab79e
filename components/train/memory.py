"""Will the training job fit in the GPUs? A per-GPU memory estimate, checked before any job is created.

Per GPU, in bytes, with P parameters (all MoE experts included), N = num_nodes x gpus_per_node GPUs,
L = the largest block ZeRO-3 gathers at once, T = trainable LoRA parameters:

  model states (the weights, gradients and Adam states; DeepSpeed's own estimators for full fine-tuning,
  ``estimate_zero{2,3}_model_states_mem_needs``, give the same numbers and a test holds us to them):
    full, ZeRO-3                    4L + 18P/N     (offload_optimizer: 4L + 2P/N; offload_param too: 4L)
    full, ZeRO-2                    2P + 18P/N     (offload_optimizer: 2P)
    full, no DeepSpeed (DDP, fp32)  16P            (fp32 weights 4 + grads 4 + Adam 8, replicated)
    lora, ZeRO-3                    4L + 2P/N + 18T/N
    lora, ZeRO-2 or DDP             2P + 16T       (frozen bf16 base replicated; fp32 adapter + grads + Adam)
    qlora (DDP)                     0.52Q + 2(P-Q) + 16T   (Q = nn.Linear weights: NF4 with double
                                    quantisation is ~4.13 bits; Qwen3-MoE experts are fused 3-D tensors,
                                    not nn.Linear, so bitsandbytes leaves them in bf16)
  activations (bf16, gradient checkpointing on, as the trainer runs on GPUs; b = micro-batch, s = seq):
    checkpointed layer inputs       2 s b h x layers
    one layer recomputed            2 s b (6h + 2(q + 2kv) + 3 I)   (I = intermediate, k x moe_intermediate for MoE)
    logits                          10 s b V       (bf16 logits + fp32 copy + fp32 gradient)
  plus 3 GiB for the CUDA context, NCCL buffers and allocator fragmentation.

Attention memory is linear in s because flash-attention (or SDPA's memory-efficient kernel) never
materialises the s x s scores.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

GIB = 1024**3
OVERHEAD_BYTES = 3 * GIB
NF4_BYTES_PER_PARAM = 4.127 / 8  # 4-bit codes + double-quantised fp8 absmax per 64 weights
ARCHITECTURES = Path(__file__).with_name("architectures")
# Model names whose architecture ships with the package (no download needed to check the fit).
KNOWN_MODELS = {re.compile(r"^Qwen/Qwen3-30B-A3B(-[A-Za-z0-9.-]+)?$"): "qwen3-30b-a3b.json"}


@dataclass(frozen=True)
class ModelShape:
    """The parameter counts of a (Qwen3 or Qwen3-MoE) decoder, from its config.json fields."""

    total: int  # every parameter, all experts included
    active: int  # parameters one token's forward pass multiplies by (for FLOPs)
    linear: int  # parameters held in nn.Linear modules (what bitsandbytes quantises)
    largest_block: int  # the most parameters ZeRO-3 gathers at once (embedding, or a whole MoE block as a leaf)
    layers: int
    hidden: int
    q_dim: int
    kv_dim: int
    intermediate: int  # MLP width one token passes through (k x moe_intermediate for MoE)
    vocab: int
    experts: int = 0

    def lora_params(self, r: int, targets: list[str]) -> int:
        """Trainable parameters of rank-``r`` LoRA on ``targets`` (nn.Linear module names) in every layer."""
        shapes = {"q_proj": (self.hidden, self.q_dim), "k_proj": (self.hidden, self.kv_dim),
                  "v_proj": (self.hidden, self.kv_dim), "o_proj": (self.q_dim, self.hidden)}
        if not self.is_moe:
            shapes.update(gate_proj=(self.hidden, self.intermediate), up_proj=(self.hidden, self.intermediate),
                          down_proj=(self.intermediate, self.hidden))
        unknown = [t for t in targets if t not in shapes]
        if unknown:
            raise ValueError(f"lora_target_modules {unknown} are not nn.Linear modules of this model; use some of {sorted(shapes)}")
        return self.layers * sum(r * (shapes[t][0] + shapes[t][1]) for t in targets)

    @property
    def is_moe(self) -> bool:
        return self.experts > 0


def model_shape(config: dict) -> ModelShape:
    """Count parameters from a Qwen3 / Qwen3-MoE ``config.json`` dict (no weights needed)."""
    h, layers, vocab = config["hidden_size"], config["num_hidden_layers"], config["vocab_size"]
    head_dim = config.get("head_dim") or h // config["num_attention_heads"]
    q_dim, kv_dim = config["num_attention_heads"] * head_dim, config["num_key_value_heads"] * head_dim
    attention = h * q_dim + 2 * h * kv_dim + q_dim * h + 2 * head_dim  # q, k, v, o + q/k norms
    norms = 2 * h
    experts = config.get("num_experts") or config.get("num_local_experts") or 0
    embed = vocab * h
    lm_head = 0 if config.get("tie_word_embeddings", False) else vocab * h
    dense_i = config.get("intermediate_size", 0)
    dense = 3 * h * dense_i
    sparse_layers = 0
    if experts:
        # Qwen3-MoE: layer i is sparse unless listed in mlp_only_layers or off the decoder_sparse_step grid.
        step, only_mlp = config.get("decoder_sparse_step", 1), set(config.get("mlp_only_layers") or [])
        sparse_layers = sum(1 for i in range(layers) if i not in only_mlp and (i + 1) % step == 0)
        moe_i, k = config["moe_intermediate_size"], config["num_experts_per_tok"]
        block = experts * 3 * h * moe_i + experts * h  # experts + router
        block_active = k * 3 * h * moe_i + experts * h
        width, largest = k * moe_i, max(block, embed)
    else:
        block = block_active = 0
        width, largest = dense_i, embed
    dense_layers = layers - sparse_layers
    linear_attention = h * q_dim + 2 * h * kv_dim + q_dim * h
    return ModelShape(
        total=layers * (attention + norms) + dense_layers * dense + sparse_layers * block + embed + lm_head + h,
        active=layers * (attention + norms) + dense_layers * dense + sparse_layers * block_active + (lm_head or embed) + h,
        linear=layers * linear_attention + dense_layers * dense + lm_head,
        largest_block=largest, layers=layers, hidden=h, q_dim=q_dim, kv_dim=kv_dim, intermediate=width, vocab=vocab,
        experts=experts,
    )


def load_architecture(model_name_or_path: str) -> dict | None:
    """The config.json dict for a shipped architecture or a local model folder; None when neither (not checked)."""
    for pattern, filename in KNOWN_MODELS.items():
        if pattern.match(model_name_or_path):
            return json.loads((ARCHITECTURES / filename).read_text())
    local = Path(model_name_or_path, "config.json")
    if local.exists():
        return json.loads(local.read_text())
    return None


def model_states_bytes(shape: ModelShape, method: str, zero: dict, n_gpus: int, lora_params: int = 0) -> int:
    """Weights + gradients + optimizer states per GPU (see the module docstring for the formulas)."""
    p, n, t = shape.total, n_gpus, lora_params
    stage = zero.get("stage", 0)
    offload_opt = zero.get("offload_optimizer", {}).get("device", "none") != "none"
    offload_param = zero.get("offload_param", {}).get("device", "none") != "none"
    largest = 4 * shape.largest_block
    if method == "full":
        if stage == 3:
            if offload_param:
                return largest
            return largest + (int(2 * p / n) if offload_opt else int(18 * p / n))
        if stage in (1, 2):
            return 2 * p if offload_opt else 2 * p + int(18 * p / n)
        return 16 * p
    if method == "lora":
        if stage == 3:
            return largest + int(2 * p / n) + int(18 * t / n)
        return 2 * p + 16 * t
    if method == "qlora":
        return int(NF4_BYTES_PER_PARAM * shape.linear) + 2 * (p - shape.linear) + 16 * t
    raise ValueError(f"method {method!r} is not one of full, lora, qlora")


def activation_bytes(shape: ModelShape, max_seq_length: int, per_device_train_batch_size: int) -> int:
    """Activation memory per GPU for one micro-batch with gradient checkpointing (module docstring)."""
    tokens = max_seq_length * per_device_train_batch_size
    checkpoints = 2 * tokens * shape.hidden * shape.layers
    one_layer = 2 * tokens * (6 * shape.hidden + 2 * (shape.q_dim + 2 * shape.kv_dim) + 3 * shape.intermediate)
    logits = 10 * tokens * shape.vocab
    return checkpoints + one_layer + logits


def estimate_gib(shape: ModelShape, method: str, zero: dict, n_gpus: int, max_seq_length: int,
                 per_device_train_batch_size: int, lora_params: int = 0) -> dict:
    """The per-GPU estimate in GiB: ``model_states``, ``activations``, ``overhead`` and ``total``."""
    states = model_states_bytes(shape, method, zero, n_gpus, lora_params) / GIB
    acts = activation_bytes(shape, max_seq_length, per_device_train_batch_size) / GIB
    overhead = OVERHEAD_BYTES / GIB
    return {"model_states": states, "activations": acts, "overhead": overhead, "total": states + acts + overhead}


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
) -> str | None:
    """An error naming the knob to change when the job cannot fit in ``gpu_memory_gib`` per GPU, else None.

    ``model`` is a model name/folder (architecture looked up with :func:`load_architecture`; an unknown
    Hub id is not checked and returns None) or a config.json dict. ``deepspeed_config`` is a shipped
    name (``zero3``), a JSON path, or ``none``.
    """
    from components.train.config import LORA_TARGETS_DENSE, LORA_TARGETS_MOE, load_deepspeed_config

    config = model if isinstance(model, dict) else load_architecture(model)
    if config is None:
        return None
    shape = model_shape(config)
    zero = load_deepspeed_config(deepspeed_config).get("zero_optimization", {})
    n_gpus = num_nodes * gpus_per_node
    targets = lora_target_modules or (LORA_TARGETS_MOE if shape.is_moe else LORA_TARGETS_DENSE)
    lora = shape.lora_params(lora_r, targets.split(",")) if method in ("lora", "qlora") else 0
    est = estimate_gib(shape, method, zero, n_gpus, max_seq_length, per_device_train_batch_size, lora)
    if est["total"] <= gpu_memory_gib:
        return None
    summary = (f"needs about {est['total']:.1f} GiB per GPU ({est['model_states']:.1f} model states + "
               f"{est['activations']:.1f} activations + {est['overhead']:.0f} overhead) but a GPU has {gpu_memory_gib:g} GiB")
    if est["model_states"] + est["overhead"] > gpu_memory_gib:
        if method == "full" and zero.get("stage", 0) != 3:
            fix = "set deepspeed_config to 'zero3' (shards weights, gradients and optimizer states over all GPUs)"
        elif method == "full" or (method == "lora" and zero.get("stage", 0) == 3):
            fix = f"raise num_nodes (now {num_nodes}) or set deepspeed_config to 'zero3_offload'"
        else:
            fix = "use method 'full' with deepspeed_config 'zero3', or a GPU with more memory (gpu_memory_gib)"
    else:
        fix = (f"lower per_device_train_batch_size (now {per_device_train_batch_size}) or max_seq_length "
               f"(now {max_seq_length}) and raise gradient_accumulation_steps to keep the global batch")
    return f"{method} fine-tuning of {model if isinstance(model, str) else 'the model'} {summary}: {fix}"
