"""Compare the base and the tuned model on the held-out split, token for token, and on a prompt set.

Both models see exactly the same eval rows and score exactly the same label tokens (assistant
tokens for chat data), so the difference in loss is the effect of fine-tuning and nothing else. Both
answer the same prompts with greedy decoding, side by side in the report. Optional lm-evaluation-harness
tasks add benchmark scores. On GPUs with vLLM installed, vLLM does the scoring and generation (each model
in its own process); otherwise transformers, with ``device_map="auto"`` over the GPUs when there are any.
"""

from __future__ import annotations

import codecs
import html
import importlib.util
import logging
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass

import datasets
import torch
from transformers import AutoTokenizer

from components.evaluate.curves import training_section
from components.evaluate.harness import check_tasks, run_tasks
from components.evaluate.isolated import run_isolated
from components.evaluate.judge import judge_gate, judge_metrics, judge_section, load_rubric, run_judge
from components.evaluate.loading import load_causal_lm
from components.evaluate.prompts import BUILTIN_PROMPTS, load_prompts
from components.evaluate.reward_gain import reward_gate, reward_model_accuracy, reward_scores, rewards_section
from components.evaluate.stage_metrics import preference_scores, stage_metrics, stages_section
from components.evaluate.vllm_scoring import score_with_vllm
from components.models.batches import label_nll, pad_collator
from components.models.logprobs import transformers_reference, write_reference

log = logging.getLogger("evaluate_model")

# What ``eval_loss`` (and ``base_eval_loss``) are, in the report and the run's summary.
LOSS_DEFINITION = (
    "Held-out loss: cross-entropy summed over all {tokens} label (assistant) tokens of the {rows} "
    "held-out rows, divided by {tokens}; the same tokens for both models; perplexity = exp(loss)."
)


def _perplexity(loss: float) -> float:
    return math.exp(min(loss, 50.0))  # a random model's loss can overflow exp()


def load_eval_rows(dataset_path: str, max_samples: int = 0):
    """The ``eval`` split of a prepared dataset, its first ``max_samples`` rows (0 = all)."""
    try:
        splits = datasets.load_from_disk(dataset_path)
    except FileNotFoundError:
        raise ValueError(f"dataset {dataset_path!r} is not a prepared dataset; run prepare_dataset first") from None
    if "eval" not in splits:
        raise ValueError(
            f"dataset {dataset_path!r} has no 'eval' split (it has {sorted(splits)}); "
            "run prepare_dataset with eval_size > 0"
        )
    rows = splits["eval"]
    return rows.select(range(min(max_samples, len(rows)))) if max_samples > 0 else rows


def _label_nll(model, rows, batch_size: int) -> tuple[float, int]:
    collate = pad_collator(model.config.pad_token_id if model.config.pad_token_id is not None else 0)
    total_nll, total_tokens = 0.0, 0
    with torch.no_grad():
        for start in range(0, len(rows), batch_size):
            batch = collate([rows[i] for i in range(start, min(start + batch_size, len(rows)))])
            labels = batch.pop("labels").to(model.device)
            # Everything else goes to the model: packed rows carry position_ids (per-example attention).
            # use_cache=False: with a KV cache transformers ignores position_ids when building the mask.
            logits = model(**{k: v.to(model.device) for k, v in batch.items()}, use_cache=False).logits
            nll, tokens = label_nll(logits, labels).sum(dim=0).tolist()
            total_nll += nll
            total_tokens += int(tokens)
    return total_nll, total_tokens


def heldout_loss(model_path: str, dataset_path: str, max_samples: int = 0, batch_size: int = 8) -> dict:
    """Token-weighted mean cross-entropy of ``model_path`` on the ``eval`` split's label tokens."""
    rows = load_eval_rows(dataset_path, max_samples)
    return _loss_dict(*_label_nll(load_causal_lm(model_path), rows, batch_size), len(rows), dataset_path)


def _loss_dict(nll: float, tokens: int, rows: int, dataset_path: str) -> dict:
    if tokens == 0:
        raise ValueError(f"{dataset_path}: the eval split has no label tokens to score")
    loss = nll / tokens
    return {"eval_loss": loss, "perplexity": _perplexity(loss), "tokens": tokens, "rows": rows}


def generate_answers(
    model, tokenizer, prompts: list[list[dict]], max_new_tokens: int, batch_size: int = 16
) -> list[str]:
    """Greedy answers of ``model`` to each conversation in ``prompts`` (chat template, generation prompt)."""
    tokenizer.padding_side = "left"  # generation continues from the right end of every row
    texts = [tokenizer.apply_chat_template(p, tokenize=False, add_generation_prompt=True) for p in prompts]
    answers = []
    with torch.no_grad():
        for start in range(0, len(texts), batch_size):
            enc = tokenizer(
                texts[start : start + batch_size], return_tensors="pt", padding=True, add_special_tokens=False
            ).to(model.device)
            out = model.generate(
                **enc, max_new_tokens=max_new_tokens, do_sample=False, pad_token_id=tokenizer.pad_token_id
            )
            answers += [readable_decode(tokenizer, ids) for ids in out[:, enc["input_ids"].shape[1] :].tolist()]
    return [a.strip() for a in answers]


def _byte_level_chars() -> dict[str, int]:
    """Byte-level BPE (GPT-2, Qwen) spells each byte with one printable character: character -> byte."""
    printable = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    table, extra = {}, 0
    for b in range(256):
        if b in printable:
            table[chr(b)] = b
        else:
            table[chr(256 + extra)] = b
            extra += 1
    return table


def _hex_bytes(err: UnicodeError) -> tuple[str, int]:
    if not isinstance(err, UnicodeDecodeError):  # a decoding handler only
        raise err
    return "".join(f"<0x{b:02X}>" for b in err.object[err.start : err.end]), err.end


codecs.register_error("hex_bytes", _hex_bytes)


def readable_decode(tokenizer, ids: list[int]) -> str:
    """``ids`` as text, with bytes that form no character shown as ``<0xEC>`` instead of U+FFFD.

    A small model can emit the first bytes of a multi-byte character (Korean: 3 bytes) and never the rest;
    plain decoding turns them into replacement characters, which tell a reader nothing. For byte-level BPE
    tokenizers the tokens spell the raw bytes, decoded here with the bad ones in hex; other tokenizers'
    text is returned as decoded.
    """
    text = tokenizer.decode(ids, skip_special_tokens=True)
    if "\ufffd" not in text:
        return text
    chars = _byte_level_chars()
    spelled = "".join(tokenizer.convert_ids_to_tokens(ids, skip_special_tokens=True))
    if any(c not in chars for c in spelled):
        return text
    return bytes(chars[c] for c in spelled).decode("utf-8", errors="hex_bytes")


def score_model(
    model_path: str,
    rows,
    prompts: list[list[dict]],
    max_new_tokens: int,
    dataset_path: str,
    batch_size: int = 8,
    serving_reference: bool = False,
) -> dict:
    """Held-out loss and prompt answers of one model: vLLM (own process) on GPUs where installed, else transformers.
    With ``serving_reference``, also ``serving_reference``: what the served model must reproduce
    (components/models/logprobs.py), from the same engine and weights."""
    gpus = torch.cuda.device_count()
    if gpus and importlib.util.find_spec("vllm") is not None:
        return run_isolated(
            score_with_vllm,
            model_path,
            rows.to_list(),
            prompts,
            max_new_tokens,
            gpus,
            serving_reference=serving_reference,
        )
    model = load_causal_lm(model_path)
    result = _loss_dict(*_label_nll(model, rows, batch_size), len(rows), dataset_path)
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    result["answers"] = generate_answers(model, tokenizer, prompts, max_new_tokens)
    if serving_reference:
        result["serving_reference"] = transformers_reference(model, tokenizer, rows, prompts)
    del model
    if gpus:
        torch.cuda.empty_cache()  # room for the next model
    return result


def gate(
    base: dict,
    tuned: dict,
    min_loss_improvement: float,
    *,
    min_perplexity_improvement: float = 0.0,
    base_tasks: dict | None = None,
    tuned_tasks: dict | None = None,
    max_task_regression: float = 0.01,
) -> tuple[bool, str]:
    """Pass when every rule holds; the reason names each rule's numbers, and the fix when one fails.

    Rules: the tuned eval loss is lower than the base's by at least ``min_loss_improvement`` (a fraction);
    its perplexity is lower by at least ``min_perplexity_improvement`` (a fraction); and on each
    lm-evaluation-harness task the tuned score is at most ``max_task_regression`` (absolute, in the task
    metric's units; accuracies are 0..1) worse than the base's. A model that is worse on held-out loss never passes.
    """
    failures, notes = [], []
    improvement = (base["eval_loss"] - tuned["eval_loss"]) / base["eval_loss"]
    loss_line = f"eval_loss {base['eval_loss']:.4f} -> {tuned['eval_loss']:.4f} ({improvement:+.1%})"
    if improvement >= min_loss_improvement and tuned["eval_loss"] < base["eval_loss"]:
        notes.append(f"{loss_line}, required >= {min_loss_improvement:.1%}")
    else:
        failures.append(
            f"{loss_line} is short of the required {min_loss_improvement:.1%} improvement "
            "(lower min_loss_improvement to accept it)"
        )
    base_ppl = base.get("perplexity", _perplexity(base["eval_loss"]))
    tuned_ppl = tuned.get("perplexity", _perplexity(tuned["eval_loss"]))
    ppl_improvement = (base_ppl - tuned_ppl) / base_ppl
    ppl_line = f"perplexity {base_ppl:.2f} -> {tuned_ppl:.2f} ({ppl_improvement:+.1%})"
    if ppl_improvement >= min_perplexity_improvement:
        notes.append(f"{ppl_line}, required >= {min_perplexity_improvement:.1%}")
    else:
        failures.append(
            f"{ppl_line} is short of the required {min_perplexity_improvement:.1%} improvement "
            "(lower min_perplexity_improvement to accept it)"
        )
    for task, b in sorted((base_tasks or {}).items()):
        t = (tuned_tasks or {})[task]
        line = f"{task} {b['metric']} {b['score']:.4f} -> {t['score']:.4f}"
        regression = b["score"] - t["score"] if b.get("higher_is_better", True) else t["score"] - b["score"]
        if regression > max_task_regression:
            failures.append(
                f"{line} regresses by more than {max_task_regression:.4f} (raise max_task_regression to accept it)"
            )
        else:
            notes.append(line)
    if failures:
        return False, "; ".join(failures) + "; not deploying"
    return True, "; ".join(notes)


@dataclass(frozen=True)
class EvalOptions:
    """What ``evaluate`` scores and the deploy gate's rules (components/settings/'s evaluate settings).

    Attributes:
        max_samples: at most this many held-out rows, and examples per lm-eval task (0 = all).
        min_loss_improvement, min_perplexity_improvement, max_task_regression: the gate rules (see ``gate``).
        eval_prompts: ``builtin:sample`` (bundled Korean/English prompts) or a JSONL file of conversations.
        max_new_tokens: length limit of each generated answer.
        lm_eval_tasks: lm-evaluation-harness task names; empty: none run.
    """

    max_samples: int
    min_loss_improvement: float
    min_perplexity_improvement: float = 0.0
    eval_prompts: str = BUILTIN_PROMPTS
    max_new_tokens: int = 64
    lm_eval_tasks: list | None = None
    max_task_regression: float = 0.01


def evaluate(
    base_model: str,
    tuned_model: str,
    dataset_path: str,
    options: EvalOptions,
    *,
    train_dir: str | None = None,
    stage_dirs: dict | None = None,
    preference_path: str | None = None,
    before_dpo: str | None = None,
    serving_reference: str | None = None,
    grpo: dict | None = None,
    rm: dict | None = None,
    judge: dict | None = None,
) -> dict:
    """Score base and tuned on the same held-out tokens, prompts and tasks; return metrics, the gate
    decision and a Markdown report.

    Args:
        base_model, tuned_model: model folders (config, weights, tokenizer).
        dataset_path: a prepared dataset (its ``eval`` split is scored).
        options: what is scored (rows, prompts, answer length, lm-eval tasks) and the gate's rules.
        train_dir: the trainer's output folder (checkpoints with its log): the report draws the loss curve.
        stage_dirs: stage -> its output folder, when several stages ran: the report shows each one's metrics.
        preference_path: the dpo stage's prepared pairs: base, ``before_dpo`` and tuned are scored on their eval split
            (preference accuracy, components/evaluate/stage_metrics.py).
        serving_reference: where to write what the served tuned model must reproduce: a few held-out examples'
            per-token log-probabilities and greedy first tokens (components/models/logprobs.py); the deploy step
            compares the server with it.
        grpo: when the grpo stage ran: ``prompts_path`` (its prepared prompts), ``before`` (the model it started
            from), ``rewards``, ``pattern``, ``length_budget``, ``max_new_tokens``, ``temperature``, ``reward_model``,
            ``reward_function``, ``min_reward_improvement``: mean rewards on held-out prompts and the reward gate
            (components/evaluate/reward_gain.py).
        rm: when the rm stage ran: ``model`` (its final folder) and ``pairs_path`` (its prepared pairs): the reward
            model's pairwise accuracy on held-out pairs.
        judge: the judged evaluation, when judge_endpoint names a judge: ``endpoint``, ``model``, ``rubric``,
            ``max_tokens``, ``log_dir``, ``min_judge_score``, ``min_judge_win_rate``, ``min_judged_fraction``: both
            models' answers to the prompts scored on the rubric, with reasons, and its gate
            (components/evaluate/judge.py).

    Raises:
        ValueError: bad prompts file, dataset, task list or length, before any model is loaded.
    """
    started = time.time()
    o = options
    tasks, prompts, rows = _checked_inputs(o, dataset_path, judge)
    log.info(
        "evaluating %s (base) vs %s (tuned): %d held-out rows, %d prompts, tasks %s",
        base_model,
        tuned_model,
        len(rows),
        len(prompts),
        tasks or "none",
    )
    base, tuned = _score_both(base_model, tuned_model, dataset_path, rows, prompts, tasks, o, serving_reference)
    if serving_reference is not None:
        write_reference(serving_reference, tuned.pop("serving_reference"))
    passed, reason = gate(
        base,
        tuned,
        o.min_loss_improvement,
        min_perplexity_improvement=o.min_perplexity_improvement,
        base_tasks=base["tasks"],
        tuned_tasks=tuned["tasks"],
        max_task_regression=o.max_task_regression,
    )
    metrics = _model_metrics(base, tuned, len(prompts), tasks)
    stages = stage_metrics(stage_dirs or {})
    preference = {}
    if preference_path:
        models = {"base": base_model, **({"before dpo": before_dpo} if before_dpo else {}), "tuned": tuned_model}
        preference = _preference_check(models, preference_path, o.max_samples, metrics)
    reward_eval = rm_eval = None
    if grpo:
        reward_eval, ok, line = _reward_check(grpo, base_model, tuned_model, o.max_samples, metrics)
        passed, reason = _also_gated(passed, reason, ok, line)
    judged = None
    if judge:  # both models' answers, scored by the judge on the rubric
        judged, ok, line = _judge_check(
            judge, base_model, prompts, {"base": base["answers"], "tuned": tuned["answers"]}
        )
        metrics.update(judge_metrics(judged))
        passed, reason = _also_gated(passed, reason, ok, line)
    if rm:
        rm_eval = reward_model_accuracy(rm["model"], rm["pairs_path"], o.max_samples)
        metrics["reward_model_accuracy"] = rm_eval["accuracy"]
    for stage, m in stages.items():
        for key in ("eval_loss", "eval_rewards/accuracies"):
            if key in m:
                metrics[f"{stage}_{key.replace('/', '_')}"] = m[key]
    metrics["seconds"] = round(time.time() - started, 2)
    log.info("%s", reason)
    report = build_report(
        base_model,
        tuned_model,
        base,
        tuned,
        prompts,
        passed,
        reason,
        train_dir,
        extra=stages_section(stages, preference) + rewards_section(reward_eval, rm_eval) + judge_section(judged, _cell),
    )
    return {
        "metrics": metrics,
        "passed": passed,
        "reason": reason,
        "report": report,
        "answers": {"base": base["answers"], "tuned": tuned["answers"]},
        "prompts": [messages[-1]["content"] for messages in prompts],
        "judge": judged,
    }


def _checked_inputs(
    o: EvalOptions, dataset_path: str, judge: dict | None
) -> tuple[list, list[list[dict]], datasets.Dataset]:
    """The task names, the prompts and the held-out rows, each checked before any model is loaded."""
    tasks = list(o.lm_eval_tasks or [])
    if o.max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be >= 1, got {o.max_new_tokens}")
    prompts = load_prompts(o.eval_prompts)
    if judge:
        load_rubric(judge["rubric"])  # a bad rubric fails before any model is loaded
    check_tasks(tasks)
    return tasks, prompts, load_eval_rows(dataset_path, o.max_samples)


def _score_both(
    base_model: str,
    tuned_model: str,
    dataset_path: str,
    rows,
    prompts: list[list[dict]],
    tasks: list,
    o: EvalOptions,
    serving_reference: str | None,
) -> tuple[dict, dict]:
    """Base's and tuned's scores (``score_model``) with their lm-eval task scores under ``tasks``; the tuned one also
    holds its ``serving_reference`` when one is to be written."""
    gpus = torch.cuda.device_count()
    use_vllm = bool(gpus) and importlib.util.find_spec("vllm") is not None
    scores = {}
    for role, path in (("base", base_model), ("tuned", tuned_model)):
        t0 = time.time()
        scores[role] = score_model(
            path,
            rows,
            prompts,
            o.max_new_tokens,
            dataset_path,
            serving_reference=role == "tuned" and serving_reference is not None,
        )
        scores[role]["tasks"] = run_tasks(path, tasks, o.max_samples, use_vllm, gpus)
        log.info(
            "%-5s eval_loss %.4f over %d tokens, %d answers, %d tasks in %.1fs",
            role,
            scores[role]["eval_loss"],
            scores[role]["tokens"],
            len(prompts),
            len(tasks),
            time.time() - t0,
        )
    return scores["base"], scores["tuned"]


def _model_metrics(base: dict, tuned: dict, prompts_answered: int, tasks: list) -> dict:
    """The metrics of base against tuned: held-out loss, perplexity, their deltas, and each lm-eval task's score."""
    metrics = {
        "base_eval_loss": base["eval_loss"],
        "eval_loss": tuned["eval_loss"],
        "base_perplexity": base["perplexity"],
        "perplexity": tuned["perplexity"],
        "eval_loss_delta": tuned["eval_loss"] - base["eval_loss"],
        "perplexity_delta": tuned["perplexity"] - base["perplexity"],
        "tokens_evaluated": tuned["tokens"],
        "prompts_answered": prompts_answered,
    }
    for task in tasks:
        metrics[f"base_{task}_{base['tasks'][task]['metric']}"] = base["tasks"][task]["score"]
        metrics[f"{task}_{tuned['tasks'][task]['metric']}"] = tuned["tasks"][task]["score"]
    return metrics


def _reward_check(
    grpo: dict, base_model: str, tuned_model: str, max_samples: int, metrics: dict
) -> tuple[dict, bool, str]:
    """The grpo stage's check: each model's mean reward on held-out prompts (into ``metrics``) and the reward gate's
    verdict and line."""
    roles = {
        "base": base_model,
        **({"before grpo": grpo["before"]} if grpo["before"] != base_model else {}),
        "tuned": tuned_model,
    }
    reward_eval = reward_scores(
        roles,
        grpo["prompts_path"],
        grpo["rewards"],
        temperature=grpo["temperature"],
        pattern=grpo["pattern"],
        length_budget=grpo["length_budget"],
        max_new_tokens=grpo["max_new_tokens"],
        reward_model=grpo["reward_model"],
        reward_function=grpo["reward_function"],
        max_prompts=max_samples,
    )
    for role in roles:
        metrics[{"base": "base_", "before grpo": "before_grpo_", "tuned": ""}[role] + "mean_reward"] = reward_eval[
            role
        ]["mean_reward"]
    ok, line = reward_gate(
        {"before grpo": reward_eval.get("before grpo", reward_eval["base"]), "tuned": reward_eval["tuned"]},
        grpo["min_reward_improvement"],
    )
    return reward_eval, ok, line


def _preference_check(models: dict, preference_path: str, max_samples: int, metrics: dict) -> dict:
    """The dpo stage's check: each model's preference accuracy on the held-out pairs (into ``metrics``)."""
    preference = preference_scores(models, preference_path, max_samples)
    for role, score in preference.items():
        prefix = {"base": "base_", "before dpo": "before_dpo_", "tuned": ""}[role]
        metrics[f"{prefix}preference_accuracy"] = score["accuracy"]
    return preference


def _judge_check(judge: dict, base_model: str, prompts: list[list[dict]], answers: dict) -> tuple[dict, bool, str]:
    """The judged evaluation: both models' ``answers`` scored by the judge on the rubric, and its gate's verdict and
    line."""
    judged = run_judge(judge, base_model=base_model, prompts=prompts, answers=answers)
    ok, line = judge_gate(
        judged,
        min_judge_score=judge["min_judge_score"],
        min_judge_win_rate=judge["min_judge_win_rate"],
        min_judged_fraction=judge.get("min_judged_fraction", 0.0),
    )
    return judged, ok, line


def _also_gated(passed: bool, reason: str, ok: bool, line: str) -> tuple[bool, str]:
    """The decision with one more gate's verdict ``ok`` and its ``line``: a pass only when both passed; a failing
    reason names the failed gates only and ends with '; not deploying'."""
    if passed and ok:
        return True, f"{reason}; {line}"
    kept = reason.removesuffix("; not deploying")
    return False, f"{kept}; {line}; not deploying" if not passed else f"{line}; not deploying"


def _cell(text: str) -> str:
    """Text safe inside one Markdown table cell: HTML-escaped, pipes escaped, newlines as <br>."""
    return html.escape(text).replace("|", "\\|").replace("\n", "<br>") or "*(empty)*"


def build_report(
    base_model: str,
    tuned_model: str,
    base: dict,
    tuned: dict,
    prompts: list[list[dict]],
    passed: bool,
    reason: str,
    train_dir: str | None = None,
    extra: Sequence[str] = (),
) -> str:
    """The Markdown report the KFP UI renders: the decision, the numbers, the training curve (with
    ``train_dir``), ``extra`` sections (stages, preference accuracy), task scores, answers side by side."""
    lines = [
        "# Evaluation",
        "",
        f"**{'PASSED' if passed else 'NOT PASSED'}**: {reason}",
        "",
        "| model | held-out loss (per label token) | perplexity |",
        "|---|---|---|",
        f"| base `{base_model}` | {base['eval_loss']:.4f} | {base['perplexity']:.2f} |",
        f"| tuned `{tuned_model}` | {tuned['eval_loss']:.4f} | {tuned['perplexity']:.2f} |",
        f"| delta | {tuned['eval_loss'] - base['eval_loss']:+.4f} | {tuned['perplexity'] - base['perplexity']:+.2f} |",
        "",
        f"{LOSS_DEFINITION.format(tokens=tuned['tokens'], rows=tuned['rows'])} Compare models with these numbers: "
        "an `eval_loss` computed another way (Hugging Face Trainer's default is a mean of per-batch mean losses, "
        "which weights batches, not tokens) differs even on the same rows.",
    ]
    if train_dir:
        lines += ["", *training_section(train_dir, base["eval_loss"], tuned["eval_loss"])]
    if extra:
        lines += ["", *extra]
    if base["tasks"]:
        lines += [
            "",
            "## lm-evaluation-harness",
            "",
            "| task | metric | base | tuned | delta |",
            "|---|---|---|---|---|",
        ]
        for task, b in sorted(base["tasks"].items()):
            t = tuned["tasks"][task]["score"]
            lines.append(f"| {task} | {b['metric']} | {b['score']:.4f} | {t:.4f} | {t - b['score']:+.4f} |")
    lines += ["", "## Answers (greedy)", "", "| # | prompt | base | tuned |", "|---|---|---|---|"]
    for i, (messages, a, b) in enumerate(zip(prompts, base["answers"], tuned["answers"], strict=True), 1):
        lines.append(f"| {i} | {_cell(messages[-1]['content'])} | {_cell(a)} | {_cell(b)} |")
    return "\n".join(lines) + "\n"
