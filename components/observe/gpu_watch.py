"""The launcher's eye on the job's GPUs: their utilisation from Prometheus (NVIDIA's DCGM exporter), logged beside
the progress lines, and one webhook alert per episode of low utilisation.

    watch = GpuWatch("http://prometheus-operated.monitoring:9090", "team-llm", "sft-run-1")
    watch(pods)   # on every poll of the job; asks Prometheus at most every query_seconds

The query is ``DCGM_FI_DEV_GPU_UTIL{namespace="<ns>", pod=~"<the job's pods>"}``: one series per GPU (the DCGM exporter
labels each with the pod that holds it), averaged here. An episode starts when the average has stayed below
``threshold`` percent for ``window_seconds`` (one post to the run's webhook, components/observe/alerts.py) and ends
when it is back at or above the threshold (a later episode posts again). No series (pods still pending, no DCGM
exporter) leaves the state as it was. Nothing here raises into the launcher: an unreachable or failing Prometheus
is one warning per outage and the job goes on.
"""

from __future__ import annotations

import json
import logging
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable

from components.observe.alerts import HEADER_LIMIT, _cut, _escape, post_alert
from components.settings import ObservabilitySettings

log = logging.getLogger("gpu_watch")

METRIC = "DCGM_FI_DEV_GPU_UTIL"


def utilisation_query(namespace: str, pods: list[str]) -> str:
    """The PromQL selector of the GPUs of ``pods`` in ``namespace``.

    Pod names are DNS subdomains: only ``.`` is special in the (RE2) regex, escaped with a backslash that the PromQL
    string literal doubles; PromQL refuses other escapes (``\\-``), so ``re.escape`` will not do.
    """
    names = "|".join(p.replace(".", "\\\\.") for p in sorted(pods))
    return f'{METRIC}{{namespace="{namespace}",pod=~"{names}"}}'


def query_prometheus(url: str, query: str, timeout_seconds: float = 5.0) -> list[dict]:
    """The result of an instant ``query`` (``/api/v1/query``): ``[{"metric": {...}, "value": [t, "v"]}, ...]``.

    Raises:
        OSError: Prometheus unreachable (URLError, timeouts, refused connections).
        RuntimeError: it answered with an error (``status: error``, or an HTTP error with its ``error`` text).
    """
    request = urllib.request.Request(
        f"{url.rstrip('/')}/api/v1/query?" + urllib.parse.urlencode({"query": query}),
        headers={"Accept": "application/json"},
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout_seconds) as response:
            answer = json.load(response)
    except urllib.error.HTTPError as exc:
        try:
            body = json.load(exc)
            detail = f"{body.get('errorType', 'error')}: {body.get('error', '')}"
        except (ValueError, OSError):
            detail = ""
        raise RuntimeError(f"HTTP {exc.code} {detail or exc.reason}") from None
    except ValueError as exc:
        raise RuntimeError(f"not a Prometheus API answer: {exc}") from None
    if answer.get("status") != "success":
        raise RuntimeError(f"{answer.get('errorType', 'error')}: {answer.get('error', answer)}")
    return answer["data"]["result"]


def low_utilisation_message(
    job: str, namespace: str, utilisation: float, gpus: int, threshold: float, window_seconds: float
) -> dict:
    """The webhook payload (Slack's ``text`` + ``blocks``) for a job whose GPUs idle."""
    minutes = f"{window_seconds / 60:.0f} minutes" if window_seconds >= 60 else f"{window_seconds:.0f} s"
    headline = f":warning: {job}: GPUs below {threshold:.0f}% for {minutes}"
    detail = (
        f"Training job `{_escape(namespace)}/{_escape(job)}`: {gpus} GPUs at {utilisation:.0f}% average "
        f"utilisation (DCGM_FI_DEV_GPU_UTIL) for {minutes}. The job still holds them."
    )
    return {
        "text": _escape(f"{job}: {gpus} GPUs at {utilisation:.0f}% utilisation for {minutes}"),
        "blocks": [
            {"type": "header", "text": {"type": "plain_text", "text": _cut(headline, HEADER_LIMIT), "emoji": True}},
            {"type": "section", "text": {"type": "mrkdwn", "text": detail}},
        ],
    }


class GpuWatch:
    """Called with the job's pods on every poll: queries Prometheus every ``query_seconds``, prints the average
    utilisation, posts one alert per low-utilisation episode. Never raises."""

    def __init__(
        self,
        prometheus_url: str,
        namespace: str,
        job: str,
        *,
        threshold: float = 50.0,
        window_seconds: float = 600.0,
        query_seconds: float = 60.0,
        post: Callable[[dict], bool] = post_alert,
        out: Callable[[str], None] = print,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.url, self.namespace, self.job = prometheus_url, namespace, job
        self.threshold, self.window, self.every = threshold, window_seconds, query_seconds
        self.post, self.out, self.clock = post, out, clock
        self.last_query: float | None = None
        self.low_since: float | None = None  # when the average went below the threshold
        self.alerted = False  # this episode was posted
        self.unreachable = False  # the last query failed (warned once per outage)
        self.last: tuple[float, int] | None = None  # (average %, GPUs) of the last answer with series

    def __call__(self, pods) -> None:
        try:
            self._poll([getattr(getattr(p, "metadata", None), "name", p) for p in pods])
        except Exception as exc:  # noqa: BLE001 - watching must never fail the run
            log.warning("GPU utilisation not read: unexpected %s: %s", type(exc).__name__, exc)

    def _poll(self, pods: list[str]) -> None:
        now = self.clock()
        if not pods or (self.last_query is not None and now - self.last_query < self.every):
            return
        self.last_query = now
        try:
            result = query_prometheus(self.url, utilisation_query(self.namespace, pods))
        except (OSError, RuntimeError) as exc:
            if not self.unreachable:
                log.warning(
                    "GPU utilisation not read from %s (%s); the job goes on, unwatched until it answers",
                    self.url,
                    getattr(exc, "reason", exc),
                )
            self.unreachable = True
            return
        if self.unreachable:
            log.info("GPU utilisation: %s answers again", self.url)
        self.unreachable = False
        values = [float(s["value"][1]) for s in result]
        if not values:
            return  # pods pending, or no DCGM exporter: nothing to judge
        average = sum(values) / len(values)
        self.last = (average, len(values))
        held = len({s["metric"].get("pod") for s in result})
        self.out(f"GPU utilisation: {average:.0f}% average over {len(values)} GPUs ({held} pods)")
        if average >= self.threshold:
            if self.alerted:
                log.info("GPU utilisation back at %.0f%% (>= %.0f%%)", average, self.threshold)
            self.low_since, self.alerted = None, False
            return
        if self.low_since is None:
            self.low_since = now
        if not self.alerted and now - self.low_since >= self.window:
            self.alerted = True
            self.out(f"GPU utilisation below {self.threshold:.0f}% for {now - self.low_since:.0f}s: alerting")
            self.post(
                low_utilisation_message(
                    self.job, self.namespace, average, len(values), self.threshold, now - self.low_since
                )
            )


def gpu_watch_for(observability: ObservabilitySettings, namespace: str, job: str) -> GpuWatch | None:
    """The watch the run's observability settings ask for (``prometheus_url``, ``gpu_util_threshold``,
    ``gpu_util_window_seconds``), or None when ``prometheus_url`` is empty."""
    if not observability.prometheus_url:
        return None
    return GpuWatch(
        observability.prometheus_url,
        namespace,
        job,
        threshold=observability.gpu_util_threshold,
        window_seconds=observability.gpu_util_window_seconds,
        query_seconds=min(60.0, observability.gpu_util_window_seconds / 4),
    )
