"""The evaluation step's rules: lm-eval task names, the prompt file of a local run, GPUs for the model."""

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
    if s.cluster.train_backend == "local":
        # The evaluation runs on this machine: read the prompts now, not after training. (On a cluster the file is on
        # a volume this step does not mount; the data step looks for it there.)
        from components.evaluate.prompts import load_prompts

        try:
            load_prompts(s.evaluate.eval_prompts)
        except (ValueError, OSError) as e:
            errors.append(str(e))
    else:
        errors.append(_eval_gpus(s))
    return errors


def _eval_gpus(s: Settings) -> str | None:
    """eval_gpus=0 on a cluster for a model whose size is known here and too large for the pod's CPUs."""
    from components.models.shape import load_architecture, model_shape

    if s.evaluate.eval_gpus > 0:
        return None
    model = s.train.model_name_or_path
    config = load_architecture(model)
    if config is None:
        return None
    params = model_shape(config).total
    if params <= CPU_EVAL_MAX_PARAMS:
        return None
    return (
        f"eval_gpus=0 scores {model} ({params / 1e9:.1f}B parameters) on the evaluation pod's CPUs, which takes days "
        f"for a model this size; give the pod GPUs for its bf16 weights ({2 * params / 1024**3:.0f} GiB), "
        f"e.g. eval_gpus={s.cluster.gpus_per_node}"
    )
