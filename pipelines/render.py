"""``python -m pipelines.run --render DIR``: everything a cluster run would create, written to files.

Touches nothing: no KFP request, no Kubernetes request. The manifests come from the same builders the
steps call at run time, with a placeholder run id (on the cluster it is the KFP run id).
"""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path

import yaml

from components.deploy.manifest import inference_service_for_run
from components.deploy.serving_runtime import SERVING_RUNTIME_FILE, serving_runtime_manifest
from components.hpo.katib import experiment_manifest, experiment_name_for, trials_dir_for
from components.kube import job_name_for
from components.observe.tensorboard import server_manifests, tensorboard_manifest
from components.paths import DATA_MOUNT, MODEL_MOUNT, pvc_uri, run_dir
from components.settings import Settings
from components.stages import (
    dataset_folder,
    hands_on,
    job_groups,
    stage_folder,
    stage_train_settings,
)
from components.train.config import build_trainer_config
from components.train.launcher.generation_server import run_server_manifests, runs_own_server, stage_server_url
from components.train.launcher.job import training_job_for_run
from components.train.launcher.pods import trainer_network_policy
from pipelines.compile import compile_pipeline

RENDER_RUN_ID = "render-preview"


def render(params: dict, out_dir: Path, namespace: str = "default") -> list[Path]:
    """Write the compiled pipeline, the resolved settings (``params``: every setting by name), the trainer config
    and the manifests; return the paths."""
    out_dir.mkdir(parents=True, exist_ok=True)
    written = [compile_pipeline(out_dir / "llm_finetune.yaml")]
    written.append(_write(out_dir / "params.yaml", yaml.safe_dump(params, sort_keys=True, allow_unicode=True)))

    s = Settings.from_flat(params)
    base = s.model.model_name_or_path
    for stage in s.stages.stages:  # each stage's trainer config and job: sft's keep the plain file names
        suffix = "" if stage == "sft" else f"-{stage}"
        stage_dir = os.path.join(run_dir(MODEL_MOUNT, RENDER_RUN_ID), stage_folder(stage))
        trainer = stage_train_settings(s, stage, base)
        if runs_own_server(stage, trainer.preference, s.job):
            # The grpo stage's own vLLM server, which the train step runs beside the job; the config names its URL.
            manifests = run_server_manifests(
                s.job, s.storage, run_id=RENDER_RUN_ID, namespace=namespace, model_path=base
            )
            written.append(_write(out_dir / "grpo-vllm-server.yaml", yaml.safe_dump_all(manifests, sort_keys=False)))
            preference = stage_server_url(stage, trainer.preference, s.job, run_id=RENDER_RUN_ID, namespace=namespace)
            trainer = dataclasses.replace(trainer, preference=preference)
        cfg = build_trainer_config(
            trainer,
            stage=stage,
            dataset_path=os.path.join(run_dir(DATA_MOUNT, RENDER_RUN_ID), dataset_folder(stage)),
            output_dir=stage_dir,
            use_cpu=s.job.train_backend == "local",
            model_cache_dir=f"{DATA_MOUNT}/cache",
        )
        written.append(_write(out_dir / f"train_config{suffix}.json", json.dumps(cfg, indent=2, sort_keys=True)))
        if s.job.train_backend != "local":
            job = training_job_for_run(
                *job_groups(s, stage),  # the stage's own nodes and GPUs (stage_settings) over the run's
                run_id=RENDER_RUN_ID,
                namespace=namespace,
                stage=stage,
                config_path=os.path.join(stage_dir, "train_config.json"),
            )
            manifest = yaml.safe_dump(job, sort_keys=False)
            written.append(_write(out_dir / f"{job['kind'].lower()}{suffix}.yaml", manifest))
            # Created before the job by the train step: only the run's own pods reach the job's pods.
            policy = yaml.safe_dump(trainer_network_policy(job), sort_keys=False)
            written.append(_write(out_dir / f"networkpolicy{suffix}.yaml", policy))
        if hands_on(stage):  # rm's model scores the next stage; the next stage trains from rm's own start
            base = os.path.join(stage_dir, "final")
    train_dir = os.path.dirname(base)  # the last stage's: its final model is what is served
    if s.job.train_backend != "local" and s.observability.tensorboard:
        board = tensorboard_manifest(job_name_for(RENDER_RUN_ID, "tb"), namespace, s.storage.model_pvc, RENDER_RUN_ID)
        written.append(_write(out_dir / "tensorboard.yaml", yaml.safe_dump(board, sort_keys=False)))
        # What the train step creates instead on a cluster without Kubeflow's Tensorboard controller.
        server = yaml.safe_dump_all(
            server_manifests(board, s.job.trainer_image, list(s.job.image_pull_secrets)), sort_keys=False
        )
        written.append(_write(out_dir / "tensorboard-server.yaml", server))
    if s.job.train_backend != "local" and s.hpo.hpo_trials:
        # The search tunes the sft stage, from the run's base model with the sft data (components/hpo/).
        sft_dir = os.path.join(run_dir(MODEL_MOUNT, RENDER_RUN_ID), stage_folder("sft"))
        h = s.hpo
        experiment = experiment_manifest(
            name=experiment_name_for(RENDER_RUN_ID),
            namespace=namespace,
            training_job=training_job_for_run(
                *job_groups(s, "sft"),
                run_id=RENDER_RUN_ID,
                namespace=namespace,
                stage="sft",
                config_path=os.path.join(sft_dir, "train_config.json"),
            ),
            trials_dir=trials_dir_for(RENDER_RUN_ID),
            search_space=h.hpo_search_space,
            trials=h.hpo_trials,
            parallel_trials=h.hpo_parallel_trials,
            max_failed_trials=h.hpo_max_failed_trials,
            algorithm=h.hpo_algorithm,
            trial_steps=h.hpo_trial_steps,
            method=s.model.method,
            seed=s.train.seed,
        )
        written.append(_write(out_dir / "experiment.yaml", yaml.safe_dump(experiment, sort_keys=False)))
    if s.deploy.deploy_backend.startswith("kserve"):
        isvc = inference_service_for_run(
            s.deploy,
            s.job,
            s.network,
            s.storage,
            run_id=RENDER_RUN_ID,
            namespace=namespace,
            storage_uri=pvc_uri(s.storage.model_pvc, MODEL_MOUNT, os.path.join(train_dir, "final")),
        )
        written.append(_write(out_dir / "inferenceservice.yaml", yaml.safe_dump(isvc, sort_keys=False)))
    if s.deploy.deploy_backend == "kserve-vllm":
        # For clusters without KServe's built-in runtime; it ships in the source checkout (manifests/serving).
        if SERVING_RUNTIME_FILE.is_file():
            runtime = serving_runtime_manifest(namespace)
            written.append(_write(out_dir / "servingruntime.yaml", yaml.safe_dump(runtime, sort_keys=False)))
    return written


def _write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path
