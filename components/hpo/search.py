"""The hyper-parameter search step's work (search_hyperparameters, components/hpo/component.py) as a plain function,
testable without KFP: check the search settings, write the trials' base config, run the trials (Optuna here, or a
Katib Experiment it creates and follows) and pick the best."""

from __future__ import annotations

import json
import logging
import math
import os
from typing import NamedTuple

from components.hpo import katib
from components.hpo.space import check_hpo_settings
from components.settings import Settings
from components.stages import job_groups, stage_job, stage_train_settings
from components.train.launcher.job_setup import TrainerMounts, cluster_job, record_created, write_config

log = logging.getLogger("search_hyperparameters")

OFF_REPORT = "## Hyper-parameter search\n\nOff (`hpo_trials` is 0): the sft stage trains with the run's settings.\n"


class SearchResult(NamedTuple):
    """What a search found."""

    best: dict  # the best trial's values, {setting name: value} typed as the settings model types them; {}: off
    report: str  # Markdown: the best trial, then every trial, best first


def search_sft_settings(
    s: Settings, *, dataset_path: str, packing: bool, data_root: str, model_root: str, run_id: str
) -> SearchResult:
    """Search the sft stage's training settings of run ``run_id`` with short trials on the prepared dataset at
    ``dataset_path`` (its rows packed or not: ``packing``); ``hpo_trials`` 0 searches nothing.

    Every trial is the run's sft training from ``model_name_or_path`` with the values it searches
    (``hpo_search_space``), ``hpo_trial_steps`` steps and no checkpoints; the objective (``katib.OBJECTIVE``, the
    held-out ``eval_loss``) is minimised. The trials' base config and folders are under
    ``<model_root>/runs/<run id>/hpo/``, and so is the report (``report.md``), whatever becomes of the run.
    ``train_backend=local`` runs the trials here one at a time (components/hpo/local_search.py); ``pytorchjob`` and
    ``trainjob`` create the Katib Experiment ``hpo-<run id>`` whose trials are the run's training job and follow it
    (components/hpo/follow.py; with ``active_deadline_seconds``, given up after ceil(trials / parallel trials)
    rounds of it).

    Raises:
        ValueError: bad search settings, one line per problem, before any trial starts.
        RuntimeError: the search failed, or no trial reported an eval_loss.
    """
    hpo = s.hpo
    if hpo.hpo_trials == 0:
        return SearchResult({}, OFF_REPORT)
    search_space = katib.typed_search_space(hpo.hpo_search_space)  # KFP hands integers over as doubles
    errors = check_hpo_settings(s)
    if errors:
        raise ValueError("\n".join(errors))
    mounts = TrainerMounts.for_backend(data_root, model_root, s.job.train_backend)
    log.info(
        "search: %s over %s, %d trials of %d steps (%d at once), objective %s; %s",
        hpo.hpo_algorithm,
        json.dumps(search_space),
        hpo.hpo_trials,
        hpo.hpo_trial_steps,
        1 if mounts.local else hpo.hpo_parallel_trials,
        katib.OBJECTIVE,
        "local torchrun" if mounts.local else s.job.train_backend,
    )

    # The run's sft training as the trials start from it, written next to the trials' folders; from the run's base
    # model, also when a cpt stage comes first: the search runs before the stages train.
    trials_dir = katib.trials_dir_for(run_id, root=model_root)
    _, base_config = write_config(
        stage_train_settings(s, "sft", s.model.model_name_or_path),
        stage="sft",
        dataset_path=dataset_path,
        packing=packing,
        out_dir=trials_dir,
        mounts=mounts,
    )
    name = katib.experiment_name_for(run_id)
    if mounts.local:
        experiment, trials = _search_here(s, base_config, trials_dir, name=name, search_space=search_space)
    else:
        experiment, trials = _search_on_cluster(
            s, base_config, trials_dir, name=name, search_space=search_space, mounts=mounts, run_id=run_id
        )

    text = katib.trials_markdown(experiment, trials)
    with open(os.path.join(trials_dir, "report.md"), "w") as f:  # beside the trials, whatever becomes of the run
        f.write(text)
    print(text, flush=True)
    try:
        best = katib.best_trial(experiment)
    except ValueError as exc:  # every trial ended without an eval_loss, and not enough of them failed to say so
        raise RuntimeError(str(exc)) from None
    log.info("best trial %s: %s %.4f with %s", best["name"], katib.OBJECTIVE, best[katib.OBJECTIVE], best["parameters"])
    return SearchResult(best["parameters"], text)


def search_timeout_seconds(s: Settings) -> float | None:
    """How long a cluster search may take: every trial's job carries ``active_deadline_seconds``, and the search is
    at most ceil(hpo_trials / hpo_parallel_trials) rounds of trials, each also allowed ``pending_timeout_seconds``
    to start. None (no limit) without a deadline."""
    if not s.scheduling.active_deadline_seconds:
        return None
    rounds = math.ceil(s.hpo.hpo_trials / s.hpo.hpo_parallel_trials)
    return rounds * (s.scheduling.active_deadline_seconds + s.scheduling.pending_timeout_seconds)


def _search_here(
    s: Settings, base_config: str, trials_dir: str, *, name: str, search_space: dict
) -> tuple[dict, list[dict]]:
    """Optuna's trials, one at a time under torchrun on this machine."""
    from components.hpo import local_search

    hpo = s.hpo
    if hpo.hpo_parallel_trials > 1:
        log.warning(
            "hpo_parallel_trials=%d: local trials run one at a time (each torchrun already uses every core; two at "
            "once would only slow both)",
            hpo.hpo_parallel_trials,
        )
    return local_search.run_search(
        base_config,
        trials_dir,
        name=name,
        search_space=search_space,
        trials=hpo.hpo_trials,
        algorithm=hpo.hpo_algorithm,
        seed=s.train.seed,
        trial_steps=hpo.hpo_trial_steps,
        max_failed_trials=hpo.hpo_max_failed_trials,
        nproc_per_node=stage_job(s, "sft").gpus_per_node,
    )


def _search_on_cluster(
    s: Settings,
    base_config: str,
    trials_dir: str,
    *,
    name: str,
    search_space: dict,
    mounts: TrainerMounts,
    run_id: str,
) -> tuple[dict, list[dict]]:
    """The Katib Experiment whose trials are the run's training job, created (or re-attached to) and followed."""
    from components.hpo import follow
    from components.kube import current_namespace

    hpo = s.hpo
    namespace = current_namespace()
    # Katib creates the trials' jobs as the template says: rendered for the installed Trainer (a TrainJob).
    job = cluster_job(  # the sft stage's nodes and GPUs (stage_settings.sft) over the run's
        *job_groups(s, "sft"), run_id=run_id, namespace=namespace, config_path=base_config, stage="sft", mounts=mounts
    )
    manifest = katib.experiment_manifest(
        name=name,
        namespace=namespace,
        training_job=job,
        trials_dir=katib.trials_dir_for(run_id),
        search_space=search_space,
        trials=hpo.hpo_trials,
        parallel_trials=hpo.hpo_parallel_trials,
        max_failed_trials=hpo.hpo_max_failed_trials,
        algorithm=hpo.hpo_algorithm,
        trial_steps=hpo.hpo_trial_steps,
        method=s.model.method,
        seed=s.train.seed,
    )
    return follow.run_experiment(
        manifest,
        trials_dir=trials_dir,
        timeout_seconds=search_timeout_seconds(s),
        pending_timeout_seconds=s.scheduling.pending_timeout_seconds,
        on_created=record_created(trials_dir, log),
    )
