"""Optional lm-evaluation-harness tasks (``lm-eval==0.4.13``), scored for base and tuned with the same settings.

Nothing is imported and nothing runs when the task list is empty. Each model is scored in its own
process (``run_isolated``), on vLLM where it is installed and GPUs are present, else on transformers
(``parallelize`` spreads the model over the GPUs like ``device_map="auto"``). The harness downloads its
task data from the Hugging Face Hub (or reads ``HF_HOME``'s cache), so the evaluate pod needs either.
"""

from __future__ import annotations

import importlib.util
import math

from components.evaluate.isolated import run_isolated

LM_EVAL_PIN = "lm-eval==0.4.13"
# The metric a task is judged on: the first of these it reports, else its first numeric metric.
PREFERRED_METRICS = ("acc_norm", "acc", "exact_match")


def check_tasks(tasks: list) -> None:
    """Fail before any model is loaded when ``tasks`` is malformed or the harness is not installed."""
    if not tasks:
        return
    if not isinstance(tasks, list) or not all(isinstance(t, str) and t.strip() for t in tasks):
        raise ValueError(f"lm_eval_tasks must be a list of task names such as ['arc_easy', 'hellaswag'], got {tasks!r}")
    if not installed():
        raise ValueError(
            f"lm_eval_tasks {tasks} need lm-evaluation-harness, which is not installed in this image: "
            f"install {LM_EVAL_PIN} (add the vllm extra for vLLM), or pass lm_eval_tasks=[]"
        )


def installed() -> bool:
    """Whether lm-evaluation-harness can be imported here (the components image has it: the ``eval`` extra)."""
    return importlib.util.find_spec("lm_eval") is not None


def unknown_tasks_problem(tasks: list) -> str | None:
    """One line naming the entries of ``tasks`` that lm-evaluation-harness's task registry does not know (a task, a
    group such as ``mmlu``, a tag, or a glob such as ``arc_*``: what ``simple_evaluate`` resolves), with the closest
    names; None when it knows them all. Needs the harness installed (``installed()``); the index is built from its
    task configs, without downloading any data."""
    import difflib

    from lm_eval.tasks import TaskManager

    manager = TaskManager()  # lm_eval/tasks/manager.py: all_tasks (tasks, groups, tags) and match_tasks (globs)
    unknown = [t for t in tasks if not manager.match_tasks([t])]
    if not unknown:
        return None
    hints = [
        f"{t!r}: {', '.join(close)}?" for t in unknown if (close := difflib.get_close_matches(t, manager.all_tasks))
    ]
    closest = f" (closest: {'; '.join(hints)})" if hints else ""
    return (
        f"lm_eval_tasks: {unknown} are not tasks, groups or tags lm-evaluation-harness knows{closest}; "
        f"pick from its {len(manager.all_tasks):,} names (lm_eval.tasks.TaskManager().all_tasks)"
    )


def harness_arguments(model_path: str, tasks: list, limit: int, use_vllm: bool, gpus: int) -> dict:
    """The keyword arguments of ``lm_eval.simple_evaluate`` for one model (``limit`` 0: every example)."""
    if use_vllm:
        model, model_args = (
            "vllm",
            {
                "pretrained": model_path,
                "tensor_parallel_size": gpus,
                "dtype": "bfloat16",
                "gpu_memory_utilization": 0.85,
            },
        )
    else:
        model_args = {
            "pretrained": model_path,
            "dtype": "bfloat16" if gpus else "float32",
            "device": "cuda" if gpus else "cpu",
        }
        if gpus > 1:
            model_args["parallelize"] = True
        model = "hf"
    return {
        "model": model,
        "model_args": model_args,
        "tasks": list(tasks),
        "limit": limit or None,
        "batch_size": "auto" if gpus else 8,
        "log_samples": False,
    }


def task_scores(results: dict) -> dict[str, dict]:
    """``{task: {"metric": name, "score": value, "higher_is_better": bool}}`` from ``simple_evaluate``'s results."""
    scores = {}
    for task, metrics in results["results"].items():
        numeric = {
            k.split(",")[0]: v
            for k, v in metrics.items()
            if isinstance(v, (int, float))
            and not isinstance(v, bool)
            and "_stderr" not in k
            and not (isinstance(v, float) and math.isnan(v))
        }
        metric = next((m for m in PREFERRED_METRICS if m in numeric), next(iter(numeric), None))
        if metric is not None:
            higher = results.get("higher_is_better", {}).get(task, {}).get(metric, True)
            scores[task] = {"metric": metric, "score": float(numeric[metric]), "higher_is_better": bool(higher)}
    return scores


def run_tasks(model_path: str, tasks: list, limit: int, use_vllm: bool, gpus: int) -> dict[str, dict]:
    """Score ``model_path`` on ``tasks``; ``{}`` (and no import of lm_eval) when ``tasks`` is empty."""
    if not tasks:
        return {}
    return run_isolated(_evaluate, harness_arguments(model_path, tasks, limit, use_vllm, gpus))


def _evaluate(kwargs: dict) -> dict[str, dict]:
    # Lazy and optional: lm-evaluation-harness comes with the package's ``eval`` extra only, for lm_eval_tasks.
    import lm_eval

    return task_scores(lm_eval.simple_evaluate(**kwargs))
