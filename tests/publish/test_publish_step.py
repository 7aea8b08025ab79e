"""publish_model, the KFP step, as the cluster runs it: its Secrets read through the Kubernetes API (the fake API
server), the model registered in a fake Model Registry that checks every request against the real OpenAPI spec,
pushed to a fake Hub that speaks huggingface_hub's protocol, and the evaluation added to the MLflow run the trainer
logged into (a real file store)."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
from huggingface_hub import constants
from safetensors.numpy import save_file

from components.publish.component import publish_model
from components.settings import defaults
from tests.fakes.hub import running_fake_hub
from tests.fakes.k8s_api import FakeKubeAPI
from tests.fakes.model_registry import running_fake_model_registry

RUN_ID = "7f3a9c1e-0000-4000-8000-00000000abcd"
HUB_TOKEN, REGISTRY_TOKEN = "hf_write_token", "sa-token"


@pytest.fixture
def model(tmp_path):
    """The chosen variant's final folder, where the train step exports it (runs/<variant run id>/train/final)."""
    import numpy as np

    final = tmp_path / "models" / "runs" / f"{RUN_ID}-lr-high" / "train" / "final"
    final.mkdir(parents=True)
    save_file({"w": np.zeros((4, 4), dtype=np.float32)}, str(final / "model.safetensors"))
    (final / "config.json").write_text('{"model_type": "qwen3"}')
    (final / "optimizer.pt").write_bytes(b"not pushed")
    return final


def test_the_step_registers_pushes_and_records_the_deployed_model(tmp_path, monkeypatch, model):
    mlflow = pytest.importorskip("mlflow")
    from components.train.trainer.tracking import OneMLflowRunCallback

    for name, value in (("HF_HUB_DISABLE_TELEMETRY", True), ("HF_HUB_OFFLINE", False), ("HF_HUB_DISABLE_XET", True)):
        monkeypatch.setattr(constants, name, value)
    store = f"file:{tmp_path / 'mlruns'}"
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    # The trainer's pods logged the stage into the pipeline's experiment under the variant's run id.
    monkeypatch.setenv("MLFLOW_TRACKING_URI", store)
    monkeypatch.setenv("MLFLOW_EXPERIMENT_NAME", "llm-finetune")
    monkeypatch.setenv("TRAINER_RUN_ID", f"{RUN_ID}-lr-high")
    args = SimpleNamespace(report_to=["mlflow"], run_name="sft", stage="sft")
    OneMLflowRunCallback().on_train_begin(args, SimpleNamespace(is_world_process_zero=True), None)
    trained = mlflow.active_run().info.run_id
    mlflow.end_run()
    for name in ("MLFLOW_TRACKING_URI", "MLFLOW_EXPERIMENT_NAME", "TRAINER_RUN_ID"):
        monkeypatch.delenv(name)  # the publish step's pod has them from tracking_secret only
    token_file = tmp_path / "sa-token"
    token_file.write_text(REGISTRY_TOKEN)
    monkeypatch.setenv("KF_PIPELINES_SA_TOKEN_PATH", str(token_file))

    with (
        FakeKubeAPI() as kube,
        running_fake_hub(tokens={HUB_TOKEN: "write"}) as hub,
        running_fake_model_registry(token=REGISTRY_TOKEN) as registry,
    ):
        kube.add_secret("default", "hf-token", {"HF_TOKEN": HUB_TOKEN})
        kube.add_secret("default", "llm-tracking", {"MLFLOW_TRACKING_URI": store})
        monkeypatch.setattr("components.kube.load_api_client", lambda: kube.client)
        settings = {
            **defaults(),
            "report_to": ["tensorboard", "mlflow"],
            "model_registry_url": registry.url,
            "hub_repo_id": "team/qwen3-support",
            "hub_endpoint": hub.url,
        }
        report = tmp_path / "report.md"
        report.write_text("# lr-high passed\n")
        done = publish_model.python_func(
            model_path=str(model),
            model_uri=f"pvc://llm-models/runs/{RUN_ID}-lr-high/train/final",
            settings=settings,
            run_id=RUN_ID,
            endpoint="http://qwen3-30b-a3b-sft.team.svc.cluster.local/v1",
            metrics=SimpleNamespace(metadata={"eval_loss": 1.5, "lr-high_eval_loss": 1.5}),
            report=SimpleNamespace(path=str(report)),
        )
        secrets_read = [r.path for r in kube.requests_for("GET", "/secrets/")]
    assert len(done) == 4 and done[-1].startswith("served at http://qwen3")
    # Model Registry: the serving name, a version named after the run the model trained in, its URI and metrics.
    (version,) = registry.model_versions.values()
    (artifact,) = registry.artifacts.values()
    assert version["name"] == f"{RUN_ID}-lr-high" and registry.problems == []
    assert artifact["uri"] == f"pvc://llm-models/runs/{RUN_ID}-lr-high/train/final"
    assert version["customProperties"]["eval_loss"]["double_value"] == 1.5
    assert [m["name"] for m in registry.registered_models.values()] == ["qwen3-30b-a3b-sft"]
    # Hub: private, the model's files only.
    assert hub.repos["team/qwen3-support"].private
    assert sorted(hub.files("team/qwen3-support")) == [".gitattributes", "config.json", "model.safetensors"]
    # Tracker: the stage's run has the evaluation, the report and where the model is.
    run = mlflow.MlflowClient(store).get_run(trained)
    assert run.data.metrics["eval/eval_loss"] == 1.5 and run.data.tags["model_uri"].startswith("pvc://llm-models/")
    # The Secrets it read, by name, through the API: the Hub token's and the tracker's, nothing else.
    assert sorted(p.rsplit("/", 1)[1] for p in secrets_read) == ["hf-token", "llm-tracking"]
    assert HUB_TOKEN not in json.dumps(done)


def test_nothing_set_nothing_done_and_no_secret_read(tmp_path, model):
    with FakeKubeAPI() as kube:
        done = publish_model.python_func(
            model_path=str(model),
            model_uri="pvc://llm-models/x",
            settings=defaults(),
            run_id=RUN_ID,
            endpoint="http://x",
            metrics=SimpleNamespace(metadata={"eval_loss": 1.5}),
            report=SimpleNamespace(path=str(tmp_path / "none.md")),
        )
        assert done == [] and kube.requests == []


def test_a_missing_hub_token_secret_is_one_line_naming_the_setting(tmp_path, monkeypatch, model):
    with FakeKubeAPI() as kube:
        monkeypatch.setattr("components.kube.load_api_client", lambda: kube.client)
        with pytest.raises(ValueError, match=r"^hub_token_secret='hf-token': Secret not found in default \(kubectl"):
            publish_model.python_func(
                model_path=str(model),
                model_uri="pvc://llm-models/x",
                settings={**defaults(), "hub_repo_id": "team/m"},
                run_id=RUN_ID,
                endpoint="http://x",
                metrics=SimpleNamespace(metadata={}),
                report=SimpleNamespace(path=""),
            )
