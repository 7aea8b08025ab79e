"""The trainer's configuration: Hugging Face ``TrainingArguments`` plus what SFT on packed data needs.

The pipeline writes one such file per run (JSON) onto the model volume; every pod of the job reads it
with ``torchrun -m components.train.sft --config FILE``. Unknown keys are an error.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from transformers import TrainingArguments

DEEPSPEED_DIR = Path(__file__).with_name("deepspeed")
METHODS = ("full", "lora", "qlora")


def deepspeed_config_path(name: str) -> str | None:
    """The shipped DeepSpeed JSON for ``name`` (``zero2``, ``zero3``), a user's JSON path, or None for ``none``."""
    if name in ("", "none"):
        return None
    shipped = DEEPSPEED_DIR / f"{name}.json"
    if shipped.exists():
        return str(shipped)
    if name.endswith(".json"):
        return name
    choices = sorted(p.stem for p in DEEPSPEED_DIR.glob("*.json"))
    raise ValueError(f"deepspeed_config {name!r} is unknown; use one of {choices + ['none']} or a path to a JSON file")


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
    lora_dropout: float = field(default=0.05)
    lora_target_modules: str = field(
        default="q_proj,k_proj,v_proj,o_proj",
        metadata={"help": "comma-separated module names; attention projections exist in dense and MoE Qwen3"},
    )


def build_trainer_config(
    *,
    model_name_or_path: str,
    dataset_path: str,
    output_dir: str,
    method: str,
    max_seq_length: int,
    per_device_train_batch_size: int,
    gradient_accumulation_steps: int,
    learning_rate: float,
    num_train_epochs: float,
    max_steps: int,
    warmup_ratio: float,
    seed: int,
    deepspeed_config: str,
    use_cpu: bool,
    model_cache_dir: str,
) -> dict:
    """The config dict the pipeline writes for the trainer, from the pipeline's parameters."""
    cfg = {
        "model_name_or_path": model_name_or_path,
        "dataset_path": dataset_path,
        "output_dir": output_dir,
        "method": method,
        "max_seq_length": max_seq_length,
        "per_device_train_batch_size": per_device_train_batch_size,
        "per_device_eval_batch_size": per_device_train_batch_size,
        "gradient_accumulation_steps": gradient_accumulation_steps,
        "learning_rate": learning_rate,
        "num_train_epochs": num_train_epochs,
        "max_steps": max_steps,
        "warmup_steps": warmup_ratio,  # transformers 5: a float < 1 is a ratio of total steps
        "lr_scheduler_type": "cosine",
        "seed": seed,
        "model_cache_dir": model_cache_dir,
        "logging_steps": 5 if use_cpu else 10,
        "save_strategy": "steps",
        "save_steps": 500,
        "save_total_limit": 2,
        "report_to": [],
        "remove_unused_columns": False,
        # Rows are padded per batch (until packing): batching similar lengths halves the padding work.
        "train_sampling_strategy": "group_by_length",
        "dataloader_num_workers": 0 if use_cpu else 2,
    }
    if use_cpu:
        # torchrun on a laptop: gloo between CPU processes, fp32.
        cfg.update(use_cpu=True, ddp_backend="gloo", ddp_find_unused_parameters=False)
    else:
        cfg.update(bf16=True, gradient_checkpointing=True, ddp_backend="nccl")
        ds = deepspeed_config_path(deepspeed_config)
        if ds:
            cfg["deepspeed"] = ds
    return cfg


def write_trainer_config(cfg: dict, path: str) -> str:
    """Write ``cfg`` as JSON at ``path`` (creating folders) and return the path."""
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps(cfg, indent=2, sort_keys=True))
    return path
