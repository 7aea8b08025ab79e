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
) -> NamedTuple("EvalOutputs", [("passed", bool), ("reason", str)]):
    """Score the base and the tuned model on the same held-out tokens and decide whether to deploy.

    Args:
        dataset: prepare_dataset's output; its ``eval`` split is scored (assistant tokens only).
        model: train_model's output; ``metadata.path`` is the tuned model's folder.
        model_name_or_path: the base model the run started from.
        eval_max_samples: score at most this many held-out rows (0 = all); bounds the step's time.
        min_loss_improvement: relative eval-loss improvement required to pass (0.0 = any improvement).
        data_root: where the data volume is mounted (built-in models are cached there).

    Returns:
        metrics: eval_loss, perplexity, base values, delta, tokens evaluated, seconds.
        report: a Markdown table the KFP UI renders.
        passed: whether the tuned model clears the gate.
        reason: the numbers behind the decision, in one line.
    """
    import logging
    import os
    from collections import namedtuple

    from components.evaluate.evaluate import evaluate
    from components.models.tiny import resolve_model

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    base = resolve_model(model_name_or_path, os.path.join(data_root, "cache"))
    result = evaluate(base, model.metadata["path"], dataset.metadata["path"], eval_max_samples, min_loss_improvement)
    for name, value in result["metrics"].items():
        metrics.log_metric(name, value)
    with open(report.path, "w") as f:
        f.write(result["report"])
    return namedtuple("EvalOutputs", ["passed", "reason"])(result["passed"], result["reason"])
