"""The launcher's command line (python -m components.train.launcher) renders the pods' metrics port, scrape
annotations and Langfuse references, and documents the GPU watch."""

from __future__ import annotations

import yaml

from tests.helpers.repo import run_module

ARGS = [
    "components.train.launcher",
    "--run-id",
    "run-1",
    "--config-path",
    "/mnt/models/runs/run-1/train/c.json",
    *["-p", "num_nodes=2", "-p", "gpus_per_node=8", "-p", "data_pvc=d", "-p", "model_pvc=m"],
    "--namespace",
    "team",
    "--dry-run",
]


def test_dry_run_renders_the_metrics_port_and_langfuse_references():
    result = run_module(*ARGS, "-p", "metrics_port=9555", "-p", "langfuse_secret=team-langfuse")
    assert result.returncode == 0, result.stderr
    job = yaml.safe_load(result.stdout)
    template = job["spec"]["pytorchReplicaSpecs"]["Master"]["template"]
    assert template["metadata"]["annotations"]["prometheus.io/port"] == "9555"
    (container,) = template["spec"]["containers"]
    assert container["ports"] == [{"name": "metrics", "containerPort": 9555}]
    refs = {e["name"]: e["valueFrom"]["secretKeyRef"]["name"] for e in container["env"] if "valueFrom" in e}
    assert refs["LANGFUSE_SECRET_KEY"] == "team-langfuse"


def test_defaults_serve_on_9410_and_help_names_the_watch():
    job = yaml.safe_load(run_module(*ARGS).stdout)
    assert (
        job["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["metadata"]["annotations"]["prometheus.io/port"]
        == "9410"
    )
    help_text = run_module("components.train.launcher", "--help").stdout
    assert "prometheus_url" in help_text and "GPU watch" in help_text  # the settings that turn it on
