"""The evaluation step's work (evaluate_model, components/evaluate/component.py) as a plain function, testable
without KFP: the run's base and tuned model scored on the same held-out data and prompts, each stage's own checks,
the deploy gate, and the result recorded beside the model. No ML library at import: ``evaluate`` loads them."""

from __future__ import annotations

import json
import os

from components.models.logprobs import reference_path
from components.paths import evaluation_path
from components.settings import Settings
from components.stages import dataset_folder, stage_folder, stage_trainer, started_from


def stage_checks(s: Settings, *, base: str, model_path: str, dataset_path: str) -> dict:
    """What ``evaluate`` needs beyond the run's base and tuned model to check each of the run's stages: their
    folders (``stage_dirs``, for a run of several stages), the dpo stage's preference pairs and the model it started
    from, the grpo stage's prompts and reward settings (``grpo``) and the reward model with its pairs (``rm``).

    The stages' folders and data sit beside the final model's (``model_path``, ``<run>/<stage folder>/final``) and
    the sft data's (``dataset_path``) (components/stages.py).
    """
    run_models = os.path.dirname(os.path.dirname(model_path))
    stages = s.stages.stages
    stage_dirs = {stage: os.path.join(run_models, stage_folder(stage)) for stage in stages}
    data_dir = os.path.dirname(dataset_path)
    # The model each stage started from (rm's model is not the next stage's: stages.py).
    started = started_from(stages, stage_dirs.__getitem__)
    e = s.evaluate
    grpo = None
    if "grpo" in stages:
        p = stage_trainer(s, "grpo").preference  # the grpo stage's own settings (stage_settings) over the run's
        grpo = {
            "prompts_path": os.path.join(data_dir, dataset_folder("grpo")),
            "before": started.get("grpo") or base,
            "rewards": p.grpo_rewards,
            "pattern": p.grpo_answer_pattern,
            "length_budget": p.grpo_length_budget,
            "max_new_tokens": p.grpo_max_completion_length,
            "temperature": p.grpo_temperature,
            "reward_model": p.grpo_reward_model or os.path.join(stage_dirs.get("rm", ""), "final"),
            "reward_function": p.grpo_reward_function,
            "min_reward_improvement": e.min_reward_improvement,
        }
    rm = (
        {"model": os.path.join(stage_dirs["rm"], "final"), "pairs_path": os.path.join(data_dir, dataset_folder("rm"))}
        if "rm" in stages
        else None
    )
    return {
        "stage_dirs": stage_dirs if len(stages) > 1 else None,
        "preference_path": os.path.join(data_dir, dataset_folder("dpo")) if "dpo" in stages else None,
        "before_dpo": started.get("dpo"),
        "grpo": grpo,
        "rm": rm,
    }


def judge_config(s: Settings, *, log_dir: str) -> dict | None:
    """``evaluate``'s ``judge`` from the judge settings (components/evaluate/judge.py); None when judge_endpoint is
    empty. ``log_dir``: where the served base's server log goes (``judge_serve.log``)."""
    e = s.evaluate
    if not e.judge_endpoint:
        return None
    return {
        "endpoint": e.judge_endpoint,
        "model": e.judge_model,
        "rubric": e.judge_rubric,
        "max_tokens": e.judge_max_tokens,
        "log_dir": log_dir,
        "min_judge_score": e.min_judge_score,
        "min_judge_win_rate": e.min_judge_win_rate,
        "min_judged_fraction": e.min_judged_fraction,
    }


def evaluate_tuned_model(s: Settings, *, model_path: str, dataset_path: str, data_root: str) -> dict:
    """Score the run's base model (``model_name_or_path``, resolved into the cache on the data volume) and the tuned
    one (``model_path``, the last stage's final folder) on the held-out split at ``dataset_path``, with the evaluate
    settings (the gate's thresholds, prompts, answer length, lm-eval tasks).

    Beside the tuned model it writes ``serving_check.json`` (what deploy_model requires the server to reproduce) and
    ``evaluation.json`` (the result the variants' comparison reads, with the judged evaluation's scores and reasons
    under ``judge`` when judge_endpoint names a judge); every generation goes to Langfuse when
    langfuse_secret's keys are set. Returns ``evaluate``'s result: ``metrics``, ``report``, ``passed``, ``reason``,
    ``prompts`` and ``answers``.
    """
    from components.evaluate.base_vs_tuned import (  # torch, transformers, datasets: when evaluating
        EvalOptions,
        evaluate,
    )
    from components.models.resolve import resolve_model

    e = s.evaluate
    base = resolve_model(s.model.model_name_or_path, os.path.join(data_root, "cache"))
    result = evaluate(
        base,
        model_path,
        dataset_path,
        EvalOptions(
            e.eval_max_samples,
            e.min_loss_improvement,
            min_perplexity_improvement=e.min_perplexity_improvement,
            eval_prompts=e.eval_prompts,
            max_new_tokens=e.max_new_tokens,
            lm_eval_tasks=e.lm_eval_tasks,
            max_task_regression=e.max_task_regression,
        ),
        train_dir=os.path.dirname(model_path),
        serving_reference=reference_path(model_path),
        judge=judge_config(s, log_dir=os.path.dirname(model_path)),
        **stage_checks(s, base=base, model_path=model_path, dataset_path=dataset_path),
    )
    from components.langfuse_trace import trace_evaluation

    # Every generation, with both models' identities, to Langfuse when langfuse_secret's keys are set.
    trace_evaluation(
        run_id=os.path.basename(os.path.dirname(os.path.dirname(model_path))),
        base_model=base,
        tuned_model=model_path,
        prompts=result["prompts"],
        answers=result["answers"],
        metrics=result["metrics"],
        passed=result["passed"],
        reason=result["reason"],
        max_new_tokens=e.max_new_tokens,
    )
    # The run's comparison of its variants reads each one's result here (components/variants/compare.py).
    record = {
        "base_model": base,
        "tuned_model": model_path,
        **{k: result[k] for k in ("metrics", "passed", "reason", "prompts", "answers", "report")},
        **({"judge": result["judge"]} if result.get("judge") else {}),
    }
    with open(evaluation_path(model_path), "w") as f:
        json.dump(record, f)
    return result
