"""The local deployment: `transformers serve` on a free localhost port, smoke-tested, stopped unless kept."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
from typing import Any

from components import quick_exit
from components.deploy.logprobs import check_greedy_text
from components.deploy.smoke import chat_completion, wait_healthy

SMOKE_PROMPT = "What is Kubeflow? 쿠버네티스에서 무엇을 합니까?"


def free_port() -> int:
    """A TCP port nothing listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def serve_locally(model_path: str, log_path: str, keep_serving: bool = False, startup_timeout: float = 180.0,
                  serving_reference: dict | None = None) -> dict:
    """Start `transformers serve` on the model, send one chat completion, and stop it unless ``keep_serving``.

    With ``serving_reference`` (the evaluate step's, components/deploy/logprobs.py) the server's greedy answers
    must also start as the evaluated model's (``check_greedy_text``: `transformers serve` returns no
    log-probabilities, so only the answers are compared); otherwise the server is stopped and the step fails.

    Returns ``endpoint`` (the OpenAI-compatible base URL), ``served_model_name``, ``smoke_reply``, with a reference
    ``greedy_prompts_checked``, and, when kept, the server's ``pid`` (stop it with ``kill <pid>``).
    """
    port = free_port()
    # `transformers serve` in a process that skips the final garbage collection at exit: _stop waits for it.
    cmd = quick_exit.command(
        "transformers.cli.transformers", "serve", model_path,
        "--host", "127.0.0.1", "--port", str(port), "--device", "cpu", "--log-level", "warning",
    )
    # The CLI asks PyPI for a newer transformers once a day, for up to 2 s before it serves (and waits that long
    # where there is no network): a local server has no use for the hint.
    env = {**os.environ, "HF_HUB_DISABLE_UPDATE_CHECK": os.environ.get("HF_HUB_DISABLE_UPDATE_CHECK", "1")}
    log = open(log_path, "ab")
    # Own session: a kept server outlives this step's process without being killed with it.
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, env=env)
    endpoint = f"http://127.0.0.1:{port}/v1"
    try:
        # A local port refuses at once until the server listens: asking often costs nothing.
        wait_healthy(f"http://127.0.0.1:{port}/health", startup_timeout, is_alive=lambda: proc.poll() is None,
                     interval=0.1)
        # No temperature: the model's generation config is greedy already, and transformers serve warns about
        # a temperature sent along with greedy decoding.
        reply = chat_completion(endpoint, model_path, SMOKE_PROMPT, temperature=None)
        checked = check_greedy_text(endpoint, model_path, serving_reference) if serving_reference else 0
    except BaseException as e:
        _stop(proc)
        with open(log_path, "rb") as f:
            tail = f.read()[-2000:].decode(errors="replace")
        raise RuntimeError(f"local server failed: {e}\n--- {log_path} ---\n{tail}") from None
    result: dict[str, Any] = {"endpoint": endpoint, "served_model_name": model_path, "smoke_reply": reply}
    if serving_reference:
        result["greedy_prompts_checked"] = checked
    if keep_serving:
        result["pid"] = proc.pid
    else:
        _stop(proc)
    return result


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
