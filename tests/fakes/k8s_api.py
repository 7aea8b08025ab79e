"""A fake Kubernetes API server over real HTTP, for driving launchers through the real kubernetes client.

    with FakeKubeAPI() as api:
        api.on_get("pytorchjobs", api.steps(created, running_with_logs, succeeded))
        run_training_job(manifest, poll_seconds=0.01, api_client=api.client)
        assert len(api.requests_for("POST", "/pytorchjobs")) == 1

What it serves, shaped like the real API: custom objects (create, get, merge-patch or JSON-patch, replace,
delete) for any group/version/plural under ``/apis/<group>/<version>/namespaces/<ns>/<plural>`` (Deployments
among them), and core/v1 Services and ConfigMaps the same way (key ``("", "v1", "services", ns, name)``); core/v1
pods (list with ``labelSelector``) and ``pods/<name>/log`` (``container``, ``previous``, ``sinceSeconds``,
``tailLines``, ``timestamps``); errors as ``Status`` objects (``AlreadyExists`` 409, ``NotFound`` 404,
``Conflict`` 409, ``BadRequest`` 400).

For the cluster preflight it also serves API discovery (``/apis/<group>/<version>``, for the resources
registered with ``install_crd``), the OpenAPI v3 document of a group/version (``/openapi/v3/apis/<group>/<version>``,
for the schemas registered with ``publish_schema``), core/v1 PersistentVolumeClaims and Secrets (get), Namespaces
(get, ``add_namespace``), Nodes (list with ``labelSelector``) and ``SelfSubjectAccessReview`` (allowed unless
``deny`` says otherwise). ``forbid`` answers a path with 403 Forbidden, as RBAC would.

The controller side is scripted: ``on_get(plural, fn)`` calls ``fn(obj)`` on every GET of such an object,
before answering, so a scenario advances one step per poll (``steps(...)`` builds such a function from a
sequence). ``fail_next``/``drop_next`` inject HTTP errors or dropped connections. Every request is logged.

Failures come in the shapes real clusters give them: ``evict_pod`` (the kubelet under node pressure),
``preempt_pod`` (the scheduler), ``disrupt_pod`` (any other ``DisruptionTarget``: node shutdown, taint
manager, pod GC of a lost node), and an OOM kill via ``set_container_state(..., reason="OOMKilled",
exit_code=137)``. Deletion is not instant when it need not be: a ``propagationPolicy: Foreground`` DELETE
leaves the object in place with ``metadata.deletionTimestamp`` and the ``foregroundDeletion`` finalizer for
``deletion_gets`` GETs (controllers do not run on it; a create under its name answers 409 "object is being
deleted"), then removes it and the pods it owns (``add_pod(owner=...)``) and answers 404, as the garbage
collector does once the dependents are gone. A background DELETE removes the object at once.
"""

from __future__ import annotations

import copy
import json
import threading
import time
import uuid
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

from kubernetes import client as k8s

# The kubelet's eviction message (pkg/kubelet/eviction/helpers.go), trailing space included.
EVICTION_MESSAGE = (
    "The node was low on resource: memory. Threshold quantity: 100Mi, available: 51200Ki. "
    "Container pytorch was using 1890Gi, request is 128Gi, has larger consumption of memory. "
)


# core/v1 kinds served like custom objects (create, get, patch, delete).
CORE_OBJECTS = ("services", "configmaps")


@dataclass
class Request:
    """One request as the server saw it."""

    method: str
    path: str
    query: dict
    body: object
    content_type: str


@dataclass
class _Fault:
    remaining: int
    kind: str  # "status" or "drop"
    status: int
    method: str | None
    path_contains: str | None


@dataclass
class _Pod:
    obj: dict
    log: list = field(default_factory=list)  # [(time_ns, line)] of the current container
    previous: list | None = None  # the previous container's log, once it restarted
    sidecars: dict = field(default_factory=dict)  # container name -> [(time_ns, line)] of each other container


def rfc3339_nano(t_ns: int) -> str:
    """Format like Go's RFC3339Nano, as the kubelet does: trailing zeros of the fraction dropped."""
    seconds, nanos = divmod(t_ns, 1_000_000_000)
    base = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(seconds))
    frac = f"{nanos:09d}".rstrip("0")
    return f"{base}.{frac}Z" if frac else f"{base}Z"


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def merge_patch(target, patch):
    """RFC 7386 JSON merge patch, as the API server applies ``application/merge-patch+json``."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


def _json_patch(doc, ops):
    """RFC 6902 add/replace/remove, enough for what clients send to custom resources."""
    doc = copy.deepcopy(doc)
    for op in ops:
        parts = [p.replace("~1", "/").replace("~0", "~") for p in op["path"].lstrip("/").split("/")]
        parent = doc
        for part in parts[:-1]:
            parent = parent[int(part)] if isinstance(parent, list) else parent[part]
        last = parts[-1]
        if op["op"] == "remove":
            del parent[int(last) if isinstance(parent, list) else last]
        elif isinstance(parent, list) and op["op"] == "add":
            parent.insert(len(parent) if last == "-" else int(last), op["value"])
        else:
            parent[int(last) if isinstance(parent, list) else last] = op["value"]
    return doc


class FakeKubeAPI:
    """The fake API server's state and scripting surface; a context manager that runs the server."""

    def __init__(self):
        self.lock = threading.RLock()
        self.objects: dict[tuple, dict] = {}  # (group, version, plural, namespace, name) -> object
        self.pods: dict[tuple, _Pod] = {}  # (namespace, name) -> pod
        self.requests: list[Request] = []
        self._controllers: dict[str, list] = {}
        self._faults: list[_Fault] = []
        self.core: dict[tuple, dict] = {}  # (plural, namespace or "", name) -> PVCs, Secrets, Nodes
        self.crds: dict[tuple, list] = {}  # (group, version) -> discovery APIResource entries
        self.openapi: dict[tuple, dict] = {}  # (group, version) -> components.schemas of its OpenAPI v3 document
        self.denied: set[tuple] = set()  # (verb, group, resource, subresource) a SelfSubjectAccessReview refuses
        self.forbidden: list[str] = []  # path fragments answered 403
        # GETs a foreground-deleted object survives, as while the garbage collector deletes its pods.
        self.deletion_gets = 3
        self._deleting: dict[tuple, int] = {}  # object key -> GETs it has left
        self._server: ThreadingHTTPServer | None = None
        self.client: k8s.ApiClient | None = None

    # -- lifecycle ---------------------------------------------------------------------------------
    def __enter__(self) -> FakeKubeAPI:
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _handler_for(self))
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
        host, port = self._server.server_address
        self.client = k8s.ApiClient(k8s.Configuration(host=f"http://{host}:{port}"))
        return self

    def __exit__(self, *exc) -> None:
        self.client.close()
        self._server.shutdown()
        self._server.server_close()

    # -- scripting -----------------------------------------------------------------------------------
    def on_get(self, plural: str, fn) -> None:
        """Call ``fn(obj)`` (under the lock; mutate ``obj`` in place) before answering each GET of a ``plural``."""
        self._controllers.setdefault(plural, []).append(fn)

    @staticmethod
    def steps(*steps):
        """A controller function that runs ``steps[i]`` on the i-th call, then keeps running the last one."""
        calls = iter(range(len(steps)))

        def advance(obj):
            steps[next(calls, len(steps) - 1)](obj)

        return advance

    def fail_next(self, n: int, status: int = 500, method: str | None = None, path_contains: str | None = None) -> None:
        """Answer the next ``n`` matching requests with an HTTP ``status`` Status object."""
        self._faults.append(_Fault(n, "status", status, method, path_contains))

    def drop_next(self, n: int, method: str | None = None, path_contains: str | None = None) -> None:
        """Close the connection without answering the next ``n`` matching requests."""
        self._faults.append(_Fault(n, "drop", 0, method, path_contains))

    def put_object(self, group: str, version: str, plural: str, obj: dict) -> dict:
        """Store an object, status included, as if created earlier (metadata filled in like the API server
        does); returns a copy of what is stored."""
        with self.lock:
            obj = self._stamp(copy.deepcopy(obj))
            self.objects[(group, version, plural, obj["metadata"]["namespace"], obj["metadata"]["name"])] = obj
            return copy.deepcopy(obj)

    def get_object(self, group: str, version: str, plural: str, namespace: str, name: str) -> dict | None:
        """The stored object, or None."""
        with self.lock:
            return copy.deepcopy(self.objects.get((group, version, plural, namespace, name)))

    @staticmethod
    def set_condition(obj: dict, type_: str, status: str = "True", reason: str = "", message: str = "") -> None:
        """Add or update a status condition, flipping older True conditions of job-state kinds to False."""
        conditions = obj.setdefault("status", {}).setdefault("conditions", [])
        if status == "True" and type_ in ("Created", "Running", "Restarting", "Succeeded", "Failed"):
            for cond in conditions:
                if cond["type"] in ("Running", "Restarting") and cond["type"] != type_:
                    cond["status"] = "False"
        for cond in conditions:
            if cond["type"] == type_:
                cond.update(status=status, reason=reason, message=message, lastTransitionTime=_now())
                return
        conditions.append(
            {
                "type": type_,
                "status": status,
                "reason": reason,
                "message": message,
                "lastTransitionTime": _now(),
                "lastUpdateTime": _now(),
            }
        )

    def add_pod(
        self,
        namespace: str,
        name: str,
        labels: dict,
        *,
        container: str = "pytorch",
        state: str = "running",
        reason: str = "",
        message: str = "",
        unschedulable: str | None = None,
        owner: dict | None = None,
        sidecars: tuple = (),
    ) -> None:
        """Create or replace a pod (a new uid, an empty log): ``state`` is running, waiting (with
        ``reason``/``message``) or terminated; ``unschedulable`` (the scheduler's message) makes it Pending with
        PodScheduled=False; ``owner`` (a job as stored) makes it the job's controlled dependent, as the
        operator creates its pods, so deleting the job removes it; ``sidecars`` names more containers (Katib's
        metrics collector, say), running beside the first, each with its own log."""
        with self.lock:
            pod = {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {
                    "name": name,
                    "namespace": namespace,
                    "labels": dict(labels),
                    "uid": str(uuid.uuid4()),
                    "creationTimestamp": _now(),
                },
                "spec": {
                    "containers": [
                        {"name": container, "image": "trainer:test"},
                        *({"name": c, "image": f"{c}:test"} for c in sidecars),
                    ]
                },
                "status": {"phase": "Pending"},
            }
            if owner is not None:
                pod["metadata"]["ownerReferences"] = [
                    {
                        "apiVersion": owner["apiVersion"],
                        "kind": owner["kind"],
                        "name": owner["metadata"]["name"],
                        "uid": owner["metadata"]["uid"],
                        "controller": True,
                        "blockOwnerDeletion": True,
                    }
                ]
            self.pods[(namespace, name)] = _Pod(pod, sidecars={c: [] for c in sidecars})
            if unschedulable is None:
                self.schedule_pod(namespace, name, state, reason=reason, message=message)
            else:
                pod["status"]["conditions"] = [
                    {
                        "type": "PodScheduled",
                        "status": "False",
                        "reason": "Unschedulable",
                        "message": unschedulable,
                        "lastTransitionTime": _now(),
                    }
                ]

    def schedule_pod(
        self, namespace: str, name: str, state: str = "running", *, reason: str = "", message: str = ""
    ) -> None:
        """The scheduler binds the pod (same uid) and its container moves to ``state``."""
        with self.lock:
            pod = self.pods[(namespace, name)].obj
            container, *sidecars = (c["name"] for c in pod["spec"]["containers"])
            pod["status"]["conditions"] = [{"type": "PodScheduled", "status": "True", "lastTransitionTime": _now()}]
            pod["status"]["containerStatuses"] = [
                {
                    "name": container,
                    "image": "trainer:test",
                    "imageID": "",
                    "ready": False,
                    "restartCount": 0,
                    "state": {},
                }
            ]
            pod["status"]["containerStatuses"] += [
                {
                    "name": c,
                    "image": f"{c}:test",
                    "imageID": "",
                    "ready": True,
                    "restartCount": 0,
                    "state": {"running": {"startedAt": _now()}},
                }
                for c in sidecars
            ]
            self.set_container_state(namespace, name, state, reason=reason, message=message)

    def set_container_state(
        self, namespace: str, name: str, state: str, *, reason: str = "", message: str = "", exit_code: int = 0
    ) -> None:
        """Move the pod's container to running, waiting or terminated (and the pod's phase with it)."""
        with self.lock:
            pod = self.pods[(namespace, name)].obj
            cs = pod["status"]["containerStatuses"][0]
            cs["ready"] = state == "running"
            if state == "running":
                cs["state"] = {"running": {"startedAt": _now()}}
                pod["status"]["phase"] = "Running"
            elif state == "waiting":
                cs["state"] = {"waiting": {"reason": reason, "message": message}}
            else:
                cs["state"] = {
                    "terminated": {
                        "exitCode": exit_code,
                        "reason": reason or "Completed",
                        "startedAt": _now(),
                        "finishedAt": _now(),
                    }
                }
                pod["status"]["phase"] = "Succeeded" if exit_code == 0 else "Failed"

    def restart_container(self, namespace: str, name: str) -> None:
        """The kubelet restarts the container: its log becomes the previous log and a new one begins."""
        with self.lock:
            pod = self.pods[(namespace, name)]
            pod.previous, pod.log = pod.log, []
            cs = pod.obj["status"]["containerStatuses"][0]
            cs["restartCount"] += 1
            cs["lastState"] = {
                "terminated": {"exitCode": 1, "reason": "Error", "startedAt": _now(), "finishedAt": _now()}
            }
            cs["state"] = {"running": {"startedAt": _now()}}

    def disrupt_pod(
        self,
        namespace: str,
        name: str,
        condition_reason: str | None,
        message: str,
        *,
        pod_reason: str = "",
        exit_code: int = 137,
    ) -> None:
        """The pod is ended from outside, as Kubernetes records it: phase Failed, a ``DisruptionTarget``
        condition with ``condition_reason`` (None: an older cluster that sets none), ``pod_reason`` and
        ``message`` on the pod status if given, and its container killed (``exit_code``, reason Error)."""
        with self.lock:
            status = self.pods[(namespace, name)].obj["status"]
            conditions = [c for c in status.get("conditions", []) if c["type"] not in ("DisruptionTarget", "Ready")]
            if condition_reason is not None:
                conditions.append(
                    {
                        "type": "DisruptionTarget",
                        "status": "True",
                        "reason": condition_reason,
                        "message": message,
                        "lastTransitionTime": _now(),
                    }
                )
            conditions.append({"type": "Ready", "status": "False", "reason": "PodFailed", "lastTransitionTime": _now()})
            status["conditions"] = conditions
            if pod_reason:
                status.update(reason=pod_reason, message=message)
            self.set_container_state(namespace, name, "terminated", reason="Error", exit_code=exit_code)

    def evict_pod(self, namespace: str, name: str, message: str = EVICTION_MESSAGE) -> None:
        """The kubelet evicts the pod under node pressure: reason Evicted, DisruptionTarget
        TerminationByKubelet, the container killed at once (hard eviction: SIGKILL, exit 137, not OOMKilled)."""
        self.disrupt_pod(namespace, name, "TerminationByKubelet", message, pod_reason="Evicted", exit_code=137)

    def preempt_pod(self, namespace: str, name: str, scheduler: str = "default-scheduler") -> None:
        """The scheduler preempts the pod for a higher-priority one: DisruptionTarget PreemptionByScheduler,
        then a graceful delete (deletionTimestamp set; the kubelet marks it Failed after SIGTERM, exit 143).
        ``remove_pod`` finishes the deletion."""
        with self.lock:
            self.disrupt_pod(
                namespace,
                name,
                "PreemptionByScheduler",
                f"{scheduler}: preempting to accommodate a higher priority pod",
                exit_code=143,
            )
            self.pods[(namespace, name)].obj["metadata"]["deletionTimestamp"] = _now()

    def remove_pod(self, namespace: str, name: str) -> None:
        """The pod object is gone (its deletion finished)."""
        with self.lock:
            del self.pods[(namespace, name)]

    def log(self, namespace: str, name: str, *lines: str, container: str | None = None) -> None:
        """Append lines to the pod's current container log (or a sidecar's), stamped now."""
        with self.lock:
            pod = self.pods[(namespace, name)]
            log = pod.sidecars[container] if container in pod.sidecars else pod.log
            for line in lines:
                log.append((time.time_ns(), line))

    def install_crd(self, group: str, version: str, plural: str, kind: str, namespaced: bool = True) -> None:
        """Make ``plural`` discoverable under ``/apis/<group>/<version>``, as an installed CRD is."""
        with self.lock:
            self.crds.setdefault((group, version), []).append(
                {
                    "name": plural,
                    "singularName": kind.lower(),
                    "namespaced": namespaced,
                    "kind": kind,
                    "verbs": ["delete", "deletecollection", "get", "list", "patch", "create", "update", "watch"],
                }
            )

    def publish_schema(self, group: str, version: str, kind: str, schema: dict) -> None:
        """Publish ``schema`` (a CRD version's ``openAPIV3Schema``) at ``/openapi/v3/apis/<group>/<version>`` as the
        API server does for a CRD: under ``components.schemas`` as ``<reversed group>.<version>.<kind>``, tagged
        with ``x-kubernetes-group-version-kind``."""
        name = ".".join([*reversed(group.split(".")), version, kind])
        with self.lock:
            self.openapi.setdefault((group, version), {})[name] = {
                **copy.deepcopy(schema),
                "x-kubernetes-group-version-kind": [{"group": group, "version": version, "kind": kind}],
            }

    def add_namespace(self, name: str, labels: dict | None = None) -> None:
        """A Namespace with these labels (plus the ``kubernetes.io/metadata.name`` label every namespace has)."""
        self._put_core(
            "namespaces",
            "",
            name,
            {
                "apiVersion": "v1",
                "kind": "Namespace",
                "metadata": {"labels": {"kubernetes.io/metadata.name": name, **(labels or {})}},
                "status": {"phase": "Active"},
            },
        )

    def add_pvc(
        self, namespace: str, name: str, *, phase: str = "Bound", access_modes=("ReadWriteMany",), storage: str = "1Ti"
    ) -> None:
        """A PersistentVolumeClaim in ``phase`` with these access modes."""
        self._put_core(
            "persistentvolumeclaims",
            namespace,
            name,
            {
                "apiVersion": "v1",
                "kind": "PersistentVolumeClaim",
                "spec": {"accessModes": list(access_modes), "resources": {"requests": {"storage": storage}}},
                "status": {"phase": phase, **({"accessModes": list(access_modes)} if phase == "Bound" else {})},
            },
        )

    def add_secret(self, namespace: str, name: str, data: dict, type: str = "Opaque") -> None:
        """A Secret of ``type`` holding ``data`` (plain values; stored base64-encoded like the real API)."""
        import base64

        self._put_core(
            "secrets",
            namespace,
            name,
            {
                "apiVersion": "v1",
                "kind": "Secret",
                "type": type,
                "data": {k: base64.b64encode(v.encode()).decode() for k, v in data.items()},
            },
        )

    def add_node(
        self,
        name: str,
        labels: dict,
        *,
        gpus: int = 8,
        taints: list | None = None,
        unschedulable: bool = False,
        devices: dict | None = None,
    ) -> None:
        """A Node with ``gpus`` allocatable ``nvidia.com/gpu`` (and ``devices``: a device plugin's extended
        resources, name -> count), these labels and taints."""
        allocatable = {"cpu": "190", "memory": "2000Gi", "pods": "110"}
        if gpus:
            allocatable["nvidia.com/gpu"] = str(gpus)
        allocatable.update({k: str(v) for k, v in (devices or {}).items()})
        self._put_core(
            "nodes",
            "",
            name,
            {
                "apiVersion": "v1",
                "kind": "Node",
                "metadata": {"labels": dict(labels)},
                "spec": {"taints": list(taints or []), **({"unschedulable": True} if unschedulable else {})},
                "status": {"allocatable": allocatable, "capacity": dict(allocatable)},
            },
        )

    def deny(self, verb: str, resource: str, group: str = "", subresource: str = "") -> None:
        """SelfSubjectAccessReviews for this verb on this resource answer allowed: false."""
        self.denied.add((verb, group, resource, subresource))

    def forbid(self, path_contains: str) -> None:
        """Requests whose path contains ``path_contains`` answer 403 Forbidden."""
        self.forbidden.append(path_contains)

    def _put_core(self, plural: str, namespace: str, name: str, obj: dict) -> None:
        with self.lock:
            obj.setdefault("metadata", {}).update(name=name, **({"namespace": namespace} if namespace else {}))
            self.core[(plural, namespace, name)] = self._stamp(obj)

    def requests_for(self, method: str, path_contains: str = "") -> list[Request]:
        """Logged requests with this method whose path contains ``path_contains``."""
        with self.lock:
            return [r for r in self.requests if r.method == method and path_contains in r.path]

    # -- serving -------------------------------------------------------------------------------------
    def _stamp(self, obj: dict) -> dict:
        meta = obj.setdefault("metadata", {})
        meta.setdefault("uid", str(uuid.uuid4()))
        meta.setdefault("creationTimestamp", _now())
        meta.setdefault("generation", 1)
        meta["resourceVersion"] = str(time.time_ns())
        return obj

    def _fault_for(self, method: str, path: str) -> _Fault | None:
        for fault in self._faults:
            if fault.remaining > 0 and fault.method in (None, method) and (fault.path_contains or "") in path:
                fault.remaining -= 1
                return fault
        return None

    def handle(self, method: str, path: str, query: dict, body, content_type: str):
        """Route one request; returns (status, payload, content type) or None to drop the connection."""
        with self.lock:
            self.requests.append(Request(method, path, query, body, content_type))
            fault = self._fault_for(method, path)
            if fault is not None:
                if fault.kind == "drop":
                    return None
                return _status(fault.status, "InternalError", "injected failure")
            parts = path.strip("/").split("/")
            if any(fragment in path for fragment in self.forbidden):
                return _status(403, "Forbidden", f"{method} {path} is forbidden: the service account may not do this")
            if parts[:2] == ["api", "v1"] and len(parts) >= 5 and parts[2] == "namespaces" and parts[4] == "pods":
                return self._pods(method, parts[3], parts[5:], query)
            if parts[:3] == ["api", "v1", "namespaces"] and len(parts) in (5, 6) and parts[4] in CORE_OBJECTS:
                # Services and ConfigMaps (the TensorBoard's, the grpo vLLM server's) live with the custom objects.
                name = parts[5] if len(parts) == 6 else None
                return self._custom(method, ("", "v1", parts[4], parts[3]), name, body, content_type)
            if parts[:3] == ["api", "v1", "namespaces"] and parts[4:] == ["secrets"] and method == "POST":
                return self._create_secret(parts[3], body)
            if parts[:2] == ["api", "v1"] and len(parts) == 6 and parts[2] == "namespaces" and method == "GET":
                return self._core_get(parts[4], parts[3], parts[5])
            if parts[:3] == ["api", "v1", "namespaces"] and len(parts) == 4 and method == "GET":
                return self._core_get("namespaces", "", parts[3])
            if parts[:3] == ["openapi", "v3", "apis"] and len(parts) == 5 and method == "GET":
                return self._openapi(parts[3], parts[4])
            if parts == ["api", "v1", "nodes"] and method == "GET":
                return self._core_list("nodes", query)
            if parts == ["apis", "authorization.k8s.io", "v1", "selfsubjectaccessreviews"] and method == "POST":
                return self._access_review(body)
            if parts[0] == "apis" and len(parts) == 3 and method == "GET":
                return self._discovery(parts[1], parts[2])
            if parts[0] == "apis" and len(parts) == 6 and parts[3] == "namespaces" and method == "GET":
                _, group, version, _, namespace, plural = parts
                return self._custom_list((group, version, plural, namespace), query)
            if parts[0] == "apis" and len(parts) in (6, 7) and parts[3] == "namespaces":
                _, group, version, _, namespace, plural, *rest = parts
                return self._custom(
                    method, (group, version, plural, namespace), rest[0] if rest else None, body, content_type
                )
            return _status(404, "NotFound", f"the server could not find the requested resource ({path})")

    def _custom_list(self, coll, query):
        """A list of custom objects in one namespace, filtered by ``labelSelector`` (equality terms, as the real API
        server takes them)."""
        wanted = dict(kv.split("=", 1) for kv in query.get("labelSelector", [""])[0].split(",") if kv)
        items = []
        for key, obj in sorted(self.objects.items()):
            if key[:4] == coll and all(obj["metadata"].get("labels", {}).get(k) == v for k, v in wanted.items()):
                items.append(copy.deepcopy(obj))
        group, version, plural, _ = coll
        kind = (items[0]["kind"] if items else plural.capitalize().rstrip("s")) + "List"
        listed = {"apiVersion": f"{group}/{version}", "kind": kind, "metadata": {}, "items": items}
        return 200, listed, "application/json"

    def _custom(self, method, coll, name, body, content_type):
        group, version, plural, namespace = coll
        key = (*coll, name or (body or {}).get("metadata", {}).get("name"))
        obj = self.objects.get(key)
        kind_ref = f"{plural}.{group}"
        if method == "POST":
            if obj is not None:
                # The API server's wording when the name is held by an object still being deleted.
                deleting = "object is being deleted: " if obj["metadata"].get("deletionTimestamp") else ""
                return _status(
                    409, "AlreadyExists", f'{deleting}{kind_ref} "{key[-1]}" already exists', key[-1], group, plural
                )
            new = self._stamp(copy.deepcopy(body))
            new["metadata"]["namespace"] = namespace
            new.pop("status", None)
            self.objects[key] = new
            return 201, new, "application/json"
        if obj is None:
            return _status(404, "NotFound", f'{kind_ref} "{key[-1]}" not found', key[-1], group, plural)
        if method == "GET":
            if key in self._deleting:  # controllers leave a deleted object alone; the GC finishes it
                if self._deleting[key] == 0:
                    self._remove(key)
                    return _status(404, "NotFound", f'{kind_ref} "{key[-1]}" not found', key[-1], group, plural)
                self._deleting[key] -= 1
                return 200, obj, "application/json"
            try:
                for fn in self._controllers.get(plural, []):
                    fn(obj)
            except Exception as exc:  # a broken scenario must fail the test, not look like a flaky server
                return _status(400, "BadRequest", f"fake controller raised {exc!r}")
            return 200, obj, "application/json"
        if method == "DELETE":
            wanted_uid = ((body or {}).get("preconditions") or {}).get("uid")
            if wanted_uid and wanted_uid != obj["metadata"]["uid"]:
                # k8s.io/apiserver storage.Preconditions.Check: a conflict, the object left as it is.
                return _status(
                    409,
                    "Conflict",
                    f"Precondition failed: UID in precondition: {wanted_uid}, UID in object meta: "
                    f"{obj['metadata']['uid']}",
                    key[-1],
                    group,
                    plural,
                )
            if (body or {}).get("propagationPolicy") == "Foreground" and self.deletion_gets > 0:
                # The object stays, marked, until its dependents are gone; the API server answers with it.
                if key not in self._deleting:
                    obj["metadata"]["deletionTimestamp"] = _now()
                    obj["metadata"]["finalizers"] = [*obj["metadata"].get("finalizers", []), "foregroundDeletion"]
                    obj["metadata"]["resourceVersion"] = str(time.time_ns())
                    self._deleting[key] = self.deletion_gets
                return 200, obj, "application/json"
            self._remove(key)
            return _status(200, "", "", key[-1], group, plural, status="Success")
        if method in ("PATCH", "PUT"):
            if method == "PUT":
                sent_version = (body.get("metadata") or {}).get("resourceVersion")
                if sent_version and sent_version != obj["metadata"]["resourceVersion"]:
                    return _status(
                        409,
                        "Conflict",
                        f'Operation cannot be fulfilled on {kind_ref} "{key[-1]}": the object has been modified',
                        key[-1],
                        group,
                        plural,
                    )
                new = {**copy.deepcopy(body), "status": obj.get("status", {})}
                new["metadata"] = {**obj["metadata"], **body.get("metadata", {})}
            elif content_type == "application/json-patch+json":
                new = _json_patch(obj, body)
            elif content_type == "application/merge-patch+json":
                new = merge_patch(obj, body)
            else:
                return _status(
                    415,
                    "UnsupportedMediaType",
                    "the body of the request was in an unknown format - "
                    "accepted media types include: application/json-patch+json, "
                    "application/merge-patch+json",
                )
            if new.get("spec") != obj.get("spec"):
                new["metadata"]["generation"] = obj["metadata"].get("generation", 1) + 1
            new["metadata"]["resourceVersion"] = str(time.time_ns())
            self.objects[key] = new
            return 200, new, "application/json"
        return _status(405, "MethodNotAllowed", f"{method} is not supported")

    def _remove(self, key):
        """The object is gone, and (the garbage collector) the pods and core objects it owned with it."""
        uid = self.objects.pop(key)["metadata"]["uid"]
        self._deleting.pop(key, None)
        for pod_key in [
            k
            for k, p in self.pods.items()
            if any(ref.get("uid") == uid for ref in p.obj["metadata"].get("ownerReferences", []))
        ]:
            del self.pods[pod_key]
        for core_key in [
            k
            for k, o in self.core.items()
            if any(ref.get("uid") == uid for ref in o["metadata"].get("ownerReferences", []))
        ]:
            del self.core[core_key]

    def _create_secret(self, namespace: str, body: dict):
        """POST a Secret: ``stringData`` becomes base64 ``data``, as the API server stores it; 409 for a name held."""
        import base64

        name = body["metadata"]["name"]
        if ("secrets", namespace, name) in self.core:
            return _status(409, "AlreadyExists", f'secrets "{name}" already exists', name, "", "secrets")
        obj = copy.deepcopy(body)
        data = {
            **obj.get("data", {}),
            **{k: base64.b64encode(v.encode()).decode() for k, v in obj.pop("stringData", {}).items()},
        }
        obj["data"] = data
        self._put_core("secrets", namespace, name, obj)
        return 201, self.core[("secrets", namespace, name)], "application/json"

    def _core_get(self, plural, namespace, name):
        obj = self.core.get((plural, namespace, name))
        if obj is None:
            return _status(404, "NotFound", f'{plural} "{name}" not found', name, "", plural)
        return 200, obj, "application/json"

    def _core_list(self, plural, query):
        wanted = dict(kv.split("=", 1) for kv in query.get("labelSelector", [""])[0].split(",") if kv)
        items = [
            copy.deepcopy(o)
            for (p, _, _), o in sorted(self.core.items())
            if p == plural and all(o["metadata"].get("labels", {}).get(k) == v for k, v in wanted.items())
        ]
        kind = {"nodes": "NodeList"}[plural]
        return (
            200,
            {"apiVersion": "v1", "kind": kind, "metadata": {"resourceVersion": "1"}, "items": items},
            "application/json",
        )

    def _access_review(self, body):
        attrs = (body.get("spec") or {}).get("resourceAttributes") or {}
        key = (attrs.get("verb", ""), attrs.get("group", ""), attrs.get("resource", ""), attrs.get("subresource", ""))
        allowed = key not in self.denied
        review = {**body, "status": {"allowed": allowed, **({} if allowed else {"reason": "no RBAC rule allows it"})}}
        return 201, review, "application/json"

    def _discovery(self, group, version):
        resources = self.crds.get((group, version))
        if resources is None:
            return _status(404, "NotFound", "the server could not find the requested resource")
        return (
            200,
            {
                "kind": "APIResourceList",
                "apiVersion": "v1",
                "groupVersion": f"{group}/{version}",
                "resources": resources,
            },
            "application/json",
        )

    def _openapi(self, group, version):
        schemas = self.openapi.get((group, version))
        if schemas is None:
            return _status(404, "NotFound", "the server could not find the requested resource")
        return (
            200,
            {
                "openapi": "3.0.0",
                "info": {"title": "Kubernetes", "version": "v1.33.0"},
                "paths": {},
                "components": {"schemas": copy.deepcopy(schemas)},
            },
            "application/json",
        )

    def _pods(self, method, namespace, rest, query):
        if method != "GET":
            return _status(405, "MethodNotAllowed", f"{method} is not supported on pods here")
        if not rest:
            wanted = dict(kv.split("=", 1) for kv in query.get("labelSelector", [""])[0].split(",") if kv)
            items = [
                copy.deepcopy(p.obj)
                for (ns, _), p in sorted(self.pods.items())
                if ns == namespace and all(p.obj["metadata"]["labels"].get(k) == v for k, v in wanted.items())
            ]
            pod_list = {"apiVersion": "v1", "kind": "PodList", "metadata": {"resourceVersion": "1"}, "items": items}
            return 200, pod_list, "application/json"
        pod = self.pods.get((namespace, rest[0]))
        if pod is None:
            return _status(404, "NotFound", f'pods "{rest[0]}" not found', rest[0], "", "pods")
        if rest[1:] != ["log"]:
            return 200, pod.obj, "application/json"
        container = query.get("container", [pod.obj["spec"]["containers"][0]["name"]])[0]
        if _go_bool(query.get("previous", ["false"])[0]):
            if pod.previous is None:
                return _status(
                    400, "BadRequest", f'previous terminated container "{container}" in pod "{rest[0]}" not found'
                )
            lines = pod.previous
        elif container in pod.sidecars:
            lines = pod.sidecars[container]
        else:
            state = pod.obj["status"].get("containerStatuses", [{}])[0].get("state", {})
            if "waiting" in state or not state:
                reason = state.get("waiting", {}).get("reason", "ContainerCreating")
                return _status(
                    400, "BadRequest", f'container "{container}" in pod "{rest[0]}" is waiting to start: {reason}'
                )
            lines = pod.log
        if "sinceSeconds" in query:
            cutoff = time.time_ns() - int(query["sinceSeconds"][0]) * 1_000_000_000
            lines = [(t, s) for t, s in lines if t >= cutoff]
        if "tailLines" in query:
            lines = lines[-int(query["tailLines"][0]) :]
        stamped = _go_bool(query.get("timestamps", ["false"])[0])
        text = "".join(f"{rfc3339_nano(t)} {s}\n" if stamped else f"{s}\n" for t, s in lines)
        return 200, text, "text/plain"


def _go_bool(text: str) -> bool:
    """Query booleans as the API server parses them (Go's strconv.ParseBool): the Python client sends "True"."""
    if text in ("1", "t", "T", "true", "TRUE", "True"):
        return True
    if text in ("0", "f", "F", "false", "FALSE", "False"):
        return False
    raise ValueError(f"invalid boolean {text!r}")


def _status(code, reason, message, name=None, group=None, kind=None, status="Failure"):
    payload = {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": status,
        "message": message,
        "reason": reason,
        "code": code,
    }
    if name is not None:
        payload["details"] = {"name": name, "group": group, "kind": kind}
    return code, payload, "application/json"


def _handler_for(api: FakeKubeAPI):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive, like the real server: the client pools connections
        disable_nagle_algorithm = True  # headers and body go out as two writes: no 40 ms delayed-ACK stall

        def _serve(self):
            url = urlsplit(self.path)
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length) if length else b""
            body = json.loads(raw) if raw else None
            content_type = (self.headers.get("Content-Type") or "").split(";")[0]
            answer = api.handle(self.command, url.path, parse_qs(url.query), body, content_type)
            if answer is None:
                self.close_connection = True
                return
            status, payload, ctype = answer
            data = payload.encode() if isinstance(payload, str) else json.dumps(payload).encode()
            self.send_response(status)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        do_GET = do_POST = do_PATCH = do_PUT = do_DELETE = _serve

        def log_message(self, *args):  # keep test output to what the code under test prints
            pass

    return Handler
