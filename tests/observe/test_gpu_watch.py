"""The launcher's GPU watch (components/observe/gpu_watch.py) against a real Prometheus 2.42 that scrapes a DCGM
exporter's series (served here as the exporter serves them), and through the launcher against the fake API server."""

from __future__ import annotations

import json
import logging
import socket

import pytest
from prometheus_client import CollectorRegistry, Gauge, start_http_server

from components import kube
from components.kube import job_name_for
from components.observe import alerts
from components.observe.gpu_watch import GpuWatch, gpu_watch_for, query_prometheus, utilisation_query
from components.settings import ObservabilitySettings
from components.train.launcher.job import run_training_job
from components.train.launcher.pytorchjob import build_pytorchjob
from components.train.launcher.spec import TrainingJobSpec
from tests.fakes.k8s_api import FakeKubeAPI
from tests.fakes.webhook import Hook

NS = "team-llm"
NAME = job_name_for("run-5")
PODS = [f"{NAME}-master-0", f"{NAME}-worker-0"]


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def dcgm():
    """A DCGM exporter's GPU utilisation series: two GPUs on each of the job's pods, one idle GPU of another pod.
    ``set(value)`` sets the job's GPUs."""
    registry = CollectorRegistry()
    gauge = Gauge("DCGM_FI_DEV_GPU_UTIL", "GPU utilization (in %).", ["gpu", "namespace", "pod"], registry=registry)
    gauge.labels("0", NS, "notebook-0").set(0)
    server, _ = start_http_server(0, addr="127.0.0.1", registry=registry)

    def set_job(value: float) -> None:
        for pod in PODS:
            for gpu in ("0", "1"):
                gauge.labels(gpu, NS, pod).set(value)

    set_job(20)
    yield f"127.0.0.1:{server.server_port}", set_job
    server.shutdown()
    server.server_close()


def until(check, timeout: float = 30.0):
    import time

    deadline = time.monotonic() + timeout
    while not (result := check()) and time.monotonic() < deadline:
        time.sleep(0.2)
    return result


@pytest.fixture
def prometheus(start_prometheus, dcgm):
    target, set_job = dcgm
    server = start_prometheus(
        {
            "global": {"scrape_interval": "1s"},
            "scrape_configs": [{"job_name": "dcgm", "static_configs": [{"targets": [target]}]}],
        }
    )

    def sees(value: float) -> bool:
        """Wait until Prometheus's latest scrape has the job's GPUs at ``value``."""

        def seen():
            result = query_prometheus(server.url, utilisation_query(NS, PODS))
            return len(result) == 4 and all(float(s["value"][1]) == value for s in result)

        return bool(until(seen))

    assert sees(20)
    return server, set_job, sees


@pytest.mark.slow  # a real Prometheus: its first scrape answers ~5 s after it starts
def test_utilisation_is_logged_and_each_low_episode_posts_once(prometheus, monkeypatch):
    server, set_job, sees = prometheus
    clock, lines = Clock(), []
    with Hook() as hook:
        monkeypatch.setenv(alerts.WEBHOOK_URL_ENV, hook.url)
        watch = GpuWatch(
            server.url, NS, NAME, threshold=50, window_seconds=600, query_seconds=60, clock=clock, out=lines.append
        )
        watch(PODS)
        assert lines == ["GPU utilisation: 20% average over 4 GPUs (2 pods)"]  # the idle notebook is not the job's
        clock.now = 30
        watch(PODS)  # within query_seconds: not asked again
        assert len(lines) == 1
        clock.now = 540
        watch(PODS)
        assert hook.requests == []  # 9 minutes low: not yet
        clock.now = 600
        watch(PODS)
        clock.now = 700
        watch(PODS)
        assert len(hook.requests) == 1  # once per episode
        set_job(90)
        assert sees(90)
        clock.now = 800
        watch(PODS)
        assert lines[-1] == "GPU utilisation: 90% average over 4 GPUs (2 pods)"
        set_job(5)
        assert sees(5)
        for clock.now in (900, 1200, 1500):
            watch(PODS)
        assert len(hook.requests) == 2  # a second episode, a second post
    first = json.loads(hook.requests[0]["body"])
    assert first["text"] == f"{NAME}: 4 GPUs at 20% utilisation for 10 minutes"
    assert first["blocks"][0]["text"]["text"] == f":warning: {NAME}: GPUs below 50% for 10 minutes"
    assert "DCGM_FI_DEV_GPU_UTIL" in first["blocks"][1]["text"]["text"]
    assert json.loads(hook.requests[1]["body"])["text"] == f"{NAME}: 4 GPUs at 5% utilisation for 10 minutes"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_an_unreachable_prometheus_is_one_warning_and_never_raises(caplog):
    clock, lines, posts = Clock(), [], []
    watch = GpuWatch(
        f"http://127.0.0.1:{free_port()}", NS, NAME, query_seconds=0, clock=clock, out=lines.append, post=posts.append
    )
    with caplog.at_level(logging.WARNING, logger="gpu_watch"):
        for clock.now in range(0, 2000, 100):
            watch(PODS)
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "the job goes on" in warnings[0]
    assert lines == [] and posts == []


@pytest.mark.slow  # a real Prometheus: its first scrape answers ~5 s after it starts
def test_a_prometheus_error_answer_is_a_warning(prometheus, caplog):
    server, _, _ = prometheus
    watch = GpuWatch(server.url, 'bad"namespace', NAME, query_seconds=0, post=lambda p: pytest.fail("posted"))
    with caplog.at_level(logging.WARNING, logger="gpu_watch"):
        watch(PODS)
    assert "bad_data" in caplog.text  # Prometheus's own errorType for a query it cannot parse


@pytest.mark.slow  # a real Prometheus: its first scrape answers ~5 s after it starts
def test_pod_names_become_a_regex_prometheus_accepts_and_matches_exactly(prometheus):
    server, _, _ = prometheus
    assert query_prometheus(server.url, utilisation_query(NS, ["web.v1-0", "a-b"])) == []  # parsed, no series
    # '.' matches itself only: the pod "sft-run-5-master-0" is not matched by "sft-run-5-master.0".
    assert query_prometheus(server.url, utilisation_query(NS, [PODS[0].replace("-0", ".0")])) == []
    assert len(query_prometheus(server.url, utilisation_query(NS, [PODS[0]]))) == 2


def test_the_settings_make_the_watch_and_an_empty_url_makes_none():
    assert gpu_watch_for(ObservabilitySettings(), NS, NAME) is None
    watch = gpu_watch_for(
        ObservabilitySettings(prometheus_url="http://prom:9090", gpu_util_threshold=30, gpu_util_window_seconds=120),
        NS,
        NAME,
    )
    assert watch is not None and (watch.url, watch.threshold, watch.window, watch.every) == (
        "http://prom:9090",
        30,
        120,
        30,
    )


@pytest.mark.slow  # a real Prometheus: its first scrape answers ~5 s after it starts
def test_the_launcher_logs_utilisation_beside_the_progress_and_an_unreachable_prometheus_fails_nothing(
    prometheus, monkeypatch, capsys
):
    monkeypatch.setattr(kube, "API_RETRY_WINDOW_SECONDS", 3.0)
    server, _, _ = prometheus
    master = PODS[0]
    labels = {"training.kubeflow.org/job-name": NAME}
    spec = TrainingJobSpec(
        name=NAME,
        namespace=NS,
        image="trainer:1",
        config_path="/mnt/models/runs/r1/train/c.json",
        num_nodes=1,
        gpus_per_node=2,
        data_pvc="d",
        model_pvc="m",
        hf_token_secret="hf-token",
        node_selector={},
        tolerations=[],
        labels={"pipelines.kubeflow.org/run-id": "run-5"},
    )
    job = build_pytorchjob(spec)

    def running(job):
        api.add_pod(NS, master, labels)
        api.set_condition(job, "Running", reason="PyTorchJobRunning")
        api.log(NS, master, "step 1/10 | loss 2.1")

    def succeeded(job):
        api.log(NS, master, "step 10/10 | loss 1.2")
        api.set_container_state(NS, master, "terminated", exit_code=0)
        api.set_condition(job, "Succeeded", reason="PyTorchJobSucceeded", message="done")

    for url, expect in (
        (server.url, "GPU utilisation: 20% average over 2 GPUs (1 pods)"),
        (f"http://127.0.0.1:{free_port()}", None),
    ):
        with FakeKubeAPI() as api:
            api.on_get(
                "pytorchjobs",
                api.steps(lambda job: api.set_condition(job, "Created"), running, lambda job: None, succeeded),
            )
            watch = GpuWatch(url, NS, NAME, query_seconds=0)
            result = run_training_job(job, api_client=api.client, poll_seconds=0.01, watch=watch)
        assert result["state"] == "Succeeded"
        out = capsys.readouterr().out
        assert f"[{master}] step 1/10 | loss 2.1" in out
        if expect:
            assert expect in out
        else:
            assert "GPU utilisation" not in out and watch.unreachable
