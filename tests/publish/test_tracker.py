"""The evaluation reaches the stage's tracker run that the trainer logged into: MLflow through a real file store,
W&B in its offline mode (its run files), with the trainer's own callback and environment naming the runs."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from components.names import tracker_run_id
from components.publish.tracker import record_evaluation

RUN_ID = "0f0e0d0c-0000-4000-8000-0000000000aa"
EVALUATION = {"eval_loss": 1.25, "judge_mean_score": 7.5}


@pytest.fixture
def report(tmp_path):
    path = tmp_path / "evaluation.json"
    path.write_text(json.dumps({"metrics": EVALUATION}))
    return str(path)


def test_mlflow_the_evaluation_lands_on_the_run_the_trainer_logged_into(tmp_path, monkeypatch, report):
    mlflow = pytest.importorskip("mlflow")
    from components.train.trainer.tracking import OneMLflowRunCallback, record_final_model

    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"file:{tmp_path / 'mlruns'}")
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    monkeypatch.setenv("MLFLOW_EXPERIMENT_NAME", "llm-finetune")
    monkeypatch.setenv("TRAINER_RUN_ID", RUN_ID)
    # The trainer's rank 0: its callback starts the stage's run, the export records the final model and ends it.
    args = SimpleNamespace(report_to=["mlflow"], run_name="sft", stage="sft")
    OneMLflowRunCallback().on_train_begin(args, SimpleNamespace(is_world_process_zero=True), None)
    trained = mlflow.active_run().info.run_id
    mlflow.log_metric("loss", 2.0)
    record_final_model(["mlflow"], "/mnt/models/runs/x/train/final")
    # An earlier run's stage (another KFP run) is not the one found.
    monkeypatch.setenv("TRAINER_RUN_ID", "another-run")
    OneMLflowRunCallback().on_train_begin(args, SimpleNamespace(is_world_process_zero=True), None)
    mlflow.end_run()

    (line,) = record_evaluation(
        ["mlflow"],
        run_id=RUN_ID,
        stage="sft",
        evaluation=EVALUATION,
        model_uri="pvc://llm-models/x",
        report_path=report,
    )
    assert trained in line and "(the stage)" in line
    run = mlflow.MlflowClient().get_run(trained)
    assert {k: v for k, v in run.data.metrics.items() if k.startswith("eval/")} == {
        "eval/eval_loss": 1.25,
        "eval/judge_mean_score": 7.5,
    }
    assert run.data.tags["model_uri"] == "pvc://llm-models/x" and run.data.tags["final_model"].endswith("final")
    assert [a.path for a in mlflow.MlflowClient().list_artifacts(trained, "evaluation")] == [
        "evaluation/evaluation.json"
    ]

    # No run of that stage (the tracker was not used while training): a new one with the same tags holds it.
    (line,) = record_evaluation(["mlflow"], run_id=RUN_ID, stage="dpo", evaluation=EVALUATION, model_uri="s3://b/m")
    assert "(new)" in line
    (new,) = mlflow.MlflowClient().search_runs(
        [run.info.experiment_id], "tags.kfp_run_id = '" + RUN_ID + "' and tags.stage = 'dpo'"
    )
    assert new.data.metrics["eval/eval_loss"] == 1.25 and new.info.status == "FINISHED"


def test_wandb_the_trainer_and_the_evaluation_share_the_stages_run_id(tmp_path, monkeypatch, report):
    pytest.importorskip("wandb")
    from components.train.trainer.tracking import name_wandb_run

    for key in ("WANDB_RUN_ID", "WANDB_RESUME"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("TRAINER_RUN_ID", RUN_ID)
    name_wandb_run(["wandb"], "sft")  # what the trainer's pods set before WandbCallback starts the run
    import os

    assert os.environ["WANDB_RUN_ID"] == tracker_run_id(RUN_ID, "sft") and os.environ["WANDB_RESUME"] == "allow"
    for key in ("WANDB_RUN_ID", "WANDB_RESUME", "TRAINER_RUN_ID"):
        monkeypatch.delenv(key)  # the publish step's pod has neither
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    monkeypatch.setenv("WANDB_SILENT", "true")

    (line,) = record_evaluation(
        ["wandb"], run_id=RUN_ID, stage="sft", evaluation=EVALUATION, model_uri="pvc://llm-models/x", report_path=report
    )
    key = tracker_run_id(RUN_ID, "sft")
    assert key in line
    import wandb

    wandb.teardown()  # the run's records reach its file when W&B's service process ends, as the step's does
    (run_file,) = (tmp_path / "wandb").glob(f"offline-run-*-{key}/run-{key}.wandb")
    data = run_file.read_bytes()
    assert b"eval/judge_mean_score" in data and b"pvc://llm-models/x" in data and b"evaluation.json" in data


def test_tracker_run_ids_are_what_wandb_accepts():
    assert tracker_run_id(RUN_ID, "sft") == f"{RUN_ID}-sft"
    long = tracker_run_id("local/" + "x" * 80, "grpo")
    assert len(long) == 64 and all(c.isalnum() or c in "-_" for c in long)
    assert long != tracker_run_id("local/" + "x" * 81, "grpo")
