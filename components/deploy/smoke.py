"""The smoke test every deployment gets: one chat completion on an OpenAI-compatible route; then its latency: time
to first token and output tokens per second of a few concurrent streamed chat completions, gated on the deploy
settings ``max_ttft_seconds`` and ``min_output_tokens_per_second``.

The same client checks a local `transformers serve` (``/v1``), KServe's vLLM runtime (vLLM's own server,
``/v1``) and its Hugging Face runtime (KServe's model server, ``/openai/v1``): callers pass the base URL
including the route prefix.
"""

from __future__ import annotations

import json
import re
import statistics
import time
import urllib.error
import urllib.request


def chat_completion(
    base_url: str, model: str, prompt: str, max_tokens: int = 16, timeout: float = 60.0, temperature: float | None = 0
) -> str:
    """POST one chat completion to ``{base_url}/chat/completions`` and return the reply text (``readable_reply``).

    ``temperature`` 0 asks for greedy decoding (vLLM's way); None leaves it out, so the server decodes as the
    model's generation config says (`transformers serve` is greedy then, and warns that a temperature sent
    with greedy decoding is not a valid generation flag).

    Raises RuntimeError with the status and body when the server answers with an error or no choices.
    """
    request = {"model": model, "messages": [{"role": "user", "content": prompt}], "max_tokens": max_tokens}
    if temperature is not None:
        request["temperature"] = temperature
    body = json.dumps(request).encode()
    req = urllib.request.Request(
        base_url.rstrip("/") + "/chat/completions", data=body, headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            payload = json.loads(resp.read())
    except urllib.error.HTTPError as e:
        raise RuntimeError(f"smoke test: {base_url} answered HTTP {e.code}: {e.read()[:300]!r}") from None
    choices = payload.get("choices") or []
    if not choices or "message" not in choices[0]:
        raise RuntimeError(f"smoke test: {base_url} returned no choices: {json.dumps(payload)[:300]}")
    return readable_reply(choices[0]["message"].get("content") or "")


# The latency probe: short chat prompts sent together, as traffic arrives (vLLM batches them, so its figures under
# this load stay close to one request's), each streaming up to this many tokens.
LATENCY_PROMPTS = (
    "Explain in two sentences what a Kubernetes operator does.",
    "Write a haiku about distributed training.",
    "쿠버네티스에서 파드는 무엇입니까? 짧게 답하세요.",
    "List three uses of a large language model in customer support.",
)
LATENCY_MAX_TOKENS = 32


def stream_chat_completion(
    base_url: str,
    model: str,
    prompt: str,
    max_tokens: int = LATENCY_MAX_TOKENS,
    timeout: float = 60.0,
    temperature: float | None = 0,
) -> dict:
    """Stream one chat completion (``stream: true``, server-sent events) and time it.

    Returns ``ttft_seconds`` (request sent to the first chunk with generated text: content, reasoning or a tool
    call; the whole request when none came), ``seconds`` (to the end of the stream) and ``output_tokens`` (the
    usage the server reports, which vLLM sends with ``stream_options.include_usage`` and `transformers serve`
    always; else one per chunk with text).

    Raises RuntimeError with the status and body when the server answers with an error.
    """
    request: dict = {
        "model": model,
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": max_tokens,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    if temperature is not None:
        request["temperature"] = temperature
    req = urllib.request.Request(
        base_url.rstrip("/") + "/chat/completions",
        data=json.dumps(request).encode(),
        headers={"Content-Type": "application/json", "Accept": "text/event-stream"},
    )
    started = time.perf_counter()
    first: float | None = None
    chunks_with_text, usage_tokens = 0, None
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            for raw in resp:
                line = raw.decode(errors="replace").strip()
                if not line.startswith("data:"):
                    continue
                data = line[len("data:") :].strip()
                if data == "[DONE]":
                    break
                chunk = json.loads(data)
                if "error" in chunk:
                    raise RuntimeError(f"latency probe: {base_url} streamed an error: {data[:300]}")
                if (chunk.get("usage") or {}).get("completion_tokens") is not None:
                    usage_tokens = chunk["usage"]["completion_tokens"]
                for choice in chunk.get("choices") or []:
                    delta = choice.get("delta") or {}
                    if not any(delta.get(k) for k in ("content", "reasoning_content", "reasoning", "tool_calls")):
                        continue  # the role, or the finish reason
                    chunks_with_text += 1
                    if first is None:
                        first = time.perf_counter()
    except urllib.error.HTTPError as e:
        raise RuntimeError(f"latency probe: {base_url} answered HTTP {e.code}: {e.read()[:300]!r}") from None
    ended = time.perf_counter()
    return {
        "ttft_seconds": (first if first is not None else ended) - started,
        "seconds": ended - started,
        "output_tokens": usage_tokens if usage_tokens is not None else chunks_with_text,
    }


def measure_latency(
    base_url: str,
    model: str,
    prompts: tuple[str, ...] = LATENCY_PROMPTS,
    max_tokens: int = LATENCY_MAX_TOKENS,
    timeout: float = 120.0,
    temperature: float | None = 0,
) -> dict:
    """Send every prompt of ``prompts`` at once as a streamed chat completion (``stream_chat_completion``) and
    summarise what the server did with them.

    Returns ``requests`` (= concurrent requests), ``max_tokens``, ``ttft_seconds_p50`` and ``ttft_seconds_max``
    (time to first token), ``output_tokens`` (all requests'), ``seconds`` (first request sent to last stream
    ended) and ``output_tokens_per_second`` (``output_tokens`` / ``seconds``: what the server streams under
    that load), each rounded for the step's outputs.
    """
    from concurrent.futures import ThreadPoolExecutor

    started = time.perf_counter()
    pool = ThreadPoolExecutor(max_workers=len(prompts))
    try:
        futures = [
            pool.submit(stream_chat_completion, base_url, model, p, max_tokens, timeout, temperature) for p in prompts
        ]
        runs = [f.result() for f in futures]
    finally:
        # Not waiting: a step cancelled mid-probe stops its server next, which ends the streams.
        pool.shutdown(wait=False, cancel_futures=True)
    seconds = time.perf_counter() - started
    tokens = sum(r["output_tokens"] for r in runs)
    ttfts = [r["ttft_seconds"] for r in runs]
    return {
        "requests": len(runs),
        "max_tokens": max_tokens,
        "ttft_seconds_p50": round(statistics.median(ttfts), 4),
        "ttft_seconds_max": round(max(ttfts), 4),
        "output_tokens": tokens,
        "seconds": round(seconds, 4),
        "output_tokens_per_second": round(tokens / seconds, 2) if seconds > 0 else 0.0,
    }


def latency_failures(latency: dict, *, max_ttft_seconds: float = 0.0, min_output_tokens_per_second: float = 0.0) -> str:
    """What of ``measure_latency``'s ``latency`` breaks the deploy settings' gates (0: no gate), naming each setting
    and the measured value; "" when it passes."""
    failures = []
    if max_ttft_seconds and latency["ttft_seconds_p50"] > max_ttft_seconds:
        failures.append(
            f"median time to first token {latency['ttft_seconds_p50']:.3f}s is above max_ttft_seconds="
            f"{max_ttft_seconds:g}"
        )
    if min_output_tokens_per_second and latency["output_tokens_per_second"] < min_output_tokens_per_second:
        failures.append(
            f"{latency['output_tokens_per_second']:.2f} output tokens/s is below min_output_tokens_per_second="
            f"{min_output_tokens_per_second:g}"
        )
    if not failures:
        return ""
    return (
        "; ".join(failures)
        + f" ({latency['requests']} concurrent streamed chat completions of up to {latency['max_tokens']} tokens)"
    )


class TooSlow(RuntimeError):
    """The server is slower than a latency gate allows, or its latency could not be measured under a gate."""


def check_latency(
    base_url: str,
    model: str,
    *,
    max_ttft_seconds: float = 0.0,
    min_output_tokens_per_second: float = 0.0,
    timeout: float = 120.0,
    temperature: float | None = 0,
) -> dict:
    """``measure_latency`` gated on ``max_ttft_seconds`` and ``min_output_tokens_per_second`` (0: no gate).

    Without a gate the figures are a report only: a probe that fails (a server that does not stream) gives
    ``{"error": ...}``, since the smoke test has already shown the server answers.

    Raises:
        TooSlow: a gate failed (``latency_failures``: the setting and the measured value), or the probe failed
            under a gate.
    """
    gated = bool(max_ttft_seconds or min_output_tokens_per_second)
    try:
        latency = measure_latency(base_url, model, timeout=timeout, temperature=temperature)
    except (RuntimeError, OSError, ValueError) as exc:  # OSError: refused, reset, timed out; ValueError: bad JSON
        if gated:
            raise TooSlow(f"the latency probe failed, so the latency gates cannot pass: {exc}") from exc
        return {"error": str(exc)[:300]}
    if failure := latency_failures(
        latency, max_ttft_seconds=max_ttft_seconds, min_output_tokens_per_second=min_output_tokens_per_second
    ):
        raise TooSlow(failure)
    return latency


def describe_latency(latency: dict) -> str:
    """``measure_latency``'s figures (or ``check_latency``'s error) in one line, for the step's log."""
    if "error" in latency:
        return f"not measured ({latency['error']})"
    return (
        f"time to first token {latency['ttft_seconds_p50']:.3f}s median, {latency['ttft_seconds_max']:.3f}s max; "
        f"{latency['output_tokens_per_second']:.1f} output tokens/s ({latency['output_tokens']} tokens in "
        f"{latency['seconds']:.2f}s, {latency['requests']} concurrent requests)"
    )


def readable_reply(text: str) -> str:
    """``text`` with each run of U+FFFD replacement characters shown as ``<?>``.

    A server decodes the generated bytes itself; where a small model emitted part of a multi-byte character
    (Korean: 3 bytes) the reply holds U+FFFD, and the bytes are gone. ``<?>`` says so plainly.
    """
    return re.sub("\ufffd+", "<?>", text)
