"""Supervised fine-tuning, the ``sft`` and ``cpt`` stages: the Hugging Face Trainer on the packed rows
prepare_dataset wrote.

    torchrun ... -m components.train.trainer --config train_config.json        # the config says "stage": "sft"

Every stage runs from the same entry point (__main__.py) and shares the model loading, checkpoints, progress lines and
export (common.py). ``cpt`` (continued pretraining: the data step labels every token of its plain-text rows) is the
same loss on other rows.

Reads the tokenized (packed) dataset written by prepare_dataset (no re-tokenisation) and trains with the Hugging Face
Trainer: DDP, or DeepSpeed ZeRO-2/3 when the config names a DeepSpeed JSON; full fine-tuning or PEFT LoRA/QLoRA.
Checkpoints every ``save_steps`` (DeepSpeed's shards only under DeepSpeed; complete-marker written last, last
``save_total_limit`` kept), resumes from the newest complete one, logs progress on rank 0 and to TensorBoard, and ends
with ``final/`` (see export.py) and ``metrics.json``. On SIGTERM it saves a complete checkpoint at the end of the
current step and the process exits with 143 (checkpoints.py: what the pod's grace period must cover).

With ``early_stopping_patience`` it evaluates every ``eval_steps``, stops once the held-out loss per label token has
not improved for that many evaluations, and loads the best checkpoint's weights before the export (transformers'
``load_best_model_at_end``; callbacks.py's ``HeldOutEarlyStopping``): ``final/`` is the best model, and metrics.json
says where training stopped and which step was best.
"""

from __future__ import annotations

import time

import datasets
from transformers import AutoTokenizer

from components.models.batches import label_nll, token_weighted_loss
from components.train.trainer import chunked_loss
from components.train.trainer.callbacks import HeldOutEarlyStopping, ProgressCallback, early_stopping_summary
from components.train.trainer.common import (
    checkpoint_callbacks,
    finish_run,
    load_model,
    start_run,
    summary_metrics,
    train_resuming,
    use_progress,
)
from components.train.trainer.sharded_checkpoints import ShardedCheckpointTrainer
from components.train.trainer.speed import packed_collator


class SFTTrainer(ShardedCheckpointTrainer):
    """The sft and cpt stages' Trainer: loads the best checkpoint at the end from wherever this trainer's checkpoints
    hold the weights.

    transformers 5.23's ``_load_best_model`` reads DeepSpeed's shards through the engine (CheckpointMixin writes
    those) and a plain checkpoint's weights file, but not the per-rank shards of a model sharded at load
    (sharded_checkpoints.py: under ``model/``), which it would skip with a warning, exporting the last weights.
    """

    def _load_best_model(self) -> None:
        if not self._sharded:
            return super()._load_best_model()
        assert self.state.best_model_checkpoint is not None  # the Trainer calls this only with one
        self._load_from_checkpoint(self.state.best_model_checkpoint)


def main(cfg) -> dict:
    """Train the sft or cpt stage according to ``cfg`` (an ``SFTConfig``) and return the final metrics (also
    metrics.json)."""
    started = time.time()
    model_path = start_run(cfg)
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    data = datasets.load_from_disk(cfg.dataset_path)
    model = load_model(cfg, model_path)
    if cfg.chunked_cross_entropy:
        chunked_loss.enable(model.get_base_model() if hasattr(model, "get_base_model") else model)

    callbacks, sigterm = checkpoint_callbacks(cfg)
    # On where the config file turned on the best-model arguments (config.py's early_stopping_on): not in a
    # hyper-parameter trial, which has no checkpoints to keep a best in.
    early_stopping = cfg.early_stopping_patience > 0 and cfg.load_best_model_at_end
    if early_stopping:
        callbacks.append(HeldOutEarlyStopping(cfg.early_stopping_patience, cfg.early_stopping_min_delta))
    trainer = SFTTrainer(
        model=model,
        args=cfg,
        train_dataset=data["train"],
        eval_dataset=data["eval"],
        # Under flash-attention and varlen_attn a micro-batch's packed rows are joined into one, with their documents'
        # boundaries: transformers keeps documents apart from position_ids only in a batch of one row (speed.py).
        data_collator=packed_collator(tokenizer.pad_token_id, model.config._attn_implementation),
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
    # eval_loss: the same tokens, the same way as evaluate_model (with early stopping: of the best checkpoint's
    # weights, which the Trainer loaded at the end).
    evaluation = {"eval_loss": eval_metrics["eval_loss_per_token"]}
    if early_stopping:
        evaluation.update(early_stopping_summary(trainer.state))
    metrics = summary_metrics(trainer, result, evaluation, started)
    finish_run(trainer, cfg, tokenizer, model_path, metrics)
    return metrics
