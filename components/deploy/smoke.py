"""The smoke test every deployment gets: one chat completion on an OpenAI-compatible route.

The same client checks a local `transformers serve` (``/v1``), KServe's vLLM runtime (vLLM's own server,
``/v1``) and its Hugging Face runtime (KServe's model server, ``/openai/v1``): callers pass the base URL
including the route prefix.
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request


def chat_completion(base_url: str, model: str, prompt: str, max_tokens: int = 16, timeout: float = 60.0) -> str:
    """POST one chat completion to ``{base_url}/chat/completions`` and return the reply text.

    Raises RuntimeError with the status and body when the server answers with an error or no choices.
    """
    body = json.dumps({
        "model": model,
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": max_tokens,
        "temperature": 0,
    }).encode()
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
    return choices[0]["message"].get("content") or ""


def wait_healthy(url: str, timeout: float, is_alive=lambda: True) -> None:
    """Poll ``url`` until it answers 200; raise TimeoutError after ``timeout`` seconds or when ``is_alive()`` turns false."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not is_alive():
            raise RuntimeError(f"the server exited before {url} became healthy")
        try:
            with urllib.request.urlopen(url, timeout=5) as resp:
                if resp.status == 200:
                    return
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            pass
        time.sleep(0.5)
    raise TimeoutError(f"{url} did not become healthy within {timeout:.0f}s")
