"""What evaluation adds when a run trains several stages: each stage's own numbers, and, when the dpo stage ran,
how often each model prefers the chosen answer of a held-out preference pair.

Preference accuracy is the model's own: the share of held-out pairs where it finds the chosen answer likelier than
the rejected one (log-probabilities summed over the answer's tokens, the prompt through the chat template). No
reference model is involved, so base, the model before preference tuning and the final model are scored alike.
Beside it, DPO's reward accuracy with the base as the one reference: the share of pairs where log p_model(answer) -
log p_base(answer) is higher for the chosen answer (the base scores 0): it shows a preference moving before the
raw likelihoods cross.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import datasets
import torch
from transformers import AutoTokenizer

from components.evaluate.loading import load_causal_lm

log = logging.getLogger("evaluate_model")

# What each stage's metrics.json reports, by stage, for the table (the trainer's own keys).
STAGE_KEYS = (
    "eval_loss",
    "final_train_loss",
    "global_step",
    "eval_rewards/accuracies",
    "eval_rewards/margins",
    "train_runtime_seconds",
)


def stage_metrics(stage_dirs: dict[str, str]) -> dict[str, dict]:
    """``{stage: metrics.json}`` for each stage folder that has one."""
    found = {}
    for stage, folder in stage_dirs.items():
        path = Path(folder, "metrics.json")
        if path.exists():
            found[stage] = json.loads(path.read_text())
    return found


def _response_logprob(model, tokenizer, prompt: list[dict], response: list[dict]) -> float:
    """Sum of the log-probabilities of ``response``'s tokens after ``prompt`` (both through the chat template)."""
    prefix = tokenizer.apply_chat_template(prompt, tokenize=False, add_generation_prompt=True)
    full = tokenizer.apply_chat_template(prompt + response, tokenize=False)
    prefix_ids = tokenizer(prefix, add_special_tokens=False)["input_ids"]
    ids = tokenizer(full, add_special_tokens=False)["input_ids"]
    input_ids = torch.tensor([ids], device=model.device)
    with torch.no_grad():
        logits = model(input_ids=input_ids).logits.float()
    logprobs = torch.log_softmax(logits[0, :-1], dim=-1).gather(1, input_ids[0, 1:, None])[:, 0]
    return float(logprobs[len(prefix_ids) - 1 :].sum())


def pair_logprobs(model_path: str, pairs) -> list[tuple[float, float]]:
    """``(log p(chosen), log p(rejected))`` of each pair under the model at ``model_path``."""
    model, tokenizer = load_causal_lm(model_path), AutoTokenizer.from_pretrained(model_path)
    scores = [
        (
            _response_logprob(model, tokenizer, r["prompt"], r["chosen"]),
            _response_logprob(model, tokenizer, r["prompt"], r["rejected"]),
        )
        for r in pairs
    ]
    del model
    return scores


def preference_scores(models: dict[str, str], preference_path: str, max_pairs: int = 0) -> dict[str, dict]:
    """For each of ``models`` (role -> folder; ``base`` is the reference): ``accuracy`` (chosen likelier),
    ``reward_accuracy`` (against the base), ``margin`` (mean log-prob margin, chosen - rejected, nats) and ``pairs``,
    on the eval split of the pairs at ``preference_path``."""
    pairs = datasets.load_from_disk(preference_path)["eval"]
    pairs = pairs.select(range(min(max_pairs, len(pairs)))) if max_pairs > 0 else pairs
    reference = pair_logprobs(models["base"], pairs)
    scores = {}
    for role, path in models.items():
        logps = reference if role == "base" else pair_logprobs(path, pairs)
        rewards = [(c - bc) - (r - br) for (c, r), (bc, br) in zip(logps, reference, strict=True)]
        scores[role] = {
            "accuracy": sum(c > r for c, r in logps) / len(logps),
            "reward_accuracy": sum(m > 0 for m in rewards) / len(rewards),
            "margin": sum(c - r for c, r in logps) / len(logps),
            "pairs": len(logps),
        }
        log.info(
            "%s preference accuracy %.3f (mean margin %+.2f nats; reward accuracy against the base %.3f) over "
            "%d held-out pairs",
            role,
            scores[role]["accuracy"],
            scores[role]["margin"],
            scores[role]["reward_accuracy"],
            scores[role]["pairs"],
        )
    return scores


def stages_section(stages: dict[str, dict], preference: dict[str, dict]) -> list[str]:
    """The report's lines for the stages' own metrics and the preference accuracies."""
    lines = []
    if stages:
        keys = [k for k in STAGE_KEYS if any(k in m for m in stages.values())]
        lines += ["## Stages", "", "| stage | " + " | ".join(keys) + " |", "|---|" + "---|" * len(keys)]
        for stage, m in stages.items():
            cells = [f"{m[k]:.4g}" if isinstance(m.get(k), float) else str(m.get(k, "")) for k in keys]
            lines.append(f"| {stage} | " + " | ".join(cells) + " |")
        lines.append("")
    if preference:
        lines += [
            "## Preference accuracy (held-out pairs of the dpo stage)",
            "",
            "Accuracy: the share of pairs where the model finds the chosen answer likelier than the rejected "
            "one. Reward accuracy: where its log-probability ratio to the base model is higher for the chosen "
            "answer (DPO's reward, the base as reference).",
            "",
            "| model | accuracy | mean margin (nats) | reward accuracy | pairs |",
            "|---|---|---|---|---|",
        ]
        for role, s in preference.items():
            lines.append(
                f"| {role} | {s['accuracy']:.3f} | {s['margin']:+.2f} | {s['reward_accuracy']:.3f} | {s['pairs']} |"
            )
        lines.append("")
    return lines
