"""evaluate_model as a KFP component: base vs tuned on the held-out split, and the deploy gate."""

from typing import NamedTuple

from kfp import dsl
from kfp.dsl import Dataset, Input, Markdown, Metrics, Model, Output

from components.version import COMPONENTS_IMAGE


@dsl.component(base_image=COMPONENTS_IMAGE, install_kfp_package=False)
def evaluate_model(
    dataset: Input[Dataset],
    model: Input[Model],
    model_name_or_path: str,
    eval_max_samples: int,
    min_loss_improvement: float,
    data_root: str,
    metrics: Output[Metrics],
    report: Output[Markdown],
    min_perplexity_improvement: float = 0.0,
    eval_prompts: str = "builtin:sample",
    max_new_tokens: int = 64,
    lm_eval_tasks: list = [],
    max_task_regression: float = 0.01,
) -> NamedTuple("EvalOutputs", [("passed", bool), ("reason", str)]):
    """Score the base and the tuned model on the same held-out tokens and prompts, and decide whether to deploy.

    On GPUs, vLLM scores and generates where the image has it (each model in its own process, tensor
    parallel over the step's GPUs); otherwise transformers with ``device_map="auto"``.

    Args:
        dataset: prepare_dataset's output; its ``eval`` split is scored (assistant tokens only).
        model: train_model's output; ``metadata.path`` is the tuned model's folder.
        model_name_or_path: the base model the run started from.
        eval_max_samples: score at most this many held-out rows, and examples per lm-eval task (0 = all);
            bounds the step's time.
        min_loss_improvement: relative eval-loss improvement required to pass (0.0 = any improvement).
        data_root: where the data volume is mounted (built-in models are cached there).
        min_perplexity_improvement: relative perplexity improvement required to pass (0.0 = no worse).
        eval_prompts: ``builtin:sample`` (16 bundled Korean/English prompts) or a JSONL file of
            ``{"messages": [...]}`` conversations ending with a user turn (a path the step can read, e.g. on
            the data volume); base and tuned answers appear side by side in the report.
        max_new_tokens: length limit of each generated answer (greedy decoding); 64 keeps a CPU run short,
            a thinking model (Qwen3-...-Thinking) needs 512 or more to get past its reasoning.
        lm_eval_tasks: lm-evaluation-harness task names (e.g. ``["arc_easy"]``); empty: none run, nothing is
            imported. Needs ``lm-eval==0.4.13`` in the image and the tasks' data reachable (Hub or HF_HOME).
        max_task_regression: largest drop of a task's score (absolute, 0..1) that still passes.

    Returns:
        metrics: eval_loss (cross-entropy per label token over every held-out label token), perplexity
            (exp of it), base values, deltas, task scores (``<task>_<metric>`` and ``base_<task>_<metric>``),
            tokens evaluated, prompts answered, seconds.
        report: Markdown the KFP UI renders: the decision, the numbers, the training loss curve (a PNG drawn
            from the trainer's log in its last complete checkpoint), task scores, answers side by side.
        passed: whether the tuned model clears the gate.
        reason: the numbers behind the decision, in one line.
    """
    import logging
    import os
    from collections import namedtuple

    from components.evaluate.evaluate import evaluate
    from components.models.hub import resolve_model

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    base = resolve_model(model_name_or_path, os.path.join(data_root, "cache"))
    result = evaluate(
        base, model.metadata["path"], dataset.metadata["path"], eval_max_samples, min_loss_improvement,
        min_perplexity_improvement=min_perplexity_improvement, eval_prompts=eval_prompts,
        max_new_tokens=max_new_tokens, lm_eval_tasks=lm_eval_tasks, max_task_regression=max_task_regression,
        train_dir=os.path.dirname(model.metadata["path"]),
    )
    for name, value in result["metrics"].items():
        metrics.log_metric(name, value)
    with open(report.path, "w") as f:
        f.write(result["report"])
    return namedtuple("EvalOutputs", ["passed", "reason"])(result["passed"], result["reason"])
