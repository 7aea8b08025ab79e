"""PEFT adapters for the trainer: which parts of the model LoRA/QLoRA wraps, and the wrapping itself."""

from __future__ import annotations


def apply_lora(model, cfg):
    """Wrap ``model`` in a PEFT LoRA model as ``cfg`` (an ``SFTConfig``) says; QLoRA prepares the 4-bit base first."""
    from peft import LoraConfig, get_peft_model, prepare_model_for_kbit_training

    if cfg.method == "qlora":
        model = prepare_model_for_kbit_training(model, use_gradient_checkpointing=cfg.gradient_checkpointing)
    return get_peft_model(model, LoraConfig(
        r=cfg.lora_r, lora_alpha=cfg.lora_alpha, lora_dropout=cfg.lora_dropout,
        target_modules=cfg.lora_target_modules.split(","), task_type="CAUSAL_LM",
    ))
