"""How a run ended, posted to a Slack-compatible incoming webhook by the pipeline's exit handler.

    notify_run_outcome(RunOutcome(pipeline="llm-finetune", run_id=run_id, status="FAILED",
                                  failed_step="train-model", reason="pod sft-...-master-0: OOMKilled ...",
                                  metrics={"eval_loss": 5.3763}, model_uri="pvc://llm-models/runs/.../final"))

The webhook URL is a credential (whoever holds it posts to the channel), so it comes only from the environment
variable ``ALERT_WEBHOOK_URL``, which a Secret reference fills (kfp-kubernetes ``use_secret_as_env`` with key
``ALERT_WEBHOOK_URL``): never a pipeline parameter, whose values are stored in plain text with the run, and
never logged (log lines name its host only).

The message is Slack's ``{"text": ..., "blocks": [...]}``: ``text`` is the notification line and the fallback
where blocks are not shown; Mattermost, Rocket.Chat and others take the same payload at their Slack-compatible
hooks. Delivery is best effort and never fails the run: a 429 (rate limited) is retried after its
``Retry-After``, a 5xx, a dropped connection or a timeout after an exponential backoff, up to ``attempts``
times; any other answer (400 invalid_payload, 403 invalid_token, 404 no_service, 410 channel_is_archived) is
final. Either way the outcome is one log line, and nothing is raised into the pipeline. A retry after a dropped
connection can post the message twice if the first one did arrive: a repeated alert beats a lost one.
"""

from __future__ import annotations

import http.client
import json
import logging
import os
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from components.secrets import WEBHOOK_SECRET_KEY

log = logging.getLogger("alerts")

# The variable the webhook URL arrives in: the Secret's key of the same name (as HF_TOKEN is for the Hub token).
WEBHOOK_URL_ENV = WEBHOOK_SECRET_KEY
STATES = ("SUCCEEDED", "FAILED", "CANCELLED", "UNKNOWN")  # components/observe/outcome.py maps KFP's states to these
_HEADLINE = {
    "SUCCEEDED": ":white_check_mark: {} succeeded",
    "FAILED": ":x: {} failed",
    "CANCELLED": ":warning: {} was cancelled",
    "UNKNOWN": ":grey_question: {} ended, outcome not reported",
}
# Slack's limits on what a block holds (characters); longer text makes the whole post an invalid_blocks 400.
HEADER_LIMIT, SECTION_LIMIT, FIELD_LIMIT = 150, 3000, 2000


@dataclass(frozen=True)
class RunOutcome:
    """What the exit handler knows about the run when it ends."""

    pipeline: str
    run_id: str
    status: str  # one of STATES
    failed_step: str = ""
    reason: str = ""
    metrics: dict = field(default_factory=dict)
    model_uri: str = ""
    run_url: str = ""  # the run's page in the KFP UI


def _escape(text: str) -> str:
    """Slack's mrkdwn control characters, escaped as its docs require."""
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def _cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _number(value) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def alert_message(outcome: RunOutcome) -> dict:
    """The webhook payload for ``outcome``: a one-line ``text`` and blocks with the run, step, reason, metrics, model.

    Text is escaped for Slack's mrkdwn and cut to its block limits (an over-long reason is shortened, not refused).
    """
    status = outcome.status.upper()
    headline = _HEADLINE.get(status, ":grey_question: {} ended " + status).format(outcome.pipeline)
    run = f"<{outcome.run_url}|{_escape(outcome.run_id)}>" if outcome.run_url else f"`{_escape(outcome.run_id)}`"
    fields = [f"*Run*\n{run}", f"*Status*\n{status.lower()}"]
    if outcome.failed_step:
        fields.append(f"*Failed step*\n`{_escape(outcome.failed_step)}`")
    if outcome.model_uri:
        fields.append(f"*Model*\n`{_escape(outcome.model_uri)}`")
    blocks = [
        {"type": "header", "text": {"type": "plain_text", "text": _cut(headline, HEADER_LIMIT), "emoji": True}},
        {"type": "section", "fields": [{"type": "mrkdwn", "text": _cut(f, FIELD_LIMIT)} for f in fields]},
    ]
    if outcome.reason:
        # Code block: a reason is often a log tail, whose newlines and symbols should reach the reader unchanged.
        reason = _cut(_escape(outcome.reason.strip()), SECTION_LIMIT - 20)
        blocks.append({"type": "section", "text": {"type": "mrkdwn", "text": f"*Reason*\n```{reason}```"}})
    if outcome.metrics:
        shown = " · ".join(f"{_escape(str(k))} {_escape(_number(v))}" for k, v in outcome.metrics.items())
        blocks.append(
            {"type": "section", "text": {"type": "mrkdwn", "text": _cut(f"*Metrics*\n{shown}", SECTION_LIMIT)}}
        )
    where = f" at {outcome.failed_step}" if outcome.failed_step else ""
    why = f": {' '.join(outcome.reason.split())}" if outcome.reason else ""
    text = _cut(f"{headline.split(' ', 1)[1]} (run {outcome.run_id}){where}{why}", 300)
    return {"text": _escape(text), "blocks": blocks}


def _retry_after(headers) -> float | None:
    try:
        return max(0.0, float(headers.get("Retry-After", "")))
    except (TypeError, ValueError):  # absent, or an HTTP date: fall back to the backoff
        return None


def post_alert(
    payload: dict,
    *,
    attempts: int = 5,
    backoff_seconds: float = 2.0,
    max_wait_seconds: float = 60.0,
    timeout_seconds: float = 10.0,
) -> bool:
    """POST ``payload`` as JSON to the webhook in ``$ALERT_WEBHOOK_URL``; True once it is accepted (2xx).

    Args:
        payload: the JSON body (``alert_message``).
        attempts: tries in all, for 429, 5xx, dropped connections and timeouts.
        backoff_seconds: the wait before the second try, doubled for each one after it.
        max_wait_seconds: the longest wait between tries, a ``Retry-After`` included.
        timeout_seconds: per request, connect and read.

    Returns:
        False, after one log line that says why, when no URL is set, it is not http(s), every attempt failed
        or the hook refused the message. Never raises.
    """
    url = os.environ.get(WEBHOOK_URL_ENV, "").strip()
    if not url:
        log.info(
            "alert not sent: %s is not set (set it from a Secret with key %s)", WEBHOOK_URL_ENV, WEBHOOK_SECRET_KEY
        )
        return False
    parts = urlsplit(url)
    if parts.scheme not in ("https", "http") or not parts.hostname:
        log.warning(
            "alert not sent: %s is not an http(s) URL (its value is not shown: it is a credential)", WEBHOOK_URL_ENV
        )
        return False
    host = parts.hostname  # the path holds the hook's token: never log it
    try:
        body = json.dumps(payload).encode()
    except (TypeError, ValueError) as exc:
        log.warning("alert not sent: the message is not JSON (%s)", exc)
        return False
    last = ""
    for attempt in range(1, attempts + 1):
        wait = min(max_wait_seconds, backoff_seconds * 2 ** (attempt - 1))
        request = urllib.request.Request(
            url, data=body, method="POST", headers={"Content-Type": "application/json; charset=utf-8"}
        )
        try:
            with urllib.request.urlopen(request, timeout=timeout_seconds) as response:
                response.read()
            log.info("alert posted to %s (attempt %d of %d)", host, attempt, attempts)
            return True
        except urllib.error.HTTPError as exc:
            try:
                answer = exc.read(200).decode(errors="replace").strip()  # Slack's reason: invalid_payload, ...
            except OSError:
                answer = ""
            last = f"HTTP {exc.code} {answer or exc.reason}"
            if exc.code != 429 and exc.code < 500:
                log.warning(
                    "alert not sent: %s refused it with %s; not retried (check the hook and the message)", host, last
                )
                return False
            if (after := _retry_after(exc.headers)) is not None:
                wait = min(max_wait_seconds, after)
        except (urllib.error.URLError, http.client.HTTPException, OSError) as exc:
            reason = getattr(exc, "reason", exc)  # URLError wraps the socket's error
            last = f"{type(reason).__name__}: {reason}"
        except Exception as exc:  # noqa: BLE001 - an alert must never fail the run
            log.warning("alert not sent: unexpected %s: %s", type(exc).__name__, exc)
            return False
        if attempt < attempts:
            log.info("alert to %s: %s; retrying in %.1fs (attempt %d of %d)", host, last, wait, attempt, attempts)
            time.sleep(wait)
    log.warning("alert not sent: gave up on %s after %d attempts; last: %s", host, attempts, last)
    return False


def notify_run_outcome(outcome: RunOutcome, **retry) -> bool:
    """Post ``alert_message(outcome)`` with ``post_alert`` (``retry``: its keyword arguments); never raises."""
    try:
        payload = alert_message(outcome)
    except Exception as exc:  # noqa: BLE001 - an alert must never fail the run
        log.warning("alert not sent: cannot build the message: %s: %s", type(exc).__name__, exc)
        return False
    return post_alert(payload, **retry)
