"""The evaluation, the report and where the model is, on the run's experiment tracker (``report_to`` mlflow, wandb).

The trainer's pods log the training metrics into one run per stage (components/train/trainer/tracking.py); the
evaluation and the deployment come later, in other steps. This adds them to that same run, found without any file a
pod could write: MLflow's by the tags the trainer set (``kfp_run_id``, ``stage``), W&B's by its id, which the trainer
took from ``tracker_run_id`` (restarts resume it). Where the stage logged to no run (the tracker was unreachable
then, or the run was deleted), a new run with the same tags holds them.
"""

from __future__ import annotations

import logging
import os
import re

from components.names import TRACKER_RUN_TAG, TRACKER_STAGE_TAG, tracker_run_id

log = logging.getLogger("publish.tracker")

# transformers' WandbCallback logs into this project unless WANDB_PROJECT names another: the same run is found there.
WANDB_DEFAULT_PROJECT = "huggingface"


def record_evaluation(
    report_to: list[str],
    *,
    run_id: str,
    stage: str,
    evaluation: dict[str, float],
    model_uri: str,
    report_path: str = "",
) -> list[str]:
    """Add ``evaluation`` (as ``eval/<name>`` metrics), the report file and ``model_uri`` (the model as served or
    stored) to the stage's run on each tracker ``report_to`` names; returns one line per tracker saying where."""
    done = []
    if "mlflow" in report_to:
        done.append(_mlflow(run_id, stage, evaluation, model_uri, report_path))
    if "wandb" in report_to:
        done.append(_wandb(run_id, stage, evaluation, model_uri, report_path))
    return done


def _mlflow(run_id: str, stage: str, evaluation: dict, model_uri: str, report_path: str) -> str:
    import mlflow

    client = mlflow.MlflowClient()
    name = os.environ.get("MLFLOW_EXPERIMENT_NAME", "")
    experiment = client.get_experiment_by_name(name) if name else client.get_experiment("0")
    if experiment is None:
        experiment = client.get_experiment(client.create_experiment(name))
    tags = {TRACKER_RUN_TAG: run_id, TRACKER_STAGE_TAG: stage}
    found: list = []
    # MLflow's filter strings quote with '...' and have no escape: an id with a quote is never searched for.
    if re.fullmatch(r"[A-Za-z0-9_.:-]+", run_id + stage):
        query = " and ".join(f"tags.{k} = '{v}'" for k, v in tags.items())
        found = client.search_runs(
            [experiment.experiment_id], query, max_results=1, order_by=["attributes.start_time DESC"]
        )
    if found:
        run = found[0].info.run_id
    else:
        run = client.create_run(experiment.experiment_id, tags=tags, run_name=f"{stage}-evaluation").info.run_id
    for key, value in evaluation.items():
        client.log_metric(run, f"eval/{key}", float(value))
    client.set_tag(run, "model_uri", model_uri)
    if report_path:
        client.log_artifact(run, report_path, artifact_path="evaluation")
    if not found:
        client.set_terminated(run)
    return f"mlflow: run {run} ({'the stage' if found else 'new'}) has the evaluation and model_uri={model_uri}"


def _wandb(run_id: str, stage: str, evaluation: dict, model_uri: str, report_path: str) -> str:
    import wandb

    key = tracker_run_id(run_id, stage)
    project = os.environ.get("WANDB_PROJECT", WANDB_DEFAULT_PROJECT)
    run = wandb.init(id=key, resume="allow", project=project, job_type="evaluation")
    try:
        run.summary.update({f"eval/{k}": float(v) for k, v in evaluation.items()})
        run.summary["model_uri"] = model_uri
        if report_path:
            artifact = wandb.Artifact(f"evaluation-{key}", type="evaluation")
            artifact.add_file(report_path)
            run.log_artifact(artifact)
    finally:
        run.finish()
    return f"wandb: run {key} in project {project} has the evaluation and model_uri={model_uri}"
