"""Talking to the Kubernetes API from inside a pipeline step: client, retries, pod checks, logs.

Shared by the training launcher (PyTorchJob) and the deployer (InferenceService), which both create a
resource, wait on its pods, fail fast on pods that cannot start and stream their logs.
"""

from __future__ import annotations

import calendar
import hashlib
import math
import re
import signal
import threading
import time
from collections import deque
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import urllib3
from kubernetes import client as k8s
from kubernetes import config as k8s_config
from kubernetes.client.rest import ApiException

from components.names import DNS1035_LABEL, DNS1123_SUBDOMAIN, name_error  # noqa: F401 (kube.name_error: one place)

# Every object a run creates carries the KFP run id under this label (jobs, their pods, Experiments,
# InferenceServices, Tensorboards): the Katib search finds its trials' pods by it, and users find a run's objects.
RUN_ID_LABEL = "pipelines.kubeflow.org/run-id"
# The PyTorchJob operator names pods and their headless Services ``<job>-worker-<index>``; Service names must be
# DNS-1035 labels (<= 63 characters), which leaves 52 for the job with three-digit worker indexes. Names from
# ``job_name_for`` keep to it by default, whatever their kind.
MAX_JOB_NAME = 52

_SA_NAMESPACE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")


def job_name_for(run_id: str, prefix: str = "sft", max_length: int = MAX_JOB_NAME) -> str:
    """Deterministic, valid DNS-1035 label (<= ``max_length`` chars, lowercase, starts with a letter) from the KFP
    run id.

    The same run id always gives the same name, so a retried launcher finds the job it created. Names
    longer than ``max_length`` keep their start and end in an 8-character hash of the full run id.
    """
    if not DNS1035_LABEL.match(prefix):
        raise ValueError(f"prefix {prefix!r} must be a DNS-1035 label (lowercase letters, digits, '-'; "
                         "starts with a letter)")
    slug = re.sub(r"[^a-z0-9]+", "-", run_id.lower()).strip("-")
    if not slug:
        raise ValueError(f"run_id {run_id!r} has no letters or digits; pass the KFP run id")
    name = f"{prefix}-{slug}"
    if len(name) > max_length:
        digest = hashlib.sha256(run_id.encode()).hexdigest()[:8]
        name = f"{name[:max_length - len(digest) - 1].rstrip('-')}-{digest}"
    return name


def current_namespace(default: str = "default") -> str:
    """The namespace this pod runs in (where KFP runs the user's steps), else ``default``."""
    try:
        return _SA_NAMESPACE.read_text().strip() or default
    except OSError:
        return default


# Container waiting reasons that never resolve by waiting: a wrong image name or tag, a missing
# ConfigMap/Secret key, a process that crashes as soon as it starts.
FATAL_WAITING_REASONS = frozenset(
    {"ImagePullBackOff", "ErrImagePull", "InvalidImageName", "CrashLoopBackOff", "CreateContainerConfigError"}
)
# An API server that keeps failing for this long (an upgrade, an etcd failover) is an outage, not a blip.
API_RETRY_WINDOW_SECONDS = 300.0
# A hung connection must not stall the launcher; no API call here legitimately takes longer.
REQUEST_TIMEOUT_SECONDS = 60
# since_seconds is counted on the node's clock, ours is not the same one: over-fetch and drop duplicates.
LOG_OVERLAP_SECONDS = 5
# The end of each pod's log stays in memory for failure reports: enough to reach past torchrun's
# ChildFailedError summary to the error the rank printed above it.
LOG_LINES_KEPT = 200


def load_api_client() -> k8s.ApiClient:
    """An ApiClient for this pod's service account, or for the local kubeconfig outside a cluster."""
    try:
        k8s_config.load_incluster_config()
    except k8s_config.ConfigException:
        k8s_config.load_kube_config()
    return k8s.ApiClient()


def _is_transient(exc: Exception) -> bool:
    if isinstance(exc, ApiException):
        return exc.status == 429 or exc.status >= 500
    return isinstance(exc, (urllib3.exceptions.HTTPError, ConnectionError))


def call_api(fn, *args, retry_delay: float = 1.0, **kwargs):
    """``fn(*args, **kwargs)`` with a request timeout, retrying transient failures with exponential backoff.

    Raises the last error once failures have lasted ``API_RETRY_WINDOW_SECONDS``; anything else (4xx) at once.
    """
    kwargs.setdefault("_request_timeout", REQUEST_TIMEOUT_SECONDS)
    first_failure = None
    delay = retry_delay
    while True:
        try:
            return fn(*args, **kwargs)
        except Exception as exc:
            if not _is_transient(exc):
                raise
            now = time.monotonic()
            first_failure = first_failure or now
            if now - first_failure > API_RETRY_WINDOW_SECONDS:
                raise
            what = f"HTTP {exc.status}" if isinstance(exc, ApiException) else type(exc).__name__
            print(f"transient API error ({what}) in {fn.__name__}; retrying in {delay:.1f}s", flush=True)
            time.sleep(delay)
            delay = min(delay * 2, 30.0)


def unstartable_pod_reason(pods: list, unschedulable_since: dict, pending_timeout_seconds: float) -> str | None:
    """Why one of ``pods`` will never run, or None.

    A container waiting for one of ``FATAL_WAITING_REASONS``, or a pod the scheduler has called
    Unschedulable for longer than ``pending_timeout_seconds`` (autoscalers need a few minutes to add a GPU
    node, so unschedulable alone is not final). ``unschedulable_since`` maps pod uid to when this caller
    first saw it unschedulable; it is updated here.
    """
    now = time.monotonic()
    for pod in pods:
        statuses = (pod.status.init_container_statuses or []) + (pod.status.container_statuses or [])
        for cs in statuses:
            waiting = cs.state.waiting if cs.state else None
            if waiting and waiting.reason in FATAL_WAITING_REASONS:
                detail = f": {waiting.message}" if waiting.message else ""
                return f"pod {pod.metadata.name}: container {cs.name} is {waiting.reason}{detail}"
        unschedulable = next((c for c in pod.status.conditions or [] if c.type == "PodScheduled"
                              and c.status == "False" and c.reason == "Unschedulable"), None)
        if unschedulable is None:
            unschedulable_since.pop(pod.metadata.uid, None)
            continue
        since = unschedulable_since.setdefault(pod.metadata.uid, now)
        if now - since >= pending_timeout_seconds:
            return (f"pod {pod.metadata.name} could not be scheduled for {now - since:.0f}s: {unschedulable.message} "
                    "(check the GPU count, node selector and tolerations against the cluster's GPU nodes)")
    return None


def _parse_timestamp(ts: str) -> tuple[int, int] | None:
    """RFC 3339 with nanoseconds, as the kubelet writes it (``2024-05-01T12:00:00.123456789Z``), as (s, ns)."""
    try:
        whole, _, frac = ts.rstrip("Z").partition(".")
        seconds = calendar.timegm(time.strptime(whole, "%Y-%m-%dT%H:%M:%S"))
        return seconds, int((frac + "000000000")[:9])
    except ValueError:
        return None


@dataclass
class _LogCursor:
    uid: str
    restarts: int
    last: tuple[int, int] | None = None  # timestamp of the newest line printed
    at_last: int = 0  # lines printed carrying exactly that timestamp
    fetched_at: float | None = None  # monotonic time of the previous fetch
    done: bool = False  # the container had terminated before the last fetch: nothing more will come
    recent: deque = field(default_factory=lambda: deque(maxlen=LOG_LINES_KEPT))  # the last lines printed


class PodLogFollower:
    """Print every new log line of a set of pods exactly once, ``[pod] line``, by polling.

    Each fetch asks for timestamps and, after the first, only the last few seconds (``sinceSeconds``);
    lines at or before the newest timestamp already printed are dropped. When a container restarts, the
    rest of the previous container's log is fetched (``previous``) before the new one's; a pod recreated
    under the same name (new uid) starts afresh, since it may run on a node with another clock. The last
    ``LOG_LINES_KEPT`` lines printed for each pod are kept for ``last_lines``.
    """

    def __init__(self, core: k8s.CoreV1Api, namespace: str, container: str, out=print, retry_delay: float = 1.0):
        self._core, self._namespace, self._container = core, namespace, container
        self._out, self._retry_delay = out, retry_delay
        self._cursors: dict[str, _LogCursor] = {}

    def poll(self, pods: list) -> None:
        """Fetch and print what each pod has logged since the previous poll."""
        for pod in pods:
            status = next((cs for cs in pod.status.container_statuses or [] if cs.name == self._container), None)
            if status is None or not (status.state and (status.state.running or status.state.terminated)
                                      or status.restart_count):
                continue  # not started yet: no log to read
            name = pod.metadata.name
            cursor = self._cursors.get(name)
            if cursor is None or cursor.uid != pod.metadata.uid:
                cursor = self._cursors[name] = _LogCursor(uid=pod.metadata.uid, restarts=status.restart_count)
            terminated = bool(status.state and status.state.terminated)
            if cursor.done and status.restart_count == cursor.restarts:
                continue
            started = time.monotonic()
            first_sight = cursor.fetched_at is None and cursor.last is None
            if (first_sight and status.restart_count) or status.restart_count > cursor.restarts:
                # The kubelet keeps the previous container's log: print what it wrote after our last fetch.
                self._print_new(name, cursor, self._read(name, previous=True))
            if status.restart_count != cursor.restarts:
                cursor.restarts, cursor.fetched_at = status.restart_count, None
            since = None if cursor.fetched_at is None else math.ceil(started - cursor.fetched_at) + LOG_OVERLAP_SECONDS
            text = self._read(name, since_seconds=since)
            if text is None:
                continue
            self._print_new(name, cursor, text)
            cursor.fetched_at, cursor.done = started, terminated

    def last_lines(self, pod_name: str) -> list[str]:
        """The last lines printed for the pod of that name (its latest uid), oldest first; poll first to drain."""
        cursor = self._cursors.get(pod_name)
        return list(cursor.recent) if cursor else []

    def _read(self, pod_name: str, *, previous: bool = False, since_seconds: int | None = None) -> str | None:
        kwargs = {"container": self._container, "timestamps": True, "previous": previous}
        if since_seconds is not None:
            kwargs["since_seconds"] = since_seconds
        try:
            # Raw bytes: the client otherwise json-decodes a log that happens to be valid JSON.
            resp = call_api(self._core.read_namespaced_pod_log, pod_name, self._namespace,
                            _preload_content=False, retry_delay=self._retry_delay, **kwargs)
        except ApiException as exc:
            if exc.status in (400, 404):  # container not running yet / pod gone: nothing to read now
                return None
            raise
        return resp.data.decode("utf-8", errors="replace")

    def _print_new(self, pod_name: str, cursor: _LogCursor, text: str | None) -> None:
        seen_at_last = 0
        # Only "\n" ends a log line: the kubelet timestamps each one, and a "\r" inside (a progress bar
        # redrawn in place) belongs to the line; splitting on it would strip the pieces of their timestamp.
        for raw in (text or "").split("\n"):
            if not raw:
                continue
            stamp, _, line = raw.partition(" ")
            key = _parse_timestamp(stamp)
            if key is None:  # not a kubelet timestamp: cannot be ordered, so never deduplicated
                self._emit(pod_name, cursor, raw)
                continue
            if cursor.last is not None and key < cursor.last:
                continue
            if key == cursor.last:
                if seen_at_last < cursor.at_last:  # logs are append-only: the first N at this stamp are known
                    seen_at_last += 1
                    continue
                cursor.at_last += 1
                seen_at_last += 1
            else:
                cursor.last, cursor.at_last, seen_at_last = key, 1, 1
            self._emit(pod_name, cursor, line)

    def _emit(self, pod_name: str, cursor: _LogCursor, line: str) -> None:
        cursor.recent.append(line)
        self._out(f"[{pod_name}] {line}")


class Cancelled(BaseException):
    """SIGTERM arrived: KFP cancelled the run (a BaseException so no ``except Exception`` swallows it)."""


@contextmanager
def sigterm_cancels():
    """Turn SIGTERM into ``Cancelled`` while the block runs; restore the previous handler afterwards."""
    if threading.current_thread() is not threading.main_thread():
        yield  # signal handlers can only be installed from the main thread
        return

    def handler(signum, frame):
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # a second SIGTERM must not interrupt the clean-up or rollback
        raise Cancelled()

    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        # None: the previous handler was not installed from Python; the default is what it did.
        signal.signal(signal.SIGTERM, signal.SIG_DFL if previous is None else previous)
