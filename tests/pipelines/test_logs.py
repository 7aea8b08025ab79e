"""``python -m pipelines.run logs RUN_ID [--step NAME] [--follow]`` (issue 40): each step's pod named by the run's
tasks on KFP (the fake KFP API, requests checked against the swagger), its ``main`` container's log read from
Kubernetes (the fake API server, through the real client), each line once."""

from __future__ import annotations

import threading

import pytest

from pipelines.run import main as run_main
from tests.fakes.k8s_api import FakeKubeAPI

NS = "kubeflow"

pytestmark = pytest.mark.usefixtures("isolated_kfp_client", "token")


def _task(task_id: str, name: str, state: str, pod: str | None = None) -> dict:
    return {"task_id": task_id, "display_name": name, "state": state, **({"pod_name": pod} if pod else {})}


TASKS = [
    _task("root", "llm-finetune", "RUNNING"),
    _task("t1", "validate-inputs", "SUCCEEDED", "llm-finetune-x-validate"),
    _task("t2", "train-model", "RUNNING", "llm-finetune-x-train"),
]


@pytest.fixture
def kube(monkeypatch):
    with FakeKubeAPI() as api:
        for _, _, _, pod in (t.values() for t in TASKS if "pod_name" in t):
            api.add_pod(NS, pod, {"pipelines.kubeflow.org/v2_component": "true"}, container="main")
        api.log(NS, "llm-finetune-x-validate", "validate: 0 problems")
        api.log(NS, "llm-finetune-x-train", "step 1/10 | loss 7.6", "step 2/10 | loss 7.1")
        monkeypatch.setattr("components.kube.load_api_client", lambda: api.client)
        yield api


def test_logs_prints_each_steps_log_once_and_step_picks_one(capsys, kfp_api, kube):
    run = kfp_api.add_run(state="RUNNING", run_details={"task_details": TASKS})
    assert run_main(["logs", run["run_id"], "--host", kfp_api.url]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out == [
        "[llm-finetune-x-validate] validate: 0 problems",
        "[llm-finetune-x-train] step 1/10 | loss 7.6",
        "[llm-finetune-x-train] step 2/10 | loss 7.1",
    ]
    assert run_main(["logs", run["run_id"], "--step", "train-model", "--host", kfp_api.url]) == 0
    assert capsys.readouterr().out.splitlines() == out[1:]
    assert run_main(["logs", run["run_id"], "--step", "evaluate", "--host", kfp_api.url]) == 2
    err = capsys.readouterr().err
    assert "has no step 'evaluate'" in err and "validate-inputs, train-model" in err and err.count("\n") == 1


def test_follow_prints_new_lines_until_the_run_ends(capsys, kfp_api, kube):
    run = kfp_api.add_run(state="RUNNING", run_details={"task_details": TASKS})

    def later():
        kube.log(NS, "llm-finetune-x-train", "step 3/10 | loss 6.8")
        kfp_api.runs[run["run_id"]]["state"] = "SUCCEEDED"

    timer = threading.Timer(0.3, later)
    timer.start()
    try:
        code = run_main(["logs", run["run_id"], "--step", "train-model", "--follow", "--interval", "0.1"]
                        + ["--host", kfp_api.url])  # fmt: skip
    finally:
        timer.cancel()
    lines = capsys.readouterr().out.splitlines()
    assert code == 0 and lines[-1] == "[llm-finetune-x-train] step 3/10 | loss 6.8"
    assert lines.count("[llm-finetune-x-train] step 1/10 | loss 7.6") == 1  # each line once across polls
