"""The final export to ``<output_dir>/final``: what evaluation loads and vLLM serves.

- full: consolidated Hugging Face safetensors (``Trainer.save_model`` gathers ZeRO-3 shards into 16-bit
  weights on rank 0: ``stage3_gather_16bit_weights_on_model_save`` in the shipped JSONs), tokenizer,
  generation config, ``model.json``.
- lora/qlora: the adapter in ``<output_dir>/adapter``; with ``merge_lora`` the base reloaded in its own dtype
  (bf16 for Qwen3, FP8 dequantised; never the 4-bit copy: merging into NF4 would round the update away) plus the adapter, merged, in
  ``final/``; without it ``final/`` holds the adapter (serve with vLLM ``--enable-lora`` against the base).
"""

from __future__ import annotations

import json
import logging
import os
import shutil
from pathlib import Path

log = logging.getLogger("sft.export")


def merge_adapter(base_path: str, adapter_dir: str, out_dir: str) -> None:
    """Load the base in its own dtype (FP8 dequantised) on CPU, apply the adapter, merge, save to ``out_dir``."""
    from peft import PeftModel
    from transformers import AutoConfig, AutoModelForCausalLM

    from components.train.sft import fp8_dequantize_kwargs

    kwargs = fp8_dequantize_kwargs(AutoConfig.from_pretrained(base_path))
    base = AutoModelForCausalLM.from_pretrained(base_path, dtype="auto", **kwargs)
    merged = PeftModel.from_pretrained(base, adapter_dir).merge_and_unload()
    merged.save_pretrained(out_dir)


def model_card(cfg, base_path: str, metrics: dict) -> dict:
    """``model.json``: what this model is and how it was made."""
    return {
        "base_model": cfg.model_name_or_path,
        "base_model_path": base_path,
        "method": cfg.method,
        "merged": cfg.method == "full" or cfg.merge_lora,
        "dataset_path": cfg.dataset_path,
        "max_seq_length": cfg.max_seq_length,
        "learning_rate": cfg.learning_rate,
        "seed": cfg.seed,
        "deepspeed": cfg.deepspeed,
        "steps": metrics["global_step"],
        "metrics": metrics,
    }


def export_final(trainer, cfg, tokenizer, base_path: str, metrics: dict) -> str:
    """Write ``final/`` (and ``adapter/`` for LoRA) as the module docstring says; return the final folder."""
    final_dir = os.path.join(cfg.output_dir, "final")
    trainer.model.config.use_cache = True  # off for packed training; generation (serving) wants the KV cache
    if cfg.method == "full":
        trainer.save_model(final_dir)  # every rank takes part: ZeRO-3 gathers the shards
    else:
        adapter_dir = os.path.join(cfg.output_dir, "adapter")
        trainer.save_model(adapter_dir)
        if trainer.is_world_process_zero():
            if cfg.merge_lora:
                merge_adapter(base_path, adapter_dir, final_dir)
            else:
                shutil.copytree(adapter_dir, final_dir, dirs_exist_ok=True)
    if trainer.is_world_process_zero():
        tokenizer.save_pretrained(final_dir)
        generation = Path(base_path, "generation_config.json")
        if generation.exists() and not Path(final_dir, "generation_config.json").exists():
            shutil.copy(generation, final_dir)
        Path(final_dir, "training_args.bin").unlink(missing_ok=True)  # pickled TrainingArguments: not a model file
        Path(final_dir, "model.json").write_text(json.dumps(model_card(cfg, base_path, metrics), indent=2, default=str))
        log.info("final model in %s", final_dir)
    return final_dir
