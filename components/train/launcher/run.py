"""The train step's work (train_model, components/train/component.py) as a plain function, testable without KFP:
write one stage's trainer config, run the trainer to the end (torchrun here, or a PyTorchJob or TrainJob it
creates and follows) and say where the model is."""

from __future__ import annotations

import dataclasses
import json
import logging
import os
from typing import NamedTuple

from components.paths import pvc_uri, run_dir
from components.settings import Settings
from components.stages import hands_on, job_groups, stage_folder, stage_job, stage_train_settings
from components.train.launcher.job_setup import TrainerMounts, cluster_job, record_created, write_config
from components.train.launcher.model_store import CheckpointUploads, upload_model

log = logging.getLogger("train_model")


class TrainedStage(NamedTuple):
    """Where a trained stage's model is, and what its artifact says."""

    model_uri: str  # the model the next stage reads, as a pvc:// URI (local runs: its path)
    model_path: str  # the same as this step sees it: the next stage's base_model_path
    job_name: str  # the PyTorchJob's or TrainJob's name; empty for local runs
    metadata: dict  # the model artifact's: pvc, path, uri, stage, base_model, method, job_name, the trainer's metrics


def train_stage(
    s: Settings,
    *,
    stage: str,
    base_model_path: str,
    tuned: dict,
    dataset_path: str,
    packing: bool,
    data_root: str,
    model_root: str,
    run_id: str,
) -> TrainedStage:
    """Train ``stage`` of run ``run_id`` from ``base_model_path`` on the prepared dataset at ``dataset_path`` (its rows
    packed or not: ``packing``), with the settings a search chose (``tuned``, typed) for the sft stage.

    The config goes to the stage's folder of the run on the model volume (``<model_root>/runs/<run id>/<stage
    folder>/train_config.json``), every path in it as the trainer sees it. ``train_backend=local`` runs the
    trainer here under torchrun; ``pytorchjob`` and ``trainjob`` create the job ``<stage>-<run id>`` (a Kubeflow
    Tensorboard beside it with ``tensorboard``), follow it to the end and re-run it for retriable failures
    (components/train/launcher/job.py). The trainer's ``metrics.json`` goes into the model's metadata.

    A stage that is not hands-on (``rm``: its model scores a later grpo stage) hands ``base_model_path`` on as the
    next stage's model (components/stages.py).
    """
    mounts = TrainerMounts.for_backend(data_root, model_root, s.job.train_backend)
    out_dir = os.path.join(run_dir(model_root, run_id), stage_folder(stage))
    trainer = stage_train_settings(s, stage, mounts.for_trainer(base_model_path), tuned)
    server_model = None  # the grpo stage's own vLLM server's model (vllm-server with no URL, on a cluster)
    if not mounts.local:
        from components.kube import current_namespace
        from components.train.launcher.generation_server import runs_own_server, stage_server_url

        if runs_own_server(stage, trainer.preference, s.job):
            server_model = trainer.model.model_name_or_path
            preference = stage_server_url(
                stage, trainer.preference, s.job, run_id=run_id, namespace=current_namespace()
            )
            trainer = dataclasses.replace(trainer, preference=preference)
    cfg, config_path = write_config(
        trainer,
        stage=stage,
        dataset_path=dataset_path,
        packing=packing,
        out_dir=out_dir,
        mounts=mounts,
    )
    # upload_checkpoints: each complete checkpoint goes to the object store while the job trains (model_store.py).
    with CheckpointUploads(s.storage, out_dir, model_root=model_root, local=mounts.local):
        if mounts.local:
            job_name = ""
            _train_here(s, cfg, config_path, stage=stage, model_root=model_root, run_id=run_id)
        else:
            job_name = _train_on_cluster(
                s, config_path, stage=stage, out_dir=out_dir, mounts=mounts, run_id=run_id, server_model=server_model
            )

    final_dir = os.path.join(out_dir, "final")
    uri = final_dir if mounts.local else pvc_uri(s.storage.model_pvc, model_root, final_dir)
    with open(os.path.join(out_dir, "metrics.json")) as f:
        metrics = json.load(f)
    metadata = {
        "pvc": s.storage.model_pvc,
        "path": final_dir,
        "uri": uri,
        "stage": stage,
        "base_model": base_model_path,
        "method": cfg["method"],
        "job_name": job_name,
        **metrics,
    }
    if s.storage.model_store_uri and hands_on(stage):
        # The final model, verified, then uploaded from this pod (it mounts the claim; the GPUs are released):
        # model_store.py says why here. Its URI goes into the artifact's metadata.
        metadata["store_uri"] = upload_model(s.storage, final_dir, model_root=model_root, local=mounts.local)
    if not hands_on(stage):
        # The rm stage's model scores the policy (a later grpo stage reads it from its folder); the next stage
        # trains from the model this one started from (components/stages.py).
        uri, final_dir = base_model_path, base_model_path
    return TrainedStage(uri, final_dir, job_name, metadata)


def trainer_env(s: Settings, cfg: dict, *, model_root: str, run_id: str, environ: dict | None = None) -> dict:
    """The environment of a local run's trainer: this process's (``environ``), plus what it needs when the user's
    environment does not say otherwise: a local MLflow store (``report_to`` has mlflow), the run id, and the port of
    its live metrics (``metrics_port``; another free one when that is taken here)."""
    from components.train.launcher import local_torchrun

    env = dict(os.environ if environ is None else environ)
    if "mlflow" in cfg["report_to"]:
        # A local run's MLflow: a file store in the workspace (mlflow ui --backend-store-uri <it>), unless the
        # user's environment names a tracking server.
        env.setdefault("MLFLOW_TRACKING_URI", "file:" + os.path.join(os.path.dirname(model_root), "mlruns"))
        env.setdefault("MLFLOW_EXPERIMENT_NAME", "llm-finetune")
        # MLflow 3 keeps file stores in maintenance mode and refuses them unless asked: a laptop run needs no
        # database server, and `mlflow ui` reads the folder.
        env.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
    env.setdefault("TRAINER_RUN_ID", run_id)  # the metrics' label and the Langfuse record's session
    if s.observability.metrics_port:
        # The trainer's rank 0 serves its live metrics here while it trains (taken here: another port).
        env.setdefault("TRAINER_METRICS_PORT", str(local_torchrun.metrics_port_here(s.observability.metrics_port)))
    return env


def _train_here(s: Settings, cfg: dict, config_path: str, *, stage: str, model_root: str, run_id: str) -> None:
    """torchrun on this machine, the stage's ``gpus_per_node`` processes, to the end."""
    from components.train.launcher import local_torchrun

    env = trainer_env(s, cfg, model_root=model_root, run_id=run_id)
    if s.observability.metrics_port:
        log.info("live metrics while training runs: http://localhost:%s/metrics", env["TRAINER_METRICS_PORT"])
    local_torchrun.run_torchrun(config_path, stage_job(s, stage).gpus_per_node, env=env)


def _train_on_cluster(
    s: Settings,
    config_path: str,
    *,
    stage: str,
    out_dir: str,
    mounts: TrainerMounts,
    run_id: str,
    server_model: str | None = None,
) -> str:
    """Create the stage's job (or re-attach to it), follow it to the end, re-run it for retriable failures; its
    name. ``server_model``: the grpo stage's own vLLM server runs on it first, until the job ends
    (components/train/launcher/generation_server.py)."""
    from contextlib import AbstractContextManager, nullcontext

    from components.kube import current_namespace, job_name_for
    from components.observe.gpu_watch import gpu_watch_for
    from components.train.launcher import job

    job_name = job_name_for(run_id, stage)
    if s.observability.tensorboard:
        # After the config is written: the run's folder, the Tensorboard's subPath mount, exists now.
        from components.observe.tensorboard import ensure_tensorboard, tensorboard_manifest

        ensure_tensorboard(
            tensorboard_manifest(job_name_for(run_id, "tb"), current_namespace(), s.storage.model_pvc, run_id),
            image=s.job.trainer_image,  # without Kubeflow's controller, its pod runs the trainer's tensorboard
            image_pull_secrets=list(s.job.image_pull_secrets),
        )
    manifest = cluster_job(  # the stage's own nodes and GPUs (stage_settings) over the run's
        *job_groups(s, stage),
        run_id=run_id,
        namespace=current_namespace(),
        config_path=config_path,
        stage=stage,
        mounts=mounts,
    )
    server: AbstractContextManager = nullcontext()
    if server_model:
        from components.train.launcher.generation_server import generation_server

        server = generation_server(
            stage_job(s, stage),
            s.storage,
            run_id=run_id,
            namespace=current_namespace(),
            model_path=server_model,
            model_root=mounts.model_root,
            pending_timeout_seconds=s.scheduling.pending_timeout_seconds,
        )
    # Both deleted when the job ends, succeeded or failed; the job's NetworkPolicy exists before its pods.
    with server, job.trainer_network(manifest, model_root=mounts.model_root):
        job.run_training_job(
            manifest,
            cleanup=s.scheduling.job_cleanup,
            on_created=record_created(out_dir, log),
            job_restarts=s.scheduling.job_restarts,
            pending_timeout_seconds=s.scheduling.pending_timeout_seconds,
            stall_timeout_seconds=s.observability.stall_timeout_seconds,
            watch=gpu_watch_for(s.observability, current_namespace(), job_name),
        )
    return job_name
