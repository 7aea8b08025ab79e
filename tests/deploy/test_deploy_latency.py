"""The deploy step's latency probe (components/deploy/smoke.py: time to first token and output tokens/s of a few
concurrent streamed chat completions) and its gates ``max_ttft_seconds`` / ``min_output_tokens_per_second``:
measured on the real local server (`transformers serve` on the tiny model, as the local deploy backend starts it)
through the deploy step's own function, and against a server that cannot stream."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest

from components import kube
from components.deploy import smoke
from components.deploy.local_server import serve_locally
from components.deploy.rollout import deploy_inference_service
from components.deploy.run import deploy_models, serve_list
from components.models.logprobs import FORMAT_VERSION, REFERENCE_FILE
from components.models.tiny import materialize
from components.settings import Settings
from tests.fakes.k8s_api import FakeKubeAPI
from tests.fakes.kserve import becomes_ready
from tests.fakes.openai_server import OpenAIServer
from tests.helpers.inference_service import GVP, NAME, NS, isvc

FIGURES = {
    "requests": 4,
    "max_tokens": 32,
    "ttft_seconds_p50": 0.25,
    "ttft_seconds_max": 0.4,
    "output_tokens": 128,
    "seconds": 0.5,
    "output_tokens_per_second": 256.0,
}


def _deploy_locally(tmp_path: Path, **deploy) -> tuple[object, str]:
    """deploy_models with deploy_backend=local on the tiny model (an empty serving reference: no greedy answers to
    compare, so only the smoke test and the latency probe run); the deployment and the model folder."""
    model = materialize(str(tmp_path / "cache"))
    (Path(model).parent / REFERENCE_FILE).write_text(
        json.dumps({"version": FORMAT_VERSION, "variant": "", "examples": [], "greedy": []})
    )
    flat = Settings().flat() | {"deploy_backend": "local", "train_backend": "local", "serving_name": "tiny", **deploy}
    s = Settings.from_flat(flat)
    serve = serve_list([], model_path=model, settings=flat, serving_name="tiny")
    return deploy_models(s, serve, model_path=model, run_id="r1"), model


def _servers_of(model: str) -> list[int]:
    """Pids of `transformers serve` processes still serving ``model``."""
    pids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                cmdline = Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0")
                status = Path(f"/proc/{entry}/status").read_text()
            except OSError:
                continue
            if b"serve" in cmdline and model.encode() in cmdline and "State:\tZ" not in status:
                pids.append(int(entry))
    return pids


@pytest.mark.slow
def test_the_local_deploy_step_measures_time_to_first_token_and_tokens_per_second(tmp_path):
    deployed, model = _deploy_locally(tmp_path)
    latency = deployed.best["latency"]
    assert latency["requests"] == 4 and latency["max_tokens"] == 32
    # the tiny model stops at max_tokens or earlier, and says how many it made (transformers serve's usage)
    assert 0 < latency["output_tokens"] <= 4 * 32
    assert 0 < latency["ttft_seconds_p50"] <= latency["ttft_seconds_max"] <= latency["seconds"]
    assert latency["output_tokens_per_second"] == pytest.approx(latency["output_tokens"] / latency["seconds"], rel=0.01)
    assert deployed.served == [deployed.best]  # the step's `served` output carries the figures
    print(smoke.describe_latency(latency))
    assert _servers_of(model) == []  # stopped after the probe: keep_serving is off


@pytest.mark.slow
def test_an_impossible_tokens_per_second_gate_fails_the_local_deploy_naming_the_setting_and_the_figure(tmp_path):
    with pytest.raises(RuntimeError) as failed:
        _deploy_locally(tmp_path, min_output_tokens_per_second=1e9)
    message = str(failed.value)
    assert "too slow to serve" in message and "min_output_tokens_per_second=1e+09" in message
    measured = float(message.split(" output tokens/s is below")[0].rsplit(" ", 1)[-1])
    assert 0 < measured < 1e9
    assert _servers_of(str(tmp_path / "cache")) == []  # a server too slow is not left running


@pytest.mark.slow
def test_the_rollout_measures_the_ready_service_and_rolls_back_one_too_slow(tmp_path, monkeypatch):
    """deploy_inference_service against the fake KServe API, the real `transformers serve` standing in for the
    predictor (its OpenAI route is /v1, as kserve-vllm's)."""
    monkeypatch.setattr(kube, "API_RETRY_WINDOW_SECONDS", 3.0)
    model = materialize(str(tmp_path / "cache"))
    server = serve_locally(model, str(tmp_path / "serve.log"), keep_serving=True)
    base = server["endpoint"].removesuffix("/v1")
    try:
        with FakeKubeAPI() as api:
            api.on_get("inferenceservices", becomes_ready(api, base))
            result = deploy_inference_service(
                isvc(served_model_name=model), api_client=api.client, poll_seconds=0.01, latency_gates={}
            )
            assert result["latency"]["output_tokens"] > 0 and result["latency"]["ttft_seconds_p50"] > 0
        with FakeKubeAPI() as api:
            api.on_get("inferenceservices", becomes_ready(api, base))
            with pytest.raises(RuntimeError) as failed:
                deploy_inference_service(
                    isvc(served_model_name=model),
                    api_client=api.client,
                    poll_seconds=0.01,
                    latency_gates={"min_output_tokens_per_second": 1e9},
                )
            assert api.get_object(*GVP, NS, NAME) is None
        message = str(failed.value)
        assert (
            "too slow to serve" in message and "output tokens/s is below min_output_tokens_per_second=1e+09" in message
        )
        assert message.endswith("deleted the new InferenceService")
    finally:
        os.killpg(server["pid"], signal.SIGTERM)  # what the pipeline tells the user to do with a kept server


def test_each_gate_names_its_setting_and_the_measured_value():
    latency_failures = smoke.latency_failures
    assert latency_failures(FIGURES) == ""  # 0: measured, not gated
    assert latency_failures(FIGURES, max_ttft_seconds=1, min_output_tokens_per_second=100) == ""
    slow_start = latency_failures(FIGURES, max_ttft_seconds=0.1)
    assert "median time to first token 0.250s is above max_ttft_seconds=0.1" in slow_start
    both = latency_failures(FIGURES, max_ttft_seconds=0.1, min_output_tokens_per_second=1e9)
    assert "256.00 output tokens/s is below min_output_tokens_per_second=1e+09" in both
    assert "4 concurrent streamed chat completions of up to 32 tokens" in both


def test_a_server_that_does_not_stream_is_reported_without_a_gate_and_fails_one():
    with OpenAIServer(fail=True) as server:
        assert "error" in smoke.check_latency(server.url + "/v1", "qwen3-sft")
        with pytest.raises(smoke.TooSlow, match="latency gates cannot pass"):
            smoke.check_latency(server.url + "/v1", "qwen3-sft", max_ttft_seconds=5)
    assert smoke.describe_latency({"error": "HTTP 500"}) == "not measured (HTTP 500)"
