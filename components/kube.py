"""Talking to the Kubernetes API from inside a pipeline step: client, retries, pod checks, logs, and the one
runner of a custom resource's life (``CustomResourceRunner``).

Shared by the training launcher (PyTorchJob, TrainJob), the Katib search (Experiment) and the deployer
(InferenceService), which all create a resource, follow it, fail fast on pods that cannot start, read their logs
and delete what they created when the run is cancelled.
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
from components.settings import NetworkSettings

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
        raise ValueError(
            f"prefix {prefix!r} must be a DNS-1035 label (lowercase letters, digits, '-'; starts with a letter)"
        )
    slug = re.sub(r"[^a-z0-9]+", "-", run_id.lower()).strip("-")
    if not slug:
        raise ValueError(f"run_id {run_id!r} has no letters or digits; pass the KFP run id")
    name = f"{prefix}-{slug}"
    if len(name) > max_length:
        digest = hashlib.sha256(run_id.encode()).hexdigest()[:8]
        name = f"{name[: max_length - len(digest) - 1].rstrip('-')}-{digest}"
    return name


def egress_env(network: NetworkSettings) -> dict[str, str]:
    """The proxy and Hub-mirror variables of the pods the package creates, from the network settings
    (``components.settings.NetworkSettings``): each proxy in both spellings (curl and Go read the lowercase one,
    requests either), ``HF_ENDPOINT`` for the Hub mirror; the settings left empty are left out."""
    env = {}
    proxies = (("http_proxy", network.http_proxy), ("https_proxy", network.https_proxy), ("no_proxy", network.no_proxy))
    for name, value in proxies:
        if value:
            env[name.upper()] = env[name] = value
    if network.hf_endpoint:
        env["HF_ENDPOINT"] = network.hf_endpoint
    return env


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
        unschedulable = next(
            (
                c
                for c in pod.status.conditions or []
                if c.type == "PodScheduled" and c.status == "False" and c.reason == "Unschedulable"
            ),
            None,
        )
        if unschedulable is None:
            unschedulable_since.pop(pod.metadata.uid, None)
            continue
        since = unschedulable_since.setdefault(pod.metadata.uid, now)
        if now - since >= pending_timeout_seconds:
            return (
                f"pod {pod.metadata.name} could not be scheduled for {now - since:.0f}s: {unschedulable.message} "
                "(check the GPU count, node selector and tolerations against the cluster's GPU nodes)"
            )
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
            if status is None or not (
                status.state and (status.state.running or status.state.terminated) or status.restart_count
            ):
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
            resp = call_api(
                self._core.read_namespaced_pod_log,
                pod_name,
                self._namespace,
                _preload_content=False,
                retry_delay=self._retry_delay,
                **kwargs,
            )
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


def _inside_logging(frame) -> bool:
    """Whether ``frame`` (where a signal interrupted the main thread) is in the logging package's code. It takes its
    locks outside its ``try`` blocks (``_acquireLock(); try:`` in CPython 3.11's logging/__init__.py): an exception
    raised there can leave its module lock held for good, and every other thread that logs then waits forever (a W&B
    client's event loop did, in a pytest worker after a SIGTERM test)."""
    while frame is not None:
        if frame.f_globals.get("__name__", "").partition(".")[0] == "logging":
            return True
        frame = frame.f_back
    return False


@contextmanager
def sigterm_cancels():
    """Turn SIGTERM into ``Cancelled`` while the block runs, and set the ``threading.Event`` it yields; restore the
    previous handler afterwards.

    The Event is for the poll loops (``CustomResourceRunner.sleep``): the handler raises ``Cancelled`` wherever the
    main thread is, and when that is a finalizer (a ``__del__`` the garbage collector runs, say a dropped
    connection's) Python reports the exception and drops it, while the handler has already set a second SIGTERM
    to be ignored. Without the Event the step would poll on and what it created would outlive the cancelled run.
    Inside the logging package the handler only sets the Event (``_inside_logging``): the next poll raises.
    """
    received = threading.Event()
    if threading.current_thread() is not threading.main_thread():
        yield received  # signal handlers can only be installed from the main thread
        return

    def handler(signum, frame):
        received.set()
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # a second SIGTERM must not interrupt the clean-up or rollback
        if not _inside_logging(frame):
            raise Cancelled()

    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield received
    finally:
        # None: the previous handler was not installed from Python; the default is what it did.
        signal.signal(signal.SIGTERM, signal.SIG_DFL if previous is None else previous)


# -- one custom resource's life ----------------------------------------------------------------------------


def true_condition(obj: dict, type_: str) -> dict | None:
    """The object's status condition of this type if its status is True, else None."""
    return next(
        (
            c
            for c in (obj.get("status") or {}).get("conditions") or []
            if c.get("type") == type_ and c.get("status") == "True"
        ),
        None,
    )


def latest_state(obj: dict) -> str:
    """The type of the object's last True status condition (Created, Running, Succeeded, ...), or Pending."""
    true = [c for c in (obj.get("status") or {}).get("conditions") or [] if c.get("status") == "True"]
    return true[-1]["type"] if true else "Pending"


class CustomResourceRunner:
    """One custom resource's life as a pipeline step drives it: create or re-attach, follow, delete, wait until gone.

        runner = CustomResourceRunner(manifest, "pytorchjobs", poll_seconds=10, timeout_seconds=None,
                                      controller="the training operator")
        with runner.cancel_on_sigterm():          # SIGTERM: delete it, exit 143
            runner.create(manifest)               # or re-attach to the one of its name
            result = runner.follow(poll)          # poll(obj) -> a result, or None to poll again

    The resource's name comes from the run id, so a retried step finds what its first attempt created. ``create``
    answers a 409 AlreadyExists by reading the object: one being deleted (a previous attempt deleted it and
    stopped) is waited out and created again; one that ``replace`` says is spent (a finished, failed Katib
    Experiment) is deleted, waited out and created again; any other is re-attached to. ``follow`` reads the object
    every ``poll_seconds`` and hands it to the callback until that returns a result; a 404 meanwhile means someone
    deleted it. Past ``timeout_seconds`` (counted from the runner's creation, across re-creations) the resource is
    deleted and ``TimeoutError`` raised, unless ``follow`` is told otherwise. ``wait_until_gone`` polls until the
    API server answers 404 (until then a create under the name answers 409); a deletion still there after
    ``deletion_timeout_seconds`` is held by a finalizer nobody removes, and the error names it and ``controller``.

    Inside ``cancel_on_sigterm`` SIGTERM deletes the resource (or runs the step's own undo) and exits with 143,
    also when the signal's exception was dropped inside a finalizer or not raised inside logging
    (``sigterm_cancels``): ``sleep``, between polls, checks the Event as well, and so does the block's end. Every
    request goes through ``call_api`` (transient errors are retried).
    """

    def __init__(
        self,
        manifest: dict,
        plural: str,
        *,
        api_client=None,
        poll_seconds: float = 10.0,
        timeout_seconds: float | None = None,
        deletion_timeout_seconds: float = 900.0,
        controller: str = "its controller",
    ):
        group, _, version = manifest["apiVersion"].rpartition("/")
        self.name, self.namespace = manifest["metadata"]["name"], manifest["metadata"]["namespace"]
        self.what = f"{manifest['kind']} {self.namespace}/{self.name}"
        self.ref = (group, version, self.namespace, plural)
        self.api_client = api_client or load_api_client()
        self.custom = k8s.CustomObjectsApi(self.api_client)
        self.poll_seconds, self.retry_delay = poll_seconds, min(1.0, poll_seconds)
        self.timeout_seconds = timeout_seconds
        self.deadline = None if timeout_seconds is None else time.monotonic() + timeout_seconds
        self.deletion_timeout_seconds, self.controller = deletion_timeout_seconds, controller
        self._cancelled = threading.Event()  # replaced by sigterm_cancels' Event inside cancel_on_sigterm

    # -- requests ------------------------------------------------------------------------------------------
    def get(self) -> dict:
        """The object as the API server has it (ApiException 404 when there is none)."""
        return call_api(self.custom.get_namespaced_custom_object, *self.ref, self.name, retry_delay=self.retry_delay)

    def read(self) -> dict | None:
        """The object, or None when there is none."""
        try:
            return self.get()
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise

    def create(self, body, *, replace=None, describe=None) -> dict:
        """Create the resource, or re-attach to the one of its name; returns it as the API server answered.

        Args:
            body: the manifest, or a function of the object found being deleted (None at first) that returns the
                manifest to create (the launcher carries a re-run count over from the deleted job).
            replace: a function of an existing object that says why it must be replaced (deleted, waited out and
                created again) rather than re-attached to, or returns None.
            describe: a function of the body created that returns what to add to the "created" line.
        """
        gone = None
        while True:
            manifest = body(gone) if callable(body) else body
            try:
                created = call_api(
                    self.custom.create_namespaced_custom_object, *self.ref, manifest, retry_delay=self.retry_delay
                )
                print(f"created {self.what}" + (describe(manifest) if describe else ""), flush=True)
                return created
            except ApiException as exc:
                if exc.status != 409:
                    raise
            existing = self.read()
            if existing is None:
                continue  # deleted in between: the name is free now
            if existing["metadata"].get("deletionTimestamp"):
                # A previous attempt deleted it (for a re-run, a clean-up) and stopped before creating it again.
                print(f"{self.what} is being deleted: creating it again once it is gone", flush=True)
                gone = existing
                self.wait_until_gone()
                continue
            why = replace(existing) if replace is not None else None
            if why is None:
                # The step was retried (or a dropped response hid our own create): same run, same resource.
                print(f"{self.what} already exists: re-attaching to it", flush=True)
                return existing
            self.delete(f"{why}; creating it again once it is gone", foreground=True)
            gone = existing
            self.wait_until_gone()

    def patch(self, body: dict) -> dict:
        """Merge-patch the resource (RFC 7386); returns it as patched."""
        return call_api(
            self.custom.patch_namespaced_custom_object, *self.ref, self.name, body, retry_delay=self.retry_delay
        )

    def delete(self, why: str, *, foreground: bool = False) -> None:
        """Delete the resource (gone already: nothing to do). Foreground: the API server keeps it until its
        dependents (pods, trials) are gone, so ``wait_until_gone`` returns once what they held is free."""
        print(f"deleting {self.what}: {why}", flush=True)
        try:
            call_api(
                self.custom.delete_namespaced_custom_object,
                *self.ref,
                self.name,
                retry_delay=self.retry_delay,
                body=k8s.V1DeleteOptions(propagation_policy="Foreground" if foreground else "Background"),
            )
        except ApiException as exc:
            if exc.status != 404:
                raise

    def wait_until_gone(self) -> None:
        """Poll until the API server answers 404 for the resource.

        Raises:
            RuntimeError: still there after ``deletion_timeout_seconds``, naming its finalizers.
            TimeoutError: the runner's ``timeout_seconds`` passed meanwhile.
        """
        print(f"waiting for {self.what} to be deleted", flush=True)
        give_up = time.monotonic() + self.deletion_timeout_seconds
        while (obj := self.read()) is not None:
            if self.past_deadline():
                raise TimeoutError(
                    f"{self.what} did not finish within {self.timeout_seconds:.0f}s (it was being deleted)"
                )
            if time.monotonic() > give_up:
                finalizers = ", ".join(obj["metadata"].get("finalizers") or []) or "none"
                raise RuntimeError(
                    f"{self.what} is still being deleted after {self.deletion_timeout_seconds:.0f}s "
                    f"(finalizers: {finalizers}): check that {self.controller} is running, then "
                    "delete what holds it (its pods, or its finalizers)"
                )
            self.sleep()

    # -- following -----------------------------------------------------------------------------------------
    def past_deadline(self) -> bool:
        """Whether the runner's ``timeout_seconds`` have passed."""
        return self.deadline is not None and time.monotonic() > self.deadline

    def sleep(self) -> None:
        """Wait ``poll_seconds``; raise ``Cancelled`` at once if SIGTERM has arrived (even one whose exception a
        finalizer dropped)."""
        if self._cancelled.wait(self.poll_seconds):
            raise Cancelled()

    def follow(self, poll, *, describe=None, on_deadline=None):
        """Read the resource every ``poll_seconds`` and return the first result ``poll(obj)`` gives (not None).

        Args:
            poll: called with the object as read; returns a result to end the wait, or None; may raise.
            describe: a function of the object for the timeout's messages; default: its latest state.
            on_deadline: called with the object once ``timeout_seconds`` have passed, instead of deleting it and
                raising ``TimeoutError``; it must raise.

        Raises:
            RuntimeError: the resource was deleted while it was followed.
        """
        while True:
            try:
                obj = self.get()
            except ApiException as exc:
                if exc.status == 404:
                    raise RuntimeError(f"{self.what} was deleted while it ran") from None
                raise
            result = poll(obj)
            if result is not None:
                return result
            if self.past_deadline():
                if on_deadline is not None:
                    on_deadline(obj)
                state = describe(obj) if describe else f"last state {latest_state(obj)}"
                self.delete(f"not finished after {self.timeout_seconds:.0f}s ({state})")
                raise TimeoutError(f"{self.what} did not finish within {self.timeout_seconds:.0f}s ({state})")
            self.sleep()

    @contextmanager
    def cancel_on_sigterm(self, on_cancel=None):
        """While the block runs, SIGTERM deletes the resource (``on_cancel()`` instead, when given) and raises
        ``SystemExit(143)``: at once, at the next poll, or when the block ends (``sigterm_cancels``)."""
        with sigterm_cancels() as received:
            self._cancelled = received
            try:
                yield self
                if received.is_set():  # a SIGTERM not raised (inside logging) or dropped (a finalizer), no poll since
                    raise Cancelled()
            except Cancelled:
                if on_cancel is None:
                    self.delete("the run was cancelled (SIGTERM)")
                else:
                    on_cancel()
                raise SystemExit(128 + signal.SIGTERM) from None
            finally:
                self._cancelled = threading.Event()
