"""The exit handler's component, run as the KFP executor runs it, against a real local webhook."""

import json

from kfp.dsl import PipelineTaskFinalStatus

from components.observe import alerts
from components.observe.component import notify_run
from tests.fakes.webhook import Hook


def _status(state: str, task: str = "", error: str = "") -> PipelineTaskFinalStatus:
    return PipelineTaskFinalStatus(
        state=state,
        pipeline_job_resource_name="runs/r-42",
        pipeline_task_name=task,
        error_code=1 if error else None,
        error_message=error,
    )


def _finished_stage(root, run_id: str, folder: str, metrics: dict):
    stage = root / "runs" / run_id / folder
    (stage / "final").mkdir(parents=True)
    (stage / "metrics.json").write_text(json.dumps(metrics))


def test_a_failed_run_posts_the_failing_task_the_error_and_the_last_stages_metrics(tmp_path, monkeypatch):
    _finished_stage(tmp_path, "r-42", "train", {"eval_loss": 5.3763, "global_step": 102, "world_size": 2})
    with Hook() as hook:
        monkeypatch.setenv(alerts.WEBHOOK_URL_ENV, hook.url)
        notify_run.python_func(
            status=_status("FAILED", "evaluate-model", "tuned model worse than base"),
            run_id="r-42",
            model_root=str(tmp_path),
            model_pvc="llm-models",
            data_root=str(tmp_path),
        )
    (request,) = hook.requests
    text = json.dumps(json.loads(request["body"]))
    assert "evaluate-model" in text and "tuned model worse than base" in text and "5.376" in text
    assert "pvc://llm-models/runs/r-42/train/final" in text and "world_size" not in text


def test_without_a_webhook_nothing_is_posted_and_nothing_fails(tmp_path, monkeypatch, caplog):
    monkeypatch.delenv(alerts.WEBHOOK_URL_ENV, raising=False)
    caplog.set_level("INFO")
    notify_run.python_func(
        status=_status("SUCCEEDED"), run_id="r-1", model_root=str(tmp_path), model_pvc="m", data_root=str(tmp_path)
    )
    assert "nothing posted" in caplog.text
