"""The compiled pipeline: in sync with the source, valid KFP IR, and shaped for the cluster."""

import json

import pytest
import yaml
from google.protobuf import json_format
from kfp.kubernetes import kubernetes_executor_config_pb2
from kfp.pipeline_spec import pipeline_spec_pb2

from pipelines.compile import COMPILED, same_pipeline
from tests.conftest import run_cli


@pytest.fixture(scope="module")
def docs():
    pipeline, platform = yaml.safe_load_all(COMPILED.read_text())
    return pipeline, platform


def test_check_passes_on_the_checked_in_yaml():
    result = run_cli("pipelines.compile", "--check")
    assert result.returncode == 0, result.stdout + result.stderr


def test_check_fails_and_shows_the_difference_when_stale(tmp_path):
    stale = tmp_path / "llm_finetune.yaml"
    stale.write_text(COMPILED.read_text().replace("learning_rate", "learn_rate"))
    result = run_cli("pipelines.compile", "--check", "--output", str(stale))
    assert result.returncode == 1
    assert "is stale: run `python -m pipelines.compile`" in result.stderr
    assert "+" in result.stdout and "learning_rate" in result.stdout


def test_header_order_noise_is_not_staleness():
    text = COMPILED.read_text()
    assert same_pipeline(text, "# a different comment\n" + text)


def test_yaml_parses_strictly_as_kfp_ir_and_platform_spec(docs):
    pipeline, platform = docs
    json_format.ParseDict(pipeline, pipeline_spec_pb2.PipelineSpec())  # unknown fields raise
    json_format.ParseDict(platform, pipeline_spec_pb2.PlatformSpec())
    for executor in platform["platforms"]["kubernetes"]["deploymentSpec"]["executors"].values():
        json_format.ParseDict(executor, kubernetes_executor_config_pb2.KubernetesExecutorConfig())


def _tasks(pipeline):
    tasks = dict(pipeline["root"]["dag"]["tasks"])
    for name, comp in pipeline["components"].items():
        tasks.update(comp.get("dag", {}).get("tasks", {}))
    return tasks


def test_every_task_has_a_display_name_and_side_effect_steps_do_not_cache(docs):
    pipeline, _ = docs
    tasks = _tasks(pipeline)
    assert {"validate-inputs", "prepare-dataset", "train-model", "evaluate-model", "deploy-model", "skip-deployment"} <= set(tasks)
    for name, task in tasks.items():
        if not name.startswith("condition"):
            assert task["taskInfo"]["name"][0].isupper(), f"{name} has no display name"
    for name in ("validate-inputs", "prepare-dataset", "train-model", "deploy-model"):
        assert not tasks[name].get("cachingOptions", {}).get("enableCache", False), name


def test_deploy_is_gated_on_the_evaluation_output(docs):
    pipeline, _ = docs
    tasks = _tasks(pipeline)
    conditions = {name: t["triggerPolicy"]["condition"] for name, t in tasks.items() if "triggerPolicy" in t}
    passed = "inputs.parameter_values['pipelinechannel--evaluate-model-passed'] == true"
    assert conditions == {"condition-2": passed, "condition-3": f"!({passed})"}
    # the branches hold the deploy and the skip step respectively
    comps = pipeline["components"]
    assert set(comps["comp-condition-2"]["dag"]["tasks"]) == {"deploy-model"}
    assert set(comps["comp-condition-3"]["dag"]["tasks"]) == {"skip-deployment"}


def test_volumes_secret_gpus_and_placement(docs):
    _, platform = docs
    ex = platform["platforms"]["kubernetes"]["deploymentSpec"]["executors"]
    mounts = {name: {m["mountPath"]: m["pvcNameParameter"]["componentInputParameter"] for m in e.get("pvcMount", [])}
              for name, e in ex.items()}
    assert mounts["exec-prepare-dataset"] == {"/mnt/data": "data_pvc"}
    assert mounts["exec-train-model"] == {"/mnt/data": "data_pvc", "/mnt/models": "model_pvc"}
    assert mounts["exec-evaluate-model"] == {"/mnt/data": "data_pvc", "/mnt/models": "model_pvc"}
    for name in ("exec-prepare-dataset", "exec-evaluate-model"):
        (secret,) = ex[name]["secretAsEnv"]
        assert secret["secretNameParameter"]["componentInputParameter"] == "hf_token_secret"
        assert secret["keyToEnv"] == [{"envVar": "HF_TOKEN", "secretKey": "HF_TOKEN"}]
        assert secret["optional"] is True
    ev = ex["exec-evaluate-model"]
    assert ev["emptyDirMounts"] == [{"medium": "Memory", "mountPath": "/dev/shm", "sizeLimit": "64Gi", "volumeName": "dshm"}]
    assert ev["nodeSelector"]["nodeSelectorJson"]["componentInputParameter"] == "node_selector"
    assert ev["tolerations"][0]["tolerationJson"]["componentInputParameter"] == "tolerations"


def test_evaluate_requests_gpus_from_a_parameter(docs):
    pipeline, _ = docs
    container = pipeline["deploymentSpec"]["executors"]["exec-evaluate-model"]["container"]
    acc = container["resources"]["accelerator"]
    assert acc["resourceType"] == "nvidia.com/gpu"
    assert "eval_gpus" in json.dumps(acc)


def test_paths_are_run_scoped(docs):
    pipeline, _ = docs
    tasks = _tasks(pipeline)
    for name in ("prepare-dataset", "train-model"):
        run_id = tasks[name]["inputs"]["parameters"]["run_id"]
        assert run_id["runtimeValue"]["constant"] == "{{$.pipeline_job_uuid}}"


def test_no_secret_values_and_no_shell(docs):
    text = COMPILED.read_text()
    assert "hf_" not in text.lower().replace("hf_token", "").replace("hf_home", "")
    pipeline, _ = docs
    for executor in pipeline["deploymentSpec"]["executors"].values():
        container = executor["container"]
        assert container["image"].endswith(":" + __import__("components.version").version.__version__)
        # KFP's own lightweight-component launcher is `sh -ec` with a fixed script; our inputs are never in it.
        script = " ".join(container["command"])
        assert "{{$.inputs" not in script


def test_pipeline_outputs_summary_fields(docs):
    pipeline, _ = docs
    outputs = pipeline["root"]["outputDefinitions"]
    assert set(outputs["parameters"]) == {"model_uri", "passed", "reason", "endpoint", "smoke_reply"}
    assert set(outputs["artifacts"]) == {"metrics"}
