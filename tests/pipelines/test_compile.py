"""The compiled pipeline: in sync with the source, valid KFP IR, and shaped for the cluster."""

import json

import pytest
import yaml
from google.protobuf import json_format
from kfp.kubernetes import kubernetes_executor_config_pb2
from kfp.pipeline_spec import pipeline_spec_pb2

from components.stages import STAGES
from pipelines.compile import COMPILED, same_pipeline
from tests.helpers.repo import run_cli


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
    for comp in pipeline["components"].values():
        tasks.update(comp.get("dag", {}).get("tasks", {}))
    return tasks


def test_every_task_has_a_display_name_and_side_effect_steps_do_not_cache(docs):
    pipeline, _ = docs
    tasks = _tasks(pipeline)
    assert {
        "validate-inputs",
        "prepare-dataset",
        "train-model",
        "evaluate-model",
        "deploy-model",
        "skip-deployment",
    } <= set(tasks)
    for name, task in tasks.items():
        if not name.startswith("condition"):
            assert task["taskInfo"]["name"][0].isupper(), f"{name} has no display name"
    for name in ("validate-inputs", "prepare-dataset", "train-model", "deploy-model"):
        assert not tasks[name].get("cachingOptions", {}).get("enableCache", False), name


def test_deploy_is_gated_on_the_evaluation_output(docs):
    # Each variant's evaluation gates it; the comparison after the variants' loop passes on whether any passed (a
    # run without variants: its one evaluation's decision).
    pipeline, _ = docs
    tasks = _tasks(pipeline)
    passed = "inputs.parameter_values['pipelinechannel--compare-variants-passed'] == true"
    gates = {
        t["taskInfo"]["name"]: (t["componentRef"]["name"], t["triggerPolicy"]["condition"])
        for t in tasks.values()
        if "compare-variants-passed" in t.get("triggerPolicy", {}).get("condition", "")
    }
    assert {name: condition for name, (_, condition) in gates.items()} == {
        "evaluation-passed": passed,
        "evaluation-not-passed": f"!({passed})",
    }
    # the branches hold the deploy and the skip step respectively
    comps = pipeline["components"]
    gated = comps[gates["evaluation-passed"][0]]["dag"]["tasks"]
    assert set(gated) == {"deploy-model", "publish-model"}
    # published only once deployed (its endpoint is an input): a model that failed its gates goes nowhere
    assert gated["publish-model"]["dependentTasks"] == ["deploy-model"]
    assert set(comps[gates["evaluation-not-passed"][0]]["dag"]["tasks"]) == {"skip-deployment"}


def test_volumes_secret_gpus_and_placement(docs):
    _, platform = docs
    ex = platform["platforms"]["kubernetes"]["deploymentSpec"]["executors"]

    def param(ref):  # inside a condition or the exit handler, a pipeline parameter arrives as a channel
        return ref["componentInputParameter"].removeprefix("pipelinechannel--")

    mounts = {
        name: {m["mountPath"]: param(m["pvcNameParameter"]) for m in e.get("pvcMount", [])} for name, e in ex.items()
    }
    prepares = [name for name in ex if name.startswith("exec-prepare-dataset")]
    trains = [name for name in ex if name.startswith("exec-train-model")]
    # the sft data for evaluation, then a slot per stage
    assert len(prepares) == 1 + len(STAGES) and len(trains) == len(STAGES)
    for name in prepares:
        assert mounts[name] == {"/mnt/data": "data_pvc"}, name
    for name in trains:
        assert mounts[name] == {"/mnt/data": "data_pvc", "/mnt/models": "model_pvc"}, name
    assert mounts["exec-evaluate-model"] == {"/mnt/data": "data_pvc", "/mnt/models": "model_pvc"}
    # The exit handler reads the steps' outcome records on both volumes (components/observe/outcome.py).
    assert mounts["exec-notify-run"] == {"/mnt/data": "data_pvc", "/mnt/models": "model_pvc"}
    (alert,) = ex["exec-notify-run"]["secretAsEnv"]
    assert param(alert["secretNameParameter"]) == "alert_webhook_secret"
    assert alert["keyToEnv"] == [{"envVar": "ALERT_WEBHOOK_URL", "secretKey": "ALERT_WEBHOOK_URL"}]
    assert alert["optional"] is True
    for name in (*prepares, "exec-evaluate-model"):
        # The evaluation also references the Langfuse Secret (tests/observe/test_pipeline_watching.py).
        secret = next(r for r in ex[name]["secretAsEnv"] if param(r["secretNameParameter"]) == "hf_token_secret")
        assert secret["keyToEnv"] == [{"envVar": "HF_TOKEN", "secretKey": "HF_TOKEN"}]
        assert secret["optional"] is True
    ev = ex["exec-evaluate-model"]
    assert ev["emptyDirMounts"] == [
        {"medium": "Memory", "mountPath": "/dev/shm", "sizeLimit": "64Gi", "volumeName": "dshm"}
    ]
    assert param(ev["nodeSelector"]["nodeSelectorJson"]) == "node_selector"
    assert param(ev["tolerations"][0]["tolerationJson"]) == "tolerations"


def test_evaluate_requests_gpus_from_a_parameter(docs):
    pipeline, _ = docs
    container = pipeline["deploymentSpec"]["executors"]["exec-evaluate-model"]["container"]
    acc = container["resources"]["accelerator"]
    assert acc["resourceType"] == "nvidia.com/gpu"
    assert "eval_gpus" in json.dumps(acc)


def test_paths_are_run_scoped(docs):
    pipeline, _ = docs
    tasks = _tasks(pipeline)
    for name in ("prepare-dataset", "list-variants"):
        run_id = tasks[name]["inputs"]["parameters"]["run_id"]
        assert run_id["runtimeValue"]["constant"] == "{{$.pipeline_job_uuid}}"
    # Inside the variants' loop each step takes its variant's run id (the run's, or <run id>-<variant>).
    for name in ("prepare-dataset-2", "train-model"):
        assert tasks[name]["inputs"]["parameters"]["run_id"] == {
            "componentInputParameter": "pipelinechannel--list-variants-Output-loop-item",
            "parameterExpressionSelector": 'parseJson(string_value)["run_id"]',
        }


def test_no_secret_values_and_no_shell(docs):
    text = COMPILED.read_text()
    assert "hf_" not in text.lower().replace("hf_token", "").replace("hf_home", "").replace("hf_endpoint", "")
    pipeline, _ = docs
    for executor in pipeline["deploymentSpec"]["executors"].values():
        container = executor["container"]
        assert container["image"].endswith(":" + __import__("components.version").version.__version__)
        # KFP's own lightweight-component launcher is `sh -ec` with a fixed script; our inputs are never in it.
        script = " ".join(container["command"])
        assert "{{$.inputs" not in script


def test_an_exit_handler_reports_the_outcome_of_every_run(docs):
    pipeline, _ = docs
    root = pipeline["root"]["dag"]["tasks"]
    (handler,) = [t for t in root.values() if t["componentRef"]["name"].startswith("comp-exit-handler")]
    notify = root["notify-run"]
    assert notify["triggerPolicy"]["strategy"] == "ALL_UPSTREAM_TASKS_COMPLETED"  # also after a failure
    assert notify["dependentTasks"] == [next(k for k, t in root.items() if t is handler)]
    inside = pipeline["components"][handler["componentRef"]["name"]]["dag"]["tasks"]
    assert "validate-inputs" in inside and "compare-variants" in inside
    # KFP allows no pipeline outputs from inside an exit handler: the cluster pipeline has none.
    assert "outputDefinitions" not in pipeline["root"]


def test_the_local_variant_returns_the_summary_fields():
    from pipelines.llm_finetune import build_pipeline

    outputs = build_pipeline("local", "/tmp/ws").pipeline_spec.root.output_definitions
    assert set(outputs.parameters) == {"model_uri", "passed", "reason", "endpoint", "smoke_reply"}
    assert set(outputs.artifacts) == {"metrics"}
