"""PEFT adapters for the trainer: which parts of the model LoRA/QLoRA wraps, and the wrapping itself.

``lora_target_modules`` is a comma-separated list; empty means "by model type":

  dense Qwen3   q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj      every nn.Linear of a decoder layer
  Qwen3-MoE     q_proj,k_proj,v_proj,o_proj,experts.gate_up_proj,experts.down_proj
                                                                            attention and every expert

A plain name (``q_proj``) is an nn.Linear module: PEFT's ``target_modules``. A name with a dot
(``experts.gate_up_proj``) is a parameter: PEFT's ``target_parameters``. In transformers 5 the experts of a
Qwen3-MoE layer are not nn.Linear modules but two fused 3-D tensors of ``Qwen3MoeExperts``: ``gate_up_proj``
(experts, 2 x moe_intermediate, hidden) and ``down_proj`` (experts, hidden, moe_intermediate). PEFT's
``lora.ParamWrapper`` gives each expert its own rank-r pair, so one expert tensor costs
``experts x r x (in + out)`` trainable parameters (memory.py counts the same). The experts hold ~95% of
Qwen3-30B-A3B's weights: attention-only LoRA leaves almost all of the model's capacity untouched.

ParamWrapper cannot apply dropout (``x`` cannot be factored out of ``B A dropout(x)`` for a weight that is
parametrised rather than called), so targeting expert tensors needs ``lora_dropout`` 0.

QLoRA is for dense models: bitsandbytes quantises nn.Linear layers only, so a Qwen3-MoE's fused experts stay
unquantised and PEFT's k-bit preparation casts them to fp32. memory.py counts that and refuses the job where it
cannot fit, pointing to LoRA on the bf16 base under ZeRO-3 (the qwen3-30b-a3b-lora preset).
"""

from __future__ import annotations

import logging

from components.distributed import global_rank

# The targets by model type live with the model's shape, where the launcher's memory-fit estimate counts them too.
from components.models.shape import LORA_TARGETS_DENSE, LORA_TARGETS_MOE, lora_targets

log = logging.getLogger("sft.lora")

__all__ = ["LORA_TARGETS_DENSE", "LORA_TARGETS_MOE", "apply_lora", "lora_targets"]


def apply_lora(model, cfg):
    """Wrap ``model`` in a PEFT LoRA model as ``cfg`` (an ``SFTConfig``) says; QLoRA prepares the 4-bit base first.

    Targets as the module docstring says. Works on a model partitioned by DeepSpeed ZeRO-3 ``zero.Init``
    (PEFT reads a partitioned tensor's real shape from ``ds_shape``), with Qwen3-MoE's sparse block already
    a ZeRO-3 leaf: the adapters PEFT adds inside the block are gathered with it.

    Raises:
        ValueError: expert tensors targeted with a non-zero ``lora_dropout``, or a target the model lacks.
    """
    # Lazy: PEFT is needed by the lora and qlora methods only (the laptop install has none; full runs never load it).
    from peft import LoraConfig, get_peft_model, prepare_model_for_kbit_training

    modules, parameters = lora_targets(model.config.model_type, cfg.lora_target_modules)
    present = {name for name, _ in model.named_parameters()}
    missing = [p for p in parameters if not any(name == p or name.endswith(f".{p}") for name in present)]
    if missing:
        raise ValueError(
            f"lora_target_modules {missing}: the model ({model.config.model_type}) has no such "
            f"parameter; expert tensors exist in Qwen3-MoE only ({LORA_TARGETS_MOE})"
        )
    if parameters and cfg.lora_dropout:
        raise ValueError(
            f"lora_dropout={cfg.lora_dropout} with expert tensors {parameters} among the LoRA targets: PEFT adapts "
            "fused expert tensors without dropout; set lora_dropout to 0, or leave experts out of lora_target_modules"
        )
    if cfg.method == "qlora":
        model = prepare_model_for_kbit_training(model, use_gradient_checkpointing=cfg.activation_checkpointing)
    model = get_peft_model(
        model,
        LoraConfig(
            r=cfg.lora_r,
            lora_alpha=cfg.lora_alpha,
            lora_dropout=cfg.lora_dropout,
            task_type="CAUSAL_LM",
            target_modules=modules,
            target_parameters=parameters or None,
        ),
    )
    if global_rank() == 0:
        # The adapters are new tensors, not yet partitioned by ZeRO-3: numel() is their full size.
        trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
        log.info("LoRA r=%d on %s: %d trainable parameters", cfg.lora_r, ",".join(modules + parameters), trainable)
    return model
