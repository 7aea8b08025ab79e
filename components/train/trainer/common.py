"""What every stage's run shares (sft.py runs sft and cpt; dpo.py, rm.py and grpo.py the others): resolving the base
model, loading it for the method, the checkpoint callbacks, the progress output, training with resumption, the summary
metrics and the final export.

Every module of the trainer logs under the ``sft`` logger and its children (``sft.progress``, ``sft.dpo``, ...): the
name is what the pods' log lines carry, and Katib's metrics collector and the run's tests read those lines.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import time
from pathlib import Path

import torch
from transformers import AutoConfig, AutoModelForCausalLM, BitsAndBytesConfig, set_seed
from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeSparseMoeBlock
from transformers.trainer_callback import PrinterCallback
from transformers.trainer_callback import ProgressCallback as HFProgressCallback

from components.distributed import global_rank
from components.models.checkpoint_dirs import latest_complete_checkpoint
from components.models.resolve import BASE_MODEL_RECORD, resolve_model_for_run
from components.train.config import load_deepspeed_config
from components.train.trainer.checkpoints import CompleteMarkerCallback, SaveOnSigtermCallback
from components.train.trainer.export import export_final
from components.train.trainer.lora import apply_lora
from components.train.trainer.metrics import attach as attach_metrics
from components.train.trainer.metrics import finish as finish_record
from components.train.trainer.parallelism import distributed_config
from components.train.trainer.speed import (
    LIGER_EXPERTS,
    apply_liger_kernels,
    attn_implementation,
    experts_implementation,
)
from components.train.trainer.tracking import OneMLflowRunCallback, name_wandb_run

log = logging.getLogger("sft")


class TrainingInterrupted(Exception):
    """Training stopped early on SIGTERM, after saving a complete checkpoint a re-run resumes from."""


def _non_defaults(cfg) -> dict:
    """The fields a user set: the full TrainingArguments dump is 100+ keys of noise.

    Defaults come from the dataclass fields: building a second TrainingArguments would re-initialise
    accelerate's process state on this rank only and break the process group.
    """
    defaults = {f.name: f.default for f in dataclasses.fields(cfg) if f.default is not dataclasses.MISSING}
    return {k: v for k, v in cfg.to_dict().items() if k == "output_dir" or (k in defaults and defaults[k] != v)}


def load_model(cfg, model_path: str):
    """Load the base model for ``cfg.method``: full weights, or a PEFT LoRA/QLoRA wrapper.

    ``model_path`` comes from ``resolve_model``: for an FP8 checkpoint (the seeds' Qwen3-30B-A3B-...-FP8) it
    is the bf16 copy on the data volume, so the model loads as plain bf16 and ZeRO-3's ``zero.Init``
    partitions it while loading (transformers skips zero.Init for a quantized checkpoint, and every rank
    would hold the whole model). Training runs in bf16: FP8 training needs per-tensor scaling recipes the
    optimizer states and DeepSpeed do not carry, and bf16 is what the served model is exported in.
    Qwen3-MoE gets the router load-balancing loss (``router_aux_loss_coef``) and, under ZeRO-3, its sparse MoE
    block as a leaf module.
    """
    config = AutoConfig.from_pretrained(model_path)
    liger_experts = cfg.moe_experts_implementation == LIGER_EXPERTS
    if cfg.liger_kernels or liger_experts:
        # Before the model is built: Liger replaces transformers' Qwen3 modules. Its fused loss only where the head's
        # weight is whole outside the forward (not ZeRO-3), and not beside the trainer's own chunked loss.
        apply_liger_kernels(
            config.model_type,
            fused_loss=_zero_stage(cfg) != 3 and not cfg.chunked_cross_entropy,
            layers=cfg.liger_kernels,
            moe_experts=liger_experts,
        )
    # DeepSpeed keeps fp32 master weights itself; plain DDP full fine-tuning needs fp32 weights for Adam.
    low_precision = cfg.bf16 and (cfg.deepspeed or cfg.method != "full")
    dtype = torch.bfloat16 if low_precision else torch.float32
    kwargs = {"dtype": dtype, "attn_implementation": attn_implementation(cfg.attn_implementation, config.model_type)}
    # hsdp / hsdp_ep: transformers shards the model while loading it (parallelism.py); fp32 weights, bf16 compute.
    if layout := distributed_config(cfg.parallelism, cfg.bf16):
        if getattr(config, "tie_word_embeddings", False):
            # Measured: the tiny tied Qwen3's step-3 loss 5.3105 under hsdp, 5.2648 under DDP (validate_inputs too).
            raise ValueError(
                f"parallelism {cfg.parallelism!r}: {model_path} ties its input and output embeddings, which "
                "transformers 5.23's FSDP2 trains away from DDP from the second optimizer step on; use "
                "parallelism deepspeed"
            )
        kwargs["distributed_config"] = layout
    if config.model_type == "qwen3_moe":
        kwargs["experts_implementation"] = experts_implementation(cfg.moe_experts_implementation)
        kwargs.update(output_router_logits=cfg.router_aux_loss_coef > 0, router_aux_loss_coef=cfg.router_aux_loss_coef)
    if cfg.method == "qlora":
        # Only the config class: bitsandbytes itself is imported by transformers when it quantises the weights.
        kwargs["quantization_config"] = BitsAndBytesConfig(
            load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True, bnb_4bit_compute_dtype=dtype
        )
    model = AutoModelForCausalLM.from_pretrained(model_path, **kwargs)
    # With a KV cache, transformers does not look for packed rows in position_ids (and training never uses one).
    model.config.use_cache = False
    if config.model_type == "qwen3_moe" and _zero_stage(cfg) == 3:
        # ZeRO-3 gathers parameters module by module as they run. Experts run only for the tokens routed
        # to them, which differ between ranks: with per-expert modules the ranks wait on different gathers
        # and hang. As a leaf, the whole block (router + experts) is gathered at once on every rank.
        # Lazy: DeepSpeed is imported only where a run uses it (the laptop install has none).
        from deepspeed.utils import set_z3_leaf_modules

        leaves = set_z3_leaf_modules(model, [Qwen3MoeSparseMoeBlock])
        log.info("ZeRO-3 leaf modules: %d x Qwen3MoeSparseMoeBlock", len(leaves))
    if cfg.method in ("lora", "qlora"):
        model = apply_lora(model, cfg)
    return model


def _zero_stage(cfg) -> int:
    return load_deepspeed_config(cfg.deepspeed).get("zero_optimization", {}).get("stage", 0) if cfg.deepspeed else 0


def summary_metrics(trainer, result, evaluation: dict, started: float) -> dict:
    """metrics.json: the figures every stage reports, with the stage's own ``evaluation`` figures after the losses."""
    # Trainer's training_loss averages only the steps run since the last resume; log_history spans the run.
    history = trainer.state.log_history
    losses = [e["loss"] for e in history if "loss" in e]
    rates = [e["tokens_per_second_per_device"] for e in history if "tokens_per_second_per_device" in e]
    mfus = [e["mfu"] for e in history if "mfu" in e]
    metrics = {
        "stage": trainer.args.stage,
        # The mean of the losses logged every logging_steps over the whole run, resumes included; named apart from
        # TensorBoard's train/train_loss, which is HF's mean over the steps of the last session only.
        "train_loss_logged_mean": sum(losses) / len(losses) if losses else result.training_loss,
        "final_train_loss": losses[-1] if losses else result.training_loss,
        **evaluation,
        "global_step": result.global_step,
        "train_runtime_seconds": round(time.time() - started, 2),
        "world_size": trainer.args.world_size,
        "num_input_tokens_seen": trainer.state.num_input_tokens_seen,
        **{k: v for k, v in result.metrics.items() if k.endswith("per_second")},
    }
    if rates:
        metrics["tokens_per_second_per_device"] = sum(rates) / len(rates)
    if mfus:
        metrics["mfu"] = sum(mfus) / len(mfus)
    return metrics


def start_run(cfg) -> str:
    """What every stage does before loading anything: returns the base model's local path.

    Seeds the generators with the config's ``seed``, resolves the base once per run, logs the config, points
    TensorBoard at the output folder and, for DeepSpeed on CPU, wraps the process group.
    """
    # Before any model loads: what a stage adds to the base starts from random weights (the reward model's head, LoRA's
    # A matrices), and the Trainer seeds only once it is built, after. Unseeded, they came from the state the
    # libraries' imports left torch's generator in, different in every process: two runs of one config trained
    # different reward models. (TrainingArguments.seed's docs: "To ensure reproducibility across runs, use the
    # model_init function to instantiate the model if it has some randomly initialized parameters"; this does it.)
    set_seed(cfg.seed)
    # Resolved once per run, by rank 0, and recorded in the output folder: the other ranks read the record
    # (never the Hub), and a re-run after an eviction resumes on the same base snapshot.
    model_path = resolve_model_for_run(
        cfg.model_name_or_path,
        cfg.model_cache_dir or os.path.join(cfg.output_dir, ".cache"),
        os.path.join(cfg.output_dir, BASE_MODEL_RECORD),
    )
    if global_rank() == 0:
        log.info("config (non-default fields): %s", json.dumps(_non_defaults(cfg), default=str))
    os.environ.setdefault("TENSORBOARD_LOGGING_DIR", os.path.join(cfg.output_dir, "tensorboard"))
    if cfg.deepspeed and cfg.use_cpu:
        # On CUDA accelerate starts deepspeed.comm; on CPU it only starts torch.distributed (gloo), and
        # DeepSpeed would then see a world of one. Wrap the existing process group.
        init_deepspeed_comm(cfg.ddp_backend)
    return model_path


def init_deepspeed_comm(backend: str) -> None:
    """Start ``deepspeed.comm`` over torch.distributed (on CPU), without DeepSpeed's shared-memory allreduce op.

    On the CPU accelerator ``deepspeed.init_distributed`` JIT-builds and loads ``deepspeed_shm_comm``
    (deepspeed/comm/torch.py ``build_shm_op``), which only DeepSpeed's inference tensor-parallel layers use
    (``inference_all_reduce``); training's collectives are torch.distributed's. Loading it holds torch's
    ``FileBaton`` (a ``lock`` file in the extensions folder, waited on without a timeout) for a build of tens of
    seconds, or a ninja check after: a rank killed meanwhile (a cancelled local run) left a lock that made every
    later run on the machine wait forever. ``build_shm_op`` skips an op that ``__compatible_ops__`` (the dict
    deepspeed.ops probes once per process and keeps) marks incompatible.
    """
    # Lazy: DeepSpeed is imported only where a run uses it (the laptop install has none).
    import deepspeed
    import deepspeed.ops

    deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False
    deepspeed.init_distributed(dist_backend=backend)


def checkpoint_callbacks(cfg):
    """``(callbacks, sigterm)``: complete-marker checkpoints keeping ``save_total_limit``, and save-on-SIGTERM."""
    # The Trainer's rotation cannot tell complete from partial checkpoints: ours does it after the marker.
    keep = cfg.save_total_limit or 0
    cfg.save_total_limit = None
    sigterm = SaveOnSigtermCallback()
    return [CompleteMarkerCallback(keep), sigterm], sigterm


def use_progress(trainer, progress) -> None:
    """Make ``progress`` (our ProgressCallback) the trainer's only progress output, first in line."""
    # Our ProgressCallback logs each logging step with rates and ETA on rank 0; HF's tqdm bar and its printed
    # log dicts would repeat the same numbers (and a bar redrawn in place is noise in a pod's log).
    trainer.remove_callback(HFProgressCallback)
    trainer.remove_callback(PrinterCallback)
    # First in line, so the rates it adds to the logs reach TensorBoard and log_history too.
    trainer.callback_handler.callbacks.insert(0, progress)
    # Before MLflowCallback: the stage's one MLflow run, which the final model is recorded on (tracking.py).
    trainer.callback_handler.callbacks.insert(0, OneMLflowRunCallback())
    name_wandb_run(list(trainer.args.report_to or []), trainer.args.stage)
    # Last in line: it reads the rates the progress callback adds and runs after the complete-marker callback.
    attach_metrics(trainer)


def train_resuming(trainer, sigterm):
    """``trainer.train()`` from the newest complete checkpoint, if any; TrainingInterrupted once SIGTERM stopped it."""
    last = latest_complete_checkpoint(trainer.args.output_dir)
    if last and trainer.is_world_process_zero():
        log.info("resuming from %s", last)
    result = trainer.train(resume_from_checkpoint=last)
    if sigterm.stopped_at is not None:
        raise TrainingInterrupted(
            f"stopped by SIGTERM at step {sigterm.stopped_at} of {trainer.state.max_steps}; "
            f"checkpoint-{sigterm.stopped_at} is complete and a re-run resumes from it"
        )
    return result


def finish_run(trainer, cfg, tokenizer, model_path: str, metrics: dict) -> None:
    """Export ``final/`` (export.py; collective) and write ``metrics.json`` on rank 0."""
    export_final(trainer, cfg, tokenizer, model_path, metrics)
    if trainer.is_world_process_zero():
        Path(cfg.output_dir, "metrics.json").write_text(json.dumps(metrics, indent=2))
        log.info("metrics %s", metrics)
        finish_record(metrics)  # the run's Langfuse record, when its keys are set
