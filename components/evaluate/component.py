"""evaluate_model as a KFP component: base vs tuned on the held-out split, and the deploy gate."""

from typing import NamedTuple

from kfp import dsl
from kfp.dsl import Dataset, Input, Markdown, Metrics, Output

from components.version import COMPONENTS_IMAGE


@dsl.component(base_image=COMPONENTS_IMAGE, install_kfp_package=False)
def evaluate_model(
    dataset: Input[Dataset],
    model_path: str,
    settings: dict,
    data_root: str,
    metrics: Output[Metrics],
    report: Output[Markdown],
) -> NamedTuple("EvalOutputs", [("passed", bool), ("reason", str)]):
    """Score the base and the tuned model on the same held-out tokens and prompts, and decide whether to deploy.

    On GPUs, vLLM scores and generates where the image has it (each model in its own process, tensor
    parallel over the step's GPUs); otherwise transformers with ``device_map="auto"``. Base and tuned answers to
    ``eval_prompts`` appear side by side in the report; lm-evaluation-harness tasks run when ``lm_eval_tasks``
    names any (``lm-eval==0.4.13`` in the image, the tasks' data reachable).

    Args:
        dataset: prepare_dataset's output; its ``eval`` split is scored (assistant tokens only).
        model_path: the last stage's final folder (train_model's ``model_path``): the tuned model.
        settings: every setting, as validate_inputs resolved them (components/settings.py): the evaluate
            settings (the gate's thresholds, prompts, answer length, lm-eval tasks) and model_name_or_path,
            the base model the run started from.
        data_root: where the data volume is mounted (built-in models are cached there).

    Returns:
        metrics: eval_loss (cross-entropy per label token over every held-out label token), perplexity
            (exp of it), base values, deltas, task scores (``<task>_<metric>`` and ``base_<task>_<metric>``),
            tokens evaluated, prompts answered, seconds.
        report: Markdown the KFP UI renders: the decision, the numbers, the training loss curve (a PNG drawn
            from the trainer's log in its last complete checkpoint), task scores, answers side by side.
        passed: whether the tuned model clears the gate.
        reason: the numbers behind the decision, in one line.

    Beside the tuned model's folder it writes ``serving_check.json``: a few held-out examples' per-token
    log-probabilities and greedy first tokens, which deploy_model requires the server to reproduce
    (components/deploy/logprobs.py).
    """
    import json
    import logging
    import os
    from collections import namedtuple

    from components.deploy.logprobs import reference_path
    from components.evaluate.evaluate import evaluate
    from components.models.hub import resolve_model
    from components.paths import evaluation_path
    from components.settings import Settings
    from components.train.stages import dataset_folder, stage_folder, stage_overrides, started_from

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    s = Settings.from_flat(settings)
    e = s.evaluate
    base = resolve_model(s.train.model_name_or_path, os.path.join(data_root, "cache"))
    # The stages' folders and data sit beside the final model's and the sft data's (components/train/stages.py).
    run_models = os.path.dirname(os.path.dirname(model_path))
    stages = s.stages.stages
    stage_dirs = {stage: os.path.join(run_models, stage_folder(stage)) for stage in stages}
    data_dir = os.path.dirname(dataset.metadata["path"])
    preference_path = os.path.join(data_dir, dataset_folder("dpo")) if "dpo" in stages else None
    # The model each stage started from (rm's model is not the next stage's: stages.py).
    started = started_from(stages, stage_dirs.__getitem__)
    before_dpo, before_grpo = started.get("dpo"), started.get("grpo") or base
    t = s.train
    grpo = None
    if "grpo" in stages:
        over = stage_overrides(s, "grpo")
        grpo = {
            "prompts_path": os.path.join(data_dir, dataset_folder("grpo")),
            "before": before_grpo,
            "rewards": over.get("grpo_rewards", t.grpo_rewards),
            "pattern": over.get("grpo_answer_pattern", t.grpo_answer_pattern),
            "length_budget": over.get("grpo_length_budget", t.grpo_length_budget),
            "max_new_tokens": over.get("grpo_max_completion_length", t.grpo_max_completion_length),
            "temperature": over.get("grpo_temperature", t.grpo_temperature),
            "reward_model": over.get("grpo_reward_model", t.grpo_reward_model)
            or os.path.join(stage_dirs.get("rm", ""), "final"),
            "reward_function": over.get("grpo_reward_function", t.grpo_reward_function),
            "min_reward_improvement": e.min_reward_improvement,
        }
    rm = (
        {"model": os.path.join(stage_dirs["rm"], "final"), "pairs_path": os.path.join(data_dir, dataset_folder("rm"))}
        if "rm" in stages
        else None
    )
    result = evaluate(
        base,
        model_path,
        dataset.metadata["path"],
        e.eval_max_samples,
        e.min_loss_improvement,
        min_perplexity_improvement=e.min_perplexity_improvement,
        eval_prompts=e.eval_prompts,
        max_new_tokens=e.max_new_tokens,
        lm_eval_tasks=e.lm_eval_tasks,
        max_task_regression=e.max_task_regression,
        train_dir=os.path.dirname(model_path),
        stage_dirs=stage_dirs if len(stages) > 1 else None,
        preference_path=preference_path,
        before_dpo=before_dpo,
        serving_reference=reference_path(model_path),
        grpo=grpo,
        rm=rm,
    )
    from components.observe.langfuse_trace import trace_evaluation

    # Every generation, with both models' identities, to Langfuse when langfuse_secret's keys are set.
    trace_evaluation(
        run_id=os.path.basename(run_models),
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
        "metrics": result["metrics"],
        "passed": result["passed"],
        "reason": result["reason"],
        "prompts": result["prompts"],
        "answers": result["answers"],
        "report": result["report"],
    }
    with open(evaluation_path(model_path), "w") as f:
        json.dump(record, f)
    for name, value in result["metrics"].items():
        metrics.log_metric(name, value)
    with open(report.path, "w") as f:
        f.write(result["report"])
    return namedtuple("EvalOutputs", ["passed", "reason"])(result["passed"], result["reason"])
