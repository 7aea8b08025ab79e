"""Supervised fine-tuning: the entry point every pod (or local process) of the training job runs.

    torchrun --nproc_per_node 8 --nnodes 2 ... -m components.train.sft --config /mnt/models/runs/<id>/train_config.json

Reads the tokenized dataset written by prepare_dataset (no re-tokenisation), trains with the Hugging
Face Trainer (DDP, or DeepSpeed when the config names a DeepSpeed JSON), resumes from the latest
checkpoint in ``output_dir`` when there is one, and writes ``final/`` (model, tokenizer) and
``metrics.json`` from rank 0.
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


def parse_config(path: str):
    """Load an SFTConfig from a JSON or YAML file; unknown keys are an error that lists the valid ones."""
    import dataclasses

    from transformers import HfArgumentParser

    from components.train.config import METHODS, SFTConfig

    parser = HfArgumentParser(SFTConfig)
    raw = Path(path).read_text()
    if path.endswith((".yaml", ".yml")):
        import yaml

        data = yaml.safe_load(raw)
    else:
        data = json.loads(raw)
    valid = {f.name for f in dataclasses.fields(SFTConfig)}
    unknown = sorted(set(data) - valid)
    if unknown:
        raise ValueError(f"{path}: unknown keys {unknown}; valid keys are {sorted(valid)}")
    # Our own checks first: building TrainingArguments already sets up devices and process groups.
    method = data.get("method", "full")
    if method not in METHODS:
        raise ValueError(f"{path}: method {method!r} is not one of {list(METHODS)}")
    dataset_path = data.get("dataset_path", "")
    if not dataset_path or not Path(dataset_path, "dataset_dict.json").exists():
        raise ValueError(f"{path}: dataset_path {dataset_path!r} is not a prepared dataset; run prepare_dataset first")
    (cfg,) = parser.parse_dict(data)
    return cfg


def _non_defaults(cfg) -> dict:
    """The fields a user set: the full TrainingArguments dump is 100+ keys of noise.

    Defaults come from the dataclass fields: building a second TrainingArguments would re-initialise
    accelerate's process state on this rank only and break the process group.
    """
    import dataclasses

    defaults = {f.name: f.default for f in dataclasses.fields(cfg) if f.default is not dataclasses.MISSING}
    return {k: v for k, v in cfg.to_dict().items() if k == "output_dir" or (k in defaults and defaults[k] != v)}


def pad_collator(pad_token_id: int):
    """Pad a batch of tokenized rows to its longest row (labels padded with -100)."""
    import torch

    def collate(rows):
        width = max(len(r["input_ids"]) for r in rows)
        ids = torch.full((len(rows), width), pad_token_id, dtype=torch.long)
        labels = torch.full((len(rows), width), -100, dtype=torch.long)
        mask = torch.zeros((len(rows), width), dtype=torch.long)
        for i, r in enumerate(rows):
            n = len(r["input_ids"])
            ids[i, :n] = torch.tensor(r["input_ids"])
            labels[i, :n] = torch.tensor(r["labels"])
            mask[i, :n] = 1
        return {"input_ids": ids, "labels": labels, "attention_mask": mask}

    return collate


def load_model(cfg, model_path: str):
    """Load the base model for ``cfg.method``: full weights, or a PEFT LoRA/QLoRA wrapper."""
    import torch
    from transformers import AutoModelForCausalLM

    dtype = torch.bfloat16 if cfg.bf16 else torch.float32
    kwargs = {"dtype": dtype}
    if cfg.method == "qlora":
        from transformers import BitsAndBytesConfig

        kwargs["quantization_config"] = BitsAndBytesConfig(
            load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True, bnb_4bit_compute_dtype=dtype
        )
    model = AutoModelForCausalLM.from_pretrained(model_path, **kwargs)
    if cfg.method in ("lora", "qlora"):
        from peft import LoraConfig, get_peft_model, prepare_model_for_kbit_training

        if cfg.method == "qlora":
            model = prepare_model_for_kbit_training(model, use_gradient_checkpointing=cfg.gradient_checkpointing)
        model = get_peft_model(model, LoraConfig(
            r=cfg.lora_r, lora_alpha=cfg.lora_alpha, lora_dropout=cfg.lora_dropout,
            target_modules=cfg.lora_target_modules.split(","), task_type="CAUSAL_LM",
        ))
    return model


def main(cfg) -> dict:
    """Train according to ``cfg`` and return the final metrics (also written to metrics.json)."""
    import datasets
    from transformers import AutoTokenizer, Trainer
    from transformers.trainer_utils import get_last_checkpoint

    from components.models.tiny import resolve_model

    started = time.time()
    rank = int(os.environ.get("RANK", "0"))
    model_path = resolve_model(cfg.model_name_or_path, cfg.model_cache_dir or os.path.join(cfg.output_dir, ".cache"))
    if rank == 0:
        log.info("config (non-default fields): %s", json.dumps(_non_defaults(cfg), default=str))
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    data = datasets.load_from_disk(cfg.dataset_path)
    model = load_model(cfg, model_path)

    trainer = Trainer(
        model=model,
        args=cfg,
        train_dataset=data["train"],
        eval_dataset=data["eval"],
        data_collator=pad_collator(tokenizer.pad_token_id),
        processing_class=tokenizer,
    )
    last = get_last_checkpoint(cfg.output_dir) if os.path.isdir(cfg.output_dir) else None
    if last and rank == 0:
        log.info("resuming from %s", last)
    result = trainer.train(resume_from_checkpoint=last)
    eval_metrics = trainer.evaluate()

    final_dir = os.path.join(cfg.output_dir, "final")
    trainer.save_model(final_dir)
    metrics = {
        "train_loss": result.training_loss,
        "eval_loss": eval_metrics["eval_loss"],
        "global_step": result.global_step,
        "train_runtime_seconds": round(time.time() - started, 2),
        "world_size": trainer.args.world_size,
        **{k: v for k, v in result.metrics.items() if k.endswith("per_second")},
    }
    if trainer.is_world_process_zero():
        tokenizer.save_pretrained(final_dir)
        Path(cfg.output_dir, "metrics.json").write_text(json.dumps(metrics, indent=2))
        log.info("final model in %s; metrics %s", final_dir, metrics)
    return metrics


def make_parser() -> argparse.ArgumentParser:
    """The command line: one ``--config`` file (JSON or YAML)."""
    p = argparse.ArgumentParser(prog="torchrun ... -m components.train.sft", description=__doc__.split("\n")[0])
    p.add_argument("--config", required=True, help="trainer config (JSON or YAML): SFTConfig fields")
    return p


if __name__ == "__main__":
    args = make_parser().parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s rank" + os.environ.get("RANK", "0") + " %(name)s: %(message)s")
    try:
        config = parse_config(args.config)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
    main(config)
