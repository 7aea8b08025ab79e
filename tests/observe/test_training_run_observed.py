"""A real (tiny, CPU) training run watched as on a cluster: Prometheus 2.42 scrapes the trainer's endpoint while it
trains, and the run's Langfuse record (settings, checkpoints, final metrics) reaches a local receiver through the SDK.
The trainer's entry point also refuses a taken metrics port in its first second, with one error line."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import urllib.parse
from pathlib import Path

import pytest

from tests.fakes.langfuse_receiver import LangfuseReceiver
from tests.helpers.trainer import make_workdir, trainer_config

# torchrun and a training process (about 20 s and 6 s here): the slow tier, as the other trainer runs.
pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
# The trainer under torchrun, one CPU process, as the local backend runs it
# (components/train/launcher/local_torchrun.py).
TORCHRUN = [
    sys.executable,
    "-m",
    "torch.distributed.run",
    "--standalone",
    "--nproc_per_node",
    "1",
    "-m",
    "components.train.trainer",
    "--config",
]


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    return make_workdir(tmp_path_factory.mktemp("observed"))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def trainer_env(port: int, **extra) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LANGFUSE_", "TRAINER_"))}
    return {
        **env,
        "TRAINER_METRICS_PORT": str(port),
        "TRAINER_RUN_ID": "run-obs",
        "TRAINER_JOB_NAME": "sft-run-obs",
        **extra,
    }


def test_prometheus_scrapes_a_training_run_and_langfuse_receives_its_record(workdir, start_prometheus):
    port = free_port()
    config = trainer_config(workdir, "observed", max_steps=24, save_steps=6, logging_steps=2)
    prometheus = start_prometheus(
        {
            "global": {"scrape_interval": "100ms"},
            "scrape_configs": [{"job_name": "llm-trainer", "static_configs": [{"targets": [f"127.0.0.1:{port}"]}]}],
        }
    )
    with LangfuseReceiver() as langfuse:
        env = trainer_env(
            port, LANGFUSE_PUBLIC_KEY="pk-lf-run", LANGFUSE_SECRET_KEY="sk-lf-run", LANGFUSE_HOST=langfuse.url
        )
        run = subprocess.run([*TORCHRUN, config], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
        assert run.returncode == 0, run.stderr[-3000:]
    assert f"metrics at http://localhost:{port}/metrics" in run.stderr  # the run's log names its endpoint

    def query(q: str) -> list:
        answer = prometheus.api("/api/v1/query?query=" + urllib.parse.quote(q))
        assert answer["status"] == "success", answer
        return answer["data"]["result"]

    (step,) = query('max_over_time(llm_train_step{run_id="run-obs"}[10m])')
    assert step["metric"] == {
        "instance": f"127.0.0.1:{port}",
        "job": "llm-trainer",
        "run_id": "run-obs",
        "stage": "sft",
        "job_name": "sft-run-obs",
        "node_rank": "0",
    }
    # Scraped while it trained (the last steps may end between two scrapes: the process exits soon after them).
    assert 1 <= float(step["value"][1]) <= 24
    (loss,) = query('max_over_time(llm_train_loss{run_id="run-obs"}[10m])')
    assert 0 < float(loss["value"][1]) < 20
    (checkpoint,) = query('max_over_time(llm_train_last_checkpoint_timestamp_seconds{run_id="run-obs"}[10m])')
    assert float(checkpoint["value"][1]) > 0

    spans = {s["name"]: s for s in langfuse.spans}
    root = spans["train sft run-obs"]
    assert root["attributes"]["session.id"] == "run-obs"
    assert root["attributes"]["langfuse.observation.input"]["max_steps"] == 24
    output = root["attributes"]["langfuse.observation.output"]
    assert output["global_step"] == 24 and output["eval_loss"] > 0
    assert {"checkpoint-6", "checkpoint-12", "checkpoint-18", "checkpoint-24"} <= set(spans)
    assert spans["checkpoint-24"]["attributes"]["langfuse.observation.output"]["path"].endswith("checkpoint-24")


def test_a_taken_metrics_port_stops_the_trainer_at_once_with_one_error_line(workdir):
    config = trainer_config(workdir, "taken", max_steps=2)
    with socket.socket() as holder:
        holder.bind(("0.0.0.0", 0))
        holder.listen()
        port = holder.getsockname()[1]
        run = subprocess.run(
            [*TORCHRUN, config], cwd=ROOT, env=trainer_env(port), capture_output=True, text=True, timeout=120
        )
    assert run.returncode != 0
    assert "exitcode  : 2" in run.stderr  # torchrun's report of the rank's exit status
    (line,) = [line for line in run.stderr.splitlines() if line.startswith("error:")]
    assert line.startswith(f"error: metrics_port {port}: cannot serve the trainer's metrics")
    assert "Set metrics_port to a free port, or 0" in line
    assert not (workdir / "taken").exists() or not any((workdir / "taken").glob("checkpoint-*"))
