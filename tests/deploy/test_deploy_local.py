"""The smoke client every deployment uses, against local OpenAI-compatible servers: a scripted one for the
error paths, and the real `transformers serve` on the tiny model (the local deploy backend)."""

from __future__ import annotations

import contextlib
import io
import json
import os
import signal

import pytest

from components.deploy import local_server, rollout, smoke
from components.deploy.local_server import serve_locally
from components.deploy.smoke import chat_completion, readable_reply
from components.models.server_process import wait_healthy
from components.models.tiny import materialize
from tests.fakes.openai_server import OpenAIServer


def test_cluster_and_local_deploys_share_one_smoke_client():
    assert rollout.chat_completion is local_server.chat_completion is chat_completion


def test_smoke_client_sends_one_greedy_chat_completion():
    with OpenAIServer() as server:
        assert chat_completion(server.url + "/openai/v1/", "qwen3-sft", "Hello") == "Hi! How can I help?"
    ((path, body),) = server.requests
    assert path == "/openai/v1/chat/completions"
    assert body == {
        "model": "qwen3-sft",
        "messages": [{"role": "user", "content": "Hello"}],
        "max_tokens": 16,
        "temperature": 0,
    }


def test_smoke_client_can_leave_the_temperature_to_the_server():
    """The local server is asked without one: `transformers serve` is greedy by the model's generation config and
    warns that a temperature sent along with greedy decoding is not a valid generation flag."""
    with OpenAIServer() as server:
        chat_completion(server.url + "/v1", "m", "Hello", temperature=None)
    ((_, body),) = server.requests
    assert "temperature" not in body


def test_replies_show_unfinished_characters_plainly(monkeypatch):
    assert readable_reply("000 \ufffd\ufffd는 GPU") == "000 <?>는 GPU"
    assert readable_reply("Kubeflow 쿠버네티스") == "Kubeflow 쿠버네티스"
    reply = json.dumps({"choices": [{"message": {"role": "assistant", "content": "000 \ufffd는"}}]}).encode()
    monkeypatch.setattr(
        smoke.urllib.request, "urlopen", lambda request, timeout: contextlib.nullcontext(io.BytesIO(reply))
    )
    assert chat_completion("http://127.0.0.1:9/v1", "m", "Hello") == "000 <?>는"


def test_smoke_client_reports_the_servers_error():
    with OpenAIServer(fail=True) as server, pytest.raises(RuntimeError, match="answered HTTP 500.*CUDA out of memory"):
        chat_completion(server.url + "/v1", "m", "Hello")


def test_wait_healthy_gives_up_when_the_server_dies():
    with pytest.raises(RuntimeError, match="exited before"):
        wait_healthy("http://127.0.0.1:9/health", timeout=5, is_alive=lambda: False)


@pytest.mark.slow
def test_transformers_serve_on_the_tiny_model_answers_the_smoke_test(tmp_path):
    model = materialize(str(tmp_path / "cache"))
    result = serve_locally(model, str(tmp_path / "serve.log"), keep_serving=True)
    try:
        assert result["endpoint"].startswith("http://127.0.0.1:") and result["endpoint"].endswith("/v1")
        assert result["served_model_name"] == model and isinstance(result["smoke_reply"], str)
        # the smoke request is one the server takes without a warning about its generation flags
        assert "not valid" not in (tmp_path / "serve.log").read_text()
        # The kept server answers the same client again, as a user's script would call it (with a temperature).
        again = chat_completion(result["endpoint"], result["served_model_name"], "What is Kubeflow?", max_tokens=4)
        assert isinstance(again, str)
    finally:
        os.killpg(result["pid"], signal.SIGTERM)  # what the pipeline tells the user to do with a kept server
