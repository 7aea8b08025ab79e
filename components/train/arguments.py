"""``SFTConfig``: Hugging Face ``TrainingArguments`` plus what SFT on packed data needs (unknown keys are an error)."""

from __future__ import annotations

from dataclasses import dataclass, field

from transformers import TrainingArguments


@dataclass
class SFTConfig(TrainingArguments):
    """``TrainingArguments`` for supervised fine-tuning on a prepared dataset."""

    model_name_or_path: str = field(default="", metadata={"help": "Hub id, folder, or builtin:tiny-qwen3"})
    dataset_path: str = field(default="", metadata={"help": "prepare_dataset's output (save_to_disk folder)"})
    method: str = field(default="full", metadata={"help": "full | lora | qlora"})
    max_seq_length: int = field(default=4096, metadata={"help": "longer rows are an error (prepare drops them)"})
    model_cache_dir: str = field(default="", metadata={"help": "where built-in models are built"})
    lora_r: int = field(default=16, metadata={"help": "LoRA rank: higher learns more, costs more memory"})
    lora_alpha: int = field(default=32, metadata={"help": "LoRA scaling numerator"})
    lora_dropout: float = field(
        default=0.0,
        metadata={"help": "LoRA dropout; must stay 0 with adapters on fused expert tensors (PEFT refuses it there)"},
    )
    lora_target_modules: str = field(
        default="",
        metadata={"help": "comma-separated LoRA targets; empty chooses by model type (components/train/lora.py): "
                          "all linear projections for dense Qwen3, attention plus the fused expert tensors "
                          "(experts.gate_up_proj, experts.down_proj) for Qwen3-MoE. A plain name is an nn.Linear "
                          "module; a dotted name is a parameter (PEFT target_parameters)"},
    )
    merge_lora: bool = field(
        default=True,
        metadata={"help": "lora/qlora: write the base merged with the adapter (bf16) to final/ so vLLM serves it "
                          "as a plain model; the adapter alone always goes to adapter/"},
    )
    router_aux_loss_coef: float = field(
        default=0.001,
        metadata={"help": "MoE models: weight of the router load-balancing loss added to the LM loss; 0 turns it off"},
    )
