"""Rows to batches and batches to scores: shared by the trainer (components/train/trainer/) and evaluate_model.

One collator and one loss definition for both, so that the trainer's ``eval_loss`` and the evaluate step's
held-out loss are the same number for the same tokens (tests/test_local_run.py holds them together), and so
that evaluation never imports the trainer's entry point.
"""

from __future__ import annotations

import torch


def pad_collator(pad_token_id: int):
    """Collate tokenized rows into a batch; packed rows (``position_ids`` present) stay padding-free.

    Unpacked rows: padded to the longest row, with ``attention_mask``. Packed rows: ``input_ids``,
    ``labels`` and ``position_ids`` and no ``attention_mask``, so transformers builds a block-causal
    mask per example from where ``position_ids`` restart (flash-attention: varlen kernels). The first
    token of every example gets label -100: nothing predicts it from the previous example (as
    ``DataCollatorWithFlattening`` does), so a packed row's loss is exactly its examples' loss.
    """

    def collate(rows):
        width = max(len(r["input_ids"]) for r in rows)
        ids = torch.full((len(rows), width), pad_token_id, dtype=torch.long)
        labels = torch.full((len(rows), width), -100, dtype=torch.long)
        packed = "position_ids" in rows[0]
        extra = torch.zeros((len(rows), width), dtype=torch.long)  # position_ids or attention_mask
        for i, r in enumerate(rows):
            n = len(r["input_ids"])
            ids[i, :n] = torch.tensor(r["input_ids"])
            labels[i, :n] = torch.tensor(r["labels"])
            if packed:
                extra[i, :n] = torch.tensor(r["position_ids"])
            else:
                extra[i, :n] = 1
        if packed:
            labels[extra == 0] = -100
            return {"input_ids": ids, "labels": labels, "position_ids": extra}
        return {"input_ids": ids, "labels": labels, "attention_mask": extra}

    return collate


def label_nll(logits, labels):
    """Per row, ``[summed cross-entropy, label tokens]`` (a float32 ``(rows, 2)`` tensor) over the label tokens.

    Tokens < n predict n, as the causal LM loss does; label -100 is not scored. The same function serves
    Hugging Face Trainer as ``preprocess_logits_for_metrics`` (with ``compute_metrics=token_weighted_loss``),
    so the trainer's evaluation can score exactly the tokens this step scores, the same way.
    """
    if isinstance(logits, tuple):
        # Trainer passes the model's outputs after the loss: Qwen3-MoE's start with its router aux_loss (a scalar),
        # then the logits, then the router logits. The logits are the (rows, tokens, vocab) tensor.
        logits = next(t for t in logits if getattr(t, "ndim", 0) == 3)
    sums = torch.zeros((len(labels), 2), dtype=torch.float32, device=logits.device)
    for i in range(len(labels)):  # one row at a time in float32: a batch of 150k-vocab logits would not fit
        sums[i, 0] = torch.nn.functional.cross_entropy(
            logits[i, :-1].float(), labels[i, 1:], ignore_index=-100, reduction="sum"
        )
        sums[i, 1] = (labels[i, 1:] != -100).sum()
    return sums


def token_weighted_loss(eval_pred) -> dict:
    """``compute_metrics`` for Hugging Face Trainer after ``label_nll``: the loss per label token over the whole
    eval split (Trainer prefixes ``eval_``), where Trainer's own ``eval_loss`` is a mean of per-batch means."""
    sums = eval_pred.predictions.reshape(-1, 2).sum(axis=0)
    return {"loss_per_token": float(sums[0] / sums[1]), "label_tokens": int(sums[1])}
