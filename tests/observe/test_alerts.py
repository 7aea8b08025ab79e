"""Run alerts (components/observe/alerts.py) against a real local webhook that fails the way Slack's does."""

from __future__ import annotations

import json
import logging
import time

import pytest

from components.observe import alerts
from components.observe.alerts import RunOutcome, alert_message, notify_run_outcome, post_alert
from tests.fakes.webhook import TOKEN_PATH, Hook

# A "hang" reply (Hook's default 2.5 s) outlasts timeout_seconds.
FAST = dict(backoff_seconds=0.05, max_wait_seconds=5.0, timeout_seconds=2.0)

FAILED = RunOutcome(
    pipeline="llm-finetune",
    run_id="8346555",
    status="FAILED",
    failed_step="train-model",
    reason="pod sft-8346555-master-0: container pytorch was OOMKilled (exit code 137)\n"
    "last lines: <rank0> CUDA out of memory & more",
    metrics={"eval_loss": 5.376312255859375, "global_step": 102},
    model_uri="pvc://llm-models/runs/8346555/train/final",
    run_url="https://kubeflow.example.com/pipeline/#/runs/details/8346555",
)


@pytest.fixture
def webhook_env(monkeypatch):
    def use(url: str):
        monkeypatch.setenv(alerts.WEBHOOK_URL_ENV, url)

    return use


def test_429_500_and_a_dropped_connection_are_retried_until_the_hook_takes_it(webhook_env, caplog):
    with Hook((429, {"Retry-After": "1"}, "rate_limited"), (500, {}, "internal_error"), "drop") as hook:
        webhook_env(hook.url)
        with caplog.at_level(logging.INFO, logger="alerts"):
            assert notify_run_outcome(FAILED, **FAST) is True
    assert len(hook.requests) == 4
    first, second = hook.requests[0]["at"], hook.requests[1]["at"]
    assert second - first >= 0.95  # Retry-After honoured, not the 0.05 s backoff
    bodies = [json.loads(r["body"]) for r in hook.requests]
    assert all(b == alert_message(FAILED) for b in bodies)  # the same message each time
    assert all(r["headers"]["Content-Type"].startswith("application/json") for r in hook.requests)
    assert "alert posted to 127.0.0.1 (attempt 4 of 5)" in caplog.messages
    assert any("HTTP 429 rate_limited; retrying in 1.0s" in m for m in caplog.messages)
    assert any("HTTP 500 internal_error" in m for m in caplog.messages)
    assert any("RemoteDisconnected" in m for m in caplog.messages)
    assert TOKEN_PATH not in caplog.text and "s3cr3t" not in caplog.text  # the credential is never logged


def test_a_hook_that_keeps_failing_is_given_up_with_one_clear_line(webhook_env, caplog):
    with Hook(*[(503, {}, "service_unavailable")] * 3) as hook:
        webhook_env(hook.url)
        with caplog.at_level(logging.INFO, logger="alerts"):
            assert post_alert(alert_message(FAILED), attempts=3, **FAST) is False
    assert len(hook.requests) == 3
    assert caplog.records[-1].levelname == "WARNING"
    assert caplog.messages[-1] == (
        "alert not sent: gave up on 127.0.0.1 after 3 attempts; last: HTTP 503 service_unavailable"
    )


def test_a_request_that_times_out_is_retried(webhook_env, caplog):
    with Hook("hang") as hook:
        webhook_env(hook.url)
        with caplog.at_level(logging.INFO, logger="alerts"):
            assert post_alert({"text": "hi"}, attempts=2, backoff_seconds=0.05, timeout_seconds=0.5) is True
    assert len(hook.requests) == 2
    assert any("timed out" in m for m in caplog.messages)


@pytest.mark.parametrize(
    "status, body",
    [(400, "invalid_payload"), (403, "invalid_token"), (404, "no_service"), (410, "channel_is_archived")],
)
def test_a_refusal_is_final(webhook_env, caplog, status, body):
    with Hook((status, {}, body)) as hook:
        webhook_env(hook.url)
        with caplog.at_level(logging.INFO, logger="alerts"):
            assert post_alert({"text": "hi"}, **FAST) is False
    assert len(hook.requests) == 1
    assert caplog.messages[-1] == (
        f"alert not sent: 127.0.0.1 refused it with HTTP {status} {body}; not retried (check the hook and the message)"
    )


def test_a_long_retry_after_is_capped(webhook_env):
    with Hook((429, {"Retry-After": "3600"}, "rate_limited")) as hook:
        webhook_env(hook.url)
        started = time.monotonic()
        assert post_alert({"text": "hi"}, backoff_seconds=0.05, max_wait_seconds=0.3, timeout_seconds=2.0) is True
    assert time.monotonic() - started < 3 and len(hook.requests) == 2


def test_no_url_no_request_and_never_an_exception(monkeypatch, caplog):
    monkeypatch.delenv(alerts.WEBHOOK_URL_ENV, raising=False)
    with caplog.at_level(logging.INFO, logger="alerts"):
        assert notify_run_outcome(FAILED) is False
    assert caplog.messages == [
        "alert not sent: ALERT_WEBHOOK_URL is not set (set it from a Secret with key ALERT_WEBHOOK_URL)"
    ]


@pytest.mark.parametrize("url", ["hooks.slack.com/services/T/B/secret", "ftp://example.com/secret", "https://"])
def test_a_url_that_is_not_http_is_refused_without_showing_it(webhook_env, caplog, url):
    webhook_env(url)
    assert post_alert({"text": "hi"}, **FAST) is False
    assert "secret" not in caplog.text and "is not an http(s) URL" in caplog.text


def test_an_unreachable_hook_fails_quietly(webhook_env, caplog):
    hook = Hook()  # bound, never served: connections are refused once it closes
    hook.server.server_close()
    webhook_env(hook.url)
    with caplog.at_level(logging.WARNING, logger="alerts"):
        assert post_alert({"text": "hi"}, attempts=2, **FAST) is False
    assert "gave up on 127.0.0.1 after 2 attempts; last: ConnectionRefusedError" in caplog.messages[-1]


def test_a_message_that_cannot_be_built_or_sent_fails_quietly(webhook_env, caplog):
    webhook_env("http://127.0.0.1:9/hook")
    assert post_alert({"when": object()}, **FAST) is False
    assert "alert not sent: the message is not JSON (Object of type object is not JSON serializable)" in caplog.text
    assert notify_run_outcome(RunOutcome("p", "r", "FAILED", metrics=["eval_loss"]), **FAST) is False
    assert "alert not sent: cannot build the message: AttributeError" in caplog.text


# -- the message --------------------------------------------------------------------------------------------------


def _texts(message: dict) -> list[str]:
    out = []
    for block in message["blocks"]:
        if "text" in block:
            out.append(block["text"]["text"])
        out += [f["text"] for f in block.get("fields", [])]
    return out


def test_a_failure_names_the_step_the_reason_the_metrics_and_the_model():
    message = alert_message(FAILED)
    assert message["text"].startswith(
        "llm-finetune failed (run 8346555) at train-model: pod sft-8346555-master-0: "
        "container pytorch was OOMKilled (exit code 137) last lines: &lt;rank0&gt; CUDA"
    )
    header, fields, reason, metrics = message["blocks"]
    assert header == {
        "type": "header",
        "text": {"type": "plain_text", "text": ":x: llm-finetune failed", "emoji": True},
    }
    assert [f["text"] for f in fields["fields"]] == [
        "*Run*\n<https://kubeflow.example.com/pipeline/#/runs/details/8346555|8346555>",
        "*Status*\nfailed",
        "*Failed step*\n`train-model`",
        "*Model*\n`pvc://llm-models/runs/8346555/train/final`",
    ]
    assert reason["text"]["text"] == (
        "*Reason*\n```pod sft-8346555-master-0: container pytorch was OOMKilled "
        "(exit code 137)\nlast lines: &lt;rank0&gt; CUDA out of memory &amp; more```"
    )
    assert metrics["text"]["text"] == "*Metrics*\neval_loss 5.376 · global_step 102"


def test_a_success_has_no_failure_fields():
    message = alert_message(
        RunOutcome(
            "llm-finetune", "r1", "SUCCEEDED", metrics={"eval_loss": 1.5}, model_uri="pvc://m/runs/r1/train/final"
        )
    )
    assert message["text"] == "llm-finetune succeeded (run r1)"
    assert message["blocks"][0]["text"]["text"] == ":white_check_mark: llm-finetune succeeded"
    assert not any("Failed step" in t or "Reason" in t for t in _texts(message))
    cancelled = alert_message(RunOutcome("llm-finetune", "r1", "CANCELLED"))
    assert cancelled["blocks"][0]["text"]["text"] == ":warning: llm-finetune was cancelled"


def test_long_text_is_cut_to_slacks_limits():
    outcome = RunOutcome(
        "p" * 200,
        "r1",
        "FAILED",
        failed_step="s" * 3000,
        reason="x" * 10_000,
        metrics={f"m{i}": float(i) for i in range(500)},
    )
    message = alert_message(outcome)
    header = message["blocks"][0]["text"]["text"]
    assert len(header) <= alerts.HEADER_LIMIT and header.endswith("…")
    for block in message["blocks"][1:]:
        if "text" in block:
            assert len(block["text"]["text"]) <= alerts.SECTION_LIMIT
        assert all(len(f["text"]) <= alerts.FIELD_LIMIT for f in block.get("fields", []))
    assert len(message["text"]) <= 300 * 1.1  # escaping may lengthen the cut line a little
