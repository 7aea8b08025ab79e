"""What evaluation adds when the grpo or rm stage ran: the mean reward on held-out prompts of the base, the model
before grpo and the tuned model (with their answers side by side), the reward model's pairwise accuracy on held-out
pairs, and the gate on the reward gain (``min_reward_improvement``).

Each model samples ``SAMPLES`` answers to each of the grpo stage's held-out prompts, as GRPO samples them (at
``grpo_temperature``, at most ``grpo_max_completion_length`` tokens, the same seed for every model); the answers are
scored with the run's rewards and weights (components/rewards.py, the functions the trainer used; a
reward model scores prompt + answer through the chat template, as TRL does) and the weighted sum is averaged: the
expected reward GRPO maximises. Not greedy answers: a small model's greedy answer is one repeated phrase whatever it
learned (measured on the tiny model: the answer line in 0 of 48 greedy answers after grpo, in 9 of 10 sampled ones).
"""

from __future__ import annotations

import html
import logging

import datasets
import torch
from transformers import AutoModelForSequenceClassification, AutoTokenizer

from components.evaluate.loading import load_causal_lm
from components.rewards import builtin_reward, load_reward_function

log = logging.getLogger("evaluate_model")

# Rows of the side-by-side answer table in the report (each model's first sample).
SHOWN_ANSWERS = 8
# Sampled answers per held-out prompt and model, and their seed.
SAMPLES = 4
SEED = 0


def _reward_model_scores(path: str, prompts: list[list[dict]], answers: list[str]) -> list[float]:
    """The reward model's score of each prompt + answer (chat template, as TRL's GRPOTrainer scores them)."""
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForSequenceClassification.from_pretrained(path, num_labels=1, dtype=torch.float32).eval()
    scores = []
    with torch.no_grad():
        for prompt, answer in zip(prompts, answers, strict=True):
            text = tokenizer.apply_chat_template(prompt + [{"role": "assistant", "content": answer}], tokenize=False)
            ids = tokenizer(text, return_tensors="pt", add_special_tokens=False)
            scores.append(float(model(**ids).logits[0, 0]))
    return scores


def score_answers(
    prompts: list[list[dict]],
    references: list[str],
    answers: list[str],
    tokenizer,
    rewards: dict,
    *,
    pattern: str,
    length_budget: int,
    reward_model: str = "",
    reward_function: str = "",
) -> dict:
    """``{"mean_reward", "sources": {name: mean}}`` of ``answers`` under ``rewards`` (name -> weight); a source that
    gives None for a row (``answer`` without a reference) is left out of that row's sum, as TRL does."""
    used = {name: weight for name, weight in rewards.items() if weight}
    completion_ids = [tokenizer(a, add_special_tokens=False)["input_ids"] for a in answers]
    per_source = {}
    for name in used:
        if name == "model":
            values: list = _reward_model_scores(reward_model, prompts, answers)
        else:
            function = (
                load_reward_function(reward_function)
                if name == "function"
                else builtin_reward(name, pattern, length_budget)
            )
            values = function(
                prompts=prompts,
                completions=[[{"role": "assistant", "content": a}] for a in answers],
                completion_ids=completion_ids,
                answer=references,
            )
        per_source[name] = values
    totals = []
    for i in range(len(answers)):
        parts = [used[name] * values[i] for name, values in per_source.items() if values[i] is not None]
        totals.append(sum(parts))
    means = {
        name: (sum(v for v in values if v is not None) / max(1, sum(v is not None for v in values)))
        for name, values in per_source.items()
    }
    return {"mean_reward": sum(totals) / len(totals), "sources": means}


def sample_answers(
    model,
    tokenizer,
    prompts: list[list[dict]],
    max_new_tokens: int,
    temperature: float,
    samples: int = SAMPLES,
    batch_size: int = 16,
) -> list[list[str]]:
    """``samples`` answers of ``model`` to each conversation in ``prompts`` (chat template, generation prompt),
    sampled at ``temperature`` from seed ``SEED``."""
    tokenizer.padding_side = "left"  # generation continues from the right end of every row
    texts = [tokenizer.apply_chat_template(p, tokenize=False, add_generation_prompt=True) for p in prompts]
    torch.manual_seed(SEED)
    answers = []
    with torch.no_grad():
        for start in range(0, len(texts), batch_size):
            enc = tokenizer(
                texts[start : start + batch_size], return_tensors="pt", padding=True, add_special_tokens=False
            ).to(model.device)
            out = model.generate(
                **enc,
                max_new_tokens=max_new_tokens,
                do_sample=True,
                temperature=temperature,
                top_k=0,
                top_p=1.0,
                num_return_sequences=samples,
                pad_token_id=tokenizer.pad_token_id,
            )
            decoded = tokenizer.batch_decode(out[:, enc["input_ids"].shape[1] :], skip_special_tokens=True)
            answers += [[a.strip() for a in decoded[i : i + samples]] for i in range(0, len(decoded), samples)]
    return answers


def reward_scores(
    models: dict[str, str],
    prompts_path: str,
    rewards: dict,
    *,
    pattern: str,
    length_budget: int,
    max_new_tokens: int,
    temperature: float = 1.0,
    reward_model: str = "",
    reward_function: str = "",
    max_prompts: int = 0,
) -> dict:
    """For each of ``models`` (role -> folder): the mean reward of its sampled answers (module docstring) to the
    held-out prompts at ``prompts_path`` (the grpo stage's prepared data), each source's mean, and the first answer to
    each prompt."""
    rows = datasets.load_from_disk(prompts_path)["eval"]
    rows = rows.select(range(min(max_prompts, len(rows)))) if max_prompts > 0 else rows
    prompts, references = rows["prompt"], rows["answer"]
    out = {}
    for role, path in models.items():
        model, tokenizer = load_causal_lm(path), AutoTokenizer.from_pretrained(path)
        sampled = sample_answers(model, tokenizer, prompts, max_new_tokens, temperature)
        del model
        flat = [a for answers in sampled for a in answers]
        repeat = [i for i in range(len(prompts)) for _ in range(SAMPLES)]
        out[role] = {
            **score_answers(
                [prompts[i] for i in repeat],
                [references[i] for i in repeat],
                flat,
                tokenizer,
                rewards,
                pattern=pattern,
                length_budget=length_budget,
                reward_model=reward_model,
                reward_function=reward_function,
            ),
            "answers": [answers[0] for answers in sampled],
            "prompts": len(prompts),
        }
        log.info(
            "%s mean reward %.3f (%s) over %d held-out prompts",
            role,
            out[role]["mean_reward"],
            ", ".join(f"{k} {v:.3f}" for k, v in out[role]["sources"].items()),
            len(prompts),
        )
    out["_rows"] = {"prompts": [p[-1]["content"] for p in prompts], "references": list(references)}
    return out


def reward_model_accuracy(reward_model: str, pairs_path: str, max_pairs: int = 0) -> dict:
    """The reward model's pairwise accuracy over every held-out pair at ``pairs_path`` (the rm stage's data): the
    share scored higher for chosen than rejected, and the mean margin."""
    pairs = datasets.load_from_disk(pairs_path)["eval"]
    pairs = pairs.select(range(min(max_pairs, len(pairs)))) if max_pairs > 0 else pairs
    chosen = _reward_model_scores(reward_model, pairs["prompt"], [c[-1]["content"] for c in pairs["chosen"]])
    rejected = _reward_model_scores(reward_model, pairs["prompt"], [r[-1]["content"] for r in pairs["rejected"]])
    accuracy = sum(c > r for c, r in zip(chosen, rejected, strict=True)) / len(chosen)
    margin = sum(c - r for c, r in zip(chosen, rejected, strict=True)) / len(chosen)
    log.info("reward model accuracy %.3f (mean margin %+.3f) over %d held-out pairs", accuracy, margin, len(chosen))
    return {"accuracy": accuracy, "margin": margin, "pairs": len(chosen)}


def reward_gate(scores: dict, min_reward_improvement: float) -> tuple[bool, str]:
    """Whether the tuned model's mean reward beats the model before grpo by ``min_reward_improvement`` (absolute)."""
    before, tuned = scores["before grpo"]["mean_reward"], scores["tuned"]["mean_reward"]
    line = f"mean reward {before:.3f} -> {tuned:.3f} ({tuned - before:+.3f})"
    if tuned - before >= min_reward_improvement:
        return True, f"{line}, required >= {min_reward_improvement:+.3f}"
    return False, (
        f"{line} is short of the required {min_reward_improvement:+.3f} gain over the model before grpo "
        "(lower min_reward_improvement to accept it)"
    )


def _cell(text: str) -> str:
    """Text safe inside one Markdown table cell (as base_vs_tuned.py's answers): HTML-escaped, pipes escaped, <br>."""
    return html.escape(text).replace("|", "\\|").replace("\n", "<br>") or "*(empty)*"


def rewards_section(scores: dict | None, rm: dict | None) -> list[str]:
    """The report's lines: mean rewards by model and source, the answers side by side, the reward model's accuracy."""
    lines: list[str] = []
    if scores:
        roles = [r for r in scores if not r.startswith("_")]
        sources = list(scores[roles[0]]["sources"])
        lines += [
            "## Reward on held-out prompts (grpo)",
            "",
            f"{SAMPLES} sampled answers to each of the grpo stage's {scores[roles[0]]['prompts']} held-out "
            "prompts (as GRPO samples them, one seed for all models), scored with the run's rewards; the "
            "weighted sum, averaged. Below, each model's first answer.",
            "",
            "| model | mean reward | " + " | ".join(sources) + " |",
            "|---|---|" + "---|" * len(sources),
        ]
        for role in roles:
            s = scores[role]
            lines.append(
                f"| {role} | {s['mean_reward']:.3f} | " + " | ".join(f"{s['sources'][k]:.3f}" for k in sources) + " |"
            )
        rows = scores["_rows"]
        lines += ["", "| # | prompt | reference | " + " | ".join(roles) + " |", "|---|---|---|" + "---|" * len(roles)]
        for i, (prompt, ref) in enumerate(zip(rows["prompts"], rows["references"], strict=True)):
            if i >= SHOWN_ANSWERS:
                break
            cells = " | ".join(_cell(scores[r]["answers"][i]) for r in roles)
            lines.append(f"| {i + 1} | {_cell(prompt)} | {ref} | {cells} |")
        lines.append("")
    if rm:
        lines += [
            "## Reward model (rm)",
            "",
            f"Pairwise accuracy on {rm['pairs']} held-out pairs: {rm['accuracy']:.3f} (the share scored higher "
            f"for the chosen answer; mean margin {rm['margin']:+.3f}).",
            "",
        ]
    return lines
