"""Preference tuning, the ``dpo`` stage: TRL's ``DPOTrainer`` on the pairs prepare_dataset wrote.

    torchrun ... -m components.train.trainer --config train_config.json        # the config says "stage": "dpo"

The same entry point as every stage (__main__.py), and the same model loading, checkpoints, progress lines and export
(common.py); what differs:

- Data: a ``save_to_disk`` DatasetDict with ``train`` and ``eval`` splits of TRL's conversational preference
  layout, ``{"prompt": [turns], "chosen": [turns], "rejected": [turns]}``. TRL applies the tokenizer's chat
  template, scores only the response tokens (the prompt is masked) and truncates each sequence to
  ``max_length`` = ``max_seq_length``. Rows are padded per batch: TRL 1.16 has disabled ``padding_free`` since its
  DPO refactor (setting it only warns and pads), so there is no padding-free path to turn on here. The splits are
  copied into ``<output_dir>/pairs/`` with TRL's caches of them (``_in_run_folder``): nothing is written beside the
  prepared dataset.
- Loss: DPO's sigmoid loss with ``beta`` = ``dpo_beta`` against a frozen reference, held without a second copy
  of the weights: full fine-tuning precomputes the reference log-probs of every pair before training
  (``precompute_ref_log_probs``, set by config_file.parse_config; TRL then keeps no reference model, and under ZeRO-3 it
  gathers the partitioned model for that pass); LoRA/QLoRA passes the PEFT model with ``ref_model=None`` and TRL
  scores the reference through the model with the trained adapter off (PEFT >= 0.20: a frozen copy of the
  freshly initialised adapter, named ``ref``, which is zero like the adapter-off base).
- Metrics (metrics.json): TRL's eval keys ``eval_rewards/accuracies`` (the share of held-out pairs whose implicit
  reward, beta x the log-ratio to the reference, is higher for chosen than rejected), ``eval_rewards/margins``,
  ``eval_rewards/chosen``, ``eval_rewards/rejected`` and ``eval_loss`` (the DPO loss), plus what every stage
  reports (common.summary_metrics).
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

import datasets
from datasets.fingerprint import Hasher
from transformers import AutoTokenizer
from trl import DPOTrainer

from components.distributed import global_rank
from components.models.mfu import SAMPLE_ROWS, causal_attention_length, flops_per_token, peak_flops
from components.models.shape import model_shape
from components.train.trainer.callbacks import ProgressCallback
from components.train.trainer.checkpoints import CheckpointMixin
from components.train.trainer.common import (
    checkpoint_callbacks,
    finish_run,
    load_model,
    start_run,
    summary_metrics,
    train_resuming,
    use_progress,
)

log = logging.getLogger("sft.dpo")

# TRL's evaluation keys that metrics.json carries.
EVAL_KEYS = (
    "eval_loss",
    "eval_rewards/accuracies",
    "eval_rewards/margins",
    "eval_rewards/chosen",
    "eval_rewards/rejected",
)
# The adapter TRL adds for a PeftModel's reference (module docstring); not part of the tuned model.
REF_ADAPTER = "ref"


class DPOCheckpointTrainer(CheckpointMixin, DPOTrainer):
    """TRL's ``DPOTrainer`` whose checkpoints under DeepSpeed are DeepSpeed's sharded state only (checkpoints.py)."""


def _in_run_folder(split, name: str, cfg, model_path: str):
    """``split`` copied to ``<output_dir>/pairs/<name>.arrow`` (once: a re-run loads the copy), where TRL's caches of it
    then go too.

    TRL caches its tokenized rows and the precomputed reference log-probs in the folder of the dataset's files. Beside
    the prepared dataset they would change another step's artifact (read-only to the trainer's user, or reused by a
    cached data step for later runs), so they go to this run's output folder, and a re-run after an eviction finds
    them there. The reference cache is keyed by the split's fingerprint and a hash of the model's state dict; under
    ZeRO-3 the model is already partitioned when TRL hashes it (every parameter an empty placeholder), so the base
    model's path goes into the fingerprint.
    """
    path = Path(cfg.output_dir, "pairs", f"{name}.arrow")
    # Global rank 0 writes the copy; the others (every node: the volume is shared) then load it.
    with cfg.main_process_first(local=False, desc=f"copying the {name} pairs"):
        path.parent.mkdir(parents=True, exist_ok=True)
        return split.flatten_indices(
            cache_file_name=str(path), new_fingerprint=Hasher.hash((split._fingerprint, model_path))
        )


def _progress(trainer, world_size: int):
    """Our ProgressCallback, with FLOPs per token counted over the chosen and rejected sequences TRL tokenized."""
    split = trainer.train_dataset.select_columns(["prompt_ids", "chosen_ids", "rejected_ids"])
    rows = split.select(range(min(len(split), SAMPLE_ROWS)))
    limit = trainer.args.max_length
    # Columns of one split: equally long.
    prompts = rows["prompt_ids"]
    lengths = [min(len(p) + len(c), limit) for p, c in zip(prompts, rows["chosen_ids"], strict=True)]
    lengths += [min(len(p) + len(r), limit) for p, r in zip(prompts, rows["rejected_ids"], strict=True)]
    keys = causal_attention_length(lengths)
    shape = model_shape(trainer.model.config.to_dict())
    flops = flops_per_token(shape.active, shape.layers, shape.q_dim, keys)
    # The policy's forward and backward only: the LoRA reference's extra forward is overhead, not model FLOPs.
    basis = (
        f"{flops / 1e9:.3g} GFLOPs/token = 6 x {shape.active / 1e9:.3g}B active parameters + causal attention "
        f"over {keys:.0f} keys/token per chosen or rejected sequence"
    )
    return ProgressCallback(flops, world_size, peak_flops(), basis)


def main(cfg) -> dict:
    """Preference-tune according to ``cfg`` (a ``DPOStageConfig``) and return the final metrics (also metrics.json)."""
    started = time.time()
    model_path = start_run(cfg)
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    data = datasets.load_from_disk(cfg.dataset_path)
    model = load_model(cfg, model_path)  # a PeftModel for lora/qlora: TRL's reference is then the adapter off
    if model.config.model_type != "qwen3_moe":
        # TRL refuses a router-loss weight for a model without a router (the setting's default is for Qwen3-MoE).
        cfg.router_aux_loss_coef = 0.0

    callbacks, sigterm = checkpoint_callbacks(cfg)
    if global_rank() == 0:
        log.info(
            "dpo: %d train and %d eval pairs; TRL tokenizes them with the chat template; reference: %s",
            len(data["train"]),
            len(data["eval"]),
            "log-probs precomputed before training" if cfg.precompute_ref_log_probs else "the adapter off",
        )
    # One line above instead of a progress bar per datasets map (tokenize, filter, cache, flatten) on every rank;
    # TRL's bar over the reference pass, rank 0 only, stays: on a large model and dataset that pass takes minutes.
    datasets.disable_progress_bars()
    trainer = DPOCheckpointTrainer(
        model=model,
        ref_model=None,  # module docstring: precomputed log-probs (full) or the adapter off (LoRA)
        args=cfg,
        train_dataset=_in_run_folder(data["train"], "train", cfg, model_path),
        eval_dataset=_in_run_folder(data["eval"], "eval", cfg, model_path),
        processing_class=tokenizer,
        callbacks=callbacks,
    )
    use_progress(trainer, _progress(trainer, cfg.world_size))
    result = train_resuming(trainer, sigterm)
    evaluation = trainer.evaluate()
    metrics = summary_metrics(trainer, result, {k: evaluation[k] for k in EVAL_KEYS}, started)
    tuned: Any = trainer.model  # the PeftModel for lora/qlora
    if cfg.method != "full" and REF_ADAPTER in tuned.peft_config:
        tuned.delete_adapter(REF_ADAPTER)  # adapter/ and the merged final/ hold the trained adapter only
    finish_run(trainer, cfg, tokenizer, model_path, metrics)
    return metrics
