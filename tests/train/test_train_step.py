"""train_model's work without KFP (components/train/launcher/run.py) and the training setup it shares with the
hyper-parameter search (components/train/launcher/job_setup.py): the config's paths as the trainer sees them, the job it
creates, what it leaves on the volume and what it reports. The trainer and the cluster are stand-ins here; the real
ones run in tests/train/test_train_and_evaluate.py, the rehearsal and the local end-to-end run."""

import json
import logging
from pathlib import Path

import pytest

from components import kube
from components.settings import Settings, defaults
from components.train.launcher import job as launch
from components.train.launcher import job_setup, trainjob
from components.train.launcher import local_torchrun as train_local
from components.train.launcher.job_setup import TrainerMounts, record_created
from components.train.launcher.run import train_stage, trainer_env

RUN_ID = "run-1"
NS = "team-llm"
METRICS = {"eval_loss": 1.5, "global_step": 7}


def settings(**over) -> Settings:
    return Settings.from_flat({**defaults(), "tensorboard": False, "prometheus_url": "", **over})


def test_paths_on_the_volumes_become_the_pods_mounts_and_stay_as_they_are_for_a_local_run():
    pods = TrainerMounts.for_backend("/ws/data", "/ws/models", "pytorchjob")
    assert (pods.data, pods.models) == ("/mnt/data", "/mnt/models")
    assert pods.for_trainer("/ws/data/runs/r/dataset") == "/mnt/data/runs/r/dataset"
    assert pods.for_trainer("/ws/models/runs/r/train") == "/mnt/models/runs/r/train"
    assert pods.for_trainer("/ws/models") == "/mnt/models"
    # Neither volume: a Hub id, a built-in model, a folder whose name merely starts like a volume's.
    for other in ("Qwen/Qwen3-0.6B", "builtin:tiny-qwen3", "/ws/data2/x"):
        assert pods.for_trainer(other) == other
    here = TrainerMounts.for_backend("/ws/data", "/ws/models", "local")
    assert (here.data, here.models) == ("/ws/data", "/ws/models")
    assert here.for_trainer("/ws/data/runs/r/dataset") == "/ws/data/runs/r/dataset"
    nested = TrainerMounts("/vol", "/vol/models", local=False)  # the longer root is the path's volume
    assert nested.for_trainer("/vol/models/x") == "/mnt/models/x" and nested.for_trainer("/vol/x") == "/mnt/data/x"


def test_the_trainer_release_is_read_from_the_cluster_only_for_a_trainjob(monkeypatch):
    calls = []
    monkeypatch.setattr(trainjob, "installed_trainer_version", lambda: calls.append(1) or trainjob.TRAINER_V2_1)
    assert (
        job_setup.cluster_trainer_version("pytorchjob") is None and job_setup.cluster_trainer_version("local") is None
    )
    assert calls == []
    assert job_setup.cluster_trainer_version("trainjob") == trainjob.TRAINER_V2_1 and calls == [1]


def test_a_created_objects_identity_goes_beside_its_output_at_once_and_to_the_log(tmp_path, caplog):
    obj = {"kind": "Experiment", "metadata": {"namespace": NS, "name": "hpo-r", "uid": "u-1"}, "spec": {}}
    with caplog.at_level(logging.INFO, logger="a_step"):
        record_created(str(tmp_path), logging.getLogger("a_step"))(obj)
    assert json.loads((tmp_path / "experiment.json").read_text()) == obj
    assert caplog.messages == [f"Experiment {NS}/hpo-r uid u-1"]


def test_a_local_trainers_environment_keeps_the_users_and_adds_what_it_needs(monkeypatch):
    monkeypatch.setattr(train_local, "metrics_port_here", lambda port: port + 1)  # as if the port were taken here
    s = settings(train_backend="local", metrics_port=9410)
    env = trainer_env(s, {"report_to": ["mlflow"]}, model_root="/ws/models", run_id=RUN_ID, environ={"A": "1"})
    assert env == {
        "A": "1",
        "MLFLOW_TRACKING_URI": "file:/ws/mlruns",
        "MLFLOW_EXPERIMENT_NAME": "llm-finetune",
        "MLFLOW_ALLOW_FILE_STORE": "true",
        "TRAINER_RUN_ID": RUN_ID,
        "TRAINER_METRICS_PORT": "9411",
    }
    users = {"MLFLOW_TRACKING_URI": "http://mlflow:5000", "TRAINER_RUN_ID": "mine"}
    s = settings(train_backend="local", metrics_port=0)
    env = trainer_env(s, {"report_to": ["tensorboard"]}, model_root="/ws/models", run_id=RUN_ID, environ=users)
    assert env == users


def _trainer_ends(output_dir: Path) -> None:
    """What the trainer leaves when it ends: its final model and metrics.json."""
    (output_dir / "final").mkdir(parents=True, exist_ok=True)
    (output_dir / "metrics.json").write_text(json.dumps(METRICS))


@pytest.fixture
def torchrun(monkeypatch):
    """torchrun as the local backend starts it: each call's config, process count and environment; the trainer
    ends at once. This machine has no CUDA GPU."""
    calls = []

    def run(config_path, nproc_per_node, env=None):
        cfg = json.loads(Path(config_path).read_text())
        calls.append({"config_path": config_path, "cfg": cfg, "nproc": nproc_per_node, "env": env})
        _trainer_ends(Path(cfg["output_dir"]))

    monkeypatch.setattr(train_local, "run_torchrun", run)
    monkeypatch.setattr(train_local, "cuda_available", lambda: False)
    return calls


def test_a_local_stage_trains_here_with_the_steps_paths_and_reports_its_final_model(tmp_path, torchrun):
    data, models = tmp_path / "data", tmp_path / "models"
    dataset = data / "runs" / RUN_ID / "dataset"
    s = settings(train_backend="local", gpus_per_node=2, deepspeed_config="none", metrics_port=0)
    trained = train_stage(
        s,
        stage="sft",
        base_model_path="builtin:tiny-qwen3",
        tuned={"learning_rate": 1e-3},
        dataset_path=str(dataset),
        packing=False,
        data_root=str(data),
        model_root=str(models),
        run_id=RUN_ID,
    )
    out = models / "runs" / RUN_ID / "train"
    assert trained.model_uri == trained.model_path == str(out / "final") and trained.job_name == ""
    assert trained.metadata == {
        "pvc": s.storage.model_pvc,
        "path": str(out / "final"),
        "uri": str(out / "final"),
        "stage": "sft",
        "base_model": "builtin:tiny-qwen3",
        "method": s.model.method,
        "job_name": "",
        **METRICS,
    }
    (call,) = torchrun
    assert call["config_path"] == str(out / "train_config.json") and call["nproc"] == 2
    cfg = call["cfg"]
    assert (cfg["dataset_path"], cfg["output_dir"], cfg["model_cache_dir"]) == (
        str(dataset),
        str(out),
        str(data / "cache"),
    )
    assert cfg["use_cpu"] is True and cfg["learning_rate"] == 1e-3 and cfg["model_name_or_path"] == "builtin:tiny-qwen3"
    assert cfg["train_sampling_strategy"] == "group_by_length"  # unpacked rows
    assert call["env"]["TRAINER_RUN_ID"] == RUN_ID


def test_a_reward_model_stage_hands_the_model_it_started_from_to_the_next_stage(tmp_path, torchrun):
    models = tmp_path / "models"
    base = str(models / "runs" / RUN_ID / "train" / "final")
    trained = train_stage(
        settings(train_backend="local", deepspeed_config="none", metrics_port=0),
        stage="rm",
        base_model_path=base,
        tuned={},
        dataset_path=str(tmp_path / "data" / "runs" / RUN_ID / "dataset-rm"),
        packing=False,
        data_root=str(tmp_path / "data"),
        model_root=str(models),
        run_id=RUN_ID,
    )
    assert trained.model_uri == trained.model_path == base
    assert trained.metadata["path"] == str(models / "runs" / RUN_ID / "rm" / "final")


@pytest.mark.parametrize("backend, kind", [("pytorchjob", "PyTorchJob"), ("trainjob", "TrainJob")])
def test_a_cluster_stage_runs_its_job_with_the_pods_paths_and_records_it(tmp_path, monkeypatch, cluster, backend, kind):
    data, models = tmp_path / "data", tmp_path / "models"
    out = models / "runs" / RUN_ID / "dpo"
    seen = {}
    policies = ("networking.k8s.io", "v1", "networkpolicies", NS, kube.job_name_for(RUN_ID, "dpo"))

    def run_training_job(manifest, **kwargs):
        # The job's NetworkPolicy is there before the job, and recorded for the exit handler.
        seen.update(manifest=manifest, policy=cluster.get_object(*policies), **kwargs)
        seen["record"] = json.loads((models / "runs" / RUN_ID / "trainer-network-policy.json").read_text())
        kwargs["on_created"]({**manifest, "metadata": {**manifest["metadata"], "uid": "u-1"}})
        _trainer_ends(out)

    monkeypatch.setattr(launch, "run_training_job", run_training_job)
    monkeypatch.setattr(kube, "current_namespace", lambda default="default": NS)
    monkeypatch.setattr(trainjob, "installed_trainer_version", lambda: trainjob.TRAINER_V2_1)
    base = str(models / "runs" / RUN_ID / "train" / "final")  # the sft stage's model, on the model volume
    s = settings(train_backend=backend, model_pvc="llm-models", job_restarts=1, pending_timeout_seconds=300)
    trained = train_stage(
        s,
        stage="dpo",
        base_model_path=base,
        tuned={},
        dataset_path=str(data / "runs" / RUN_ID / "dataset-dpo"),
        packing=False,
        data_root=str(data),
        model_root=str(models),
        run_id=RUN_ID,
    )
    name = kube.job_name_for(RUN_ID, "dpo")
    assert trained == (f"pvc://llm-models/runs/{RUN_ID}/dpo/final", str(out / "final"), name, trained.metadata)
    assert trained.metadata["job_name"] == name and trained.metadata["base_model"] == base

    cfg = json.loads((out / "train_config.json").read_text())
    assert cfg["model_name_or_path"] == f"/mnt/models/runs/{RUN_ID}/train/final"
    assert cfg["dataset_path"] == f"/mnt/data/runs/{RUN_ID}/dataset-dpo"
    assert cfg["output_dir"] == f"/mnt/models/runs/{RUN_ID}/dpo" and cfg["model_cache_dir"] == "/mnt/data/cache"
    assert "use_cpu" not in cfg and cfg["bf16"] is True

    manifest = seen["manifest"]
    assert manifest["kind"] == kind and manifest["metadata"]["name"] == name
    assert manifest["metadata"]["namespace"] == NS
    assert f"/mnt/models/runs/{RUN_ID}/dpo/train_config.json" in json.dumps(manifest)
    assert (seen["job_restarts"], seen["pending_timeout_seconds"], seen["watch"]) == (1, 300, None)
    assert json.loads((out / f"{kind.lower()}.json").read_text())["metadata"]["uid"] == "u-1"
    # Only the run's own pods reach the job's pods (the metrics port is open to the scrapers).
    policy = seen["policy"]
    pod_label = "training.kubeflow.org/job-name" if kind == "PyTorchJob" else "jobset.sigs.k8s.io/jobset-name"
    assert policy["spec"]["podSelector"] == {"matchLabels": {pod_label: name}}
    assert policy["spec"]["ingress"][0] == {"from": [{"podSelector": {"matchLabels": {kube.RUN_ID_LABEL: RUN_ID}}}]}
    assert seen["record"] == [{"kind": "NetworkPolicy", "namespace": NS, "name": name}]
    # Deleted when the job ended, and its record with it.
    assert cluster.get_object(*policies) is None
    assert not (models / "runs" / RUN_ID / "trainer-network-policy.json").exists()
