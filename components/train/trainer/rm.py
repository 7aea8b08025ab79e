"""A reward model, the ``rm`` stage: TRL's ``RewardTrainer`` on the preference pairs prepare_dataset wrote.

    torchrun ... -m components.train.trainer --config train_config.json        # the config says "stage": "rm"

The same entry point as every stage (__main__.py), and the same checkpoints, progress lines and export (common.py);
what differs:

- Model: the previous stage's model with a sequence-classification head of one label
  (``AutoModelForSequenceClassification``, ``num_labels=1``: the head is new, the body is the previous stage's),
  trained in full (the rm stage's method is ``full``: validate_inputs refuses another).
- Data: the dpo stage's pairs (``dpo_dataset_source``), TRL's conversational preference layout; TRL applies the chat
  template to prompt + chosen and prompt + rejected and drops pairs longer than ``max_length`` = ``max_seq_length``.
  The splits are copied into ``<output_dir>/pairs/`` with TRL's caches (as dpo.py does).
- Loss: ``-log sigmoid(r(chosen) - r(rejected))`` (TRL's RewardTrainer.compute_loss).
- Metrics (metrics.json): TRL's ``eval_accuracy`` (the share of held-out pairs scored higher for chosen, averaged over
  evaluation batches), ``eval_margin``, ``eval_loss``, plus what every stage reports. The evaluation step recounts the
  accuracy over every held-out pair (components/evaluate/reward_gain.py).
- Hand-on: the rm stage's model is a scorer, not the policy; the next stage trains from the model this one started
  from (components/stages.py ``hands_on``), and grpo reads this model from ``<run>/rm/final``.
"""

from __future__ import annotations

import logging
import time

import datasets
import torch
from transformers import AutoConfig, AutoModelForSequenceClassification, AutoTokenizer
from trl import RewardTrainer

from components.distributed import global_rank
from components.models.mfu import flops_per_token, peak_flops
from components.models.shape import model_shape
from components.train.trainer.callbacks import ProgressCallback
from components.train.trainer.checkpoints import CheckpointMixin
from components.train.trainer.common import (
    checkpoint_callbacks,
    finish_run,
    start_run,
    summary_metrics,
    train_resuming,
    use_progress,
)
from components.train.trainer.dpo import _in_run_folder
from components.train.trainer.speed import attn_implementation

log = logging.getLogger("sft.rm")

EVAL_KEYS = ("eval_loss", "eval_accuracy", "eval_margin", "eval_mean_reward")


class RMCheckpointTrainer(CheckpointMixin, RewardTrainer):
    """TRL's ``RewardTrainer`` whose checkpoints under DeepSpeed are DeepSpeed's sharded state only (checkpoints.py)."""


def load_reward_model(cfg, model_path: str, pad_token_id: int):
    """The previous stage's model with a fresh one-label classification head (fp32 on CPU and for plain DDP, as
    common.load_model)."""
    low_precision = cfg.bf16 and cfg.deepspeed
    model = AutoModelForSequenceClassification.from_pretrained(
        model_path,
        num_labels=1,
        dtype=torch.bfloat16 if low_precision else torch.float32,
        attn_implementation=attn_implementation(
            cfg.attn_implementation, AutoConfig.from_pretrained(model_path).model_type
        ),
    )
    # The head reads the last non-padding token of each row: the model must know which id pads.
    model.config.pad_token_id = pad_token_id
    model.config.use_cache = False
    return model


def main(cfg) -> dict:
    """Train a reward model according to ``cfg`` (an ``RMStageConfig``) and return the final metrics (also
    metrics.json)."""
    started = time.time()
    model_path = start_run(cfg)
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    data = datasets.load_from_disk(cfg.dataset_path)
    model = load_reward_model(cfg, model_path, tokenizer.pad_token_id)
    callbacks, sigterm = checkpoint_callbacks(cfg)
    if global_rank() == 0:
        log.info(
            "rm: %d train and %d eval pairs; a one-label head on %s", len(data["train"]), len(data["eval"]), model_path
        )
    datasets.disable_progress_bars()
    trainer = RMCheckpointTrainer(
        model=model,
        args=cfg,
        train_dataset=_in_run_folder(data["train"], "train", cfg, model_path),
        eval_dataset=_in_run_folder(data["eval"], "eval", cfg, model_path),
        processing_class=tokenizer,
        callbacks=callbacks,
    )
    shape = model_shape(model.config.to_dict())
    flops = flops_per_token(shape.active, shape.layers, shape.q_dim, cfg.max_seq_length / 4)
    use_progress(
        trainer,
        ProgressCallback(
            flops, cfg.world_size, peak_flops(), f"{flops / 1e9:.3g} GFLOPs/token (chosen and rejected sequences)"
        ),
    )
    result = train_resuming(trainer, sigterm)
    evaluation = trainer.evaluate()
    metrics = summary_metrics(trainer, result, {k: evaluation[k] for k in EVAL_KEYS if k in evaluation}, started)
    finish_run(trainer, cfg, tokenizer, model_path, metrics)
    return metrics
