"""The launcher ends a job that makes no progress: its pods run, but the trainer's step stops (a hung collective, a
stuck reward function). Against the fake API server through the real kubernetes client, with the trainer's real
metrics server (components/train/trainer/metrics.py) as what the pods serve; and the watchdog and the Prometheus
alert LLMTrainingStalled hold the same limit (the stall_timeout_seconds setting)."""

from __future__ import annotations

import inspect
import re
import time
from pathlib import Path

import pytest
import yaml

from components import kube
from components.jobs import progress as progress_module
from components.jobs.progress import Progress, ProgressWatch, parse_progress, stalled
from components.kube import job_name_for
from components.settings import ObservabilitySettings
from components.train.launcher import __main__ as launcher_cli
from components.train.launcher.job import RESTARTS_ANNOTATION, run_training_job
from components.train.launcher.pods import metrics_annotations
from components.train.launcher.pytorchjob import build_pytorchjob
from components.train.launcher.spec import TrainingJobSpec
from components.train.trainer.metrics import METRIC_NAMES, TrainerMetrics
from tests.fakes.k8s_api import FakeKubeAPI

ROOT = Path(__file__).resolve().parents[3]
NS = "team-llm"
RUN_ID = "5d1c0b6e-7f3a-4e2b-9c8d-1a2b3c4d5e6f"
NAME = job_name_for(RUN_ID)
MASTER, WORKER = f"{NAME}-master-0", f"{NAME}-worker-0"
JOB_LABELS = {"training.kubeflow.org/job-name": NAME}
WHAT = f"PyTorchJob {NS}/{NAME}"
STALL = 1.0  # seconds without a step that make a stall here; the setting's default is 45 minutes


@pytest.fixture(autouse=True)
def short_api_outages(monkeypatch):
    monkeypatch.setattr(kube, "API_RETRY_WINDOW_SECONDS", 3.0)


@pytest.fixture
def trainer():
    """The trainer's own metrics server on this machine: what every training pod's local rank 0 serves."""
    metrics = TrainerMetrics("sft", RUN_ID, NAME, "0")
    metrics.serve(0, addr="127.0.0.1")
    yield metrics
    metrics.close()


def step_to(metrics: TrainerMetrics, step: int, max_steps: int = 50) -> None:
    """What MetricsCallback sets at an optimizer step's end."""
    metrics.gauges["step"].set(step)
    metrics.gauges["max_steps"].set(max_steps)
    metrics.gauges["last_step_timestamp_seconds"].set(time.time())


def manifest(metrics_port: int) -> dict:
    spec = TrainingJobSpec(
        name=NAME,
        namespace=NS,
        image="registry.example/trainer:0.1.0",
        config_path=f"/mnt/models/runs/{RUN_ID}/train/train_config.json",
        num_nodes=2,
        gpus_per_node=8,
        data_pvc="llm-data",
        model_pvc="llm-models",
        hf_token_secret="hf-token",
        node_selector={},
        tolerations=[],
        labels={},
        metrics_port=metrics_port,
    )
    return build_pytorchjob(spec)


def pods_up(api, job, port: int | None, *lines: str, ip: str = "127.0.0.1") -> None:
    """The operator creates the job's pods from its template (the scrape annotations when metrics are on); the
    kubelet gives each an IP; they run and log ``lines``."""
    for pod in (MASTER, WORKER):
        api.add_pod(NS, pod, JOB_LABELS, owner=job)
        with api.lock:
            obj = api.pods[(NS, pod)].obj
            obj["metadata"]["annotations"] = metrics_annotations(port or 0)
            obj["status"]["podIP"] = ip
        api.log(NS, pod, *lines)
    api.set_condition(job, "Created", reason="PyTorchJobCreated")
    api.set_condition(job, "Running", reason="PyTorchJobRunning", message=f"PyTorchJob {NAME} is running.")


def succeeded(api, job) -> None:
    for pod in (MASTER, WORKER):
        api.set_container_state(NS, pod, "terminated", exit_code=0)
    api.set_condition(job, "Succeeded", reason="PyTorchJobSucceeded", message=f"PyTorchJob {NAME} is completed.")


def restarts_of(job: dict | None) -> str | None:
    return ((job or {}).get("metadata", {}).get("annotations") or {}).get(RESTARTS_ANNOTATION)


HUNG = [
    "step 30/50 | loss 1.2345 | lr 2e-05 | 812 tokens/s/device | MFU 31.0% | ETA 4m10s",
    "scoring 64 completions with reward function my_rewards.judge",
]


def hangs_then_trains(api, trainer, port: int):
    """The first job's trainer steps to 30 and hangs there (its pods run on, silent); the re-run resumes, steps to
    50 and succeeds."""
    gets: dict[str, int] = {}

    def controller(job):
        uid = job["metadata"]["uid"]
        gets[uid] = n = gets.get(uid, 0) + 1
        if n == 1:
            restarted = restarts_of(job) != "0"
            pods_up(api, job, port, *(["resuming from checkpoint-20"] if restarted else HUNG))
            step_to(trainer, 21 if restarted else 30)
        elif restarts_of(job) != "0" and n == 3:
            step_to(trainer, 50)
            api.log(NS, MASTER, "step 50/50 | loss 1.1000")
            succeeded(api, job)

    return controller


def test_a_job_whose_step_stops_is_ended_and_re_run_as_retriable_with_the_pods_last_lines(trainer, capsys):
    port = trainer.server.server_port
    with FakeKubeAPI() as api:
        api.on_get("pytorchjobs", hangs_then_trains(api, trainer, port))
        began = time.monotonic()
        result = run_training_job(manifest(port), api_client=api.client, poll_seconds=0.01, stall_timeout_seconds=STALL)
        took = time.monotonic() - began
        posts = api.requests_for("POST", "/pytorchjobs")
        (delete,) = api.requests_for("DELETE", f"/pytorchjobs/{NAME}")
    assert result["state"] == "Succeeded"
    assert STALL <= took < STALL + 10
    # Ended as a retriable failure: deleted with its pods (their GPUs freed) and created again to resume.
    assert delete.body["propagationPolicy"] == "Foreground"
    assert [restarts_of(p.body) for p in posts] == ["0", "1"]
    out = capsys.readouterr().out
    assert f"watching progress: http://127.0.0.1:{port}/metrics of {MASTER}" in out
    (stalled_line,) = [ln for ln in out.splitlines() if ln.startswith(f"{WHAT} is stalled")]
    assert "no optimizer step for" in stalled_line and "step 30 of 50" in stalled_line
    assert "stall_timeout_seconds=1" in stalled_line
    # The pods' last lines, each pod's, say where it hung.
    tail = out[out.index(stalled_line) :]
    assert f"last lines of {MASTER}:" in tail and f"last lines of {WORKER}:" in tail
    assert "scoring 64 completions with reward function my_rewards.judge" in tail
    (rerun,) = [ln for ln in out.splitlines() if ln.startswith("re-running")]
    assert rerun.startswith(f"re-running {WHAT} (restart 1/2): stalled: no optimizer step for")


def test_a_stall_after_the_last_re_run_deletes_the_job_and_raises_with_the_pods_last_lines(trainer, capsys):
    port = trainer.server.server_port

    def hang(job):
        if not api.pods:
            pods_up(api, job, port, *HUNG)
            step_to(trainer, 30)

    with FakeKubeAPI() as api:
        api.on_get("pytorchjobs", hang)
        with pytest.raises(RuntimeError) as err:
            run_training_job(
                manifest(port), api_client=api.client, poll_seconds=0.01, stall_timeout_seconds=STALL, job_restarts=0
            )
        (delete,) = api.requests_for("DELETE", f"/pytorchjobs/{NAME}")  # whatever job_cleanup says: it holds GPUs
        assert api.get_object("kubeflow.org", "v1", "pytorchjobs", NS, NAME) is None
    message = str(err.value)
    assert message.startswith(f"{WHAT} stalled: no optimizer step for")
    assert "not re-run: a retriable cause, but the job was already re-run 0 times (job_restarts=0)" in message
    assert f"last lines of {MASTER}:" in message and f"last lines of {WORKER}:" in message
    assert "scoring 64 completions with reward function my_rewards.judge" in message


def test_a_job_that_keeps_stepping_is_never_stalled(trainer):
    port = trainer.server.server_port
    gets = iter(range(10**6))
    start = time.monotonic()

    def training(job):
        n = next(gets)
        if n == 0:
            pods_up(api, job, port, "step 1/50")
        step_to(trainer, min(1 + n // 10, 50))  # a step every ten polls, each well inside the limit
        if time.monotonic() - start > 3 * STALL:  # three stall limits of stepping, on a fast machine or a slow one
            succeeded(api, job)

    with FakeKubeAPI() as api:
        api.on_get("pytorchjobs", training)
        result = run_training_job(
            manifest(port), api_client=api.client, poll_seconds=0.005, stall_timeout_seconds=STALL
        )
        assert len(api.requests_for("POST", "/pytorchjobs")) == 1 and api.requests_for("DELETE") == []
    assert result["state"] == "Succeeded"


def test_without_metrics_the_job_is_not_watched_and_says_so(capsys):
    gets = iter(range(10**6))

    def quiet(job):
        n = next(gets)
        if n == 0:
            pods_up(api, job, None, "step 1/50")
        if n == 50:
            succeeded(api, job)

    with FakeKubeAPI() as api:
        api.on_get("pytorchjobs", quiet)
        result = run_training_job(manifest(0), api_client=api.client, poll_seconds=0.005, stall_timeout_seconds=0.1)
    assert result["state"] == "Succeeded"
    out = capsys.readouterr().out
    assert out.count("progress not watched: the pods serve no trainer metrics (metrics_port=0)") == 1


def test_metrics_that_cannot_be_read_are_one_warning_and_the_job_goes_on(capsys):
    gets = iter(range(10**6))

    def unreachable(job):
        n = next(gets)
        if n == 0:
            pods_up(api, job, 1, "step 1/50", ip="127.0.0.1")  # nothing listens on port 1
        if n == 50:
            succeeded(api, job)

    with FakeKubeAPI() as api:
        api.on_get("pytorchjobs", unreachable)
        result = run_training_job(manifest(1), api_client=api.client, poll_seconds=0.005, stall_timeout_seconds=0.1)
    assert result["state"] == "Succeeded"
    out = capsys.readouterr().out
    assert out.count("progress not read: cannot reach http://127.0.0.1:1/metrics") == 1


# -- what a stall is: the alert's condition, on the alert's series ----------------------------------------------


def test_the_stall_condition_is_the_alerts():
    now = 10_000.0
    # Stalled: the last step long ago, steps remain (rules_test.yaml's p1).
    assert stalled(Progress(5, 100, now - 3000, "p1"), now, 2700)
    assert not stalled(Progress(5, 100, now - 2600, "p1"), now, 2700)  # not yet
    assert not stalled(Progress(100, 100, now - 3000, "p3"), now, 2700)  # its steps are done: evaluation, export
    assert not stalled(Progress(0, 0, 0, "p4"), now, 2700)  # training has not begun: the model loads


def test_the_trainers_exposition_is_read_by_the_watchdog(trainer):
    step_to(trainer, 7, 40)
    from prometheus_client import generate_latest

    progress = parse_progress(generate_latest(trainer.registry).decode(), "p")
    assert progress is not None and (progress.step, progress.max_steps) == (7, 40)
    assert abs(progress.last_step - time.time()) < 5
    # The series the watchdog reads are the trainer's (and the alert's).
    assert set(progress_module.SERIES.values()) <= set(METRIC_NAMES)


def test_the_watchdog_and_the_alert_use_the_one_stall_limit():
    limit = ObservabilitySettings().stall_timeout_seconds
    assert limit == 45 * 60
    # The launcher's default, the CLI's and the train step's: the setting.
    assert inspect.signature(run_training_job).parameters["stall_timeout_seconds"].default == limit
    cli = launcher_cli.settings_of(launcher_cli.make_parser().parse_args(["--run-id", "r"]))
    assert cli.observability.stall_timeout_seconds == limit
    assert (
        "stall_timeout_seconds=s.observability.stall_timeout_seconds"
        in (ROOT / "components/train/launcher/run.py").read_text()
    )
    # The Prometheus rule: the same number of seconds, and its summary says as many minutes.
    (doc,) = [d for d in yaml.safe_load_all((ROOT / "manifests/monitoring/prometheusrule.yaml").read_text()) if d]
    (rule,) = [r for g in doc["spec"]["groups"] for r in g["rules"] if r.get("alert") == "LLMTrainingStalled"]
    (threshold,) = re.findall(r"llm_train_last_step_timestamp_seconds > (\d+) \* 60", rule["expr"])
    assert int(threshold) * 60 == limit
    assert f"made no step for {limit // 60} minutes" in rule["annotations"]["summary"]
    # The watchdog's condition is the rule's expression, term by term.
    for term in ("time() - llm_train_last_step_timestamp_seconds >", "llm_train_last_step_timestamp_seconds > 0"):
        assert term in rule["expr"]
    assert "llm_train_step < llm_train_max_steps" in rule["expr"]


def test_watch_reads_rank_zero_first_and_keeps_its_last_reading_when_the_pods_stop_answering(capsys):
    answers = {"10.0.0.1": "gone", "10.0.0.2": "ok"}
    clock = [1000.0]

    def fetch(url, timeout):
        ip = url.split("//")[1].split(":")[0]
        if answers[ip] == "gone":
            raise OSError("timed out")
        return (
            'llm_train_step{node_rank="0"} 12.0\nllm_train_max_steps{node_rank="0"} 50.0\n'
            'llm_train_last_step_timestamp_seconds{node_rank="0"} 990.0\n'
        )

    def pod(name, ip):
        from kubernetes import client as k8s

        return k8s.V1Pod(
            metadata=k8s.V1ObjectMeta(name=name, annotations=metrics_annotations(9410)),
            status=k8s.V1PodStatus(phase="Running", pod_ip=ip),
        )

    watch = ProgressWatch(100, read_seconds=0, fetch=fetch, clock=lambda: clock[0])
    pods = [pod("rank0", "10.0.0.1"), pod("rank1", "10.0.0.2")]
    assert watch(pods) is None  # rank 0's pod does not answer: rank 1's does, step 12 of 50
    assert watch.reading is not None and watch.reading.pod == "rank1"
    answers["10.0.0.2"] = "gone"  # a trainer stuck holding the interpreter answers nobody
    clock[0] = 1089.0
    assert watch(pods) is None
    clock[0] = 1091.0
    assert "no optimizer step for 1m41s" in watch(pods)
    assert capsys.readouterr().out.count("progress not read") == 1
