"""A one-node cluster behind ``FakeKubeAPI``: the Training Operator, the Trainer v2 controller and a kubelet.

The launcher talks to the fake API server through the real kubernetes client; this module is everything
on the other side of it, reconciling every ``RECONCILE_SECONDS``:

**Training Operator (PyTorchJob kubeflow.org/v1, release-1.9).** For each new job (by uid) it sets the
``Created`` condition and creates one pod per replica, named ``<job>-master-0`` / ``<job>-worker-<i>``,
labelled as the operator labels them, each with a Service of the same name (an entry in the hosts file
bind-mounted over /etc/hosts, pointing at 127.0.0.1). Into every container it appends, after the manifest's
own env and in the operator's order (pkg/controller.v1/pytorch/envvar.go and master.go):
``PYTHONUNBUFFERED=1``, ``MASTER_PORT``, ``PET_MASTER_PORT``, ``MASTER_ADDR`` and ``PET_MASTER_ADDR``
(``<job>-master-0`` on every pod, the Master included), ``WORLD_SIZE`` (replicas x nprocPerNode), ``RANK``
and ``PET_NODE_RANK`` (Master 0, Worker i is i + 1), ``PET_NPROC_PER_NODE`` (spec.nprocPerNode) and
``PET_NNODES`` (replicas). Status follows ``UpdateJobStatus``: ``Running`` once the Master runs, ``Succeeded``
when the Master succeeds, ``Failed`` ("PyTorchJob <job> is failed because 1 Worker replica(s) failed.") as
soon as any replica with restartPolicy Never fails. ``cleanPodPolicy: None`` leaves the other pods running
after a failure, as the operator does. Elastic jobs are not modelled (the job fails, saying so).

**Trainer v2 (TrainJob trainer.kubeflow.org/v1alpha1, runtime ``torch-distributed``).** The runtime's pod
template (replicated job and container ``node``, tests/reference/runtimes/runtime_torch_distributed.yaml)
gets the TrainJob's image, command, args, env and resources and its ``runtimePatches``; the torch plugin
(pkg/runtime/framework/plugins/torch/torch.go) upserts ``PET_NNODES``, ``PET_NPROC_PER_NODE``,
``PET_NODE_RANK`` (from the pod's ``batch.kubernetes.io/job-completion-index`` annotation),
``PET_MASTER_ADDR=<job>-node-0-0.<job>`` and ``PET_MASTER_PORT``. Pods are named as JobSet names them
(``<job>-node-0-<index>-<5 random>``, hostname ``<job>-node-0-<index>``, subdomain ``<job>``) and carry the
JobSet and Job labels. ``Complete`` (reason AllJobsCompleted) when every pod succeeded, ``Failed`` (reason
FailedJobs) when one fails: the Job's in-place retries (backoffLimit) are not modelled.

**Kubelet.** Runs each pod's container as one local process tree (tests/rehearsal/container.py) in its own
PID, mount and UTS namespace: the container's ``command`` + ``args`` exactly (``$(VAR)`` expanded as the
kubelet does, no shell), an environment built from scratch (the image's env, then ``HOSTNAME``, then the
container's env in order: ``value``, ``fieldRef``, ``secretKeyRef`` from a Secret on the fake API server or,
``optional: true``, left unset), the volumes at their mount paths, ``/mnt`` otherwise empty, the repository
(the launcher's install) and the claims' host folders hidden. Output (stdout and stderr) goes line by line,
time-stamped, into the pod's log on the fake API server and into ``<pod dir>/log``. Container state moves
waiting (ContainerCreating) -> running -> terminated (exit code; reason Completed or Error; a process killed
by signal N exits 128 + N) and the pod phase with it. Deleting a job deletes its pods: SIGTERM to the
container's PID 1, ``GRACE_SECONDS``, then SIGKILL, and the pod object goes once the process is gone. New
pods under a name still held by a terminating one wait for it, as the API server makes them.

``evict_when`` evicts a pod as the kubelet does under memory pressure: ``DisruptionTarget``
(TerminationByKubelet), SIGKILL to every process of the pod, then phase Failed, reason Evicted, the
kubelet's message, container terminated with exit code 137.

Deviations from a cluster, all deliberate: one machine, every name resolves to 127.0.0.1; the rendezvous
port is a free port picked per job instead of 23456 (PyTorchJob) or 29500 (TrainJob), so concurrent runs on
one machine cannot collide; ``HOME`` is an empty per-pod folder; ``HF_HUB_OFFLINE=1`` is added to every pod
(no network: the Hub cache on the data claim is pre-populated); no Service environment variables; the
working directory is a per-pod folder (the image's /workspace cannot be created on the host).
"""

from __future__ import annotations

import base64
import copy
import glob
import json
import os
import random
import re
import shutil
import signal
import socket
import string
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from tests.fakes.k8s_api import FakeKubeAPI
from tests.helpers.cluster import TRAINJOB_SCHEMA
from tests.rehearsal.image import TrainerImage

RECONCILE_SECONDS = 0.2
GRACE_SECONDS = 5.0  # deleting a pod: SIGTERM, then SIGKILL after this (shorter than a real grace period)
# A soft eviction honours the pod's terminationGracePeriodSeconds (600 for the trainer) up to this cap: the tiny
# model saves in seconds, and a broken SIGTERM save must not stall the scenario for ten minutes.
SOFT_EVICTION_GRACE_CAP = 60.0
CONTAINER = Path(__file__).with_name("container.py")
PYTORCHJOB = ("kubeflow.org", "v1", "pytorchjobs")
TRAINJOB = ("trainer.kubeflow.org", "v1alpha1", "trainjobs")
# The kubelet's eviction message (pkg/kubelet/eviction/helpers.go).
EVICTION_MESSAGE = (
    "The node was low on resource: memory. Threshold quantity: 100Mi, available: 51200Ki. "
    "Container {container} was using 1890Gi, request is 128Gi, has larger consumption of memory. "
)
# ClusterTrainingRuntime torch-distributed, as the Trainer chart installs it (reference/runtimes).
TORCH_DISTRIBUTED = {
    "metadata": {"labels": {"trainer.kubeflow.org/trainjob-ancestor-step": "trainer"}},
    "spec": {"containers": [{"name": "node", "image": "pytorch/pytorch:2.13.0-cuda13.0-cudnn9-runtime"}]},
}
_VAR_REF = re.compile(r"\$\$|\$\(([-._a-zA-Z][-._a-zA-Z0-9]*)\)")


def orphan_guard() -> list:
    """A command prefix that kills the command when the thread that started it dies (``setpriv --pdeathsig``):
    a killed test or scenario leaves no pods running."""
    return ["setpriv", "--pdeathsig", "KILL"] if shutil.which("setpriv") else []


def free_port() -> int:
    """A TCP port nothing listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def expand(text: str, env: dict) -> str:
    """The kubelet's ``$(VAR)`` expansion of command, args and env values: unknown references stay, ``$$`` is ``$``."""
    return _VAR_REF.sub(lambda m: "$" if m.group(0) == "$$" else env.get(m.group(1), m.group(0)), text)


def quantity_bytes(quantity: str) -> int:
    """A Kubernetes quantity (``64Gi``, ``500M``, ``1024``) in bytes, for tmpfs ``size=``."""
    units = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12}
    for suffix, factor in units.items():
        if quantity.endswith(suffix):
            return int(float(quantity[: -len(suffix)]) * factor)
    return int(float(quantity))


def pod_mounts(claims: dict, pod_spec: dict, container: dict, folder: Path) -> list:
    """The kubelet's part of mounting ``container``'s volumes, for tests/rehearsal/container.py: a claim (``claims``:
    claim name -> host folder) as a bind mount of its folder or of its ``subPath`` in it, read-only where the mount
    says so; an ``emptyDir`` as tmpfs (``medium: Memory``) or a folder under ``folder``. In the container's order."""
    volumes = {v["name"]: v for v in pod_spec.get("volumes", [])}
    mounts = []
    for m in container.get("volumeMounts", []):
        volume = volumes[m["name"]]
        entry = {"target": m["mountPath"], "read_only": bool(m.get("readOnly"))}
        if "persistentVolumeClaim" in volume:
            claim = volume["persistentVolumeClaim"]["claimName"]
            source = Path(claims[claim]) / m.get("subPath", "")
            mounts.append({**entry, "kind": "bind", "source": str(source)})
        elif "emptyDir" in volume and volume["emptyDir"].get("medium") == "Memory":
            size = volume["emptyDir"].get("sizeLimit")
            options = "mode=1777" + (f",size={quantity_bytes(size)}" if size else "")
            mounts.append({**entry, "kind": "tmpfs", "options": options})
        elif "emptyDir" in volume:
            source = folder / "volumes" / m["name"]
            source.mkdir(parents=True, exist_ok=True)
            mounts.append({**entry, "kind": "bind", "source": str(source)})
        else:
            raise ValueError(f"volume {m['name']}: the rehearsal's kubelet mounts claims and emptyDirs only")
    return mounts


def _by_name(items: list, name: str) -> dict | None:
    return next((i for i in items if i.get("name") == name), None)


def _upsert(items: list, new: list, key: str = "name") -> list:
    """Add ``new`` items to ``items``, replacing those with the same ``key`` in place (apply.UpsertEnvVars)."""
    out = [copy.deepcopy(i) for i in items]
    for item in new:
        at = next((n for n, i in enumerate(out) if i.get(key) == item.get(key)), None)
        if at is None:
            out.append(copy.deepcopy(item))
        else:
            out[at] = copy.deepcopy(item)
    return out


def _merge_pod_template(base: dict, patch: dict) -> dict:
    """A pod template patch as the Trainer applies runtimePatches: maps merged, named lists merged by name."""
    out = copy.deepcopy(base)
    meta = out.setdefault("metadata", {})
    for k in ("labels", "annotations"):
        if patch.get("metadata", {}).get(k):
            meta[k] = {**meta.get(k, {}), **patch["metadata"][k]}
    spec = out.setdefault("spec", {})
    for k, v in (patch.get("spec") or {}).items():
        if k == "containers":
            for c in v:
                mine = _by_name(spec.setdefault("containers", []), c["name"])
                if mine is None:
                    spec["containers"].append(copy.deepcopy(c))
                    continue
                for ck, cv in c.items():
                    if ck == "volumeMounts":
                        mine[ck] = _upsert(mine.get(ck, []), cv, key="mountPath")
                    elif ck == "env":
                        mine[ck] = _upsert(mine.get(ck, []), cv)
                    else:
                        mine[ck] = copy.deepcopy(cv)
        elif k == "volumes":
            spec[k] = _upsert(spec.get(k, []), v)
        else:
            spec[k] = copy.deepcopy(v)
    return out


@dataclass
class PodPlan:
    """A pod the operator creates: its identity and the container as the operator mutated it."""

    name: str
    hostname: str
    subdomain: str | None
    labels: dict
    annotations: dict
    container: dict
    pod_spec: dict  # volumes, restartPolicy, placement: the template's spec without containers
    role: str  # master / worker / node
    index: int


@dataclass
class JobRecord:
    """What the operator remembers of a job it admitted (one per uid: a re-created job is a new one)."""

    ref: tuple  # (group, version, plural)
    namespace: str
    name: str
    uid: str
    kind: str
    port: int
    plans: list
    created: set = field(default_factory=set)
    finished: bool = False


@dataclass
class PodRecord:
    """One pod the kubelet runs."""

    namespace: str
    name: str
    uid: str
    owner_uid: str
    role: str
    folder: Path
    proc: subprocess.Popen | None = None
    evicted: str | None = None  # the eviction message, once evicted
    grace_seconds: float = 30.0  # the pod's terminationGracePeriodSeconds (Kubernetes' default: 30)
    deleting: bool = False
    exit_code: int | None = None
    started: float = 0.0
    done: threading.Event = field(default_factory=threading.Event)

    @property
    def log_path(self) -> Path:
        return self.folder / "log"


class HostsFile:
    """The file bind-mounted over /etc/hosts: Services and pod hostnames, all at 127.0.0.1."""

    def __init__(self, path: Path):
        self.path = path
        path.write_text("127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n")

    def add(self, *names: str) -> None:
        with open(self.path, "a") as f:  # appended in place: the bind mount keeps pointing at this file
            f.write("127.0.0.1\t" + " ".join(names) + "\n")


class FakeCluster:
    """The operators and the kubelet over ``api``; ``start()`` runs them in a thread, ``stop()`` kills every pod.

    Args:
        api: the fake API server (started).
        workdir: where pod folders go (spec, log, home, working directory).
        claims: PersistentVolumeClaim name -> host folder holding its data.
        image: the trainer image every pod runs (whatever ``image:`` the manifest names).
        hosts: the hosts file the pods resolve names with.
        hide: host paths the pods must not see (the launcher's install; the claims' host folders).
        node_env: variables the node adds to every container, before the container's own env.
    """

    def __init__(
        self,
        api: FakeKubeAPI,
        *,
        workdir: Path,
        claims: dict,
        image: TrainerImage,
        hosts: HostsFile,
        hide: list,
        node_env: dict,
    ):
        self.api, self.workdir, self.claims, self.image = api, workdir, claims, image
        self.hosts, self.hide, self.node_env = hosts, [str(p) for p in hide], dict(node_env)
        # This Trainer takes runtimePatches (v2.2 and later): its API server publishes that TrainJob schema, which
        # the train step reads to render the TrainJob for it (components/train/launcher/trainjob.py).
        api.publish_schema("trainer.kubeflow.org", "v1alpha1", "TrainJob", TRAINJOB_SCHEMA)
        self.jobs: dict[str, JobRecord] = {}
        self.pods: dict[str, PodRecord] = {}  # pod uid -> record
        self.events: list[str] = []  # what the cluster did, time-stamped, for the scenario's report
        self.evictions: list[dict] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="fake-cluster", daemon=True)
        self._watchers: list[threading.Thread] = []
        self.error: str | None = None

    # -- lifecycle -----------------------------------------------------------------------------------------
    def start(self) -> FakeCluster:
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop reconciling and kill every pod still running (SIGKILL), waiting for their logs to close."""
        self._stop.set()
        self._thread.join(timeout=10)
        for pod in list(self.pods.values()):
            if pod.proc is not None and pod.proc.poll() is None:
                self._kill(pod, signal.SIGKILL)
        for pod in list(self.pods.values()):
            pod.done.wait(timeout=15)

    def note(self, text: str) -> None:
        self.events.append(f"{time.strftime('%H:%M:%S')} {text}")

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                self._reconcile()
            except Exception as exc:  # a harness bug must surface in the report, not hang the scenario
                import traceback

                self.error = traceback.format_exc()
                self.note(f"cluster error: {exc!r}")
                return
            self._stop.wait(RECONCILE_SECONDS)

    # -- operators -----------------------------------------------------------------------------------------
    def _reconcile(self) -> None:
        with self.api.lock:
            stored = {
                obj["metadata"]["uid"]: ((g, v, p), ns, name, copy.deepcopy(obj))
                for (g, v, p, ns, name), obj in self.api.objects.items()
                if (g, v, p) in (PYTORCHJOB, TRAINJOB)
            }
        live = {uid for uid, (*_, obj) in stored.items() if not obj["metadata"].get("deletionTimestamp")}
        # The garbage collector: pods whose job is gone or being deleted are deleted.
        for pod in list(self.pods.values()):
            if pod.owner_uid not in live and not pod.deleting:
                self.note(f"deleting pod {pod.name} (its job is gone or being deleted)")
                self._delete(pod)
        for uid in live:
            ref, namespace, name, obj = stored[uid]
            job = self.jobs.get(uid) or self._admit(ref, namespace, name, obj)
            if job.finished:
                continue
            for plan in job.plans:
                if plan.name in job.created:
                    continue
                if any(
                    p.name == plan.name and p.namespace == namespace and not p.done.is_set() for p in self.pods.values()
                ):
                    continue  # the old pod of that name is still terminating
                job.created.add(plan.name)
                self._create_pod(job, plan)
            self._update_status(job)

    def _set_conditions(self, job: JobRecord, *conditions: tuple) -> None:
        with self.api.lock:
            obj = self.api.objects.get((*job.ref, job.namespace, job.name))
            if obj is None or obj["metadata"]["uid"] != job.uid:
                return
            for type_, reason, message in conditions:
                current = next(
                    (c for c in (obj.get("status") or {}).get("conditions") or [] if c["type"] == type_), None
                )
                if current is None or current["status"] != "True":
                    FakeKubeAPI.set_condition(obj, type_, "True", reason=reason, message=message)
                    self.note(f"{job.kind} {job.name}: {type_} ({message})")

    def _set_status(self, job: JobRecord, **fields) -> None:
        with self.api.lock:
            obj = self.api.objects.get((*job.ref, job.namespace, job.name))
            if obj is not None and obj["metadata"]["uid"] == job.uid:
                obj.setdefault("status", {}).update(copy.deepcopy(fields))

    def _admit(self, ref: tuple, namespace: str, name: str, obj: dict) -> JobRecord:
        uid, port = obj["metadata"]["uid"], free_port()
        if ref == PYTORCHJOB:
            job = JobRecord(ref, namespace, name, uid, "PyTorchJob", port, [])
            self.jobs[uid] = job
            self._set_conditions(job, ("Created", "PyTorchJobCreated", f"PyTorchJob {name} is created."))
            if obj["spec"].get("elasticPolicy"):
                job.finished = True
                self._set_conditions(
                    job, ("Failed", "RehearsalUnsupported", "the rehearsal does not model elastic PyTorchJobs")
                )
                return job
            job.plans = self._pytorchjob_pods(name, obj, port)
        else:
            job = JobRecord(ref, namespace, name, uid, "TrainJob", port, [])
            self.jobs[uid] = job
            runtime = obj["spec"].get("runtimeRef", {}).get("name")
            if runtime != "torch-distributed":
                job.finished = True
                self._set_conditions(
                    job,
                    (
                        "Failed",
                        "TrainingRuntimeNotSupported",
                        f"the rehearsal models only the torch-distributed runtime, not {runtime!r}",
                    ),
                )
                return job
            job.plans = self._trainjob_pods(name, obj, port)
        self.note(f"{job.kind} {name} (uid {uid[:8]}) admitted: pods {[p.name for p in job.plans]}, port {port}")
        return job

    def _pytorchjob_pods(self, name: str, obj: dict, port: int) -> list:
        specs = obj["spec"]["pytorchReplicaSpecs"]
        total = sum(int(s.get("replicas", 1)) for s in specs.values())
        nproc = obj["spec"].get("nprocPerNode")
        world = total * (int(nproc) if str(nproc).isdigit() else 1)
        master = f"{name}-master-0"
        plans = []
        for rtype in ("Master", "Worker"):
            spec = specs.get(rtype)
            for index in range(int(spec.get("replicas", 1)) if spec else 0):
                rank = index + (1 if rtype == "Worker" else 0)
                template = copy.deepcopy(spec["template"])
                container = _by_name(template["spec"]["containers"], "pytorch")
                injected = [
                    ("PYTHONUNBUFFERED", "1"),
                    ("MASTER_PORT", str(port)),
                    ("PET_MASTER_PORT", str(port)),
                    ("MASTER_ADDR", master),
                    ("PET_MASTER_ADDR", master),
                    ("WORLD_SIZE", str(world)),
                    ("RANK", str(rank)),
                    ("PET_NODE_RANK", str(rank)),
                ]
                if nproc is not None:
                    injected.append(("PET_NPROC_PER_NODE", str(nproc)))
                injected.append(("PET_NNODES", str(total)))
                for c in template["spec"]["containers"]:  # setPodEnv: every container of the template
                    c["env"] = c.get("env", []) + [{"name": k, "value": v} for k, v in injected]
                container.setdefault("ports", []).append(
                    {"name": "pytorchjob-port", "containerPort": port, "protocol": "TCP"}
                )
                pod_name = f"{name}-{rtype.lower()}-{index}"
                labels = {
                    **template.get("metadata", {}).get("labels", {}),
                    "training.kubeflow.org/job-name": name,
                    "training.kubeflow.org/operator-name": "pytorchjob-controller",
                    "training.kubeflow.org/replica-type": rtype.lower(),
                    "training.kubeflow.org/replica-index": str(index),
                }
                if rtype == "Master":
                    labels["training.kubeflow.org/job-role"] = "master"
                pod_spec = {k: v for k, v in template["spec"].items() if k != "containers"}
                pod_spec["restartPolicy"] = spec.get("restartPolicy", "Never")
                plans.append(
                    PodPlan(
                        pod_name,
                        pod_name,
                        None,
                        labels,
                        template.get("metadata", {}).get("annotations", {}),
                        container,
                        pod_spec,
                        rtype.lower(),
                        index,
                    )
                )
                self.hosts.add(pod_name, f"{pod_name}.{obj['metadata']['namespace']}.svc.cluster.local")
        return plans

    def _trainjob_pods(self, name: str, obj: dict, port: int) -> list:
        trainer = obj["spec"].get("trainer") or {}
        template = copy.deepcopy(TORCH_DISTRIBUTED)
        container = template["spec"]["containers"][0]
        for k in ("image", "command", "args"):
            if k in trainer:
                container[k] = trainer[k]
        if "resourcesPerNode" in trainer:
            container["resources"] = trainer["resourcesPerNode"]
        container["env"] = _upsert(container.get("env", []), trainer.get("env", []))
        for patch in obj["spec"].get("runtimePatches") or []:
            runtime_spec = patch.get("trainingRuntimeSpec", {}).get("template", {}).get("spec", {})
            for rjob in runtime_spec.get("replicatedJobs", []):
                if rjob.get("name") == "node":
                    pod_patch = rjob.get("template", {}).get("spec", {}).get("template", {})
                    template = _merge_pod_template(template, pod_patch)
        container = _by_name(template["spec"]["containers"], "node")
        num_nodes = int(trainer.get("numNodes", 1))
        master = f"{name}-node-0-0.{name}"
        container["env"] = _upsert(
            container.get("env", []),
            [
                {"name": "PET_NNODES", "value": str(num_nodes)},
                {"name": "PET_NPROC_PER_NODE", "value": str(trainer.get("numProcPerNode", "auto"))},
                {
                    "name": "PET_NODE_RANK",
                    "valueFrom": {
                        "fieldRef": {"fieldPath": "metadata.annotations['batch.kubernetes.io/job-completion-index']"}
                    },
                },
                {"name": "PET_MASTER_ADDR", "value": master},
                {"name": "PET_MASTER_PORT", "value": str(port)},
            ],
        )
        container["ports"] = _upsert(container.get("ports", []), [{"containerPort": port}], key="containerPort")
        plans = []
        for index in range(num_nodes):
            hostname = f"{name}-node-0-{index}"
            suffix = "".join(random.choices(string.ascii_lowercase + string.digits, k=5))
            labels = {
                **template.get("metadata", {}).get("labels", {}),
                "jobset.sigs.k8s.io/jobset-name": name,
                "jobset.sigs.k8s.io/replicatedjob-name": "node",
                "jobset.sigs.k8s.io/job-index": "0",
                "batch.kubernetes.io/job-name": f"{name}-node-0",
                "job-name": f"{name}-node-0",
                "batch.kubernetes.io/job-completion-index": str(index),
            }
            annotations = {
                **template.get("metadata", {}).get("annotations", {}),
                "batch.kubernetes.io/job-completion-index": str(index),
            }
            pod_spec = {k: v for k, v in template["spec"].items() if k != "containers"}
            pod_spec["restartPolicy"] = "Never"  # the Job's in-place retries are not modelled
            plans.append(
                PodPlan(
                    f"{hostname}-{suffix}",
                    hostname,
                    name,
                    labels,
                    annotations,
                    copy.deepcopy(container),
                    pod_spec,
                    "node",
                    index,
                )
            )
            self.hosts.add(
                hostname, f"{hostname}.{name}", f"{hostname}.{name}.{obj['metadata']['namespace']}.svc.cluster.local"
            )
        return plans

    def _pod_phases(self, job: JobRecord) -> dict:
        """role -> {active, succeeded, failed} from the pod objects, as the operators count them."""
        counts = {p.role: {"active": 0, "succeeded": 0, "failed": 0} for p in job.plans}
        with self.api.lock:
            for pod in self.pods.values():
                if pod.owner_uid != job.uid:
                    continue
                stored = self.api.pods.get((pod.namespace, pod.name))
                if stored is None or stored.obj["metadata"]["uid"] != pod.uid:
                    continue
                phase = stored.obj["status"].get("phase")
                key = {"Running": "active", "Succeeded": "succeeded", "Failed": "failed"}.get(phase)
                if key:
                    counts[pod.role][key] += 1
        return counts

    def _update_status(self, job: JobRecord) -> None:
        counts = self._pod_phases(job)
        if job.kind == "PyTorchJob":
            self._set_status(job, replicaStatuses={r.capitalize(): c for r, c in counts.items()})
            replicas = {r: sum(1 for p in job.plans if p.role == r) for r in counts}
            if counts["master"]["active"] > 0:
                self._set_conditions(job, ("Running", "PyTorchJobRunning", f"PyTorchJob {job.name} is running."))
            if counts["master"]["succeeded"] == replicas["master"]:
                job.finished = True
                self._set_conditions(
                    job, ("Succeeded", "PyTorchJobSucceeded", f"PyTorchJob {job.name} is successfully completed.")
                )
                return
            for role, c in counts.items():
                if c["failed"] > 0 and replicas[role] > c["succeeded"] + c["active"]:
                    job.finished = True
                    self._set_conditions(
                        job,
                        (
                            "Failed",
                            "PyTorchJobFailed",
                            f"PyTorchJob {job.name} is failed because {c['failed']} "
                            f"{role.capitalize()} replica(s) failed.",
                        ),
                    )
                    self._clean_pods(job)
                    return
        else:
            c = counts["node"]
            self._set_status(
                job,
                jobsStatus=[
                    {
                        "name": "node",
                        "active": c["active"],
                        "ready": c["active"],
                        "succeeded": c["succeeded"],
                        "failed": c["failed"],
                        "suspended": 0,
                    }
                ],
            )
            if c["succeeded"] == len(job.plans):
                job.finished = True
                self._set_conditions(job, ("Complete", "AllJobsCompleted", "jobset completed successfully"))
            elif c["failed"] > 0:
                job.finished = True
                self._set_conditions(job, ("Failed", "FailedJobs", "jobset failed due to one or more job failures"))

    def _clean_pods(self, job: JobRecord) -> None:
        """runPolicy.cleanPodPolicy once the job ended: None keeps every pod (our manifests' choice)."""
        with self.api.lock:
            obj = self.api.objects.get((*job.ref, job.namespace, job.name)) or {}
        policy = obj.get("spec", {}).get("runPolicy", {}).get("cleanPodPolicy", "None")
        for pod in list(self.pods.values()):
            if pod.owner_uid == job.uid and policy in ("All", "Running") and not pod.done.is_set():
                self._delete(pod)

    # -- kubelet -------------------------------------------------------------------------------------------
    def _resolve_env(self, namespace: str, pod: dict, container: dict) -> tuple[dict | None, str]:
        """The container's environment as the kubelet builds it, or (None, why) when it cannot start."""
        env = {**self.image.env(), **self.node_env, "HOSTNAME": pod["spec"].get("hostname", pod["metadata"]["name"])}
        for var in container.get("env", []):
            if "value" in var or "valueFrom" not in var:
                env[var["name"]] = expand(var.get("value", ""), env)
                continue
            source = var["valueFrom"]
            if "secretKeyRef" in source:
                ref = source["secretKeyRef"]
                with self.api.lock:
                    secret = self.api.core.get(("secrets", namespace, ref["name"]))
                value = (secret or {}).get("data", {}).get(ref["key"])
                if value is None:
                    if ref.get("optional"):
                        continue
                    missing = (
                        f'secret "{ref["name"]}" not found'
                        if secret is None
                        else f"couldn't find key {ref['key']} in Secret {namespace}/{ref['name']}"
                    )
                    return None, missing
                env[var["name"]] = base64.b64decode(value).decode()
            elif "fieldRef" in source:
                env[var["name"]] = self._field(pod, source["fieldRef"]["fieldPath"])
            else:
                return None, f"env {var['name']}: the rehearsal's kubelet does not resolve {sorted(source)}"
        return env, ""

    @staticmethod
    def _field(pod: dict, path: str) -> str:
        meta = pod["metadata"]
        if m := re.fullmatch(r"metadata\.(labels|annotations)\['(.+)'\]", path):
            return meta.get(m.group(1), {}).get(m.group(2), "")
        simple = {
            "metadata.name": meta["name"],
            "metadata.namespace": meta["namespace"],
            "metadata.uid": meta["uid"],
            "spec.nodeName": pod["spec"].get("nodeName", ""),
            "status.podIP": "127.0.0.1",
            "status.hostIP": "127.0.0.1",
        }
        return simple[path]

    def _mounts(self, pod_spec: dict, container: dict, folder: Path) -> list:
        return pod_mounts(self.claims, pod_spec, container, folder)

    def _create_pod(self, job: JobRecord, plan: PodPlan) -> None:
        api, ns = self.api, job.namespace
        container = copy.deepcopy(plan.container)
        api.add_pod(
            ns, plan.name, plan.labels, container=container["name"], state="waiting", reason="ContainerCreating"
        )
        with api.lock:
            obj = api.pods[(ns, plan.name)].obj
            obj["metadata"]["annotations"] = dict(plan.annotations)
            obj["metadata"]["ownerReferences"] = [
                {
                    "apiVersion": "/".join(job.ref[:2]),
                    "kind": job.kind,
                    "name": job.name,
                    "uid": job.uid,
                    "controller": True,
                    "blockOwnerDeletion": True,
                }
            ]
            obj["spec"] = {
                **copy.deepcopy(plan.pod_spec),
                "containers": [container],
                "nodeName": "rehearsal-node",
                "hostname": plan.hostname,
                **({"subdomain": plan.subdomain} if plan.subdomain else {}),
            }
            obj["status"].update(hostIP="127.0.0.1", podIP="127.0.0.1")
            pod_obj = copy.deepcopy(obj)
        uid = pod_obj["metadata"]["uid"]
        folder = self.workdir / "pods" / f"{plan.name}-{uid[:8]}"
        for sub in ("home", "workspace", "staging"):
            (folder / sub).mkdir(parents=True, exist_ok=True)
        pod = PodRecord(
            ns,
            plan.name,
            uid,
            job.uid,
            plan.role,
            folder,
            grace_seconds=pod_obj["spec"].get("terminationGracePeriodSeconds", 30),
        )
        self.pods[uid] = pod
        env, why = self._resolve_env(ns, pod_obj, container)
        if env is None:
            api.set_container_state(ns, plan.name, "waiting", reason="CreateContainerConfigError", message=why)
            self.note(f"pod {plan.name}: CreateContainerConfigError: {why}")
            pod.done.set()
            return
        env["HOME"] = str(folder / "home")
        spec = {
            "hostname": plan.hostname,
            "command": [expand(a, env) for a in container.get("command", [])],
            "args": [expand(a, env) for a in container.get("args", [])],
            "env": list(env.items()),
            "working_dir": container.get("workingDir") or str(folder / "workspace"),
            "rootfs_dirs": ["/mnt"],
            "mounts": self._mounts(pod_obj["spec"], container, folder),
            # The dependency folders the image borrows stay visible where they are (image.py).
            "keep": [d for d in self.image.deps if any(Path(d).is_relative_to(h) for h in self.hide)],
            "hide": self.hide,
            "staging": str(folder / "staging"),
        }
        (folder / "spec.json").write_text(json.dumps(spec, indent=2))
        (folder / "pod.json").write_text(json.dumps(pod_obj, indent=2))
        cmd = [
            *orphan_guard(),
            "unshare",
            "--pid",
            "--fork",
            "--kill-child=SIGKILL",
            "--mount-proc",
            "--uts",
            "--propagation",
            "private",
            sys.executable,
            "-I",
            "-S",
            str(CONTAINER),
            str(folder / "spec.json"),
        ]
        pod.proc = subprocess.Popen(
            cmd,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin"},
            start_new_session=True,
        )
        pod.started = time.monotonic()
        api.set_container_state(ns, plan.name, "running")
        self.note(f"pod {plan.name} (uid {uid[:8]}) running: {' '.join(spec['command'] + spec['args'])}")
        reader = threading.Thread(target=self._read_log, args=(pod,), daemon=True)
        reader.start()
        threading.Thread(target=self._wait, args=(pod, reader), daemon=True).start()

    def _read_log(self, pod: PodRecord) -> None:
        with open(pod.log_path, "w", encoding="utf-8") as out:
            for raw in pod.proc.stdout:
                line = raw.decode("utf-8", errors="replace").rstrip("\n")
                out.write(line + "\n")
                out.flush()
                with self.api.lock:
                    stored = self.api.pods.get((pod.namespace, pod.name))
                    if stored is not None and stored.obj["metadata"]["uid"] == pod.uid:
                        self.api.log(pod.namespace, pod.name, line)

    def _wait(self, pod: PodRecord, reader: threading.Thread) -> None:
        code = pod.proc.wait()
        reader.join()  # every process of the pod is gone once its output pipe is closed
        pod.exit_code = code if code >= 0 else 128 - code
        with self.api.lock:
            stored = self.api.pods.get((pod.namespace, pod.name))
            current = stored is not None and stored.obj["metadata"]["uid"] == pod.uid
            if current and pod.evicted:
                status = stored.obj["status"]
                self.api.set_container_state(
                    pod.namespace, pod.name, "terminated", reason="Error", exit_code=pod.exit_code
                )
                status.update(phase="Failed", reason="Evicted", message=pod.evicted)
                status["conditions"] = [c for c in status.get("conditions", []) if c["type"] != "Ready"] + [
                    {"type": "Ready", "status": "False", "reason": "PodFailed", "lastTransitionTime": _now()}
                ]
            elif current:
                self.api.set_container_state(
                    pod.namespace,
                    pod.name,
                    "terminated",
                    exit_code=pod.exit_code,
                    reason="Completed" if pod.exit_code == 0 else "Error",
                )
            if current and pod.deleting:
                del self.api.pods[(pod.namespace, pod.name)]
        self.note(
            f"pod {pod.name} (uid {pod.uid[:8]}) exited {pod.exit_code}"
            + (" (evicted)" if pod.evicted else "")
            + (" (deleted)" if pod.deleting else "")
        )
        pod.done.set()

    def _kill(self, pod: PodRecord, sig: int) -> None:
        """``sig`` to the container's PID 1; SIGKILL to ``unshare`` itself, whose death kills the whole pod."""
        if sig == signal.SIGKILL:
            targets = [pod.proc.pid]
        else:
            targets = _children(pod.proc.pid) or [pod.proc.pid]
        for pid in targets:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass

    def _delete(self, pod: PodRecord) -> None:
        """A graceful delete: deletionTimestamp, SIGTERM, GRACE_SECONDS, SIGKILL; the object goes when it is done."""
        pod.deleting = True
        with self.api.lock:
            stored = self.api.pods.get((pod.namespace, pod.name))
            if stored is not None and stored.obj["metadata"]["uid"] == pod.uid:
                stored.obj["metadata"]["deletionTimestamp"] = _now()
                if pod.done.is_set():
                    del self.api.pods[(pod.namespace, pod.name)]
        if pod.proc is None or pod.done.is_set():
            return

        def terminate():
            self._kill(pod, signal.SIGTERM)
            if not pod.done.wait(GRACE_SECONDS):
                self._kill(pod, signal.SIGKILL)

        threading.Thread(target=terminate, daemon=True).start()

    def evict(self, pod: PodRecord, why: str = "", *, graceful: bool = False) -> None:
        """The kubelet evicts ``pod`` under memory pressure: a hard eviction kills it at once (SIGKILL); a soft
        one (``graceful``, as eviction-soft thresholds and drains do) sends SIGTERM to the container's PID 1 and
        SIGKILL only after the pod's terminationGracePeriodSeconds (capped at ``SOFT_EVICTION_GRACE_CAP``)."""
        message = EVICTION_MESSAGE.format(container=self.jobs[pod.owner_uid].plans[0].container["name"])
        with self.api.lock:
            stored = self.api.pods.get((pod.namespace, pod.name))
            if stored is not None and stored.obj["metadata"]["uid"] == pod.uid:
                stored.obj["status"].setdefault("conditions", []).append(
                    {
                        "type": "DisruptionTarget",
                        "status": "True",
                        "reason": "TerminationByKubelet",
                        "message": message,
                        "lastTransitionTime": _now(),
                    }
                )
        pod.evicted = message
        self.note(
            f"evicting pod {pod.name} (uid {pod.uid[:8]}){' gracefully' if graceful else ''}{': ' + why if why else ''}"
        )
        if not graceful:
            self._kill(pod, signal.SIGKILL)
            return
        grace = min(float(pod.grace_seconds), SOFT_EVICTION_GRACE_CAP)

        def terminate():
            self._kill(pod, signal.SIGTERM)
            if not pod.done.wait(grace):
                self.note(f"pod {pod.name} still running {grace:.0f}s after SIGTERM: SIGKILL")
                self._kill(pod, signal.SIGKILL)

        threading.Thread(target=terminate, daemon=True).start()

    def evict_when(self, pattern: str, role: str, *, graceful: bool = False) -> None:
        """Once a file matching ``pattern`` (a host path glob) exists, evict the running ``role`` pod (once)."""

        def watch():
            while not self._stop.is_set():
                found = sorted(glob.glob(pattern))
                if found:
                    running = [
                        p
                        for p in self.pods.values()
                        if p.role == role and p.proc is not None and not p.done.is_set() and not p.deleting
                    ]
                    if running:
                        pod = running[0]
                        present = sorted(
                            os.path.basename(p)
                            for p in glob.glob(os.path.join(os.path.dirname(os.path.dirname(found[0])), "checkpoint-*"))
                        )
                        self.evict(pod, f"{found[0]} appeared", graceful=graceful)
                        self.evictions.append(
                            {"pod": pod.name, "uid": pod.uid, "trigger": found[0], "checkpoints": present}
                        )
                        return
                time.sleep(0.02)

        thread = threading.Thread(target=watch, name="evictor", daemon=True)
        thread.start()
        self._watchers.append(thread)

    # -- reporting -----------------------------------------------------------------------------------------
    def pod_report(self) -> list:
        """Every pod the kubelet ran: name, uid, role, exit code, eviction, log file."""
        return [
            {
                "name": p.name,
                "uid": p.uid,
                "owner_uid": p.owner_uid,
                "role": p.role,
                "exit_code": p.exit_code,
                "evicted": bool(p.evicted),
                "deleted": p.deleting,
                "log": str(p.log_path),
            }
            for p in self.pods.values()
        ]


def _children(pid: int) -> list:
    """The processes whose parent is ``pid`` (the container's PID 1 is ``unshare --fork``'s child)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
            found.append(int(entry))
    return found
