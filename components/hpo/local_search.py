"""The local hyper-parameter search: Optuna picks each trial's values, ``torchrun`` runs the trial, one at a time.

    experiment, trials = run_search(base_config, trials_dir, name="hpo-<run id>", search_space=space, trials=3,
                                    algorithm="tpe", seed=42, trial_steps=4, max_failed_trials=1, nproc_per_node=2)
    best = katib.best_trial(experiment)["parameters"]

The search a Katib Experiment runs on a cluster, on this machine. Each trial writes its trainer config as a Katib
trial's pods do (``components.hpo.trial.write_trial_config``: the run's config, the trial's values, ``max_steps`` =
``trial_steps``, ``save_strategy`` no, ``output_dir`` = ``<trials_dir>/trial-<n>``), runs the trainer on it with
``components.train.launcher.local_torchrun.run_torchrun`` and reads its ``eval_loss`` from ``metrics.json``: the
objective, minimised. Then the trial's ``final/`` export is deleted (trials are for their eval_loss); its config,
metrics.json and TensorBoard events stay.

Katib's algorithms here: random (``RandomSampler``), tpe and multivariate-tpe (``TPESampler``, the second with
``multivariate=True``, as Katib's Optuna service runs it) and grid (``GridSampler`` over every combination of the
listed values and stepped ranges, visited in a seeded random order where Katib's goes in order). The others
(bayesianoptimization, cmaes, sobol) run as tpe, with a warning: their libraries are not installed here.
Every sampler is seeded with the run's ``seed``. Trials run one after another whatever ``hpo_parallel_trials``
says: each torchrun already takes every core. As in Katib, a trial that fails (the trainer exits non-zero) or
reports no finite eval_loss counts as failed, and the search ends where Katib would end the Experiment
(``katib.search_failed``: once failures reach ``max_failed_trials``, at the first one when that is 0 or 1).

The results come back shaped as Katib's (an Experiment with ``status.currentOptimalTrial``, Trial objects), so that
one reader (``katib.best_trial``) and one report (``katib.trials_markdown``) serve both backends.
"""

from __future__ import annotations

import json
import logging
import math
import shutil
import time
import warnings
from pathlib import Path
from typing import Any

from components.hpo import katib
from components.hpo.trial import write_trial_config

log = logging.getLogger("search_hyperparameters")

# Katib's algorithms by the Optuna sampler that runs them locally; the rest run as tpe.
LOCAL_ALGORITHMS = ("random", "tpe", "multivariate-tpe", "grid")
FAILURE_TAIL_LINES = 10


def grid_values(name: str, spec: dict) -> list:
    """The values a grid visits for one parameter: the listed ones, or min to max by step (1 for integers)."""
    if "values" in spec:
        return list(spec["values"])
    kind = katib.SEARCHABLE[name]
    step = spec.get("step", 1)
    count = katib._grid_size(spec)
    if kind is int:
        return [spec["min"] + i * step for i in range(count)]
    # 12 significant digits: 1e-05 + 2 * 1e-05 is 3.0000000000000004e-05, and a grid value is a setting users read.
    return [float(f"{spec['min'] + i * step:.12g}") for i in range(count)]


def suggest(trial, name: str, spec: dict, algorithm: str):
    """Optuna's value for one parameter of ``trial`` (a grid's values are categorical choices)."""
    if algorithm == "grid":
        return trial.suggest_categorical(name, grid_values(name, spec))
    if "values" in spec:
        return trial.suggest_categorical(name, spec["values"])
    log = spec.get("scale") == "log"
    if katib.SEARCHABLE[name] is int:
        return trial.suggest_int(name, spec["min"], spec["max"], step=spec.get("step", 1), log=log)
    return trial.suggest_float(name, spec["min"], spec["max"], step=spec.get("step"), log=log)


def make_sampler(algorithm: str, search_space: dict, seed: int):
    """The seeded Optuna sampler that runs ``algorithm`` here (see the module docstring)."""
    import optuna

    if algorithm not in LOCAL_ALGORITHMS:
        log.warning("hpo_algorithm %r runs on a cluster (Katib) only: the local search uses tpe", algorithm)
    if algorithm == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    if algorithm == "grid":
        return optuna.samplers.GridSampler({n: grid_values(n, s) for n, s in search_space.items()}, seed=seed)
    with warnings.catch_warnings():  # multivariate is an "experimental" option of Optuna's since 2.2
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        return optuna.samplers.TPESampler(seed=seed, multivariate=algorithm == "multivariate-tpe")


class _TrialFailed(Exception):
    """A trial failed; the search goes on (Optuna records the trial as failed)."""


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def _katib_trial(name: str, params: dict, started: str, state: str, message: str, metrics: dict) -> dict:
    """A Trial object as Katib writes one (what ``katib.trial_summaries`` reads)."""
    status: dict[str, Any] = {
        "startTime": started,
        "completionTime": _now(),
        "conditions": [{"type": "Created", "status": "True"}, {"type": state, "status": "True", "message": message}],
    }
    if metrics:
        status["observation"] = {"metrics": [{"name": k, "latest": repr(v)} for k, v in metrics.items()]}
    return {
        "apiVersion": f"{katib.GROUP}/{katib.VERSION}",
        "kind": "Trial",
        "metadata": {"name": name, "creationTimestamp": started},
        "spec": {"parameterAssignments": [{"name": k, "value": str(v)} for k, v in params.items()]},
        "status": status,
    }


def _run_trial(config: str, trial_dir: Path, nproc_per_node: int) -> tuple[dict, str]:
    """Run one trial's trainer; ``(metrics, "")``, or ``({}, why it failed)``."""
    from components.train.launcher.local_torchrun import run_torchrun

    try:
        run_torchrun(config, nproc_per_node)
    except RuntimeError as exc:
        lines = str(exc).splitlines()
        return {}, "\n".join([lines[0], *lines[-FAILURE_TAIL_LINES:]])
    finally:
        shutil.rmtree(trial_dir / "final", ignore_errors=True)
    metrics = json.loads((trial_dir / "metrics.json").read_text())
    loss = metrics.get(katib.OBJECTIVE)
    if not isinstance(loss, (int, float)) or not math.isfinite(loss):
        return {}, f"the trainer reported no finite {katib.OBJECTIVE} ({loss!r})"
    found = {katib.OBJECTIVE: float(loss)}
    if isinstance(metrics.get("final_train_loss"), (int, float)):
        found[katib.TRAIN_LOSS] = float(metrics["final_train_loss"])
    return found, ""


def run_search(
    base_config: str,
    trials_dir: str,
    *,
    name: str,
    search_space: dict,
    trials: int,
    algorithm: str,
    seed: int,
    trial_steps: int,
    max_failed_trials: int,
    nproc_per_node: int,
) -> tuple[dict, list[dict]]:
    """Run ``trials`` short trainings of ``base_config``, one at a time, each with the values Optuna suggests.

    Args:
        base_config: the run's trainer config (JSON) that every trial starts from.
        trials_dir: trial n writes ``<trials_dir>/trial-<n>/`` (n from 1).
        name: the search's name in the report (``katib.experiment_name_for(run_id)``).
        search_space, trials, algorithm, max_failed_trials: as ``katib.check_search`` takes them (checked there).
        seed: every sampler's seed: the same run suggests the same trials.
        trial_steps: optimizer steps per trial (the trainer's max_steps).
        nproc_per_node: torchrun processes per trial (``gpus_per_node``).

    Returns:
        ``(experiment, trials)`` shaped as Katib's: the Experiment's ``spec`` (algorithm, parameters,
        maxTrialCount) and ``status`` (``currentOptimalTrial``: the trial with the lowest eval_loss, trial counts,
        a Succeeded condition), and one Trial object per trial, in order.

    Raises:
        RuntimeError: the failed trials reached ``max_failed_trials`` (``katib.search_failed``; each failed
            trial's values and why).
    """
    import optuna

    # Each trial is logged below, with its folder; Optuna's own lines would say it twice.
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    study = optuna.create_study(direction="minimize", sampler=make_sampler(algorithm, search_space, seed))
    rows: list[dict] = []
    best: dict | None = None
    failures: list[str] = []

    def objective(trial) -> float:
        nonlocal best
        number = trial.number + 1
        params = {setting: suggest(trial, setting, spec, algorithm) for setting, spec in search_space.items()}
        trial_name = f"trial-{number}"
        trial_dir = Path(trials_dir, trial_name)
        shutil.rmtree(trial_dir, ignore_errors=True)  # a retried step: this trial starts afresh
        overrides = {katib.TRAINER_FIELD.get(k, k): v for k, v in params.items()}
        config = write_trial_config(
            base_config, str(trial_dir), {**overrides, "max_steps": trial_steps, "save_strategy": "no"}
        )
        values = ", ".join(f"{k}={v:g}" if isinstance(v, float) else f"{k}={v}" for k, v in params.items())
        log.info("trial %d/%d (%s): %s", number, trials, trial_dir, values)
        started, began = _now(), time.monotonic()
        metrics, why = _run_trial(config, trial_dir, nproc_per_node)
        rows.append(_katib_trial(trial_name, params, started, "Failed" if why else "Succeeded", why, metrics))
        if why:
            failures.append(f"  trial {trial_name} ({values}): {why}")
            log.warning("trial %d/%d failed in %.0fs: %s", number, trials, time.monotonic() - began, why)
            if katib.search_failed(len(failures), max_failed_trials):
                count = f"{len(failures)} trial{'s' if len(failures) > 1 else ''}"
                raise RuntimeError(
                    f"the search {name} failed: {count} failed, which reaches "
                    f"hpo_max_failed_trials={max_failed_trials}\n" + "\n".join(failures)
                )
            raise _TrialFailed(why)
        loss = metrics[katib.OBJECTIVE]
        log.info("trial %d/%d: %s %.4f in %.0fs", number, trials, katib.OBJECTIVE, loss, time.monotonic() - began)
        if best is None or loss < best["loss"]:
            best = {"row": rows[-1], "loss": loss}
        return loss

    study.optimize(objective, n_trials=trials, catch=(_TrialFailed,))
    status = {
        "conditions": [{"type": "Succeeded", "status": "True", "reason": "ExperimentMaxTrialsReached"}],
        "trials": len(rows),
        "trialsSucceeded": len(rows) - len(failures),
        "trialsFailed": len(failures),
    }
    if best is not None:
        status["currentOptimalTrial"] = {
            "bestTrialName": best["row"]["metadata"]["name"],
            "parameterAssignments": best["row"]["spec"]["parameterAssignments"],
            "observation": best["row"]["status"]["observation"],
        }
    experiment = {
        "apiVersion": f"{katib.GROUP}/{katib.VERSION}",
        "kind": katib.KIND,
        "metadata": {"name": name},
        "spec": {
            "algorithm": {"algorithmName": algorithm if algorithm in LOCAL_ALGORITHMS else "tpe"},
            "parameters": [{"name": n} for n in search_space],
            "maxTrialCount": trials,
        },
        "status": status,
    }
    return experiment, rows
