"""train_model as a KFP component: the launcher that runs the trainer and reports the model."""

from typing import NamedTuple

from kfp import dsl
from kfp.dsl import Dataset, Input, Model, Output

from components.version import COMPONENTS_IMAGE


@dsl.component(base_image=COMPONENTS_IMAGE, install_kfp_package=False)
def train_model(
    dataset: Input[Dataset],
    base_model_path: str,
    settings: dict,
    stage: str,
    tuned: dict,
    data_root: str,
    model_root: str,
    run_id: str,
    model: Output[Model],
) -> NamedTuple("TrainOutputs", [("model_uri", str), ("model_path", str), ("job_name", str)]):
    """Train one stage (cpt, sft, dpo, rm or grpo) from ``base`` on the prepared dataset and record where the result is.

    With ``train_backend=pytorchjob`` (or ``trainjob``, Trainer v2) this small CPU pod writes the trainer
    config to the model volume, creates the job (``num_nodes`` pods of ``gpus_per_node`` GPUs) running
    ``torchrun -m components.train.trainer.sft``, follows it to the end and fails with the job's reason; a retried
    pod re-attaches to the job instead of creating a second one, and cancelling the run deletes it. A job that
    failed for a retriable cause (pod evicted or preempted, node lost, rendezvous/NCCL failure) is created again
    up to ``job_restarts`` times and resumes from its last complete checkpoint; deterministic failures (OOMKilled,
    config errors, image errors) fail the step at once. With ``local`` it runs the same entry point under
    ``torchrun --nproc_per_node gpus_per_node`` here. Each stage writes to its own folder of the run
    (``train/`` for sft, ``cpt/``, ``dpo/``) and is its own job (``<stage>-<run id>``).

    Args:
        dataset: prepare_dataset's output for this stage (its metadata names the folder on the data volume).
        base_model_path: the model this stage starts from: the run's model_name_or_path (base_model) or the
            previous stage's final folder (its ``model_path``), as this step sees it.
        settings: every setting, as validate_inputs resolved them (components/settings.py): the train settings,
            with the stage's own (stage_settings), go into the trainer config; the cluster settings shape the job.
        stage: ``cpt``, ``sft`` or ``dpo`` (components/train/stages.py).
        tuned: the settings a hyper-parameter search chose (search_hyperparameters; {} when none ran): the sft
            stage trains with them.
        data_root: where the data volume is mounted in this step.
        model_root: where the model volume is mounted in this step.
        run_id: the KFP run id; names the job and scopes the output folder.

    Returns:
        model: metadata ``pvc``, ``path`` and ``uri`` (``pvc://claim/.../final``) and the trainer's metrics.
        model_uri: the same ``pvc://`` URI (or local path) as a parameter.
        model_path: the final folder as this step sees it: the next stage's ``base_model_path``.
        job_name: the PyTorchJob's name (empty for local runs).
    """
    import json
    import logging
    import os
    from collections import namedtuple

    from components.observe.outcome import recording_outcome
    from components.paths import DATA_MOUNT, MODEL_MOUNT, pvc_uri, run_dir
    from components.settings import Settings, whole_numbers
    from components.train.config import build_trainer_config, write_trainer_config
    from components.train.launcher.local import cuda_available
    from components.train.stages import hands_on, stage_folder, stage_train_settings

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    # How this step ended, for the run's exit handler (components/observe/outcome.py).
    with recording_outcome(f"train_model[{stage}]", model_root, run_id):
        s = Settings.from_flat(settings)
        local = s.cluster.train_backend == "local"
        # Paths as the trainer sees them: the job's pods mount the claims at the standard mounts.
        pod_data, pod_models = (data_root, model_root) if local else (DATA_MOUNT, MODEL_MOUNT)
        out_dir = os.path.join(run_dir(model_root, run_id), stage_folder(stage))
        base_path = base_model_path
        if base_path.startswith(model_root + "/"):  # a previous stage's model, on the model volume
            base_path = base_path.replace(model_root, pod_models, 1)
        cfg = build_trainer_config(
            stage_train_settings(s, stage, base_path, whole_numbers(tuned)),
            stage=stage,
            dataset_path=dataset.metadata["path"].replace(data_root, pod_data, 1),
            output_dir=out_dir.replace(model_root, pod_models, 1),
            packing=dataset.metadata.get("packing", True),
            use_cpu=local and not cuda_available(),
            model_cache_dir=os.path.join(pod_data, "cache"),
        )
        config_path = write_trainer_config(cfg, os.path.join(out_dir, "train_config.json"))
        job_name = ""
        if local:
            from components.train.launcher.local import metrics_port_here, run_torchrun

            env = dict(os.environ)
            if "mlflow" in cfg["report_to"]:
                # A local run's MLflow: a file store in the workspace (mlflow ui --backend-store-uri <it>), unless the
                # user's environment names a tracking server.
                env.setdefault("MLFLOW_TRACKING_URI", "file:" + os.path.join(os.path.dirname(model_root), "mlruns"))
                env.setdefault("MLFLOW_EXPERIMENT_NAME", "llm-finetune")
                # MLflow 3 keeps file stores in maintenance mode and refuses them unless asked: a laptop run needs no
                # database server, and `mlflow ui` reads the folder.
                env.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
            env.setdefault("TRAINER_RUN_ID", run_id)  # the metrics' label and the Langfuse record's session
            if s.cluster.metrics_port:
                # The trainer's rank 0 serves its live metrics here while it trains (taken here: another port).
                env.setdefault("TRAINER_METRICS_PORT", str(metrics_port_here(s.cluster.metrics_port)))
                logging.getLogger("train_model").info(
                    "live metrics while training runs: http://localhost:%s/metrics", env["TRAINER_METRICS_PORT"]
                )
            run_torchrun(config_path, s.cluster.gpus_per_node, env=env)
        else:
            from components.kube import current_namespace, job_name_for
            from components.train.launcher.job import run_training_job, training_job_for_run

            job_name = job_name_for(run_id, stage)
            if s.cluster.tensorboard:
                # After the config is written: the run's folder, the Tensorboard's subPath mount, exists now.
                from components.observe.tensorboard import ensure_tensorboard, tensorboard_manifest

                ensure_tensorboard(
                    tensorboard_manifest(job_name_for(run_id, "tb"), current_namespace(), s.cluster.model_pvc, run_id)
                )
            trainer_version = None
            if s.cluster.train_backend == "trainjob":
                from components.train.launcher.trainjob import installed_trainer_version

                # Read here, in the launcher pod, once before the job is created: the TrainJob's pod patch differs
                # between Trainer releases, and the API server would silently drop the one the cluster lacks.
                trainer_version = installed_trainer_version()
            manifest = training_job_for_run(
                s.cluster,
                run_id=run_id,
                namespace=current_namespace(),
                config_path=config_path.replace(model_root, MODEL_MOUNT, 1),
                stage=stage,
                trainer_version=trainer_version,
            )

            def record(job: dict) -> None:
                # KFP uploads outputs only when the step returns: the job's identity goes to the volume now.
                with open(os.path.join(out_dir, f"{job['kind'].lower()}.json"), "w") as f:
                    json.dump(job, f, indent=2)
                logging.getLogger("train_model").info(
                    "%s %s/%s uid %s",
                    job["kind"],
                    job["metadata"]["namespace"],
                    job["metadata"]["name"],
                    job["metadata"].get("uid", "?"),
                )

            from components.observe.gpu_watch import gpu_watch_for

            run_training_job(
                manifest,
                cleanup=s.cluster.job_cleanup,
                on_created=record,
                job_restarts=s.cluster.job_restarts,
                pending_timeout_seconds=s.cluster.pending_timeout_seconds,
                watch=gpu_watch_for(s.cluster, current_namespace(), job_name),
            )

        final_dir = os.path.join(out_dir, "final")
        uri = final_dir if local else pvc_uri(s.cluster.model_pvc, model_root, final_dir)
        with open(os.path.join(out_dir, "metrics.json")) as f:
            metrics = json.load(f)
        model.metadata.update(
            {
                "pvc": s.cluster.model_pvc,
                "path": final_dir,
                "uri": uri,
                "stage": stage,
                "base_model": base_model_path,
                "method": cfg["method"],
                "job_name": job_name,
                **metrics,
            }
        )
        if not hands_on(stage):
            # The rm stage's model scores the policy (a later grpo stage reads it from its folder); the next stage
            # trains from the model this one started from (components/train/stages.py).
            uri, final_dir = base_model_path, base_model_path
        return namedtuple("TrainOutputs", ["model_uri", "model_path", "job_name"])(uri, final_dir, job_name)


@dsl.component(base_image=COMPONENTS_IMAGE, install_kfp_package=False)
def base_model(settings: dict) -> str:
    """The model the first training stage starts from: the run's ``model_name_or_path``, handed from stage to
    stage as a path (a string: kfp.local cannot choose between artifacts of condition branches).

    Args:
        settings: every setting, as validate_inputs resolved them.

    Returns:
        The Hub id, folder or ``builtin:`` name, as given.
    """
    from components.settings import Settings

    return Settings.from_flat(settings).train.model_name_or_path


@dsl.component(base_image=COMPONENTS_IMAGE, install_kfp_package=False)
def skip_stage(previous: str, stage: str) -> str:
    """Hand the previous model on unchanged: slot ``stage`` has no stage in this run's ``stages``.

    Args:
        previous: the model the stage would have started from.
        stage: the slot that does not run.

    Returns:
        ``previous``.
    """
    return previous
