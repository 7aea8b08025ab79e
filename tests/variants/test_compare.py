"""The variants' comparison (components/variants/compare.py) and its KFP step, from the records each evaluate_model
leaves beside its model: which variant is served, the table, the curves, the answers side by side."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from kfp.dsl import Markdown, Metrics

from components.paths import evaluation_path
from components.variants.compare import compare
from components.variants.component import compare_variants


def evaluated(tmp_path: Path, variant: str, eval_loss: float, passed: bool, answers=("a",), steps=(10, 20)) -> dict:
    """A variant's folders as its steps leave them: the final model, its evaluation record, its trainer log."""
    model = tmp_path / f"run-{variant}" / "train" / "final"
    model.mkdir(parents=True)
    checkpoint = model.parent / f"checkpoint-{steps[-1]}"
    checkpoint.mkdir()
    (checkpoint / "COMPLETE").write_text("")
    (checkpoint / "trainer_state.json").write_text(
        json.dumps(
            {
                "log_history": [{"step": s, "loss": eval_loss + 1 + i} for i, s in enumerate(reversed(steps))],
                "logging_steps": 10,
                "global_step": steps[-1],
            }
        )
    )
    record = {
        "base_model": "/cache/tiny",
        "tuned_model": str(model),
        "passed": passed,
        "reason": f"{variant} {'passed' if passed else 'did not pass'}",
        "report": f"# Evaluation of {variant}",
        "metrics": {
            "eval_loss": eval_loss,
            "base_eval_loss": 7.6,
            "eval_loss_delta": eval_loss - 7.6,
            "perplexity": 2.718**eval_loss,
        },
        "prompts": ["What is a DaemonSet?"],
        "answers": {"base": ["?"], "tuned": list(answers)},
    }
    Path(evaluation_path(str(model))).write_text(json.dumps(record))
    return {
        "variant": variant,
        "run_id": f"run-{variant}",
        "model_path": str(model),
        "model_uri": str(model),
        "settings": {"learning_rate": eval_loss / 1000},
        "overrides": {"learning_rate": eval_loss / 1000},
    }


def test_the_served_variant_is_the_lowest_loss_among_those_that_passed(tmp_path):
    results = [
        evaluated(tmp_path, "v1", 5.4, True, answers=["one | two"]),
        evaluated(tmp_path, "best-but-failed", 5.0, False),
        evaluated(tmp_path, "v3", 5.2, True, answers=["three"]),
    ]
    outcome = compare(results)
    assert outcome["passed"] and outcome["chosen"]["variant"] == "v3"
    assert (
        outcome["reason"] == "serving variant 'v3': lowest eval_loss 5.2000 of the 2 of 3 variants that passed "
        "their gate"
    )
    # Every variant's numbers under its name, and the served one's under the usual names.
    assert outcome["metrics"]["v1_eval_loss"] == 5.4 and outcome["metrics"]["best-but-failed_eval_loss"] == 5.0
    assert outcome["metrics"]["eval_loss"] == 5.2
    report = outcome["report"]
    assert "| v3 (served) | `/cache/tiny` | 7.6000 | 5.2000 | -2.4000 |" in report
    assert '{"learning_rate": 0.0054}' in report  # what each variant changed, readable
    assert "| # | prompt | base | v1 | best-but-failed | v3 |" in report
    assert "| 1 | What is a DaemonSet? | ? | one \\| two | a | three |" in report
    assert "![training loss](data:image/png;base64,iVBOR" in report  # one picture of every variant's curve


def test_no_variant_passing_serves_none_and_says_why(tmp_path):
    outcome = compare([evaluated(tmp_path, "v1", 7.7, False), evaluated(tmp_path, "v2", 7.9, False)])
    assert not outcome["passed"]
    assert outcome["reason"] == "no variant passed its gate: v1: v1 did not pass; v2: v2 did not pass"
    assert outcome["report"].startswith("# Variants compared\n\n**NOT PASSED**")


def test_a_run_without_variants_passes_its_evaluation_on_unchanged(tmp_path):
    (only,) = [evaluated(tmp_path, "", 5.3, True)]
    outcome = compare([only])
    assert outcome["passed"] and outcome["chosen"] is not None
    assert outcome["report"] == "# Evaluation of " and outcome["metrics"]["eval_loss"] == 5.3
    assert "v1_eval_loss" not in outcome["metrics"]


def test_the_step_logs_metrics_writes_the_report_and_returns_the_served_model(tmp_path):
    results = [evaluated(tmp_path, "v1", 5.4, True), evaluated(tmp_path, "v2", 5.1, True)]
    metrics, report = Metrics(uri=str(tmp_path / "metrics")), Markdown(uri=str(tmp_path / "report.md"))
    out = compare_variants.python_func(results=results, metrics=metrics, report=report)
    assert (out.passed, out.model_path, out.settings) == (True, results[1]["model_path"], results[1]["settings"])
    assert metrics.metadata["eval_loss"] == 5.1 and metrics.metadata["v1_eval_loss"] == 5.4
    assert Path(report.path).read_text().startswith("# Variants compared")


def test_a_missing_evaluation_record_fails_the_comparison(tmp_path):
    result = evaluated(tmp_path, "v1", 5.4, True)
    Path(evaluation_path(result["model_path"])).unlink()
    with pytest.raises(FileNotFoundError):
        compare([result, evaluated(tmp_path, "v2", 5.1, True)])
