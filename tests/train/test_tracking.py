"""Experiment tracking: report_to reaches the trainer, the tracker's keys reach the pods by Secret reference only,
and a local run with MLflow writes a real file store."""

import json
import re
from pathlib import Path

import pytest
import yaml

from components.secrets import TRACKING_KEYS
from components.settings import defaults
from components.validate.rules import check
from tests.helpers.repo import run_cli


def test_the_jobs_pods_read_the_trackers_keys_from_the_secret_by_reference(tmp_path):
    from tests.helpers.crd_schema import crd_errors

    result = run_cli(
        "pipelines.run",
        "--preset",
        "qwen3-30b-a3b-full",
        "-p",
        'report_to=["tensorboard","mlflow"]',
        "-p",
        "tracking_secret=team-mlflow",
        "--render",
        str(tmp_path),
    )
    assert result.returncode == 0, result.stderr
    assert json.loads((tmp_path / "train_config.json").read_text())["report_to"] == ["tensorboard", "mlflow"]
    job = yaml.safe_load((tmp_path / "pytorchjob.yaml").read_text())
    assert crd_errors(job, "kubeflow.org_pytorchjobs.yaml") == []
    master = job["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["containers"][0]
    env = {e["name"]: e for e in master["env"]}
    for key in TRACKING_KEYS:
        ref = env[key]["valueFrom"]["secretKeyRef"]
        assert ref == {"name": "team-mlflow", "key": key, "optional": True} and "value" not in env[key]
    assert env["MLFLOW_EXPERIMENT_NAME"]["value"] == "llm-finetune"


def test_an_unknown_tracker_is_refused_naming_the_setting():
    errors = check({**defaults(), "report_to": ["tensorboard", "neptune"]})
    assert errors == ["report_to=['tensorboard', 'neptune']: each entry is one of tensorboard, mlflow, wandb"]


@pytest.mark.slow
def test_a_local_run_with_mlflow_writes_its_metrics_to_a_file_store(tmp_path):
    pytest.importorskip("mlflow")
    from components.train.launcher.local_torchrun import run_torchrun
    from tests.helpers.trainer import make_workdir, trainer_config

    root = make_workdir(tmp_path)
    store = tmp_path / "mlruns"
    env = {
        **__import__("os").environ,
        "MLFLOW_TRACKING_URI": f"file:{store}",
        "MLFLOW_EXPERIMENT_NAME": "llm-finetune",
        "MLFLOW_ALLOW_FILE_STORE": "true",
    }  # as the local train step sets them
    run_torchrun(
        trainer_config(root, "mlflow", report_to=["tensorboard", "mlflow"], max_steps=6, save_steps=6),
        nproc_per_node=2,
        env=env,
    )
    losses = list(store.glob("*/*/metrics/loss")) + list(store.glob("*/*/*/metrics/loss"))
    assert losses, sorted(str(p.relative_to(store)) for p in store.rglob("*"))[:40]
    assert len(Path(losses[0]).read_text().splitlines()) >= 1
    # The final model, written after training ended the callback's run, is on the same run as a tag.
    (tag,) = [t for t in store.rglob("tags/final_model") if t.parent.parent == losses[0].parent.parent]
    assert tag.read_text() == str(root / "mlflow" / "final")


@pytest.mark.slow
def test_a_run_with_wandb_offline_logs_its_metrics_and_the_final_models_reference(tmp_path, capfd):
    """... and, reporting to W&B only, no rank imports MLflow (components/train/trainer/unused_trackers.py), which
    DeepSpeed would import whenever it is installed: Python's own import profile of every process says so."""
    pytest.importorskip("wandb")
    pytest.importorskip("mlflow")  # installed, as in the trainer image
    from components.train.launcher.local_torchrun import run_torchrun
    from tests.helpers.trainer import make_workdir, trainer_config

    root = make_workdir(tmp_path)
    env = {**__import__("os").environ, "WANDB_MODE": "offline", "WANDB_DIR": str(tmp_path), "WANDB_SILENT": "true"}
    run_torchrun(
        trainer_config(root, "wandb", report_to=["wandb"], max_steps=4, save_steps=4, logging_steps=1),
        nproc_per_node=2,
        env={**env, "PYTHONPROFILEIMPORTTIME": "1"},
    )
    profile = "".join(capfd.readouterr())
    imported = set(re.findall(r"^import time: +\d+ \| +\d+ \| +([\w.]+)$", profile, re.M))
    assert "deepspeed" in imported and "wandb" in imported, sorted(imported)[:50]  # the profile covers the ranks
    # An import of the absent mark fails in microseconds and still gets its line ("mlflow"); a real one loads its
    # submodules (mlflow.entities, mlflow.tracking, ...: over 300 of them).
    assert not {name for name in imported if name.startswith("mlflow.")}
    # W&B's offline run file (its records, protobuf; 0.31 ships no reader in Python): the losses, the summary key
    # and the model artifact's file:// reference are in it.
    (run,) = list((tmp_path / "wandb").glob("offline-run-*/run-*.wandb"))
    data = run.read_bytes()
    final = str(root / "wandb" / "final")
    assert b"train/loss" in data and b"final_model" in data
    assert f"file://{final}".encode() in data
