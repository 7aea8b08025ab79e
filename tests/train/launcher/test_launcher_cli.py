"""``python -m components.train.launcher`` as a user runs it: a subprocess that finds the (fake) cluster through
its kubeconfig and talks to it with the real kubernetes client."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import yaml

from components.kube import job_name_for
from tests.fakes.k8s_api import FakeKubeAPI

ROOT = Path(__file__).resolve().parents[3]
NS = "team-llm"
RUN_ID = "8b0e3f2a-1c2d-4e5f-9a8b-7c6d5e4f3a2b"
NAME = job_name_for(RUN_ID)
MASTER, WORKER = f"{NAME}-master-0", f"{NAME}-worker-0"
JOB_LABELS = {"training.kubeflow.org/job-name": NAME}
CLI = [
    "--run-id",
    RUN_ID,
    "--config-path",
    "/mnt/models/runs/x/train_config.json",
    *["-p", "gpus_per_node=8", "-p", "num_nodes=2", "-p", "data_pvc=llm-data", "-p", "model_pvc=llm-models"],
    "--namespace",
    NS,
]


def launch(api: FakeKubeAPI, tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    """Run the launcher CLI against ``api``, as from a laptop whose kubeconfig points at it."""
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "current-context": "fake",
        "clusters": [{"name": "fake", "cluster": {"server": api.client.configuration.host}}],
        "users": [{"name": "me", "user": {}}],
        "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "me"}}],
    }
    (tmp_path / "kubeconfig").write_text(yaml.safe_dump(config))
    env = {k: v for k, v in os.environ.items() if not k.startswith("KUBERNETES_")}  # not "in a cluster"
    env["KUBECONFIG"] = str(tmp_path / "kubeconfig")
    return subprocess.run(
        [sys.executable, "-m", "components.train.launcher", *CLI, *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_pending_timeout_gives_up_on_an_unschedulable_pod(tmp_path):
    why = "0/4 nodes are available: 4 Insufficient nvidia.com/gpu."
    with FakeKubeAPI() as api:
        api.on_get(
            "pytorchjobs",
            lambda job: (
                api.add_pod(NS, MASTER, JOB_LABELS, unschedulable=why) if (NS, MASTER) not in api.pods else None
            ),
        )
        proc = launch(api, tmp_path, "-p", "pending_timeout_seconds=0")  # no autoscaler: fail as soon as it is seen
        assert len(api.requests_for("DELETE", f"/pytorchjobs/{NAME}")) == 1
    assert proc.returncode == 1, proc.stderr
    assert proc.stderr.startswith(f"error: PyTorchJob {NS}/{NAME} cannot start: pod {MASTER} could not be scheduled")
    assert why in proc.stderr


def test_job_restarts_0_reports_a_retriable_failure_without_re_running(tmp_path):
    def evicted_at_once(job):
        for pod in (MASTER, WORKER):
            api.add_pod(NS, pod, JOB_LABELS, owner=job)
        api.evict_pod(NS, WORKER)
        api.set_condition(
            job,
            "Failed",
            reason="PyTorchJobFailed",
            message=f"PyTorchJob {NAME} is failed because 1 Worker replica(s) failed.",
        )

    with FakeKubeAPI() as api:
        api.on_get("pytorchjobs", evicted_at_once)
        proc = launch(api, tmp_path, "-p", "job_restarts=0")
        # The job once, never deleted; its NetworkPolicy created before it and deleted after.
        assert len(api.requests_for("POST", "/pytorchjobs")) == 1 and api.requests_for("DELETE", "/pytorchjobs") == []
        assert len(api.requests_for("POST", "/networkpolicies")) == len(api.requests_for("DELETE", "/networkpol")) == 1
    assert proc.returncode == 1, proc.stderr
    assert f"cause: pod {WORKER} was Evicted: The node was low on resource: memory." in proc.stderr
    assert "already re-run 0 times (job_restarts=0)" in proc.stderr


def test_negative_limits_exit_2_with_one_error_line_before_any_request(tmp_path):
    for setting, error in (
        ("job_restarts", "job_restarts must be >= 0, got -1"),
        ("pending_timeout_seconds", "pending_timeout_seconds must be >= 0, got -1"),
    ):
        with FakeKubeAPI() as api:
            proc = launch(api, tmp_path, "-p", f"{setting}=-1")
            assert api.requests == []
        assert proc.returncode == 2 and proc.stderr.strip().splitlines() == [f"error: {error}"]


def test_help_documents_the_restart_and_pending_limits():
    proc = subprocess.run(
        [sys.executable, "-m", "components.train.launcher", "--help"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0
    # The limits are settings, taken by name as pipelines.run takes them.
    assert "-p KEY=VALUE" in proc.stdout and "job_restarts" in proc.stdout and "pending_timeout_seconds" in proc.stdout
