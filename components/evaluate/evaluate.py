"""Compare the base and the tuned model on the held-out split, token for token.

Both models see exactly the same eval rows and score exactly the same label tokens (assistant
tokens for chat data), so the difference in loss is the effect of fine-tuning and nothing else.
"""

from __future__ import annotations

import json
import logging
import math
import time

log = logging.getLogger("evaluate_model")


def heldout_loss(model_path: str, dataset_path: str, max_samples: int = 0, batch_size: int = 8) -> dict:
    """Token-weighted mean cross-entropy of ``model_path`` on the ``eval`` split's label tokens."""
    import datasets
    import torch
    from transformers import AutoModelForCausalLM

    from components.train.sft import pad_collator

    device = "cuda" if torch.cuda.is_available() else "cpu"
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    rows = datasets.load_from_disk(dataset_path)["eval"]
    if max_samples > 0:
        rows = rows.select(range(min(max_samples, len(rows))))
    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=dtype).to(device).eval()
    collate = pad_collator(model.config.pad_token_id if model.config.pad_token_id is not None else 0)
    total_nll, total_tokens = 0.0, 0
    with torch.no_grad():
        for start in range(0, len(rows), batch_size):
            batch = {k: v.to(device) for k, v in collate([rows[i] for i in range(start, min(start + batch_size, len(rows)))]).items()}
            logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits.float()
            # Shift so that tokens < n predict n, as the causal LM loss does.
            targets = batch["labels"][:, 1:]
            nll = torch.nn.functional.cross_entropy(
                logits[:, :-1].reshape(-1, logits.size(-1)), targets.reshape(-1), ignore_index=-100, reduction="sum"
            )
            total_nll += nll.item()
            total_tokens += int((targets != -100).sum())
    if total_tokens == 0:
        raise ValueError(f"{dataset_path}: the eval split has no label tokens to score")
    loss = total_nll / total_tokens
    return {"eval_loss": loss, "perplexity": math.exp(min(loss, 50.0)), "tokens": total_tokens, "rows": len(rows)}


def gate(base: dict, tuned: dict, min_loss_improvement: float) -> tuple[bool, str]:
    """Pass when the tuned loss is lower than the base loss by at least ``min_loss_improvement`` (a fraction)."""
    improvement = (base["eval_loss"] - tuned["eval_loss"]) / base["eval_loss"]
    if improvement >= min_loss_improvement and tuned["eval_loss"] < base["eval_loss"]:
        return True, f"eval_loss {base['eval_loss']:.4f} -> {tuned['eval_loss']:.4f} ({improvement:+.1%}), required >= {min_loss_improvement:.1%}"
    return False, (
        f"eval_loss {base['eval_loss']:.4f} -> {tuned['eval_loss']:.4f} ({improvement:+.1%}) is short of the required "
        f"{min_loss_improvement:.1%} improvement; not deploying (lower min_loss_improvement to accept it)"
    )


def evaluate(base_model: str, tuned_model: str, dataset_path: str, max_samples: int, min_loss_improvement: float) -> dict:
    """Score base and tuned on the same held-out tokens; return metrics, the gate decision and a Markdown report."""
    started = time.time()
    base = heldout_loss(base_model, dataset_path, max_samples)
    log.info("base  eval_loss %.4f over %d tokens", base["eval_loss"], base["tokens"])
    tuned = heldout_loss(tuned_model, dataset_path, max_samples)
    log.info("tuned eval_loss %.4f over %d tokens", tuned["eval_loss"], tuned["tokens"])
    passed, reason = gate(base, tuned, min_loss_improvement)
    metrics = {
        "base_eval_loss": base["eval_loss"],
        "eval_loss": tuned["eval_loss"],
        "base_perplexity": base["perplexity"],
        "perplexity": tuned["perplexity"],
        "eval_loss_delta": tuned["eval_loss"] - base["eval_loss"],
        "tokens_evaluated": tuned["tokens"],
        "seconds": round(time.time() - started, 2),
    }
    report = "\n".join([
        "# Evaluation",
        "",
        f"**{'PASSED' if passed else 'NOT PASSED'}**: {reason}",
        "",
        "| model | eval loss | perplexity |",
        "|---|---|---|",
        f"| base `{base_model}` | {base['eval_loss']:.4f} | {base['perplexity']:.2f} |",
        f"| tuned `{tuned_model}` | {tuned['eval_loss']:.4f} | {tuned['perplexity']:.2f} |",
        "",
        f"{tuned['tokens']} label tokens in {tuned['rows']} held-out rows, identical for both models.",
    ])
    log.info("%s", reason)
    return {"metrics": metrics, "passed": passed, "reason": reason, "report": report}


def write_json(obj: dict, path: str) -> None:
    """Write ``obj`` as indented JSON."""
    with open(path, "w") as f:
        json.dump(obj, f, indent=2)
