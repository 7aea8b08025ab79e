"""Whether a training job still trains: the step its trainer reports, read by the launcher, which ends a job that
stalls (components/train/launcher/job.py re-runs it as a retriable failure).

    watch = ProgressWatch(stall_seconds=2700)
    why = watch(pods)     # on every poll of the job, its pods rank 0 first: None, or why the job is stalled

A stall is what the Prometheus alert ``LLMTrainingStalled`` (manifests/monitoring/prometheusrule.yaml) calls one, on
the same series and with the same limit (the ``stall_timeout_seconds`` setting; a test holds the rule to it): no
optimizer step for ``stall_seconds`` while steps remain (``stalled``). The trainer sets the step's timestamp when
training begins and at every optimizer step (components/train/trainer/metrics.py), so loading the model does not
count, and a job whose steps are done (the final evaluation and export) is not watched.

Where the step is read: each training pod's local rank 0 serves those series on ``metrics_port``, and the pods carry
the port in their ``prometheus.io/port`` annotation; the launcher reads ``http://<pod IP>:<port>/metrics`` itself,
rank 0's pod first, at most every ``read_seconds``. Not the pods' logs, although the launcher reads them anyway: the
trainer prints a step only every ``logging_steps``, which at a slow step can be longer than any limit that is safe
for a checkpoint save, and its lines are written for people. Not Prometheus: a monitoring stack is optional
(``prometheus_url``). Not a file on the model volume: the trainer writes none per step. The endpoint needs only that
the launcher's pod reach the training pods on that port, as Prometheus's scrape does: pods of one namespace can unless
a NetworkPolicy forbids it, and the training pods are outside any Istio mesh (pods.py turns injection off). A launcher
that cannot reach them says so once and goes on; ``metrics_port=0`` turns the watch off, said once.

A pod that stops answering keeps its last reading: a trainer stuck in C code that holds the interpreter (a reward
function's runaway regex) serves no scrape either, and its last step still ages. The trainer's timestamps are its
node's clock, compared with the launcher's: minutes of skew would be needed to matter against the limit.
"""

from __future__ import annotations

import re
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass

# The trainer's series (components/train/trainer/metrics.py; a test holds these names to its METRIC_NAMES).
SERIES = {
    "step": "llm_train_step",
    "max_steps": "llm_train_max_steps",
    "last_step": "llm_train_last_step_timestamp_seconds",
}
_SAMPLE = re.compile(r"^(?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{[^}]*\})?\s+(?P<value>\S+)")
PORT_ANNOTATION = "prometheus.io/port"
READ_TIMEOUT_SECONDS = 5.0
# Pods asked per read, rank 0's first: every pod serves the same step, and a read must not hold the launcher's poll
# for a timeout per pod of a large job whose pods cannot be reached.
PODS_PER_READ = 3


@dataclass(frozen=True)
class Progress:
    """One reading of a trainer's step series."""

    step: float
    max_steps: float
    last_step: float  # Unix time of the last optimizer step (of training's start, until the first); 0: not begun
    pod: str


def stalled(p: Progress, now: float, stall_seconds: float) -> bool:
    """``LLMTrainingStalled``'s condition: ``time() - last_step > limit and last_step > 0 and step < max_steps``."""
    return now - p.last_step > stall_seconds and p.last_step > 0 and p.step < p.max_steps


def parse_progress(text: str, pod: str) -> Progress | None:
    """The step series in a Prometheus text exposition (``/metrics``), or None when they are not all there."""
    found: dict[str, float] = {}
    wanted = {name: key for key, name in SERIES.items()}
    for line in text.splitlines():
        if (m := _SAMPLE.match(line)) and m.group("name") in wanted:
            try:
                found[wanted[m.group("name")]] = float(m.group("value"))
            except ValueError:
                return None
    if found.keys() != SERIES.keys():
        return None
    return Progress(found["step"], found["max_steps"], found["last_step"], pod)


def _fetch(url: str, timeout: float) -> str:
    with urllib.request.urlopen(url, timeout=timeout) as response:
        return response.read().decode("utf-8", errors="replace")


def _duration(seconds: float) -> str:
    seconds = int(seconds)
    if seconds >= 3600:
        return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"
    return f"{seconds // 60}m{seconds % 60:02d}s" if seconds >= 60 else f"{seconds}s"


class ProgressWatch:
    """Called with the job's pods (rank 0's first) on every poll; reads their trainer's step at most every
    ``read_seconds`` and says why the job is stalled, or None. ``stall_seconds`` 0: never stalled. Never raises."""

    def __init__(
        self,
        stall_seconds: float,
        *,
        read_seconds: float | None = None,
        out: Callable[[str], None] = lambda s: print(s, flush=True),
        fetch: Callable[[str, float], str] = _fetch,
        clock: Callable[[], float] = time.time,
    ):
        self.stall_seconds = stall_seconds
        # A tenth of the limit, at most a minute: a stall is seen within 10% of the limit, at one request a minute.
        self.read_seconds = min(60.0, stall_seconds / 10) if read_seconds is None else read_seconds
        self.out, self.fetch, self.clock = out, fetch, clock
        self.reset()

    def reset(self) -> None:
        """Forget the job's pods (it was created again: new pods, a new trainer)."""
        self.reading: Progress | None = None
        self.read_at: float | None = None  # monotonic time of the last read
        self.unread = False  # the last read failed (said once per outage)
        self.watching = False  # a read succeeded (said once per job)
        self.no_metrics = False  # said that the pods serve no metrics

    def __call__(self, pods: list) -> str | None:
        if self.stall_seconds <= 0:
            return None
        now = time.monotonic()
        if self.read_at is None or now - self.read_at >= self.read_seconds:
            self.read_at = now
            self._read(pods)
        p = self.reading
        if p is None or not stalled(p, self.clock(), self.stall_seconds):
            return None
        return (
            f"no optimizer step for {_duration(self.clock() - p.last_step)} (step {p.step:.0f} of {p.max_steps:.0f}, "
            f"read from {p.pod}; stall_timeout_seconds={self.stall_seconds:g}: raise it if a step or a checkpoint "
            "save legitimately takes longer)"
        )

    def _read(self, pods: list) -> None:
        running = [p for p in pods if p.status and p.status.phase == "Running" and p.status.pod_ip]
        served = [p for p in running if ((p.metadata.annotations or {}).get(PORT_ANNOTATION) or "0") != "0"]
        if running and not served:
            if not self.no_metrics:
                self.out("progress not watched: the pods serve no trainer metrics (metrics_port=0)")
            self.no_metrics = True
            return
        failures = []
        for pod in served[:PODS_PER_READ]:
            ip = pod.status.pod_ip
            host = f"[{ip}]" if ":" in ip else ip
            url = f"http://{host}:{pod.metadata.annotations[PORT_ANNOTATION]}/metrics"
            try:
                reading = parse_progress(self.fetch(url, READ_TIMEOUT_SECONDS), pod.metadata.name)
            except Exception as exc:  # noqa: BLE001 - an unreadable endpoint must never fail the run
                failures.append(f"cannot reach {url} ({type(exc).__name__}: {exc})")
                continue
            if reading is None:
                failures.append(f"{url} has no {SERIES['last_step']} yet")
                continue
            self.reading = reading
            if not self.watching:
                self.out(
                    f"watching progress: {url} of {pod.metadata.name} (no optimizer step for "
                    f"{_duration(self.stall_seconds)} ends the job and re-runs it from its last checkpoint)"
                )
            self.watching, self.unread = True, False
            return
        if failures and not self.unread:
            self.out(
                f"progress not read: {failures[0]}"
                + (f" (and {len(failures) - 1} more pods)" if len(failures) > 1 else "")
                + "; the job goes on, its last step reading (if any) still counts"
            )
            self.unread = True
