"""pipelines.runs (status, wait, list, cancel; cleanup in pipelines.cleanup) through the real kfp.Client against the
fake KFP v2beta1 API (tests/fakes/kfp_api.py) and, for cleanup's Job, the fake Kubernetes API (tests/fakes/k8s_api.py).

Nothing in kfp.Client or the Kubernetes client is mocked: every request the commands make is checked against the
paths, methods and query parameters of KFP's swagger spec (``operation_of``), and cleanup's Job runs its own program
here on folders laid out as the claims are.
"""

from __future__ import annotations

import subprocess
import sys
from datetime import UTC, datetime, timedelta

import pytest

from pipelines import cleanup as C
from pipelines import runs as R
from tests.fakes.k8s_api import FakeKubeAPI
from tests.fakes.kfp_api import API, running_fake_kfp

NOW = datetime.now(UTC)

pytestmark = pytest.mark.usefixtures("isolated_kfp_client")


def _ago(days: float) -> str:
    return (NOW - timedelta(days=days)).strftime("%Y-%m-%dT%H:%M:%SZ")


def _task(task_id: str, name: str, state: str, start: float, **more) -> dict:
    return {"task_id": task_id, "display_name": name, "state": state, "start_time": _ago(start), **more}


FAILED_TASKS = [
    _task("root", "llm-finetune", "FAILED", 1.0),
    _task("t1", "validate-inputs", "SUCCEEDED", 0.9, parent_task_id="root"),
    _task(
        "t2",
        "train-model",
        "FAILED",
        0.8,
        parent_task_id="root",
        pod_name="llm-finetune-abc-123",
        error={"code": 2, "message": "PyTorchJob sft-x failed: worker-1 OOMKilled (exit 137)"},
    ),
]


def _operations(api) -> list[str]:
    return [api.operation_of(r) for r in api.requests if not r.path.endswith("/healthz")]


def _main(capsys, *argv: str) -> tuple[int, str, str]:
    code = R.main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


# ------------------------------------------------------------------------------------------- bad input


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["status", "x"], "no KFP host: pass --host"),
        (["cleanup", "--host", "http://127.0.0.1:9", "--older-than", "7x"], "--older-than '7x' is not a duration"),
        (["cleanup", "--host", "http://127.0.0.1:9", "--older-than", "7"], "--older-than '7' is not a duration"),
        (["wait", "x", "--host", "http://127.0.0.1:9", "--timeout=0h"], "--timeout '0h' is not a duration"),
        (["cleanup", "--host", "http://127.0.0.1:9"], "cleanup needs RUN_ID arguments or --older-than"),
        (["cleanup", "r", "--host", "http://127.0.0.1:9", "--yes", "--dry-run"], "contradict"),
        (["status", "x", "--host", "localhost:8080"], "must be a URL with scheme"),
    ],
)
def test_bad_input_is_one_line_and_exit_2_before_any_request(capsys, argv, says):
    code, out, err = _main(capsys, *argv)
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and err.startswith("error: ") and says in err


def test_an_unknown_run_is_one_line_and_exit_2(capsys, kfp_api, token):
    code, out, err = _main(capsys, "status", "8d3c1e4e-0000-4000-8000-000000000000", "--host", kfp_api.url)
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and "run '8d3c1e4e-0000-4000-8000-000000000000' not found on KFP at" in err
    assert _operations(kfp_api) == ["RunService_GetRun"]


def test_a_wrong_token_is_one_line_and_exit_2(capsys, kfp_api, monkeypatch):
    monkeypatch.setenv("KFP_TOKEN", "wrong")
    code, _, err = _main(capsys, "list", "--host", kfp_api.url)
    assert code == 2 and err.count("\n") == 1 and "authentication failed (HTTP 401)" in err


# ------------------------------------------------------------------------------------------- status


def test_status_names_each_task_and_the_failing_one(capsys, kfp_api, token):
    run = kfp_api.add_run(display_name="nightly", state="FAILED", run_details={"task_details": FAILED_TASKS})
    code, out, _ = _main(capsys, "status", run["run_id"], "--host", kfp_api.url)
    assert code == 0
    assert f"run {run['run_id']} (nightly): FAILED" in out
    assert f"{kfp_api.url}/#/runs/details/{run['run_id']}" in out
    assert "validate-inputs  SUCCEEDED" in out and "train-model      FAILED" in out
    # The step, not the DAG around it.
    assert "task train-model failed: PyTorchJob sft-x failed: worker-1 OOMKilled (exit 137)" in out
    assert "task llm-finetune failed" not in out
    [get] = kfp_api.requests_to("GET", f"{API}/runs/{run['run_id']}")
    assert get.headers["authorization"] == "Bearer t0k3n"


def test_pipelines_run_hands_the_run_commands_over(capsys, kfp_api, token):
    """``python -m pipelines.run status RUN_ID``, as the issue and the guide's pipeline manager spell it."""
    from pipelines import run as cli

    run = kfp_api.add_run(display_name="nightly", state="SUCCEEDED")
    code = cli.main(["status", run["run_id"], "--host", kfp_api.url])
    out = capsys.readouterr().out
    assert code == 0 and f"run {run['run_id']} (nightly): SUCCEEDED" in out


# ------------------------------------------------------------------------------------------- wait


def _kfp(kfp_api) -> R.Kfp:
    return R.connect(kfp_api.url, None)


def test_wait_streams_task_states_and_exits_0_on_success(kfp_api, token):
    run = kfp_api.add_run(display_name="r", state="PENDING")
    stored = kfp_api.runs[run["run_id"]]
    script = iter(
        [
            lambda: stored.update(
                state="RUNNING", run_details={"task_details": [_task("t1", "train-model", "RUNNING", 0)]}
            ),
            lambda: None,  # nothing changed: nothing printed
            lambda: stored.update(
                state="SUCCEEDED", run_details={"task_details": [_task("t1", "train-model", "SUCCEEDED", 0)]}
            ),
        ]
    )
    lines: list[str] = []
    code = R.wait(
        _kfp(kfp_api), run["run_id"], timeout=None, interval=0, out=lines.append, sleep=lambda _: next(script)()
    )
    assert code == 0
    said = [line.split("  ", 1)[1] for line in lines[:-1]]
    assert said == [
        "run r: PENDING",
        "train-model: RUNNING",
        "run r: RUNNING",
        "train-model: SUCCEEDED",
        "run r: SUCCEEDED",
    ]
    assert lines[-1].startswith(f"run {run['run_id']} succeeded")
    assert set(_operations(kfp_api)) == {"RunService_GetRun"} and len(_operations(kfp_api)) == 4


def test_wait_exits_1_on_failure_naming_the_task_and_its_error(capsys, kfp_api, token):
    run = kfp_api.add_run(state="FAILED", run_details={"task_details": FAILED_TASKS})
    code, out, _ = _main(capsys, "wait", run["run_id"], "--host", kfp_api.url)
    assert code == R.EXIT_FAILED == 1
    assert out.rstrip().endswith("task train-model failed: PyTorchJob sft-x failed: worker-1 OOMKilled (exit 137)")


def test_wait_on_a_failed_task_without_an_error_points_at_its_pod(kfp_api, token):
    tasks = [_task("t2", "prepare-dataset", "FAILED", 0, pod_name="pod-7")]
    run = kfp_api.add_run(state="FAILED", run_details={"task_details": tasks})
    lines: list[str] = []
    assert R.wait(_kfp(kfp_api), run["run_id"], timeout=None, out=lines.append) == 1
    assert "task prepare-dataset failed: no error recorded; its log: kubectl logs pod-7" in lines[-1]


def test_wait_exits_3_on_a_cancelled_run(kfp_api, token):
    # kfp.Client.wait_for_run_completion does not count CANCELED as an end; this wait does.
    run = kfp_api.add_run(state="CANCELED")
    assert R.wait(_kfp(kfp_api), run["run_id"], timeout=None, out=lambda _: None) == R.EXIT_CANCELED == 3


def test_wait_times_out_with_124_while_the_run_goes_on(kfp_api, token):
    run = kfp_api.add_run(state="RUNNING")
    now = [0.0]

    def sleep(seconds: float) -> None:
        now[0] += seconds

    lines: list[str] = []
    code = R.wait(
        _kfp(kfp_api),
        run["run_id"],
        timeout=timedelta(seconds=25),
        interval=10,
        out=lines.append,
        clock=lambda: now[0],
        sleep=sleep,
    )
    assert code == R.EXIT_TIMEOUT == 124
    assert "timed out waiting" in lines[-1] and "still RUNNING" in lines[-1]
    assert len(kfp_api.requests_to("GET", f"{API}/runs/{run['run_id']}")) == 4  # at 0, 10, 20, 25 s


# ------------------------------------------------------------------------------------------- list


def _experiment(kfp_api, name: str) -> str:
    experiment_id = f"exp-{name}"
    kfp_api.experiments[experiment_id] = {"experiment_id": experiment_id, "display_name": name}
    return experiment_id


def test_list_pages_through_every_run_and_filters_by_experiment_and_state(capsys, kfp_api, token):
    nightly = _experiment(kfp_api, "nightly")
    other = _experiment(kfp_api, "other")
    for i in range(105):
        kfp_api.add_run(
            display_name=f"n{i}",
            experiment_id=nightly,
            state="FAILED" if i % 50 == 0 else "SUCCEEDED",
            created_at=_ago(200 - i),
        )
    kfp_api.add_run(display_name="elsewhere", experiment_id=other, state="FAILED")

    code, out, _ = _main(capsys, "list", "--experiment", "nightly", "--state", "failed", "--host", kfp_api.url)
    assert code == 0
    names = [line.split()[-1] for line in out.splitlines()[1:]]
    assert names == ["n100", "n50", "n0"]  # newest first, all pages, this experiment only
    pages = kfp_api.requests_to("GET", f"{API}/runs")
    assert [p.query.get("page_token") for p in pages] == [[""], ["100"]]
    assert all(p.query["experiment_id"] == [nightly] and p.query["sort_by"] == ["created_at desc"] for p in pages)
    assert _operations(kfp_api) == ["ExperimentService_ListExperiments", "RunService_ListRuns", "RunService_ListRuns"]


def test_list_of_an_unknown_experiment_and_a_bad_state_exit_2(capsys, kfp_api, token):
    code, _, err = _main(capsys, "list", "--experiment", "nope", "--host", kfp_api.url)
    assert code == 2 and "no experiment named 'nope'" in err and err.count("\n") == 1
    with pytest.raises(SystemExit) as exit_:
        R.main(["list", "--state", "DONE", "--host", kfp_api.url])
    assert exit_.value.code == 2 and "is not a run state" in capsys.readouterr().err


# ------------------------------------------------------------------------------------------- cancel


def test_cancel_terminates_a_running_run_and_leaves_a_finished_one(capsys, kfp_api, token):
    running = kfp_api.add_run(state="RUNNING")
    done = kfp_api.add_run(state="SUCCEEDED")
    code, out, _ = _main(capsys, "cancel", running["run_id"], "--host", kfp_api.url)
    assert code == 0 and "cancelling run" in out
    assert kfp_api.runs[running["run_id"]]["state"] == "CANCELING"
    assert kfp_api.requests_to("POST", f"{API}/runs/{running['run_id']}:terminate")
    code, out, _ = _main(capsys, "cancel", done["run_id"], "--host", kfp_api.url)
    assert code == 0 and "already SUCCEEDED; nothing to cancel" in out
    assert _operations(kfp_api) == ["RunService_GetRun", "RunService_TerminateRun", "RunService_GetRun"]


# ------------------------------------------------------------------------------------------- cleanup


# A run of this package's pipeline, as the API server holds one submitted from the compiled YAML (its spec inline).
OURS = {"pipeline_spec": {"pipelineInfo": {"name": "llm-finetune"}, "root": {}}}


def _fleet(kfp_api) -> dict[str, dict]:
    params = {"data_pvc": "team-data", "model_pvc": "team-models", "advanced_settings": {"image_pull_secrets": ["reg"]}}
    return {
        "old_ok": kfp_api.add_run(
            **OURS, state="SUCCEEDED", created_at=_ago(10), finished_at=_ago(9), runtime_config={"parameters": params}
        ),
        "old_failed": kfp_api.add_run(**OURS, state="FAILED", created_at=_ago(30), finished_at=_ago(30)),
        "recent": kfp_api.add_run(**OURS, state="SUCCEEDED", created_at=_ago(2), finished_at=_ago(1)),
        "old_running": kfp_api.add_run(**OURS, state="RUNNING", created_at=_ago(20)),
    }


def test_cleanup_takes_only_this_pipelines_runs(capsys, kfp_api, token):
    """Issue 39: in single-user KFP every run on the server is in the listing; --older-than takes only runs of this
    package's pipeline (llm-finetune), and a run of another pipeline named by id is refused."""
    fleet = _fleet(kfp_api)
    theirs = kfp_api.add_run(
        pipeline_spec={"pipelineInfo": {"name": "team-b-etl"}, "root": {}},
        state="SUCCEEDED",
        created_at=_ago(40),
        finished_at=_ago(40),
    )
    code, out, _ = _main(capsys, "cleanup", "--older-than", "7d", "--host", kfp_api.url)
    assert code == 0 and theirs["run_id"] not in out and fleet["old_ok"]["run_id"] in out
    assert "1 finished run of other pipelines left alone" in out
    code, _, err = _main(capsys, "cleanup", theirs["run_id"], "--yes", "--keep-folders", "--host", kfp_api.url)
    assert code == 2 and "not a run of llm-finetune (its pipeline: team-b-etl)" in err
    assert theirs["run_id"] in kfp_api.runs


def test_cleanup_keeps_a_run_whose_model_a_later_run_starts_from(capsys, kfp_api, token):
    """A later run (in any state) whose base model is the earlier run's export keeps the earlier run's folders."""
    fleet = _fleet(kfp_api)
    base = fleet["old_ok"]["run_id"]
    later = kfp_api.add_run(
        **OURS,
        display_name="continued",
        state="RUNNING",
        created_at=_ago(1),
        runtime_config={"parameters": {"model_name_or_path": f"/mnt/models/runs/{base}/train/final"}},
    )
    code, out, _ = _main(capsys, "cleanup", "--older-than", "7d", "--yes", "--keep-folders", "--host", kfp_api.url)
    assert code == 0 and f"kept: run {later['run_id']} (continued) starts from its folders" in out
    assert base in kfp_api.runs and fleet["old_failed"]["run_id"] not in kfp_api.runs


def test_cleanup_rereads_each_run_before_deleting_it(capsys, kfp_api, token, monkeypatch):
    """A run retried between the listing and the deletion is running again: it is kept."""
    fleet = _fleet(kfp_api)
    retried = fleet["old_failed"]["run_id"]
    real_select = C.select

    def select_then_retry(*args, **kwargs):
        doomed = real_select(*args, **kwargs)
        kfp_api.runs[retried]["state"] = "RUNNING"  # someone pressed Retry in the KFP UI
        return doomed

    monkeypatch.setattr(C, "select", select_then_retry)
    code, out, _ = _main(capsys, "cleanup", "--older-than", "7d", "--yes", "--keep-folders", "--host", kfp_api.url)
    assert code == 0 and f"kept: run {retried} is RUNNING now" in out
    assert retried in kfp_api.runs and fleet["old_ok"]["run_id"] not in kfp_api.runs


def test_cleanup_is_a_dry_run_by_default_and_takes_only_old_finished_runs(capsys, kfp_api, token):
    fleet = _fleet(kfp_api)
    code, out, _ = _main(capsys, "cleanup", "--older-than", "7d", "--host", kfp_api.url)
    assert code == 0
    ok, failed = fleet["old_ok"]["run_id"], fleet["old_failed"]["run_id"]
    assert f"pvc://team-data/runs/{ok} pvc://team-data/runs/{ok}-* pvc://team-models/runs/{ok}" in out
    assert f"pvc://llm-data/runs/{failed}" in out and f"pvc://llm-models/runs/{failed}-*" in out  # the defaults
    assert fleet["recent"]["run_id"] not in out and fleet["old_running"]["run_id"] not in out
    assert "dry run: nothing deleted" in out
    assert len(kfp_api.runs) == 4
    assert set(_operations(kfp_api)) == {"RunService_ListRuns"}


def test_cleanup_refuses_a_named_run_that_is_still_going(capsys, kfp_api, token):
    running = _fleet(kfp_api)["old_running"]["run_id"]
    code, _, err = _main(capsys, "cleanup", running, "--yes", "--keep-folders", "--host", kfp_api.url)
    assert code == 2 and f"run {running} is still RUNNING" in err and err.count("\n") == 1
    assert not kfp_api.requests_to("DELETE", f"{API}/runs/{running}") and len(kfp_api.runs) == 4


def _completes(job: dict) -> None:
    job["status"] = {"succeeded": 1, "conditions": [{"type": "Complete", "status": "True"}]}


def test_cleanup_yes_deletes_the_folders_with_a_job_then_the_runs(capsys, kfp_api, token, monkeypatch):
    fleet = _fleet(kfp_api)
    ok, failed = fleet["old_ok"]["run_id"], fleet["old_failed"]["run_id"]
    with FakeKubeAPI() as kube:
        kube.on_get("jobs", _completes)
        monkeypatch.setattr("components.kube.load_api_client", lambda: kube.client)
        code, out, _ = _main(
            capsys, "cleanup", "--older-than", "1w", "--yes", "--namespace", "team", "--host", kfp_api.url
        )
        [create] = kube.requests_for("POST", "/apis/batch/v1/namespaces/team/jobs")
    assert code == 0 and "deleted 2 runs" in out
    assert set(kfp_api.runs) == {fleet["recent"]["run_id"], fleet["old_running"]["run_id"]}
    assert _operations(kfp_api)[-2:] == ["RunService_DeleteRun", "RunService_DeleteRun"]
    pod = create.body["spec"]["template"]["spec"]
    claims = [v["persistentVolumeClaim"]["claimName"] for v in pod["volumes"]]
    assert claims == ["team-data", "team-models", "llm-data", "llm-models"]
    [container] = pod["containers"]
    assert container["command"][:2] == ["python", "-c"]
    assert container["command"][3:] == [*(f"{C.CLAIMS_ROOT}/{i}" for i in range(4)), "--", *sorted([ok, failed])]
    assert pod["imagePullSecrets"] == [{"name": "reg"}]
    assert pod["securityContext"]["runAsNonRoot"] is True and pod["restartPolicy"] == "Never"


def test_cleanup_keeps_everything_when_the_job_fails(capsys, kfp_api, token, monkeypatch):
    _fleet(kfp_api)

    def fails(job: dict) -> None:
        job["status"] = {
            "failed": 3,
            "conditions": [{"type": "Failed", "status": "True", "reason": "BackoffLimitExceeded"}],
        }

    with FakeKubeAPI() as kube:
        kube.on_get("jobs", fails)
        monkeypatch.setattr("components.kube.load_api_client", lambda: kube.client)
        code, _, err = _main(capsys, "cleanup", "--older-than", "7d", "--yes", "--host", kfp_api.url)
    assert (
        code == 1 and "failed (BackoffLimitExceeded)" in err and "kubectl -n kubeflow logs job/llm-runs-cleanup-" in err
    )
    assert len(kfp_api.runs) == 4
    assert "RunService_DeleteRun" not in _operations(kfp_api)


def test_cleanup_keeps_a_run_whose_model_is_served(capsys, kfp_api, token, monkeypatch):
    fleet = _fleet(kfp_api)
    served = fleet["old_failed"]["run_id"]
    with FakeKubeAPI() as kube:
        kube.on_get("jobs", _completes)
        kube.put_object(
            "serving.kserve.io",
            "v1beta1",
            "inferenceservices",
            {
                "metadata": {"name": "qwen3-30b-a3b-sft", "namespace": "kubeflow"},
                "spec": {"predictor": {"model": {"storageUri": f"pvc://llm-models/runs/{served}/sft/final"}}},
            },
        )
        monkeypatch.setattr("components.kube.load_api_client", lambda: kube.client)
        code, out, _ = _main(capsys, "cleanup", "--older-than", "7d", "--yes", "--host", kfp_api.url)
        [create] = kube.requests_for("POST", "/jobs")
    assert code == 0 and "InferenceService kubeflow/qwen3-30b-a3b-sft serves its model" in out
    assert served in kfp_api.runs and fleet["old_ok"]["run_id"] not in kfp_api.runs
    assert create.body["spec"]["template"]["spec"]["containers"][0]["command"][-1] == fleet["old_ok"]["run_id"]
    # The Job only deletes files: no API token in its pod (user code on the claims cannot borrow the runner's).
    assert create.body["spec"]["template"]["spec"]["automountServiceAccountToken"] is False


def test_the_job_program_removes_exactly_the_runs_folders(tmp_path):
    """The Job's container command, run here with the claims' mount points on folders laid out as the claims are."""
    doomed_id, kept_id = "0f0e0d0c-0000-4000-8000-00000000000a", "0f0e0d0c-0000-4000-8000-00000000000b"
    run = type("Run", (), {"run_id": doomed_id})()
    job = C.cleanup_job([C.Doomed(run, ["data", "models"])], "ns", "image")
    mounts = {
        m["mountPath"]: tmp_path / m["name"] for m in job["spec"]["template"]["spec"]["containers"][0]["volumeMounts"]
    }
    for root in mounts.values():
        for folder in (doomed_id, f"{doomed_id}-variant-a", kept_id, f"{kept_id}-b"):
            (root / "runs" / folder / "train").mkdir(parents=True)
            (root / "runs" / folder / "train" / "model.safetensors").write_bytes(b"x")
        (root / "cache").mkdir()
    command = [mounts.get(arg, arg) for arg in job["spec"]["template"]["spec"]["containers"][0]["command"]]
    done = subprocess.run([sys.executable, *map(str, command[1:])], capture_output=True, text=True, check=True)
    for root in mounts.values():
        assert sorted(p.name for p in (root / "runs").iterdir()) == [kept_id, f"{kept_id}-b"]
        assert (root / "cache").is_dir()
    assert done.stdout.count("deleted ") == 4
    # And a second run (a retried Job) finds nothing left and succeeds.
    again = subprocess.run([sys.executable, *map(str, command[1:])], capture_output=True, text=True, check=True)
    assert again.stdout == ""


def test_wait_outlasts_a_server_restart_but_not_a_lasting_outage(kfp_api, token):
    run = kfp_api.add_run(state="RUNNING")
    path = f"{API}/runs/{run['run_id']}"
    stored = kfp_api.runs[run["run_id"]]
    now = [0.0]

    def sleep(seconds: float) -> None:
        now[0] += seconds
        if now[0] == 10:  # the API server restarts: the next answer is a 503, then the run has succeeded
            kfp_api.fail_once(path, 503)
            stored["state"] = "SUCCEEDED"

    lines: list[str] = []
    code = R.wait(_kfp(kfp_api), run["run_id"], timeout=None, out=lines.append, clock=lambda: now[0], sleep=sleep)
    assert code == 0 and any("did not answer (503); retrying" in line for line in lines)

    def outage(seconds: float) -> None:
        now[0] += seconds
        kfp_api.fail_once(path, 503)

    stored["state"] = "RUNNING"
    with pytest.raises(R.UsageError, match="failed while getting run .*HTTP 503"):
        R.wait(_kfp(kfp_api), run["run_id"], timeout=None, out=lines.append, clock=lambda: now[0], sleep=outage)


def test_cleanup_keep_folders_deletes_only_the_runs_and_needs_no_cluster(capsys, kfp_api, token, monkeypatch):
    fleet = _fleet(kfp_api)
    monkeypatch.setattr("components.kube.load_api_client", lambda: pytest.fail("no Kubernetes client wanted"))
    named = fleet["recent"]["run_id"]
    code, out, _ = _main(
        capsys, "cleanup", named, "--older-than", "7d", "--yes", "--keep-folders", "--host", kfp_api.url
    )
    assert code == 0 and "deleted 3 runs" in out and "folders:" not in out
    assert set(kfp_api.runs) == {fleet["old_running"]["run_id"]}


def test_multi_user_lists_need_a_namespace(capsys, monkeypatch):
    monkeypatch.setenv("KFP_TOKEN", "t0k3n")
    with running_fake_kfp(token="t0k3n", multi_user=True) as api:
        mine = _experiment(api, "mine")
        api.experiments[mine]["namespace"] = "team-a"
        run = api.add_run(display_name="ours", experiment_id=mine, state="SUCCEEDED")
        api.add_run(display_name="theirs", experiment_id=_experiment(api, "theirs"), state="SUCCEEDED")
        code, _, err = _main(capsys, "list", "--host", api.url)
        assert code == 2 and "multi-user mode; pass --namespace" in err
        code, out, _ = _main(capsys, "list", "--host", api.url, "--namespace", "team-a")
        assert code == 0 and run["run_id"] in out and "theirs" not in out
        [listed] = api.requests_to("GET", f"{API}/runs")
        assert listed.query["namespace"] == ["team-a"] and api.operation_of(listed) == "RunService_ListRuns"


def test_cleanup_without_job_rights_fails_in_one_line_and_deletes_nothing(capsys, kfp_api, token, monkeypatch):
    _fleet(kfp_api)
    with FakeKubeAPI() as kube:
        kube.forbid("/jobs")
        monkeypatch.setattr("components.kube.load_api_client", lambda: kube.client)
        code, _, err = _main(capsys, "cleanup", "--older-than", "7d", "--yes", "--host", kfp_api.url)
    assert code == 1 and err.count("\n") == 1 and "Kubernetes refused running the cleanup Job" in err
    assert len(kfp_api.runs) == 4


def test_cleanup_without_cluster_access_is_bad_input(capsys, kfp_api, token, monkeypatch, tmp_path):
    _fleet(kfp_api)
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "none"))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    code, _, err = _main(capsys, "cleanup", "--older-than", "7d", "--yes", "--host", kfp_api.url)
    assert code == 2 and err.count("\n") == 1 and "found no cluster access" in err and "--keep-folders" in err
    assert len(kfp_api.runs) == 4
