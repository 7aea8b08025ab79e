"""Supervised fine-tuning: the entry point every pod (or local process) of the training job runs, for every stage.

    torchrun --nproc_per_node 8 --nnodes 2 ... -m components.train.trainer.sft --config /mnt/models/runs/<id>/train/train_config.json

The config's ``stage`` says what this run is: ``sft`` (the default) and ``cpt`` (continued pretraining: the data
step labels every token of its plain-text rows, so it is the same loss on other rows) run here; ``dpo`` runs
preference tuning with TRL (dpo.py) and shares the model loading, checkpoints, progress and export below.

For sft and cpt: reads the tokenized (packed) dataset written by prepare_dataset (no re-tokenisation) and trains with
the Hugging Face Trainer: DDP, or DeepSpeed ZeRO-2/3 when the config names a DeepSpeed JSON; full
fine-tuning or PEFT LoRA/QLoRA. Checkpoints every ``save_steps`` (DeepSpeed's shards only under DeepSpeed;
complete-marker written last, last ``save_total_limit`` kept), resumes from the newest complete one, logs
progress on rank 0 and to TensorBoard, and ends with ``final/`` (see export.py) and ``metrics.json``.
On SIGTERM it saves a complete checkpoint at the end of the current step and exits with 143
(checkpoints.py: what the pod's grace period must cover).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time
from pathlib import Path

log = logging.getLogger("sft")

# The columns each stage's prepared splits must have: tokenized rows with labels, or TRL's preference layout
# (conversational: lists of turns; TRL applies the chat template and masks the prompt itself).
REQUIRED_COLUMNS = {"sft": ("input_ids", "labels"), "cpt": ("input_ids", "labels"),
                    "dpo": ("prompt", "chosen", "rejected")}


class TrainingInterrupted(Exception):
    """Training stopped early on SIGTERM, after saving a complete checkpoint a re-run resumes from."""


def _read_config(path: str) -> dict:
    """The config file's mapping; ValueError naming the file for a missing, empty or unparsable one."""
    try:
        raw = Path(path).read_text()
    except FileNotFoundError:
        raise ValueError(f"{path}: no such file (the trainer config the launcher writes)") from None
    if path.endswith((".yaml", ".yml")):
        import yaml

        try:
            data = yaml.safe_load(raw)
        except yaml.YAMLError as exc:
            raise ValueError(f"{path}: not valid YAML: {' '.join(str(exc).split())}") from None
    else:
        try:
            data = json.loads(raw)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{path}: not valid JSON: {exc}") from None
    if data is None:
        raise ValueError(f"{path}: the config is empty; it must be a mapping of SFTConfig fields")
    if not isinstance(data, dict):
        raise ValueError(f"{path}: the config must be a mapping of SFTConfig fields, not a {type(data).__name__}")
    return data


_TYPE_WORDS = {bool: "true or false", int: "an integer", float: "a number", str: "a string"}


def _type_error(name: str, value, hint) -> str | None:
    """Why ``value`` does not fit the field's annotation ``hint``, or None.

    HfArgumentParser.parse_dict does not check types, and a wrong one surfaces later as a traceback deep in
    the Trainer, after the model has loaded; only plain scalar types are checked here (enums are strings).
    """
    import enum
    import types
    import typing

    options = typing.get_args(hint) if typing.get_origin(hint) in (typing.Union, types.UnionType) else (hint,)
    words = []
    for option in options:
        origin = typing.get_origin(option) or option
        if option is type(None):
            if value is None:
                return None
        elif option is bool:
            if isinstance(value, bool):
                return None
        elif option in (int, float):
            if isinstance(value, int if option is int else (int, float)) and not isinstance(value, bool):
                return None
        elif option is str or (isinstance(origin, type) and issubclass(origin, enum.Enum)):
            if isinstance(value, str):
                return None
            option = str
        elif isinstance(origin, type):
            if isinstance(value, origin):
                return None
            words.append(f"a {origin.__name__}")
            continue
        else:
            return None  # Any, Literal, ...: not checked
        if option in _TYPE_WORDS and _TYPE_WORDS[option] not in words:
            words.append(_TYPE_WORDS[option])
    return f"{name} must be {' or '.join(words)}, got {value!r}" if words else None


def parse_config(path: str):
    """Load the config of the file's ``stage`` (``SFTConfig``, or ``DPOStageConfig`` for dpo) from a JSON or YAML file;
    an unknown stage, unknown keys, wrong types, bad combinations and a missing dataset are errors.

    Every error is a ValueError naming the file and the field, raised before TrainingArguments is built
    (which sets up devices and process groups) and before anything is written.
    """
    import dataclasses
    import typing

    from transformers import HfArgumentParser

    from components.train.trainer.arguments import DPO_DERIVED, config_class
    from components.train.config import DEEPSPEED_CONFIGS, METHODS, check_combination, deepspeed_config_path
    from components.train.stages import STAGES

    data = _read_config(path)
    stage = data.get("stage", "sft")
    if stage not in STAGES:
        raise ValueError(f"{path}: stage {stage!r} is not one of {list(STAGES)}")
    config_cls = config_class(stage)
    hints = typing.get_type_hints(config_cls)
    valid = {f.name for f in dataclasses.fields(config_cls)}
    unknown = sorted(set(data) - valid)
    if unknown:
        raise ValueError(f"{path}: unknown keys {unknown}; valid keys are {sorted(valid)}")
    if stage == "dpo":
        derived = sorted(set(data) & set(DPO_DERIVED))
        if derived:
            raise ValueError(f"{path}: {derived} are set by the trainer for stage 'dpo'; set "
                             f"{[DPO_DERIVED[k] for k in derived]} instead")
        if data.get("train_sampling_strategy") == "group_by_length":
            # TRL tokenizes the preference rows inside the trainer, so the prepared rows have no input_ids to
            # group by and transformers' LengthGroupedSampler would fail after the model has loaded.
            raise ValueError(f"{path}: train_sampling_strategy 'group_by_length' cannot sort stage 'dpo' rows "
                             "(prompt/chosen/rejected, tokenized by TRL); use 'random'")
    for name, value in data.items():
        if why := _type_error(name, value, hints[name]):
            raise ValueError(f"{path}: {why}")
    method = data.get("method", "full")
    if method not in METHODS:
        raise ValueError(f"{path}: method {method!r} is not one of {list(METHODS)}")
    if isinstance(data.get("deepspeed"), str):
        # The launcher writes a setting's name (its image is not this one): resolve it in this install.
        try:
            data["deepspeed"] = deepspeed_config_path(data["deepspeed"])
        except ValueError as exc:
            raise ValueError(f"{path}: {exc}") from None
        if data["deepspeed"] and not Path(data["deepspeed"]).is_file():
            shipped = ", ".join(c for c in DEEPSPEED_CONFIGS if c != "none")
            raise ValueError(f"{path}: deepspeed {data['deepspeed']!r}: no such file; use a shipped name "
                             f"({shipped}) or a JSON file on a mounted volume")
    errors = check_combination(data)
    if errors:
        raise ValueError(f"{path}: " + "; ".join(errors))
    dataset_path = data.get("dataset_path", "")
    if not dataset_path or not Path(dataset_path, "dataset_dict.json").exists():
        raise ValueError(f"{path}: dataset_path {dataset_path!r} is not a prepared dataset; run prepare_dataset first")
    _check_dataset(dataset_path, stage)
    if stage == "dpo":
        defaults = {f.name: f.default for f in dataclasses.fields(config_cls)}
        data.update(
            beta=data.get("dpo_beta", defaults["dpo_beta"]),
            max_length=data.get("max_seq_length", defaults["max_seq_length"]),
            # Full fine-tuning: the reference log-probs of every pair are computed once, before training, and TRL
            # then keeps no reference model (no second copy of the weights on the GPUs). LoRA: each step scores the
            # reference with the same model, its adapter off (dpo.py).
            precompute_ref_log_probs=data.get("method", "full") == "full",
        )
    (cfg,) = HfArgumentParser(config_cls).parse_dict(data)
    return cfg


def _check_dataset(dataset_path: str, stage: str = "sft") -> None:
    import datasets

    data = datasets.load_from_disk(dataset_path)
    for split in ("train", "eval"):
        if split not in data:
            raise ValueError(f"{dataset_path}: no {split!r} split (found {list(data)}); run prepare_dataset again")
        missing = [c for c in REQUIRED_COLUMNS[stage] if c not in data[split].column_names]
        if missing:
            raise ValueError(f"{dataset_path}: split {split!r} lacks columns {missing} (stage {stage!r} needs "
                             f"{list(REQUIRED_COLUMNS[stage])}); it must come from prepare_dataset")


def _non_defaults(cfg) -> dict:
    """The fields a user set: the full TrainingArguments dump is 100+ keys of noise.

    Defaults come from the dataclass fields: building a second TrainingArguments would re-initialise
    accelerate's process state on this rank only and break the process group.
    """
    import dataclasses

    defaults = {f.name: f.default for f in dataclasses.fields(cfg) if f.default is not dataclasses.MISSING}
    return {k: v for k, v in cfg.to_dict().items() if k == "output_dir" or (k in defaults and defaults[k] != v)}


def load_model(cfg, model_path: str):
    """Load the base model for ``cfg.method``: full weights, or a PEFT LoRA/QLoRA wrapper.

    ``model_path`` comes from ``resolve_model``: for an FP8 checkpoint (the seeds' Qwen3-30B-A3B-...-FP8) it
    is the bf16 copy on the data volume, so the model loads as plain bf16 and ZeRO-3's ``zero.Init``
    partitions it while loading (transformers skips zero.Init for a quantized checkpoint, and every rank
    would hold the whole model). Training runs in bf16: FP8 training needs per-tensor scaling recipes the
    optimizer states and DeepSpeed do not carry, and bf16 is what the served model is exported in. Qwen3-MoE gets the router load-balancing
    loss (``router_aux_loss_coef``) and, under ZeRO-3, its sparse MoE block as a leaf module.
    """
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from components.train.trainer.speed import attn_implementation

    config = AutoConfig.from_pretrained(model_path)
    # DeepSpeed keeps fp32 master weights itself; plain DDP full fine-tuning needs fp32 weights for Adam.
    low_precision = cfg.bf16 and (cfg.deepspeed or cfg.method != "full")
    dtype = torch.bfloat16 if low_precision else torch.float32
    kwargs = {"dtype": dtype, "attn_implementation": attn_implementation()}
    if config.model_type == "qwen3_moe":
        kwargs.update(output_router_logits=cfg.router_aux_loss_coef > 0, router_aux_loss_coef=cfg.router_aux_loss_coef)
    if cfg.method == "qlora":
        from transformers import BitsAndBytesConfig

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
        from deepspeed.utils import set_z3_leaf_modules
        from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeSparseMoeBlock

        leaves = set_z3_leaf_modules(model, [Qwen3MoeSparseMoeBlock])
        log.info("ZeRO-3 leaf modules: %d x Qwen3MoeSparseMoeBlock", len(leaves))
    if cfg.method in ("lora", "qlora"):
        from components.train.trainer.lora import apply_lora

        model = apply_lora(model, cfg)
    return model


def _zero_stage(cfg) -> int:
    from components.train.config import load_deepspeed_config

    return load_deepspeed_config(cfg.deepspeed).get("zero_optimization", {}).get("stage", 0) if cfg.deepspeed else 0


def summary_metrics(trainer, result, evaluation: dict, started: float) -> dict:
    """metrics.json: the figures every stage reports, with the stage's own ``evaluation`` figures after the losses."""
    # Trainer's training_loss averages only the steps run since the last resume; log_history spans the run.
    losses = [e["loss"] for e in trainer.state.log_history if "loss" in e]
    rates = [e["tokens_per_second_per_device"] for e in trainer.state.log_history if "tokens_per_second_per_device" in e]
    mfus = [e["mfu"] for e in trainer.state.log_history if "mfu" in e]
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

    Resolves the base once per run, logs the config, points TensorBoard at the output folder and, for DeepSpeed
    on CPU, wraps the process group.
    """
    from components.distributed import global_rank
    from components.models.hub import BASE_MODEL_RECORD, resolve_model_for_run

    # Resolved once per run, by rank 0, and recorded in the output folder: the other ranks read the record
    # (never the Hub), and a re-run after an eviction resumes on the same base snapshot.
    model_path = resolve_model_for_run(cfg.model_name_or_path,
                                       cfg.model_cache_dir or os.path.join(cfg.output_dir, ".cache"),
                                       os.path.join(cfg.output_dir, BASE_MODEL_RECORD))
    if global_rank() == 0:
        log.info("config (non-default fields): %s", json.dumps(_non_defaults(cfg), default=str))
    os.environ.setdefault("TENSORBOARD_LOGGING_DIR", os.path.join(cfg.output_dir, "tensorboard"))
    if cfg.deepspeed and cfg.use_cpu:
        # On CUDA accelerate starts deepspeed.comm; on CPU it only starts torch.distributed (gloo), and
        # DeepSpeed would then see a world of one. Wrap the existing process group.
        import deepspeed

        deepspeed.init_distributed(dist_backend=cfg.ddp_backend)
    return model_path


def checkpoint_callbacks(cfg):
    """``(callbacks, sigterm)``: complete-marker checkpoints keeping ``save_total_limit``, and save-on-SIGTERM."""
    from components.train.trainer.checkpoints import CompleteMarkerCallback, SaveOnSigtermCallback

    # The Trainer's rotation cannot tell complete from partial checkpoints: ours does it after the marker.
    keep = cfg.save_total_limit or 0
    cfg.save_total_limit = None
    sigterm = SaveOnSigtermCallback()
    return [CompleteMarkerCallback(keep), sigterm], sigterm


def use_progress(trainer, progress) -> None:
    """Make ``progress`` (our ProgressCallback) the trainer's only progress output, first in line."""
    from transformers.trainer_callback import PrinterCallback
    from transformers.trainer_callback import ProgressCallback as HFProgressCallback

    # Our ProgressCallback logs each logging step with rates and ETA on rank 0; HF's tqdm bar and its printed
    # log dicts would repeat the same numbers (and a bar redrawn in place is noise in a pod's log).
    trainer.remove_callback(HFProgressCallback)
    trainer.remove_callback(PrinterCallback)
    # First in line, so the rates it adds to the logs reach TensorBoard and log_history too.
    trainer.callback_handler.callbacks.insert(0, progress)


def train_resuming(trainer, sigterm):
    """``trainer.train()`` from the newest complete checkpoint, if any; TrainingInterrupted once SIGTERM stopped it."""
    from components.train.trainer.checkpoints import latest_complete_checkpoint

    last = latest_complete_checkpoint(trainer.args.output_dir)
    if last and trainer.is_world_process_zero():
        log.info("resuming from %s", last)
    result = trainer.train(resume_from_checkpoint=last)
    if sigterm.stopped_at is not None:
        raise TrainingInterrupted(f"stopped by SIGTERM at step {sigterm.stopped_at} of {trainer.state.max_steps}; "
                                  f"checkpoint-{sigterm.stopped_at} is complete and a re-run resumes from it")
    return result


def finish_run(trainer, cfg, tokenizer, model_path: str, metrics: dict) -> None:
    """Export ``final/`` (export.py; collective) and write ``metrics.json`` on rank 0."""
    from components.train.trainer.export import export_final

    export_final(trainer, cfg, tokenizer, model_path, metrics)
    if trainer.is_world_process_zero():
        Path(cfg.output_dir, "metrics.json").write_text(json.dumps(metrics, indent=2))
        log.info("metrics %s", metrics)


def main(cfg) -> dict:
    """Train according to ``cfg`` and return the final metrics (also written to metrics.json)."""
    if cfg.stage == "dpo":
        from components.train.trainer.dpo import main as train_dpo

        return train_dpo(cfg)
    import datasets
    from transformers import AutoTokenizer

    from components.models.batches import label_nll, token_weighted_loss
    from components.train.trainer.callbacks import ProgressCallback
    from components.train.trainer.checkpoints import CheckpointTrainer
    from components.train.trainer.speed import attn_implementation, packed_collator

    started = time.time()
    model_path = start_run(cfg)
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    data = datasets.load_from_disk(cfg.dataset_path)
    model = load_model(cfg, model_path)

    callbacks, sigterm = checkpoint_callbacks(cfg)
    trainer = CheckpointTrainer(
        model=model,
        args=cfg,
        train_dataset=data["train"],
        eval_dataset=data["eval"],
        # Under flash-attention a micro-batch's packed rows are joined into one, with their documents' boundaries:
        # transformers keeps documents apart from position_ids only in a batch of one row (speed.py).
        data_collator=packed_collator(tokenizer.pad_token_id, attn_implementation()),
        processing_class=tokenizer,
        callbacks=callbacks,
        # eval_loss per label token over the whole eval split, exactly as evaluate_model scores it: Trainer's
        # own eval_loss is a mean of per-batch means, which weighs a short batch like a long one.
        preprocess_logits_for_metrics=label_nll,
        compute_metrics=token_weighted_loss,
    )
    use_progress(trainer, ProgressCallback.for_model(model.config.to_dict(), data["train"], cfg.world_size))
    result = train_resuming(trainer, sigterm)
    eval_metrics = trainer.evaluate()
    # eval_loss: the same tokens, the same way as evaluate_model.
    metrics = summary_metrics(trainer, result, {"eval_loss": eval_metrics["eval_loss_per_token"]}, started)
    finish_run(trainer, cfg, tokenizer, model_path, metrics)
    return metrics


def make_parser() -> argparse.ArgumentParser:
    """The command line: one ``--config`` file (JSON or YAML)."""
    p = argparse.ArgumentParser(prog="torchrun ... -m components.train.trainer.sft", description=__doc__.split("\n")[0])
    p.add_argument("--config", required=True,
                   help="trainer config (JSON or YAML): SFTConfig fields, DPOStageConfig for stage dpo")
    return p


if __name__ == "__main__":
    from components.distributed import global_rank

    args = make_parser().parse_args()
    logging.basicConfig(level=logging.INFO, format=f"%(asctime)s rank{global_rank()} %(name)s: %(message)s")
    try:
        config = parse_config(args.config)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
    from components.train.trainer.checkpoints import EXIT_SIGTERM

    code = 0
    try:
        main(config)
    except TrainingInterrupted as stop:
        if global_rank() == 0:
            log.warning("%s", stop)
        code = EXIT_SIGTERM  # non-zero: the job was interrupted, not finished
    import torch.distributed as dist

    if dist.is_initialized():
        # Leave together and tear the process group down: a rank that exits while gloo's threads are
        # still running aborts with "terminate called without an active exception" (seen on 2 CPU ranks).
        dist.barrier()
        dist.destroy_process_group()
    sys.exit(code)
