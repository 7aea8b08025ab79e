"""A decoder's shape from its ``config.json``: parameter counts (all, active, per block) for the memory-fit
estimate (components/estimate/memory.py), the trainer's FLOPs (components/models/mfu.py) and the plan; and
which of its parts LoRA targets by default (the trainer wraps them, components/train/trainer/lora.py, and the
memory-fit estimate counts them).

Qwen3 and Qwen3-MoE; the shipped architectures (``architectures/``) let a Hub id be checked with no download.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

ARCHITECTURES = Path(__file__).with_name("architectures")
# Model names whose architecture ships with the package (no download needed to check the fit).
KNOWN_MODELS = {
    re.compile(r"^Qwen/Qwen3-30B-A3B(-[A-Za-z0-9.-]+)?$"): "qwen3-30b-a3b.json",
    re.compile(r"^Qwen/Qwen3-32B(-FP8)?$"): "qwen3-32b.json",
}
# LoRA's targets when the user names none, by model type (components/train/trainer/lora.py says why).
LORA_TARGETS_DENSE = "q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj"
LORA_TARGETS_MOE = "q_proj,k_proj,v_proj,o_proj,experts.gate_up_proj,experts.down_proj"


def lora_targets(model_type: str, lora_target_modules: str = "") -> tuple[list[str], list[str]]:
    """``(target_modules, target_parameters)`` for PEFT from the user's list, or by ``model_type`` when it is empty.

    A plain name (``q_proj``) is an nn.Linear module, a name with a dot (``experts.gate_up_proj``) a parameter.
    """
    targets = lora_target_modules or (LORA_TARGETS_MOE if model_type == "qwen3_moe" else LORA_TARGETS_DENSE)
    names = [t.strip() for t in targets.split(",") if t.strip()]
    return [t for t in names if "." not in t], [t for t in names if "." in t]


@dataclass(frozen=True)
class ModelShape:
    """The parameter counts of a (Qwen3 or Qwen3-MoE) decoder, from its config.json fields."""

    total: int  # every parameter, all experts included
    active: int  # parameters one token's forward pass multiplies by (for FLOPs)
    linear: int  # nn.Linear weights of the decoder layers: what bitsandbytes quantises (never the output head)
    largest_block: int  # the most parameters ZeRO-3 gathers at once (embedding, or a whole MoE block as a leaf)
    layers: int
    hidden: int
    q_dim: int
    kv_dim: int
    intermediate: int  # MLP width one token passes through (k x moe_intermediate for MoE)
    vocab: int
    experts: int = 0
    expert_params: int = 0  # parameters in the fused expert tensors, all sparse layers
    moe_intermediate: int = 0
    sparse_layers: int = 0  # layers with a sparse MoE block (the others have a dense MLP)
    dense_intermediate: int = 0  # intermediate_size of the dense MLP layers
    largest_layer: int = 0  # the parameters of the largest decoder layer: attention, norms, its MLP or MoE block

    def lora_params(self, r: int, targets: list[str]) -> int:
        """Trainable parameters of rank-``r`` LoRA on ``targets`` (lora.py's names) in every layer that has them.

        An nn.Linear of shape (out, in) gets r (in + out); a fused expert tensor gets r (in + out) per expert.
        """
        h, dense_layers = self.hidden, self.layers - self.sparse_layers
        # name: (layers holding it, in + out features, copies: experts for a fused tensor)
        shapes = {
            "q_proj": (self.layers, h + self.q_dim, 1),
            "k_proj": (self.layers, h + self.kv_dim, 1),
            "v_proj": (self.layers, h + self.kv_dim, 1),
            "o_proj": (self.layers, self.q_dim + h, 1),
        }
        if dense_layers:
            width = self.dense_intermediate
            shapes.update(
                gate_proj=(dense_layers, h + width, 1),
                up_proj=(dense_layers, h + width, 1),
                down_proj=(dense_layers, width + h, 1),
            )
        if self.sparse_layers:
            m, e = self.moe_intermediate, self.experts
            shapes.update(
                {
                    "experts.gate_up_proj": (self.sparse_layers, h + 2 * m, e),
                    "experts.down_proj": (self.sparse_layers, m + h, e),
                }
            )
        unknown = [t for t in targets if t not in shapes]
        if unknown:
            raise ValueError(f"lora_target_modules {unknown} are not in this model; use some of {sorted(shapes)}")
        return sum(shapes[t][0] * shapes[t][2] * r * shapes[t][1] for t in targets)

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
    sparse_layers = moe_i = 0
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
        active=(
            layers * (attention + norms) + dense_layers * dense + sparse_layers * block_active + (lm_head or embed) + h
        ),
        linear=layers * linear_attention + dense_layers * dense,
        largest_block=largest,
        layers=layers,
        hidden=h,
        q_dim=q_dim,
        kv_dim=kv_dim,
        intermediate=width,
        vocab=vocab,
        experts=experts,
        expert_params=sparse_layers * experts * 3 * h * moe_i,
        moe_intermediate=moe_i,
        sparse_layers=sparse_layers,
        dense_intermediate=dense_i,
        largest_layer=attention + norms + (block if sparse_layers else dense),
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
