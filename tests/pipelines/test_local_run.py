"""The laptop run, for real: `python -m pipelines.run` with no KFP host runs every step through kfp.local;
and what it shows: a short log, and a summary that says where everything is."""

import io
import json
import logging
import math
import os
import socket
import urllib.parse
from pathlib import Path

import pytest

from pipelines.local_runner import ExecutorLineFilter, StepLines, inductor_cache_default
from tests.helpers.load import wall_time_bound
from tests.helpers.repo import ROOT, run_cli

# The whole terminal output of the default local run: 62 lines measured with five steps, 80 with the stage slots
# (base model, the stage's data step, two unused slots: two lines each); 640-780 before kfp.local's bookkeeping was
# silenced (progress-bar redraws vary); 89 with the variants' loop (its list, stages, result and comparison steps)
# and the rm and grpo slots (two lines each); 97 with the data shards' list and its loop's one idle item (two each).
LINE_BUDGET = 99

# The default run's losses, pinned as torchtune pins its recipes' (measured by this test's run at 6236988; the
# README's figures, taken at 97b5593 on a differently loaded machine, agree to 1e-5: the seeded 2-rank CPU run
# reproduces). rel=2% leaves room for changes that reorder float sums (threads, ranks, data loading) and is still
# 0.11 nats on the tuned eval loss, a twentieth of what training gains (7.6436 -> 5.3763): a broken learning rate,
# loss mask or data split moves it further. torchtune holds GPU recipes to rtol 1e-5..1e-3.
PINNED_EVAL_LOSS = 5.3763  # the tuned model's held-out loss per label token (summary metrics.eval_loss)
PINNED_FINAL_TRAIN_LOSS = 5.0917  # the last logged training loss, the mean over its window (summary training)
LOSS_REL = 0.02


@pytest.mark.slow
def test_default_local_run_trains_evaluates_and_serves(tmp_path):
    summary_path = tmp_path / "summary.json"
    # The user's temporary folder: the run's steps, torchrun and the trainer write theirs in a folder of the run's,
    # which goes when the run ends (pipelines/local_runner.py::RunTemp); torch's compile cache alone is meant to stay.
    user_tmp = tmp_path / "tmp"
    user_tmp.mkdir()
    result = run_cli(
        "pipelines.run",
        "--workspace",
        str(tmp_path / "ws"),
        "--summary-json",
        str(summary_path),
        timeout=600,
        env={**os.environ, "TMPDIR": str(user_tmp)},
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    left = {p.name for p in user_tmp.iterdir()} - {Path(inductor_cache_default()).name}
    assert left == set(), "the run left these in the user's temporary folder"
    first = result.stdout.splitlines()[0]
    assert first.startswith("Running pipeline llm-finetune locally") and str(tmp_path / "ws") in first

    s = json.loads(summary_path.read_text())
    assert s["status"] == "succeeded" and s["passed"] is True
    assert set(s) >= {"status", "model_uri", "metrics", "endpoint", "wall_seconds"}
    m = s["metrics"]
    assert m["eval_loss"] < 0.9 * m["base_eval_loss"], m  # fine-tuning measurably lowers held-out loss
    assert m["eval_loss"] == pytest.approx(PINNED_EVAL_LOSS, rel=LOSS_REL), m
    assert s["training"]["final_train_loss"] == pytest.approx(PINNED_FINAL_TRAIN_LOSS, rel=LOSS_REL), s["training"]
    assert m["tokens_evaluated"] > 1000
    # One number for one thing: the trainer's eval_loss (metrics.json) is the evaluate step's, same tokens, same way.
    trainer = json.loads((Path(s["model_uri"]).parent / "metrics.json").read_text())
    assert trainer["eval_loss"] == pytest.approx(m["eval_loss"], rel=1e-4), (trainer["eval_loss"], m["eval_loss"])
    # Two torchrun ranks of 4 packed rows a step, 6 epochs (test_train_and_evaluate.py's own 2-rank run before; issue
    # 38, CI's time); the evaluation's gate says what it required.
    import datasets

    rows = len(datasets.load_from_disk(str(Path(s["run_dir"]) / "dataset"))["train"])
    assert trainer["world_size"] == 2 and trainer["global_step"] == 6 * math.ceil(rows / (2 * 4)), (rows, trainer)
    assert s["reason"].endswith("required >= 0.0%"), s["reason"]
    assert s["model_uri"].startswith(str(tmp_path / "ws" / "models" / "runs"))
    assert s["model_uri"].endswith("/train/final")
    assert (tmp_path / "ws" / "models" / "runs").is_dir() and (tmp_path / "ws" / "data" / "runs").is_dir()
    # the server answered one chat completion, then was stopped
    assert s["endpoint"].startswith("http://127.0.0.1:") and s["smoke_reply"].strip()
    port = urllib.parse.urlparse(s["endpoint"]).port
    with socket.socket() as sock:
        assert sock.connect_ex(("127.0.0.1", port)) != 0, "server still running without --keep-serving"
    assert "=== llm-finetune (local) ===" in result.stdout and "endpoint:    http://127.0.0.1:" in result.stdout
    # The pre-deploy check's latency figures (issue 33), measured on the served model, in the summary and its file.
    lat = s["latency"]
    assert lat["ttft_seconds_p50"] > 0 and lat["output_tokens_per_second"] > 0 and lat["requests"] >= 2, lat
    assert f"latency:     time to first token {lat['ttft_seconds_p50']:.2f} s" in result.stdout

    # What a user sees: short, no kfp.local bookkeeping, a line per step, the trainer's progress, where things are.
    out = result.stdout + result.stderr
    assert len(out.splitlines()) <= LINE_BUDGET, out
    for noise in ("executor_input", "have no effect in the current local runner", "DockerRunner", "Task '", "it/s]"):
        assert noise not in out, noise
    for step in ("validate-inputs", "prepare-dataset", "train-model", "evaluate-model", "deploy-model"):
        assert f"{step}: started" in out and f"{step}: succeeded in " in out
    assert out.count("sft.progress: step ") >= 10
    run_dir = Path(s["run_dir"])
    assert run_dir == tmp_path / "ws" / "runs" / s["run_id"] and s["model_uri"].split("/")[-3] == s["run_id"]
    reports = {name: Path(path) for name, path in s["reports"].items()}
    assert reports == {
        "prepare_dataset": run_dir / "reports" / "prepare_dataset.md",
        "evaluation": run_dir / "reports" / "evaluation.md",
        "training_loss": run_dir / "reports" / "training_loss.png",
    }
    assert reports["training_loss"].read_bytes().startswith(b"\x89PNG")
    assert "| **kept** (train + eval examples) |" in reports["prepare_dataset"].read_text()
    assert "held-out loss (per label token)" in reports["evaluation"].read_text()
    for path in (*reports.values(), s["model_uri"], s["server_log"]):
        assert str(path) in result.stdout
    assert f"tensorboard --logdir {s['tensorboard']}" in result.stdout and list(Path(s["tensorboard"]).iterdir())
    for link in ("model", "train", "dataset", "kfp"):
        assert (run_dir / link).is_symlink() and (run_dir / link).resolve().is_dir()
    assert (run_dir / "model").resolve() == Path(s["model_uri"])
    assert json.loads((run_dir / "summary.json").read_text())["run_id"] == s["run_id"]
    # the smoke reply is text or marked bytes, never replacement characters; the server took the request as sent
    assert "\ufffd" not in result.stdout and "1M-parameter" in result.stdout
    assert "not valid" not in Path(s["server_log"]).read_text()


@pytest.mark.slow  # a real kfp.local run up to the failing step: 20 s
def test_bad_data_in_a_run_exits_2_with_one_error_line_naming_the_pipelines_settings(tmp_path):
    """How a run reports a data error. Which errors there are is the data step's (tests/data/test_data_errors.py; a
    second whole run here for ShareGPT's role in OpenAI rows moved there: issue 38, CI's time)."""
    line, message = "{not json", "rows.jsonl:3: not valid JSON"
    rows = tmp_path / "rows.jsonl"
    sample = (ROOT / "components/data/sample/instructions.jsonl").read_text(encoding="utf-8").splitlines()
    rows.write_text("\n".join([*sample[:2], line, *sample[2:40]]), encoding="utf-8")  # the first row passes validation
    summary_path = tmp_path / "summary.json"
    result = run_cli(
        "pipelines.run",
        "--workspace",
        str(tmp_path / "ws"),
        "--summary-json",
        str(summary_path),
        "-p",
        f"dataset_source={rows}",
        timeout=300,
    )
    assert result.returncode == 2, result.stdout + result.stderr
    cause = f"error: prepare_dataset[sft]: {rows.parent}/{message}"
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith(cause) and last.endswith("; to skip such rows instead, set max_bad_rows=10"), last
    assert "warning" not in result.stderr and "--max-bad-rows" not in result.stdout + result.stderr
    assert "Traceback" not in result.stdout + result.stderr
    s = json.loads(summary_path.read_text())
    assert s["status"] == "failed" and s["error"] == last.removeprefix("error: ")
    assert "prepare-dataset: FAILED after " in result.stdout and "status:      FAILED after" in result.stdout


# -- what the terminal shows, line by line (no run needed) --------------------------------------------

# kfp.local's lines as it prints them: a backslash at a line's end continues it on the next (no newline in the text),
# and \x20 is the space that ends the indent of the blank line a step printed.
EXECUTOR_OUTPUT = """    [KFP Executor 2026-11-23 04:32:06,551 INFO]: Looking for component `prepare_dataset` in \
--component_module_path `/tmp/x/ephemeral_component.py`
    [KFP Executor 2026-11-23 04:32:06,556 INFO]: Loading KFP component "prepare_dataset" from \
/tmp/x/ephemeral_component.py (directory "/tmp/x" and module name "ephemeral_component")
    [KFP Executor 2026-11-23 04:32:06,557 INFO]: Got executor_input:
    {
        "inputs": {
            "parameterValues": {"max_seq_length": 512}
        },
        "outputs": {
            "outputFile": "/ws/kfp/llm-finetune-2026/prepare-dataset/executor_output.json"
        }
    }
    [KFP Executor 2026-11-23 04:32:15,100 INFO]: tokenizing 537 rows with 1 process(es)
   \x20
    [KFP Executor 2026-11-23 04:32:15,327 INFO]: prepared 134 train / 20 eval rows
    {"a": 1}
    [KFP Executor 2026-11-23 04:32:15,333 INFO]: Wrote executor output file to /ws/kfp/x/executor_output.json.
"""


def test_step_output_keeps_what_the_step_says_and_drops_the_executors_bookkeeping():
    out = io.StringIO()
    lines = ExecutorLineFilter(out)
    for chunk in EXECUTOR_OUTPUT.splitlines(keepends=True):  # kfp.local prints the indent, then the line
        lines.write(chunk[:4])
        lines.write(chunk[4:])
    lines.write("\n\n" + "-" * 80 + "\n")
    assert out.getvalue().splitlines() == [
        "    [KFP Executor 2026-11-23 04:32:15,100 INFO]: tokenizing 537 rows with 1 process(es)",
        "    [KFP Executor 2026-11-23 04:32:15,327 INFO]: prepared 134 train / 20 eval rows",
        '    {"a": 1}',  # a step's own JSON is the step's business
    ]


def test_kfp_local_task_records_become_one_line_per_step(capsys):
    log = logging.getLogger("test-step-lines")
    log.propagate = False
    steps = StepLines()
    log.addFilter(steps)
    for message in [
        "Running pipeline: \x1b[95m'llm-finetune'\x1b[0m",
        "Executing task \x1b[96m'train-model'\x1b[0m",
        "Streamed logs:\n",
        "Task \x1b[96m'train-model'\x1b[0m finished with status \x1b[92mSUCCESS\x1b[0m",
        "Task \x1b[96m'train-model'\x1b[0m outputs:\n    model_uri: '/ws/final'",
        "Executing task \x1b[96m'evaluate-model'\x1b[0m",
    ]:
        log.warning(message)
    steps.failed()
    lines = [line.split(" ", 1)[1] for line in capsys.readouterr().out.splitlines()]  # after the time of day
    assert lines[0] == "train-model: started" and lines[1].startswith("train-model: succeeded in ")
    assert lines[2] == "evaluate-model: started" and lines[3].startswith("evaluate-model: FAILED after ")
    assert len(lines) == 4


@pytest.mark.slow
def test_three_stages_run_locally_and_preference_tuning_moves_the_preference(tmp_path):
    """cpt -> sft -> dpo on the bundled samples, for real. sft runs 2 of the laptop recipe's 6 epochs (issue 38: CI's
    time; each stage starting from the one before and dpo moving the preference need no more); docs/training.md's
    three-stage figure is the whole recipe's, measured as it says."""
    summary_path = tmp_path / "summary.json"
    result = run_cli(
        "pipelines.run",
        "--workspace",
        str(tmp_path / "ws"),
        "--summary-json",
        str(summary_path),
        "-p",
        'stages=["cpt","sft","dpo"]',
        "-p",
        "num_train_epochs=2",  # sft's; cpt and dpo have their own in the preset's stage_settings
        # The quality gate not passed (a test of its own before; issue 38, CI's time): the run succeeds, nothing is
        # deployed, and the summary says why.
        "-p",
        "min_loss_improvement=0.5",
        # The data steps sharded: two shard steps for each stage with files to tokenize (cpt and sft; not dpo's
        # pairs), and each of those stages' data step joined what they kept (components/data/shards.py).
        "-p",
        "data_shards=2",
        "--verbose",
        timeout=900,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    s = json.loads(summary_path.read_text())
    assert s["status"] == "succeeded" and s["wall_seconds"] < wall_time_bound(360), s["wall_seconds"]  # README
    models = tmp_path / "ws" / "models" / "runs" / s["run_id"]
    stages = {
        stage: json.loads((models / folder / "metrics.json").read_text())
        for stage, folder in (("cpt", "cpt"), ("sft", "train"), ("dpo", "dpo"))
    }
    assert [m["stage"] for m in stages.values()] == ["cpt", "sft", "dpo"]
    # Each stage started from the one before it.
    for stage, before in (("sft", "cpt"), ("dpo", "train")):
        folder = "train" if stage == "sft" else stage
        record = json.loads((models / folder / "base_model.json").read_text())
        assert str(models / before / "final") in json.dumps(record), record
    m = s["metrics"]
    assert s["model_uri"].endswith("/dpo/final") and m["eval_loss"] < m["base_eval_loss"]
    assert m["preference_accuracy"] > m["before_dpo_preference_accuracy"], m
    report = Path(s["reports"]["evaluation"]).read_text(encoding="utf-8")
    assert "## Stages" in report and "## Preference accuracy" in report
    # The gate: min_loss_improvement 0.5 is more than three short stages give.
    assert s["passed"] is False and s["endpoint"] == "" and "short of the required 50.0%" in s["reason"], s
    out = result.stdout + result.stderr
    assert "deployment skipped:" in out and "endpoint:    (not deployed)" in result.stdout
    # --verbose: the executor's own lines are kept.
    assert "Got executor_input:" in result.stdout and "Executing task" in result.stdout
    assert out.count('{"shard": [') == 4 and out.count("is complete: reusing it") == 4, out[-3000:]
