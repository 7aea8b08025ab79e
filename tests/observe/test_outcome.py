"""How the exit handler tells a run's outcome from what the real KFP backend gives it (issue 19, defect 1).

The backend's driver fills ``PipelineTaskFinalStatus`` with the ML Metadata state of the exit handler's group
(``COMPLETE``/``FAILED``/``CANCELED``), names the group (``exit-handler-1``) as the task and leaves the error empty
(kubeflow/pipelines backend/src/v2/driver/resolve.go; its test pipeline pipeline_with_input_status_state.py asserts
``COMPLETE``). The statuses below are built exactly so; the webhook is a real local HTTP server.
"""

import json
import signal

import pytest
from kfp.dsl import PipelineTaskFinalStatus

from components.observe import alerts
from components.observe.component import notify_run
from components.observe.outcome import recording_outcome, run_outcome
from tests.fakes.webhook import Hook

RUN = "0b6f2c1e-5a3d-4c8e-9f10-2a4b6c8d0e12"  # a KFP run id: a 36-character UUID


def _backend_status(state: str) -> PipelineTaskFinalStatus:
    """What the KFP v2 backend hands an exit handler: the group's state, the group's name, no error."""
    return PipelineTaskFinalStatus(
        state=state,
        pipeline_job_resource_name=f"runs/{RUN}",
        pipeline_task_name="exit-handler-1",
        error_code=None,
        error_message="",
    )


def _post(tmp_path, monkeypatch, state: str) -> dict:
    with Hook() as hook:
        monkeypatch.setenv(alerts.WEBHOOK_URL_ENV, hook.url)
        notify_run.python_func(
            status=_backend_status(state),
            run_id=RUN,
            model_root=str(tmp_path / "models"),
            model_pvc="llm-models",
            data_root=str(tmp_path / "data"),
        )
    (request,) = hook.requests
    return json.loads(request["body"])


def test_a_successful_cluster_run_is_posted_as_a_success(tmp_path, monkeypatch):
    body = _post(tmp_path, monkeypatch, "COMPLETE")
    text = json.dumps(body)
    assert body["text"].startswith("llm-finetune succeeded") and ":white_check_mark:" in text
    assert "Failed step" not in text and "exit-handler-1" not in text and "COMPLETE" not in text


def test_a_failed_cluster_run_names_the_step_that_recorded_its_failure_and_its_error(tmp_path, monkeypatch):
    with recording_outcome("prepare_dataset[sft]", str(tmp_path / "data"), RUN):
        pass
    with pytest.raises(RuntimeError), recording_outcome("train_model[sft]", str(tmp_path / "models"), RUN):
        raise RuntimeError("PyTorchJob team-a/sft-0b6f failed: pod sft-0b6f-master-0 was OOMKilled")
    body = _post(tmp_path, monkeypatch, "FAILED")
    text = json.dumps(body)
    assert body["text"].startswith("llm-finetune failed") and "train_model[sft]" in text
    assert "OOMKilled" in text and "exit-handler-1" not in text


def test_a_failed_run_whose_step_recorded_nothing_says_failed_without_blaming_the_exit_handler(tmp_path, monkeypatch):
    body = _post(tmp_path, monkeypatch, "FAILED")
    assert body["text"].startswith("llm-finetune failed") and "exit-handler-1" not in json.dumps(body)


def test_a_cancelled_run_is_posted_as_cancelled(tmp_path, monkeypatch):
    with pytest.raises(SystemExit), recording_outcome("train_model[sft]", str(tmp_path / "models"), RUN):
        raise SystemExit(128 + signal.SIGTERM)
    body = _post(tmp_path, monkeypatch, "CANCELED")
    assert body["text"].startswith("llm-finetune was cancelled")


def test_a_running_state_from_an_older_backend_is_not_posted_as_a_failure(tmp_path, monkeypatch):
    # kubeflow/pipelines#11979: before backend 2.17.0 the state can read RUNNING for nested conditions.
    body = _post(tmp_path, monkeypatch, "RUNNING")
    text = json.dumps(body)
    assert "outcome not reported" in text and "11979" in text and "failed" not in body["text"]


def test_a_running_state_with_a_recorded_failure_is_a_failure(tmp_path):
    records = [{"step": "evaluate_model", "state": "FAILED", "error": "ValueError: x", "ended": 1.0}]
    assert run_outcome("RUNNING", "exit-handler-1", "", records) == ("FAILED", "evaluate_model", "ValueError: x")


def test_kfp_local_states_keep_their_task_and_error():
    # kfp.local reports SUCCEEDED/FAILED with the failed task's own name and error.
    assert run_outcome("SUCCEEDED", "", "", []) == ("SUCCEEDED", "", "")
    assert run_outcome("FAILED", "evaluate-model", "worse than base", []) == (
        "FAILED",
        "evaluate-model",
        "worse than base",
    )


def test_a_data_step_that_fails_records_its_failure_where_the_exit_handler_reads_it(tmp_path, capsys):
    from kfp.dsl import Dataset, Markdown

    from components.data.component import prepare_dataset
    from components.observe.outcome import read_records
    from components.settings import defaults

    settings = {
        **defaults(),
        "dataset_source": str(tmp_path / "no-such-file.jsonl"),
        "model_name_or_path": "builtin:tiny-qwen3",
        "num_proc": 1,
    }
    with pytest.raises(SystemExit) as err:  # bad data: one line on stderr, exit 2 (components/data/component.py)
        prepare_dataset.python_func(
            settings=settings,
            stage="sft",
            data_root=str(tmp_path / "data"),
            run_id=RUN,
            dataset=Dataset(uri=str(tmp_path / "d")),
            report=Markdown(uri=str(tmp_path / "r")),
        )
    (record,) = read_records([str(tmp_path / "data")], RUN)
    assert record["step"] == "prepare_dataset[sft]" and record["state"] == "FAILED" and err.value.code == 2
    assert capsys.readouterr().err.splitlines()[-1] == f"error: {record['error']}" and record["bad_input"]


def test_the_exit_handler_reads_each_variants_records_and_no_other_runs(tmp_path):
    from components.observe.outcome import read_records, recording_outcome

    root = str(tmp_path / "models")
    with recording_outcome("train_model[sft]", root, RUN):
        pass
    with pytest.raises(RuntimeError), recording_outcome("train_model[sft]", root, f"{RUN}-hi-lr"):
        raise RuntimeError("NCCL timeout")  # a variant's step: runs/<run id>-<variant>/steps (components/variants/)
    with recording_outcome("train_model[sft]", root, "another-run"):
        pass
    records = read_records([root], RUN)
    assert [r["state"] for r in records] == ["SUCCEEDED", "FAILED"] and "NCCL timeout" in records[1]["error"]
