"""The search space of a hyper-parameter search and its rules: what a trial may vary, how, and every problem with a
search before anything is created (Katib's admission webhook and suggestion services, components/hpo/katib.py,
and the local Optuna search, components/hpo/local_search.py, share them).

It imports no Kubernetes or Katib library (only the settings model): the validate step checks a run's search with it.
"""

from __future__ import annotations

import math
import re

from components.settings import Settings, choices

# Katib's algorithms for a search over training settings (its default katib-config), and why each is there.
# Left out: hyperband (needs a resource parameter to grow), enas/darts (architecture search), pbt (hands
# checkpoints between trials).
ALGORITHMS = {
    "random": "independent random draws (hyperopt)",
    "tpe": "Tree-structured Parzen Estimator, each parameter on its own (hyperopt)",
    "multivariate-tpe": "TPE over the parameters jointly (Optuna)",
    "bayesianoptimization": "Gaussian-process Bayesian optimisation (scikit-optimize); draws every real "
    "parameter log-uniformly",
    "grid": "every combination, in order (Optuna); real parameters need a step",
    "cmaes": "CMA-ES (Goptuna); needs two or more min/max parameters, draws uniformly",
    "sobol": "Sobol quasi-random sequence (Goptuna); draws uniformly",
}
_LOG_SCALE = {"random", "tpe", "multivariate-tpe"}  # honour feasibleSpace.distribution logUniform for int and real

# Settings a trial may vary, by their name in the settings model, with their type. Not per_device_train_batch_size:
# memory fit is checked for one micro-batch size before any GPU is requested, and a larger one could OOM every
# trial. Not the paths, the model, the method or the DeepSpeed config: a trial is the run's job, only tuned.
SEARCHABLE = {
    "learning_rate": float,
    "warmup_ratio": float,
    "weight_decay": float,
    "max_grad_norm": float,
    "lr_scheduler_type": str,
    "gradient_accumulation_steps": int,
    "lora_r": int,
    "lora_alpha": int,
    "lora_dropout": float,
    "router_aux_loss_coef": float,
}
_SPEC_KEYS = {"min", "max", "scale", "step", "values"}
SCALES = ("linear", "log")


def _is_number(value, kind: type) -> bool:
    if isinstance(value, bool):
        return False
    return isinstance(value, int) if kind is int else isinstance(value, (int, float)) and math.isfinite(value)


def _grid_size(spec: dict) -> int:
    """How many values Katib's grid enumerates for one parameter (its search_space.convert_to_combinations)."""
    if "values" in spec:
        return len(spec["values"])
    step = spec.get("step", 1)
    return int(math.floor((spec["max"] - spec["min"]) / step + 1e-9)) + 1


def _parameter_errors(name: str, spec, algorithm: str, method: str) -> list[str]:
    """The problems of one search-space entry, each naming ``hpo_search_space.<name>`` and the fix."""
    where = f"hpo_search_space.{name}"
    if name not in SEARCHABLE:
        return [f"{where}: not a setting a trial can vary; use one of {sorted(SEARCHABLE)}"]
    kind = SEARCHABLE[name]
    if not isinstance(spec, dict):
        return [
            f'{where} must be an object: {{"min": 1e-5, "max": 1e-4, "scale": "log"}} or '
            f'{{"values": [8, 16, 32]}}, got {spec!r}'
        ]
    errors = []
    if name.startswith("lora_") and method == "full":
        errors.append(f"{where}: LoRA settings do nothing with method 'full'; remove it or set method to lora/qlora")
    unknown = sorted(set(spec) - _SPEC_KEYS)
    if unknown:
        return errors + [
            f"{where}: unknown keys {unknown}; use min, max, scale ({'/'.join(SCALES)}) and step, or values"
        ]
    if "values" in spec:
        values = spec["values"]
        if set(spec) != {"values"}:
            return errors + [f"{where}: give either values or min/max (with scale, step), not both"]
        if not isinstance(values, list) or len(values) < 2:
            errors.append(
                f"{where}.values must list two or more values to search (one value is no search: "
                f"set {name} itself), got {values!r}"
            )
        elif bad := [v for v in values if not (isinstance(v, str) if kind is str else _is_number(v, kind))]:
            errors.append(f"{where}.values must all be {_KIND_WORDS[kind]}; {bad!r} are not")
        elif bad := [v for v in values if kind is str and not _PLAIN_NAME.match(v)]:
            # Katib's StdOut collector runs the trial's command through sh -c: a value must stay one plain word.
            errors.append(f"{where}.values must be plain names (letters, digits, '_', '.', '-'); {bad!r} are not")
        elif bad := [v for v in values if choices(name) and v not in choices(name)]:
            # A trial drawing a value the setting does not take would fail in the trainer.
            errors.append(f"{where}.values: {bad!r} are not among {name}'s choices ({', '.join(choices(name))})")
        elif len(set(values)) != len(values):
            errors.append(f"{where}.values lists a value twice: {values!r}")
        return errors
    if kind is str:
        return errors + [
            f"{where}: {name} is a name, not a number: list the candidates as values, "
            f'e.g. {{"values": ["cosine", "linear"]}}'
        ]
    if not ("min" in spec and "max" in spec):
        return errors + [f"{where} needs both min and max (or values), got {spec!r}"]
    low, high = spec["min"], spec["max"]
    if not (_is_number(low, kind) and _is_number(high, kind)):
        return errors + [f"{where}: min and max must be {_KIND_WORDS[kind]}, got {low!r} and {high!r}"]
    if low >= high:
        errors.append(f"{where}: min ({low}) must be below max ({high})")
    scale = spec.get("scale", "linear")
    if scale not in SCALES:
        errors.append(f"{where}.scale must be one of {list(SCALES)}, got {scale!r}")
    elif scale == "log":
        if low <= 0:
            errors.append(f"{where}: a log scale needs min > 0, got {low}")
        if algorithm == "grid":
            errors.append(
                f"{where}: the grid steps evenly from min to max and would ignore scale 'log'; list the values instead"
            )
        elif algorithm not in _LOG_SCALE and not (algorithm == "bayesianoptimization" and kind is float):
            errors.append(
                f"{where}: algorithm {algorithm!r} draws it uniformly and would ignore scale 'log'; "
                f"use one of {sorted(_LOG_SCALE)}, or drop the scale"
            )
    if kind is float and algorithm == "bayesianoptimization" and low <= 0:
        errors.append(
            f"{where}: algorithm 'bayesianoptimization' draws real values log-uniformly, so min must be "
            f"> 0 (got {low}); raise min or use tpe"
        )
    if "step" in spec:
        step = spec["step"]
        if not _is_number(step, kind) or step <= 0:
            errors.append(f"{where}.step must be a positive {_KIND_WORDS[kind][:-1]}, got {step!r}")
        elif low < high and step > high - low:
            errors.append(f"{where}.step ({step}) is larger than max - min ({high - low}): one value is no search")
        elif scale == "log":  # Optuna refuses a stepped log range; hyperopt's is hard to predict: list them
            errors.append(f"{where}: step and scale 'log' do not go together; list the values instead")
    elif algorithm == "grid" and kind is float and scale != "log" and low < high:
        errors.append(
            f'{where}: the grid needs a step for a real range (e.g. "step": {(high - low) / 4:g}), or list the values'
        )
    return errors


_KIND_WORDS = {int: "integers", float: "numbers", str: "strings"}
_PLAIN_NAME = re.compile(r"^[A-Za-z0-9_.-]+$")


def typed_search_space(search_space):
    """``search_space`` with the whole numbers of each integer setting as ints. KFP carries a dict parameter as a
    protobuf Struct, whose numbers are all doubles: ``{"lora_r": {"values": [8, 16]}}`` comes back with 8.0, 16.0."""
    if not isinstance(search_space, dict):
        return search_space

    def whole(value):
        return int(value) if isinstance(value, float) and value.is_integer() else value

    typed = {}
    for name, spec in search_space.items():
        if SEARCHABLE.get(name) is int and isinstance(spec, dict):
            spec = {
                k: [whole(v) for v in value]
                if k == "values" and isinstance(value, list)
                else whole(value)
                if k in ("min", "max", "step")
                else value
                for k, value in spec.items()
            }
        typed[name] = spec
    return typed


def check_search(
    search_space, *, trials: int, parallel_trials: int, max_failed_trials: int, algorithm: str, method: str
) -> list[str]:
    """Every problem with a search before anything is created, one message each, naming the setting and the fix.

    Args:
        search_space: ``{setting: spec}``; a spec is a range ``{"min": 1e-5, "max": 1e-4}`` with optional
            ``"scale": "log"`` (default linear) and ``"step"``, or a list ``{"values": [8, 16, 32]}``. The
            settings are those in ``SEARCHABLE``; an integer setting takes integers, lr_scheduler_type names.
        trials: trials in all (Katib's maxTrialCount), at least 1.
        parallel_trials: trials at once (parallelTrialCount), 1..trials; each holds the whole training job's GPUs.
        max_failed_trials: failed trials that fail the Experiment (maxFailedTrialCount), 0..trials.
        algorithm: one of ``ALGORITHMS``.
        method: the run's fine-tuning method; LoRA settings need lora or qlora.

    Returns:
        The errors (empty when the search can start), including the rules of Katib's admission webhook and of
        its suggestion services that apply (grid size, CMA-ES dimensions, log-uniform ranges).
    """
    errors = []
    if algorithm not in ALGORITHMS:
        errors.append(f"hpo_algorithm {algorithm!r} is not one of {list(ALGORITHMS)}")
        algorithm = "random"  # judge the ranges alone: an algorithm's own limits would only add noise
    if not isinstance(search_space, dict) or not search_space:
        errors.append(
            "hpo_search_space is empty: give each setting to search a range or values, e.g. "
            '{"learning_rate": {"min": 1e-5, "max": 1e-4, "scale": "log"}, '
            '"lora_r": {"values": [8, 16, 32]}}'
        )
        search_space = {}
    for name, spec in search_space.items():
        errors += _parameter_errors(name, spec, algorithm, method)
    if trials < 1:
        errors.append(f"hpo_trials must be >= 1 to search (0 turns the search off), got {trials}")
    if parallel_trials < 1:
        errors.append(f"hpo_parallel_trials must be >= 1, got {parallel_trials}")
    elif trials >= 1 and parallel_trials > trials:
        errors.append(
            f"hpo_parallel_trials ({parallel_trials}) is more than hpo_trials ({trials}); lower "
            "hpo_parallel_trials or raise hpo_trials"
        )
    if max_failed_trials < 0 or (trials >= 1 and max_failed_trials > trials):
        errors.append(f"hpo_max_failed_trials must be between 0 and hpo_trials ({trials}), got {max_failed_trials}")
    if errors:
        return errors  # the rules below count values of specs known to be sound
    if algorithm == "grid":
        size = math.prod(_grid_size(s) for s in search_space.values())
        if trials > size:
            errors.append(
                f"hpo_trials ({trials}) is more than the grid's {size} combinations; lower hpo_trials "
                "to at most that, or add values"
            )
    if algorithm == "cmaes" and sum("values" not in s for s in search_space.values()) < 2:
        errors.append("hpo_algorithm 'cmaes' needs two or more min/max settings in hpo_search_space; use tpe for fewer")
    return errors


def check_hpo_settings(s: Settings) -> list[str]:
    """A search that can start, when ``hpo_trials`` asks for one (the search step asks again before it starts)."""
    h = s.hpo
    if h.hpo_trials == 0:
        return []
    # An algorithm outside the declared choices is named by the choice check: judge the ranges alone, as
    # check_search does for an algorithm it does not know.
    algorithm = h.hpo_algorithm if h.hpo_algorithm in choices("hpo_algorithm") else "random"
    # A dict parameter reaches validate_inputs through KFP as a Struct: integer values arrive as doubles.
    errors = check_search(
        typed_search_space(h.hpo_search_space),
        trials=h.hpo_trials,
        parallel_trials=h.hpo_parallel_trials,
        max_failed_trials=h.hpo_max_failed_trials,
        algorithm=algorithm,
        method=s.model.method,
    )
    if "sft" not in s.stages.stages:
        errors.append(
            'hpo_trials > 0 tunes the sft stage, and stages does not run it; add "sft" to stages or set hpo_trials=0'
        )
    return errors
