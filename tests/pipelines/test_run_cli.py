"""`python -m pipelines.run` as users call it: help, render, and one clear line for every bad input."""

import json
import socket
from types import SimpleNamespace

import kubernetes
import pytest
import yaml

from tests.helpers.repo import run_cli


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_help_works_without_cluster_or_gpu():
    result = run_cli("pipelines.run", "--help", timeout=30)
    assert result.returncode == 0
    for flag in (
        "--host",
        "--preset",
        "--params",
        "-p KEY=VALUE",
        "--schedule",
        "--experiment",
        "--namespace",
        "--render",
        "--summary-json",
        "--verbose",
    ):
        assert flag in result.stdout
    assert "(default: ./workspace)" in result.stdout and "``" not in result.stdout  # no RST markup


def test_help_lists_the_presets_and_every_setting_with_type_default_and_help():
    from components.settings import specs
    from pipelines.params import preset_names

    out = run_cli("pipelines.run", "--help", timeout=30).stdout
    presets = out.split("presets (--preset NAME):\n")[1].split("\n\n")[0]
    for name in preset_names():
        assert f"  {name} " in presets, name
    assert "The laptop run: a tiny Qwen3" in presets
    rows = [r for r in out.split("parameters (-p NAME=VALUE")[1].splitlines()[2:] if not r.endswith(":")]
    assert len(rows) == len(specs())
    for row, spec in zip(rows, specs().values(), strict=True):
        shown = json.dumps(spec.default) if isinstance(spec.default, (dict, list, str)) else str(spec.default)
        signature, _, help_text = row[2:].partition(f" = {shown}")
        assert signature == f"{spec.name}: {spec.type.__name__}", row
        assert row[1] == (" " if spec.plain else "*"), row  # * marks a setting inside advanced_settings
        assert len(help_text.strip()) > 5, f"{spec.name} has no help line"
    assert "  learning_rate: float = 5e-05" in out and "Peak learning rate" in out
    assert " *lora_r: int = 16" in out


def test_help_imports_no_ml_or_kubernetes_library():
    """--help stays fast: the settings model imports nothing heavy."""
    import subprocess
    import sys

    from tests.helpers.repo import ROOT

    probe = (
        "import sys\nfrom pipelines import run\ntry:\n    run.main(['--help'])\nexcept SystemExit:\n    pass\n"
        "print(sorted(m for m in ('kfp', 'torch', 'transformers', 'kubernetes', 'datasets') if m in sys.modules))"
    )
    result = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert result.stdout.splitlines()[-1] == "[]", result.stdout[-500:] + result.stderr


def test_every_setting_reaches_the_rendered_configs_from_the_command_line(tmp_path):
    """-p reaches a setting whether it is a pipeline parameter of its own or inside advanced_settings."""
    result = run_cli(
        "pipelines.run",
        "--preset",
        "qwen3-30b-a3b-lora",
        "-p",
        "lora_r=32",
        "-p",
        "learning_rate=2e-4",
        "-p",
        "weight_decay=0.1",
        "--render",
        str(tmp_path),
    )
    assert result.returncode == 0, result.stderr
    trainer = json.loads((tmp_path / "train_config.json").read_text())
    assert (trainer["lora_r"], trainer["learning_rate"], trainer["weight_decay"]) == (32, 2e-4, 0.1)
    assert yaml.safe_load((tmp_path / "params.yaml").read_text())["lora_r"] == 32


def test_render_writes_compiled_pipeline_and_resolved_params(tmp_path):
    result = run_cli(
        "pipelines.run", "--preset", "qwen3-30b-a3b-full", "-p", "learning_rate=1e-5", "--render", str(tmp_path)
    )
    assert result.returncode == 0, result.stderr
    params = yaml.safe_load((tmp_path / "params.yaml").read_text())
    assert params["learning_rate"] == 1e-5 and params["num_nodes"] == 2
    assert (tmp_path / "llm_finetune.yaml").read_text().startswith("# PIPELINE DEFINITION")


BAD_INPUTS = [
    (["--preset", "nope"], "unknown preset 'nope'"),
    (["-p", "learnin_rate=1e-5"], "unknown parameter 'learnin_rate'; did you mean 'learning_rate'?"),
    (["-p", "learning_rate"], "is not KEY=VALUE"),
    (["-p", "num_nodes=two"], "parameter 'num_nodes' expects int"),
    (["-p", "model_pvc=Models!"], "model_pvc='Models!' is not a valid Kubernetes claim name"),
    (["--host", "http://127.0.0.1:9", "--schedule", "0 3 * * 0"], "prepend a seconds field"),
    (["--host", "http://127.0.0.1:9", "--schedule", "0 0 25 * * 0"], "hour"),
    (["--schedule", "0 0 3 * * 0"], "--schedule creates a recurring run on Kubeflow Pipelines; pass --host"),
    (["--preset", "qwen3-30b-a3b-full"], "pass --host URL (or KFP_HOST) to submit it"),
]


@pytest.mark.parametrize("args, message", BAD_INPUTS, ids=[" ".join(a) for a, _ in BAD_INPUTS])
def test_bad_input_exits_2_with_one_line_and_no_traceback(args, message, tmp_path):
    result = run_cli("pipelines.run", "--workspace", str(tmp_path / "ws"), *args, timeout=60)
    assert result.returncode == 2, result.stdout + result.stderr
    assert result.stderr.startswith("error: ") and message in result.stderr, result.stderr
    assert len(result.stderr.strip().splitlines()) == 1 and "Traceback" not in result.stderr
    assert not (tmp_path / "ws").exists()  # nothing ran, nothing was written


def test_unreachable_host_is_one_clear_line():
    result = run_cli("pipelines.run", "--host", f"http://127.0.0.1:{_closed_port()}", timeout=60)
    assert result.returncode == 2
    assert result.stderr.startswith("error: ") and "127.0.0.1" in result.stderr
    assert "Traceback" not in result.stderr and len(result.stderr.strip().splitlines()) == 1


def test_render_includes_the_manifests_the_run_would_create(tmp_path):
    from tests.helpers.crd_schema import crd_errors

    result = run_cli(
        "pipelines.run", "--preset", "qwen3-30b-a3b-full", "--namespace", "team-a", "--render", str(tmp_path)
    )
    assert result.returncode == 0, result.stderr
    job = yaml.safe_load((tmp_path / "pytorchjob.yaml").read_text())
    isvc_text = (tmp_path / "inferenceservice.yaml").read_text()
    isvc = yaml.safe_load(isvc_text)
    assert crd_errors(job, "kubeflow.org_pytorchjobs.yaml") == []
    assert crd_errors(isvc, "serving.kserve.io_inferenceservices.yaml") == []
    assert job["metadata"]["namespace"] == isvc["metadata"]["namespace"] == "team-a"
    assert job["spec"]["pytorchReplicaSpecs"]["Worker"]["replicas"] == 1  # 2 nodes: Master + 1 Worker
    config = job["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["containers"][0]["args"][-1]
    assert config == "/mnt/models/runs/render-preview/train/train_config.json"
    # The job's NetworkPolicy, as the train step creates it first: the run's pods only (and the metrics scrape).
    policy = yaml.safe_load((tmp_path / "networkpolicy.yaml").read_text())
    api = kubernetes.client.ApiClient()
    typed = api.deserialize(SimpleNamespace(data=json.dumps(policy)), "V1NetworkPolicy")
    assert api.sanitize_for_serialization(typed) == policy  # every field a real NetworkPolicy field
    assert policy["spec"]["podSelector"] == {"matchLabels": {"training.kubeflow.org/job-name": job["metadata"]["name"]}}
    assert policy["spec"]["ingress"][0]["from"] == [
        {"podSelector": {"matchLabels": {"pipelines.kubeflow.org/run-id": "render-preview"}}}
    ]
    trainer = json.loads((tmp_path / "train_config.json").read_text())
    # The setting's name: the trainer image resolves it in its own install (the launcher's path is not there).
    assert trainer["deepspeed"] == "zero3" and trainer["bf16"] is True
    assert all(
        v.startswith(("/mnt/data/", "/mnt/models/"))
        for v in trainer.values()
        if isinstance(v, str) and v.startswith("/")
    ), trainer
    assert isvc["spec"]["predictor"]["model"]["storageUri"] == "pvc://llm-models/runs/render-preview/train/final"
    assert "&id" not in isvc_text  # plain YAML, no anchors
    runtime = yaml.safe_load((tmp_path / "servingruntime.yaml").read_text())
    assert crd_errors(runtime, "serving.kserve.io_servingruntimes.yaml") == []
    assert runtime["metadata"]["namespace"] == "team-a"


def test_render_of_the_local_preset_has_no_cluster_manifests(tmp_path):
    result = run_cli("pipelines.run", "--preset", "local-tiny", "--render", str(tmp_path))
    assert result.returncode == 0, result.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["llm_finetune.yaml", "params.yaml", "train_config.json"]


def test_render_with_trainjob_backend_writes_a_valid_trainjob(tmp_path):
    from tests.helpers.crd_schema import crd_errors

    result = run_cli(
        "pipelines.run", "--preset", "qwen3-30b-a3b-full", "-p", "train_backend=trainjob", "--render", str(tmp_path)
    )
    assert result.returncode == 0, result.stderr
    assert not (tmp_path / "pytorchjob.yaml").exists()
    job = yaml.safe_load((tmp_path / "trainjob.yaml").read_text())
    assert job["kind"] == "TrainJob" and job["spec"]["trainer"]["numNodes"] == 2
    assert crd_errors(job, "trainer.kubeflow.org_trainjobs.yaml") == []
