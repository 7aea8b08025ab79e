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
        settings: every setting, as validate_inputs resolved them (components/settings/): the evaluate
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
    (components/models/logprobs.py).
    """
    from collections import namedtuple

    from components.evaluate.run import evaluate_tuned_model
    from components.observe.process import start_step
    from components.settings import Settings

    start_step("evaluate_model")
    result = evaluate_tuned_model(
        Settings.from_flat(settings), model_path=model_path, dataset_path=dataset.metadata["path"], data_root=data_root
    )
    for name, value in result["metrics"].items():
        metrics.log_metric(name, value)
    with open(report.path, "w") as f:
        f.write(result["report"])
    return namedtuple("EvalOutputs", ["passed", "reason"])(result["passed"], result["reason"])
