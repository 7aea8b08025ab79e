"""The laptop run, for real: `python -m pipelines.run` with no KFP host runs every step through kfp.local."""

import json
import socket
import urllib.parse

import pytest

from tests.conftest import run_cli


@pytest.mark.slow
def test_default_local_run_trains_evaluates_and_serves(tmp_path):
    summary_path = tmp_path / "summary.json"
    result = run_cli("pipelines.run", "--workspace", str(tmp_path / "ws"), "--summary-json", str(summary_path),
                     timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    first = result.stdout.splitlines()[0]
    assert first.startswith("Running pipeline llm-finetune locally") and str(tmp_path / "ws") in first

    s = json.loads(summary_path.read_text())
    assert s["status"] == "succeeded" and s["passed"] is True
    assert set(s) >= {"status", "model_uri", "metrics", "endpoint", "wall_seconds"}
    m = s["metrics"]
    assert m["eval_loss"] < 0.9 * m["base_eval_loss"], m  # fine-tuning measurably lowers held-out loss
    assert m["tokens_evaluated"] > 1000
    assert s["model_uri"].startswith(str(tmp_path / "ws" / "models" / "runs")) and s["model_uri"].endswith("/train/final")
    assert (tmp_path / "ws" / "models" / "runs").is_dir() and (tmp_path / "ws" / "data" / "runs").is_dir()
    # the server answered one chat completion, then was stopped
    assert s["endpoint"].startswith("http://127.0.0.1:") and s["smoke_reply"].strip()
    port = urllib.parse.urlparse(s["endpoint"]).port
    with socket.socket() as sock:
        assert sock.connect_ex(("127.0.0.1", port)) != 0, "server still running without --keep-serving"
    assert "=== llm-finetune (local) ===" in result.stdout and "endpoint: http://127.0.0.1:" in result.stdout


@pytest.mark.slow
def test_gate_not_passed_skips_deployment(tmp_path):
    summary_path = tmp_path / "summary.json"
    result = run_cli("pipelines.run", "--workspace", str(tmp_path / "ws"), "--summary-json", str(summary_path),
                     "-p", "max_steps=2", "-p", "min_loss_improvement=0.5", timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    s = json.loads(summary_path.read_text())
    assert s["status"] == "succeeded" and s["passed"] is False
    assert s["endpoint"] == "" and "short of the required 50.0%" in s["reason"]
    assert "deployment skipped:" in result.stdout + result.stderr
    assert "endpoint: (not deployed)" in result.stdout


def test_failed_step_gives_exit_1_and_a_failed_summary(tmp_path):
    summary_path = tmp_path / "summary.json"
    missing = tmp_path / "missing.jsonl"
    result = run_cli("pipelines.run", "--workspace", str(tmp_path / "ws"), "--summary-json", str(summary_path),
                     "-p", f"dataset_source={missing}", timeout=300)
    assert result.returncode == 1
    s = json.loads(summary_path.read_text())
    assert s["status"] == "failed" and "prepare-dataset" in s["error"]
    assert "no such file" in result.stdout + result.stderr
