"""notify_run's work without KFP (components/observe/notify.py): which stage's result the alert reports. The post
itself, through the component: tests/observe/test_notify_run.py and tests/observe/test_outcome.py."""

import json
import os

from components.observe.notify import last_stage_result


def _stage(root, folder: str, metrics: dict, *, final: bool = True, mtime: float = 0.0):
    stage = root / "runs" / "r1" / folder
    stage.mkdir(parents=True)
    if final:
        (stage / "final").mkdir()
    (stage / "metrics.json").write_text(json.dumps(metrics))
    os.utime(stage / "metrics.json", (mtime, mtime))


def test_no_finished_stage_reports_nothing(tmp_path):
    assert last_stage_result("r1", str(tmp_path), "llm-models") == ({}, "")


def test_the_stage_that_finished_last_is_reported_with_the_alerts_metrics_only(tmp_path):
    _stage(tmp_path, "train", {"eval_loss": 2.0, "global_step": 10}, mtime=1000.0)
    _stage(tmp_path, "dpo", {"eval_loss": 1.5, "eval_rewards/accuracies": 0.75, "world_size": 2}, mtime=2000.0)
    assert last_stage_result("r1", str(tmp_path), "llm-models") == (
        {"eval_loss": 1.5, "eval_rewards/accuracies": 0.75},
        "pvc://llm-models/runs/r1/dpo/final",
    )


def test_a_stage_without_a_final_model_has_no_model_uri(tmp_path):
    _stage(tmp_path, "cpt", {"global_step": 3}, final=False)
    assert last_stage_result("r1", str(tmp_path), "llm-models") == ({"global_step": 3}, "")
