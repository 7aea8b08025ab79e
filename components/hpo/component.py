"""search_hyperparameters as a KFP component: short training trials before the sft stage, the best settings out."""

from kfp import dsl
from kfp.dsl import Dataset, Input, Markdown, Output

from components.version import COMPONENTS_IMAGE


@dsl.component(base_image=COMPONENTS_IMAGE, install_kfp_package=False)
def search_hyperparameters(
    dataset: Input[Dataset],
    settings: dict,
    data_root: str,
    model_root: str,
    run_id: str,
    report: Output[Markdown],
) -> dict:
    """Search the sft stage's training settings with short trials and return the best trial's values.

    Every trial is the run's own sft training from ``model_name_or_path`` on the prepared dataset (the sft stage's
    settings, ``stage_settings`` included), with the values it searches (``hpo_search_space``), ``max_steps`` =
    ``hpo_trial_steps`` and no checkpoints; the objective is the trainer's held-out ``eval_loss``, minimised.
    With ``train_backend=pytorchjob`` or ``trainjob`` this small CPU pod creates a Katib ``Experiment``
    (kubeflow.org/v1beta1, ``hpo-<run id>``) whose trials are the PyTorchJob or TrainJob the train step would
    create, ``hpo_parallel_trials`` at a time, and follows it: a retried step re-attaches to it, a failed
    Experiment fails the step with Katib's reason and the failed trials' messages, a trial pod that cannot start
    fails it in ``pending_timeout_seconds``, cancelling the run deletes the Experiment. With
    ``active_deadline_seconds`` set, the search is given up after ceil(hpo_trials / hpo_parallel_trials) rounds
    of that deadline (plus ``pending_timeout_seconds`` each). With ``local``, Optuna runs the same search here,
    one trial at a time under ``torchrun --nproc_per_node gpus_per_node``. Trials write under
    ``<model_root>/runs/<run id>/hpo/<trial>/``; each trial's ``final/`` model is deleted once it has ended.
    Bad search settings fail the step before any trial starts, one line per problem, naming the setting.

    Args:
        dataset: prepare_dataset's sft output (its metadata ``path`` is the prepared folder, ``packing`` its
            row layout).
        settings: every setting, as validate_inputs resolved them (components/settings.py): the hpo settings
            shape the search, the train settings each trial, the cluster settings its jobs.
        data_root: where the data volume is mounted in this step.
        model_root: where the model volume is mounted in this step (the trials' folders are deleted from it).
        run_id: the KFP run id; names the Experiment and scopes the trials' folder.

    Returns:
        report: Markdown for the KFP UI: the best trial, then every trial (values, state, eval_loss, last
            training loss), best first.
        Output: the best trial's values, ``{setting name: value}`` typed as the settings model types them
            (``{"learning_rate": 3.1e-05}``), for the sft stage's training; ``{}`` when ``hpo_trials`` is 0.
    """
    import json
    import logging
    import math
    import os

    from components.hpo import katib
    from components.observe.outcome import recording_outcome
    from components.paths import DATA_MOUNT, MODEL_MOUNT
    from components.settings import Settings
    from components.train.config import build_trainer_config, write_trainer_config
    from components.train.stages import stage_train_settings
    from components.validate.rules.hpo import check_hpo_settings

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    # How this step ended, for the run's exit handler (components/observe/outcome.py).
    with recording_outcome("search_hyperparameters", model_root, run_id):
        log = logging.getLogger("search_hyperparameters")
        s = Settings.from_flat(settings)
        hpo = s.hpo
        if hpo.hpo_trials == 0:
            with open(report.path, "w") as f:
                f.write(
                    "## Hyper-parameter search\n\nOff (`hpo_trials` is 0): the sft stage trains with the run's "
                    "settings.\n"
                )
            return {}
        search_space = katib.typed_search_space(hpo.hpo_search_space)  # KFP hands integers over as doubles
        errors = check_hpo_settings(s)
        if errors:
            raise ValueError("\n".join(errors))
        local = s.cluster.train_backend == "local"
        log.info(
            "search: %s over %s, %d trials of %d steps (%d at once), objective %s; %s",
            hpo.hpo_algorithm,
            json.dumps(search_space),
            hpo.hpo_trials,
            hpo.hpo_trial_steps,
            1 if local else hpo.hpo_parallel_trials,
            katib.OBJECTIVE,
            "local torchrun" if local else s.cluster.train_backend,
        )

        # The run's sft training as the trials start from it: paths as the trainer sees them (the job's pods mount the
        # claims at the standard mounts), written next to the trials' folders.
        pod_data, pod_models = (data_root, model_root) if local else (DATA_MOUNT, MODEL_MOUNT)
        trials_dir = katib.trials_dir_for(run_id, root=model_root)
        use_cpu = False
        if local:
            import torch

            use_cpu = not torch.cuda.is_available()
        # From the run's base model, also when a cpt stage comes first: the search runs before the stages train.
        train = stage_train_settings(s, "sft", s.train.model_name_or_path)
        cfg = build_trainer_config(
            train,
            stage="sft",
            dataset_path=dataset.metadata["path"].replace(data_root, pod_data, 1),
            output_dir=trials_dir.replace(model_root, pod_models, 1),
            packing=dataset.metadata.get("packing", True),
            use_cpu=use_cpu,
            model_cache_dir=os.path.join(pod_data, "cache"),
        )
        base_config = write_trainer_config(cfg, os.path.join(trials_dir, "train_config.json"))
        name = katib.experiment_name_for(run_id)

        if local:
            from components.hpo.local import run_search

            if hpo.hpo_parallel_trials > 1:
                log.warning(
                    "hpo_parallel_trials=%d: local trials run one at a time (each torchrun already uses every "
                    "core; two at once would only slow both)",
                    hpo.hpo_parallel_trials,
                )
            experiment, trials = run_search(
                base_config,
                trials_dir,
                name=name,
                search_space=search_space,
                trials=hpo.hpo_trials,
                algorithm=hpo.hpo_algorithm,
                seed=s.train.seed,
                trial_steps=hpo.hpo_trial_steps,
                max_failed_trials=hpo.hpo_max_failed_trials,
                nproc_per_node=s.cluster.gpus_per_node,
            )
        else:
            from components.hpo.follow import run_experiment
            from components.kube import current_namespace
            from components.train.launcher.job import training_job_for_run

            namespace = current_namespace()
            trainer_version = None
            if s.cluster.train_backend == "trainjob":
                from components.train.launcher.trainjob import installed_trainer_version

                # Katib creates the trials' TrainJobs as the template says: render it for the installed Trainer.
                trainer_version = installed_trainer_version()
            job = training_job_for_run(
                s.cluster,
                run_id=run_id,
                namespace=namespace,
                config_path=base_config.replace(model_root, MODEL_MOUNT, 1),
                stage="sft",
                trainer_version=trainer_version,
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
                method=s.train.method,
                seed=s.train.seed,
            )
            timeout = None
            if s.cluster.active_deadline_seconds:
                # Every trial's job carries the deadline; the search is at most this many rounds of trials.
                rounds = math.ceil(hpo.hpo_trials / hpo.hpo_parallel_trials)
                timeout = rounds * (s.cluster.active_deadline_seconds + s.cluster.pending_timeout_seconds)

            def record(exp: dict) -> None:
                # KFP uploads outputs only when the step returns: the Experiment's identity goes to the volume now.
                with open(os.path.join(trials_dir, "experiment.json"), "w") as f:
                    json.dump(exp, f, indent=2)
                log.info("Experiment %s/%s uid %s", namespace, name, exp["metadata"].get("uid", "?"))

            experiment, trials = run_experiment(
                manifest,
                trials_dir=trials_dir,
                timeout_seconds=timeout,
                pending_timeout_seconds=s.cluster.pending_timeout_seconds,
                on_created=record,
            )

        text = katib.trials_markdown(experiment, trials)
        with open(report.path, "w") as f:
            f.write(text)
        with open(os.path.join(trials_dir, "report.md"), "w") as f:  # beside the trials, whatever becomes of the run
            f.write(text)
        print(text, flush=True)
        try:
            best = katib.best_trial(experiment)
        except ValueError as exc:  # every trial ended without an eval_loss, and not enough of them failed to say so
            raise RuntimeError(str(exc)) from None
        log.info(
            "best trial %s: %s %.4f with %s", best["name"], katib.OBJECTIVE, best[katib.OBJECTIVE], best["parameters"]
        )
        return best["parameters"]
