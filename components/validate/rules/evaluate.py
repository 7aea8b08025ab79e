"""The evaluation step's rules: lm-eval task names, the prompt file of a local run, GPUs for the model, the judged
evaluation's endpoint, rubric and gates."""

from __future__ import annotations

from components.settings import Settings

# The largest model a cluster run scores on the evaluation pod's CPUs (eval_gpus=0): float32 forward passes on its
# 8 CPUs take about 2 x parameters FLOPs a token, at some 100 GFLOP/s, so 512 held-out rows of 1,000 tokens take
# hours for a 1B model and days for a 30B one.
CPU_EVAL_MAX_PARAMS = 1e9


def check_evaluate_settings(s: Settings) -> list[str | None]:
    """lm-eval task names are non-empty strings; a local run's eval_prompts file is there and well formed; a cluster
    run's evaluation pod has GPUs for a model of more than ``CPU_EVAL_MAX_PARAMS`` parameters."""
    tasks = s.evaluate.lm_eval_tasks
    errors: list[str | None] = []
    if not all(isinstance(t, str) and t.strip() for t in tasks):
        errors.append(f'lm_eval_tasks={tasks!r} must be a list of task names, e.g. ["hellaswag"]')
    elif tasks:
        errors.append(_lm_eval_tasks(s))
    if s.job.train_backend == "local":
        # The evaluation runs on this machine: read the prompts now, not after training. (On a cluster the file is on
        # a volume this step does not mount; the data step looks for it there.)
        from components.evaluate.prompts import load_prompts

        try:
            load_prompts(s.evaluate.eval_prompts)
        except (ValueError, OSError) as e:
            errors.append(str(e))
    else:
        errors.append(_eval_gpus(s))
    return errors + _judge(s)


def _lm_eval_tasks(s: Settings) -> str | None:
    """The task names against lm-evaluation-harness's registry, where it is installed: in the components image (the
    validate pod) and on a machine with the eval extra. A local run without it would fail after training: one error
    here. A cluster run checked from a machine without it is checked again by the validate pod."""
    from components.evaluate import harness

    if harness.installed():
        return harness.unknown_tasks_problem(s.evaluate.lm_eval_tasks)
    if s.job.train_backend == "local":
        return (
            f"lm_eval_tasks={s.evaluate.lm_eval_tasks!r}: lm-evaluation-harness is not installed on this machine, and "
            f"the local run's evaluation needs it: pip install '{harness.LM_EVAL_PIN}' (or the package's eval extra), "
            "or set lm_eval_tasks=[]"
        )
    return None


def _judge(s: Settings) -> list[str | None]:
    """The judged evaluation (components/evaluate/judge.py): an endpoint of a form it knows, served-base on a local
    run only, a model named for a URL, a gate only with a judge, a rubric it can read (where this machine sees it)
    and a min_judge_score within the rubric's scale. Whether the endpoint answers is asked after these
    (components/validate/checks.py)."""
    from components.evaluate.judge import BUILTIN_RUBRIC, SERVED_BASE, load_rubric
    from components.names import DNS1035_LABEL

    e = s.evaluate
    endpoint, local = e.judge_endpoint, s.job.train_backend == "local"
    errors: list[str | None] = []
    gates = [
        f"{name}={value:g}"
        for name, value in (("min_judge_score", e.min_judge_score), ("min_judge_win_rate", e.min_judge_win_rate))
        if value
    ]
    if not endpoint:
        if gates:
            errors.append(f"{' and '.join(gates)} gates on a judge, and judge_endpoint is empty; name the judge")
        return errors
    is_url = endpoint.startswith(("http://", "https://"))
    if endpoint == SERVED_BASE:
        if not local:
            errors.append(
                f"judge_endpoint={SERVED_BASE} serves the base model on this machine (train_backend=local); on a "
                "cluster name the InferenceService that serves the judge, or its URL"
            )
    elif not is_url and not DNS1035_LABEL.match(endpoint):
        errors.append(
            f"judge_endpoint={endpoint!r} is neither {SERVED_BASE}, an http(s):// URL nor an InferenceService name "
            "(DNS-1035)"
        )
    elif not is_url and local:
        errors.append(
            f"judge_endpoint={endpoint!r} names an InferenceService, which a local run cannot reach; use "
            f"{SERVED_BASE} or the judge's URL"
        )
    if is_url and not e.judge_model:
        errors.append(f"judge_endpoint={endpoint!r} is a URL: name the judge's model in judge_model")
    if local or e.judge_rubric == BUILTIN_RUBRIC:  # a cluster run's file is on a volume this step does not mount
        try:
            rubric = load_rubric(e.judge_rubric)
        except (ValueError, OSError) as exc:
            return [*errors, str(exc)]
        low, high = rubric["scale"]
        if e.min_judge_score and not low <= e.min_judge_score <= high:
            errors.append(
                f"min_judge_score={e.min_judge_score:g} is outside judge_rubric's scale {low:g}-{high:g}; use a "
                "score on that scale, or 0 for no gate"
            )
    return errors


def _eval_gpus(s: Settings) -> str | None:
    """eval_gpus=0 on a cluster for a model whose size is known here and too large for the pod's CPUs."""
    from components.models.shape import load_architecture, model_shape

    if s.evaluate.eval_gpus > 0:
        return None
    model = s.model.model_name_or_path
    config = load_architecture(model)
    if config is None:
        return None
    params = model_shape(config).total
    if params <= CPU_EVAL_MAX_PARAMS:
        return None
    return (
        f"eval_gpus=0 scores {model} ({params / 1e9:.1f}B parameters) on the evaluation pod's CPUs, which takes days "
        f"for a model this size; give the pod GPUs for its bf16 weights ({2 * params / 1024**3:.0f} GiB), "
        f"e.g. eval_gpus={s.job.gpus_per_node}"
    )
