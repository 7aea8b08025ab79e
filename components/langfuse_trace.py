"""Langfuse traces of a run: the training run (settings, checkpoints, final metrics), every generation of the
evaluation (prompt, base and tuned answers) and the deployment's smoke test, each with the model's identity.

The Langfuse SDK reads its project keys and address from ``LANGFUSE_PUBLIC_KEY``, ``LANGFUSE_SECRET_KEY`` and
``LANGFUSE_HOST`` (components/secrets.py ``LANGFUSE_KEYS``), which the ``langfuse_secret`` Secret fills by reference
(the training pods' ``secretKeyRef``, the evaluate and deploy steps' ``use_secret_as_env``); without all three,
nothing is traced. Every trace of a run shares the run id as its Langfuse session, so the run's training,
evaluation and deployment are read together. The SDK (v5) sends OpenTelemetry spans to
``$LANGFUSE_HOST/api/public/otel/v1/traces`` in the background; ``end`` flushes them.

Tracing is best effort, like the webhook alert: an error (a bad host, a refused key, an SDK failure) is one warning
and the step goes on; nothing here raises.
"""

from __future__ import annotations

import logging
import os
from typing import Any

from components.secrets import LANGFUSE_KEYS

log = logging.getLogger("langfuse")


def configured(env=None) -> bool:
    """Whether the environment holds all of Langfuse's keys (``LANGFUSE_KEYS``), each non-empty."""
    env = os.environ if env is None else env
    return all((env.get(key) or "").strip() for key in LANGFUSE_KEYS)


class Trace:
    """One Langfuse trace: a root span with child spans and generations. Build it with ``start_trace``."""

    def __init__(self, client, root):
        self.client, self.root = client, root

    def _safely(self, what: str, fn) -> Any:
        if self.root is None:
            return None
        try:
            return fn()
        except Exception as exc:  # noqa: BLE001 - tracing must never fail the step
            log.warning(
                "Langfuse: %s not recorded (%s: %s); tracing stops for this trace", what, type(exc).__name__, exc
            )
            self.root = None
            return None

    def span(self, name: str, *, input=None, output=None, metadata=None) -> None:
        """A finished child span (a checkpoint, the smoke test's request)."""
        self._safely(
            name,
            lambda: self.root.start_observation(
                name=name, as_type="span", input=input, output=output, metadata=metadata
            ).end(),
        )

    def generation(
        self, name: str, *, model: str, input, output, metadata=None, model_parameters: dict | None = None
    ) -> None:
        """A finished child generation: ``model`` answered ``input`` (chat messages) with ``output``."""
        self._safely(
            name,
            lambda: self.root.start_observation(
                name=name,
                as_type="generation",
                model=model,
                input=input,
                output=output,
                metadata=metadata,
                model_parameters=model_parameters,
            ).end(),
        )

    def end(self, output=None) -> None:
        """Close the trace with ``output`` and send everything (blocks until the SDK has exported)."""

        def close():
            if output is not None:
                self.root.update(output=output)
            self.root.end()
            self.client.flush()
            log.info("Langfuse: trace %s sent to %s", self.root.trace_id, os.environ.get("LANGFUSE_HOST", "?"))

        self._safely("the trace's end", close)
        self.root = None


def start_trace(
    name: str, *, run_id: str, input=None, metadata: dict | None = None, tags: list[str] | None = None
) -> Trace | None:
    """Open a trace named ``name`` in the run's session (``run_id``) with a root span of the same name; None (and
    an info line) when Langfuse is not configured, or a warning when the SDK cannot start."""
    if not configured():
        log.info("Langfuse: not traced (%s not all set; langfuse_secret fills them)", ", ".join(LANGFUSE_KEYS))
        return None
    try:
        # Lazy: the SDK (OpenTelemetry, httpx) loads only where a trace is recorded.
        from langfuse import Langfuse, propagate_attributes

        client = Langfuse()
        trace_metadata = {k: str(v)[:200] for k, v in (metadata or {}).items()}  # trace metadata: short strings
        with propagate_attributes(
            session_id=run_id[:200], trace_name=name[:200], tags=tags or [], metadata=trace_metadata
        ):
            root = client.start_observation(name=name, as_type="span", input=input, metadata=metadata)
        return Trace(client, root)
    except Exception as exc:  # noqa: BLE001 - tracing must never fail the step
        log.warning("Langfuse: not traced (%s: %s)", type(exc).__name__, exc)
        return None


def trace_evaluation(
    *,
    run_id: str,
    base_model: str,
    tuned_model: str,
    prompts: list[str],
    answers: dict,
    metrics: dict,
    passed: bool,
    reason: str,
    max_new_tokens: int,
) -> bool:
    """The evaluation as one trace: a generation per prompt and model (greedy, up to ``max_new_tokens``), the
    models' identities, and the metrics and gate decision as its output. True once sent."""
    trace = start_trace(
        f"evaluate {run_id}",
        run_id=run_id,
        tags=["evaluate"],
        input={"base_model": base_model, "tuned_model": tuned_model, "prompts": len(prompts)},
        metadata={"run_id": run_id, "base_model": base_model, "tuned_model": tuned_model},
    )
    if trace is None:
        return False
    parameters = {"max_new_tokens": max_new_tokens, "do_sample": False}
    for i, prompt in enumerate(prompts):
        for role, model in (("base", base_model), ("tuned", tuned_model)):
            trace.generation(
                f"prompt {i + 1} {role}",
                model=model,
                input=[{"role": "user", "content": prompt}],
                output=answers[role][i],
                metadata={"role": role, "prompt_index": i},
                model_parameters=parameters,
            )
    trace.end(output={"metrics": metrics, "passed": passed, "reason": reason})
    return True


def trace_smoke_test(
    *, run_id: str, model_path: str, served_model_name: str, endpoint: str, prompt: str, reply: str
) -> bool:
    """The deployment's smoke test as one trace: the served model's one generation. True once sent."""
    trace = start_trace(
        f"deploy {run_id}",
        run_id=run_id,
        tags=["deploy"],
        input={"model_path": model_path, "endpoint": endpoint},
        metadata={"run_id": run_id, "model_path": model_path, "served_model_name": served_model_name},
    )
    if trace is None:
        return False
    trace.generation(
        "smoke test",
        model=served_model_name,
        input=[{"role": "user", "content": prompt}],
        output=reply,
        metadata={"endpoint": endpoint, "model_path": model_path},
    )
    trace.end(output={"endpoint": endpoint, "smoke_reply": reply})
    return True
