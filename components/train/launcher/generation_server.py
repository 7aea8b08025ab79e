"""The grpo stage's generation server on a cluster (grpo_generation_backend=vllm-server): the manifests of a vLLM
server from the serving image with this package's weight-sync engine, beside the training job.

    server_manifests(name, namespace, image, model_path, model_pvc, gpus) -> [ConfigMap, Deployment, Service]
    run_server_manifests(job, storage, run_id=..., namespace=..., model_path=...) -> [NetworkPolicy, ConfigMap, ...]

- a ConfigMap carrying the engine module (components/models/vllm_worker/kfp_weight_sync.py: the serving image has
  vLLM, not this package), mounted at ``ENGINE_DIR`` and named by the server's ``PYTHONPATH``;
- a Deployment of one pod: vLLM's OpenAI server on the stage's starting model (the models claim, read-only), tensor
  parallel over its ``gpus``, with vLLM's RL routes and the engine (components.models.vllm_worker.server_args /
  server_env), as the Pod Security Standards' ``restricted`` profile admits it (components/security.py);
- a ClusterIP Service: ``grpo_vllm_server_url`` is ``service_url(name, namespace)``;
- for a run's own server, a NetworkPolicy first: only the run's pods reach its port (``network_policy``).

On a cluster, a grpo stage with ``grpo_generation_backend=vllm-server`` and no ``grpo_vllm_server_url`` gets one of its
own (``runs_own_server``): the train step writes the stage's trainer config with ``stage_server_url`` (the Service's
URL, from the run id and namespace alone), then ``generation_server`` creates the three objects (named
``server_name(run_id)``, labelled with the run id; ``grpo_vllm_image`` on ``grpo_vllm_server_gpus`` GPUs, the run's
pull Secrets, node selector and tolerations), waits until the Deployment has a ready replica (failing with the pod's
reason: an image that cannot be pulled, a crash loop, unschedulable past ``pending_timeout_seconds``), runs the job,
and deletes them when the stage ends, succeeded or failed. They are recorded on the model claim first
(components/observe/run_objects.py), so the run's exit handler deletes them when the step is killed. ``--render``
writes the same objects (pipelines/render.py: grpo-vllm-server.yaml).
"""

from __future__ import annotations

import dataclasses
import logging
import secrets
import time
from collections.abc import Iterator
from contextlib import contextmanager

from components.kube import RUN_ID_LABEL, job_name_for
from components.models.vllm_worker import (
    API_KEY_ENV,
    ENGINE_MODULE,
    TOKEN_ENV,
    TOKEN_KEY,
    engine_source,
    server_args,
    server_env,
)
from components.paths import MODEL_MOUNT
from components.security import container_security_context, pod_security_context
from components.settings import JobSettings, PreferenceSettings, StorageSettings

log = logging.getLogger("grpo_vllm_server")

ENGINE_DIR = "/opt/kfp-weight-sync"
PORT = 8000
SERVED_MODEL_NAME = "policy"
# What the server's pod requests per GPU beside it (requests, no limits).
CPU_PER_GPU = 4
MEMORY_GI_PER_GPU = 16
# The size of the server pod's memory-backed /dev/shm, which NCCL and vLLM's worker processes use within the node.
SHM_SIZE = "8Gi"


def service_url(name: str, namespace: str, port: int = PORT) -> str:
    """The server's URL from the training pods (``grpo_vllm_server_url``)."""
    return f"http://{name}.{namespace}.svc:{port}"


def server_manifests(
    name: str,
    namespace: str,
    image: str,
    model_path: str,
    model_pvc: str,
    gpus: int = 1,
    *,
    node_selector: dict | None = None,
    tolerations: list | None = None,
    image_pull_secrets: list | None = None,
    labels: dict | None = None,
    max_model_len: int | None = None,
    token_secret: str = "",
) -> list[dict]:
    """The ConfigMap, Deployment and Service of a grpo generation server named ``name`` serving ``model_path`` (a path
    on the models claim ``model_pvc``, mounted read-only at its usual place) on ``gpus`` GPUs of one node.
    ``token_secret``: the Secret whose ``token`` guards the server (``weight_sync_secret``): vLLM's ``--api-key`` on
    its OpenAI routes (``VLLM_API_KEY``) and the weight-sync engine's joins and rounds (``TOKEN_ENV``)."""
    if not model_path.startswith(MODEL_MOUNT + "/"):
        raise ValueError(f"the server reads the model from the models claim: {model_path!r} is not under {MODEL_MOUNT}")
    selector = {"app.kubernetes.io/name": "grpo-vllm-server", "app.kubernetes.io/instance": name}
    meta_labels = {**(labels or {}), **selector}
    args = server_args(model_path, SERVED_MODEL_NAME, PORT)
    if gpus > 1:
        args += ["--tensor-parallel-size", str(gpus)]
    if max_model_len:
        args += ["--max-model-len", str(max_model_len)]
    env = {"HOME": "/tmp", "HF_HUB_OFFLINE": "1", **server_env(ENGINE_DIR)}
    container = {
        "name": "vllm",
        "image": image,
        "command": ["python3", "-m", "vllm.entrypoints.openai.api_server"],
        "args": args,
        "env": [{"name": k, "value": v} for k, v in env.items()]
        + [
            {"name": var, "valueFrom": {"secretKeyRef": {"name": token_secret, "key": TOKEN_KEY}}}
            for var in ((API_KEY_ENV, TOKEN_ENV) if token_secret else ())
        ],
        "ports": [{"name": "http", "containerPort": PORT}],
        # CPU and memory requested, not limited (Burstable: a BestEffort pod is the first the kubelet evicts): vLLM's
        # API server, engine core and tokenizer processes per GPU's worker; the weights stream from the claim.
        "resources": {
            "limits": {"nvidia.com/gpu": str(gpus)},
            "requests": {
                "nvidia.com/gpu": str(gpus),
                "cpu": str(CPU_PER_GPU * gpus),
                "memory": f"{MEMORY_GI_PER_GPU * gpus}Gi",
            },
        },
        "readinessProbe": {
            "httpGet": {"path": "/health", "port": PORT},
            "periodSeconds": 10,
            "failureThreshold": 3,
        },
        "startupProbe": {"httpGet": {"path": "/health", "port": PORT}, "periodSeconds": 10, "failureThreshold": 180},
        "volumeMounts": [
            {"name": "engine", "mountPath": ENGINE_DIR, "readOnly": True},
            {"name": "models", "mountPath": MODEL_MOUNT, "readOnly": True},
            {"name": "dshm", "mountPath": "/dev/shm"},
        ],
        "securityContext": container_security_context(user=True),
    }
    pod: dict = {
        "securityContext": pod_security_context(),
        "automountServiceAccountToken": False,  # the server never calls the Kubernetes API
        "containers": [container],
        "volumes": [
            {"name": "engine", "configMap": {"name": f"{name}-engine"}},
            {"name": "models", "persistentVolumeClaim": {"claimName": model_pvc, "readOnly": True}},
            {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": SHM_SIZE}},
        ],
    }
    if node_selector:
        pod["nodeSelector"] = dict(node_selector)
    if tolerations:
        pod["tolerations"] = list(tolerations)
    if image_pull_secrets:
        pod["imagePullSecrets"] = [{"name": n} for n in image_pull_secrets]
    return [
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": f"{name}-engine", "namespace": namespace, "labels": meta_labels},
            "data": {f"{ENGINE_MODULE}.py": engine_source()},
        },
        {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {"name": name, "namespace": namespace, "labels": meta_labels},
            "spec": {
                "replicas": 1,
                "selector": {"matchLabels": selector},
                "strategy": {"type": "Recreate"},  # one model, one set of GPUs: never two servers at once
                "template": {"metadata": {"labels": meta_labels}, "spec": pod},
            },
        },
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": name, "namespace": namespace, "labels": meta_labels},
            "spec": {"selector": selector, "ports": [{"name": "http", "port": PORT, "targetPort": PORT}]},
        },
    ]


# ---- the train step's server (grpo_generation_backend=vllm-server, no grpo_vllm_server_url, on a cluster) ----------

# How long the server may take to become ready once its pod is scheduled: vLLM loads the model from the claim and
# compiles its graphs (the startupProbe allows 30 minutes); past this the stage fails with the pod's state.
READY_TIMEOUT_SECONDS = 3600.0
POLL_SECONDS = 5.0


def server_name(run_id: str) -> str:
    """The run's server's name (Deployment and Service; the ConfigMap adds ``-engine``): a DNS-1035 label."""
    return job_name_for(run_id, "gen")


def weight_sync_secret_name(run_id: str) -> str:
    """The run's server's Secret (its ``token``: ``weight_sync_secret``)."""
    return f"{server_name(run_id)}-token"


def weight_sync_secret(run_id: str, namespace: str, owner: dict) -> dict:
    """A new random token for run ``run_id``'s server, as a Secret owned by ``owner`` (the server's NetworkPolicy as
    the API server returned it: ``kind``, ``metadata.name`` and ``uid``), so that Kubernetes deletes the Secret with
    it: the runner's Role then needs ``create`` on Secrets and nothing more. The server's pod and the grpo stage's
    trainer pods read it by reference (``server_manifests``, ``job.training_job_for_run``); it is never logged."""
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "type": "Opaque",
        "metadata": {
            "name": weight_sync_secret_name(run_id),
            "namespace": namespace,
            "labels": {RUN_ID_LABEL: run_id},
            "ownerReferences": [
                {
                    "apiVersion": "networking.k8s.io/v1",
                    "kind": "NetworkPolicy",
                    "name": owner["metadata"]["name"],
                    "uid": owner["metadata"]["uid"],
                }
            ],
        },
        "stringData": {TOKEN_KEY: secrets.token_urlsafe(32)},
    }


def runs_own_server(stage: str, preference: PreferenceSettings, job: JobSettings) -> bool:
    """Whether the train step runs ``stage``'s generation server itself: a grpo stage generating on a vLLM server
    whose URL is not given, on a cluster (locally the URL stays required: validate_inputs says so)."""
    return (
        stage == "grpo"
        and preference.grpo_generation_backend == "vllm-server"
        and not preference.grpo_vllm_server_url.strip()
        and job.train_backend != "local"
    )


def stage_server_url(
    stage: str, preference: PreferenceSettings, job: JobSettings, *, run_id: str, namespace: str
) -> PreferenceSettings:
    """``preference`` with ``grpo_vllm_server_url`` set to the run's own server's Service where the train step runs one
    (``runs_own_server``); else ``preference`` unchanged. The same run id and namespace give the same URL (a retried
    step, ``--render``)."""
    if not runs_own_server(stage, preference, job):
        return preference
    return dataclasses.replace(preference, grpo_vllm_server_url=service_url(server_name(run_id), namespace))


def network_policy(name: str, namespace: str, server: dict, clients: dict, labels: dict | None = None) -> dict:
    """A NetworkPolicy admitting to the pods labelled ``server``, on the server's port only, the pods of the same
    namespace labelled ``clients``; no other ingress. vLLM's RL routes (``/pause``, ``/update_weights``, the weight-
    transfer group's ``/init_weight_transfer_engine``) answer whoever reaches the port, and ``--api-key`` guards only
    ``/v1``: this is what keeps another tenant's pod from pushing weights into the run's server. Enforced where the
    cluster's CNI implements NetworkPolicy (Calico, Cilium, Antrea, OVN-Kubernetes; not flannel alone):
    docs/security.md. The kubelet's probes come from the node, which those CNIs admit to local pods."""
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": {"name": name, "namespace": namespace, "labels": {**(labels or {}), **server}},
        "spec": {
            "podSelector": {"matchLabels": dict(server)},
            "policyTypes": ["Ingress"],
            "ingress": [
                {
                    "from": [{"podSelector": {"matchLabels": dict(clients)}}],
                    "ports": [{"protocol": "TCP", "port": PORT}],
                }
            ],
        },
    }


def run_server_manifests(
    job: JobSettings, storage: StorageSettings, *, run_id: str, namespace: str, model_path: str
) -> list[dict]:
    """The NetworkPolicy, ConfigMap, Deployment and Service of run ``run_id``'s server on the stage's starting model
    ``model_path`` (as the trainer sees it, on the models claim), from the job and storage settings. The
    NetworkPolicy comes first (created before the server's pod exists, deleted after it is gone): only the pods
    labelled with this run's id (the training job's) reach the server."""
    if not model_path.startswith(MODEL_MOUNT + "/"):
        raise ValueError(
            f"grpo_generation_backend vllm-server with no grpo_vllm_server_url: the train step's vLLM server reads "
            f"the grpo stage's starting model from the models claim ({MODEL_MOUNT}), and {model_path!r} is not "
            "there: train an earlier stage (sft) first, or start your own server and set grpo_vllm_server_url"
        )
    name = server_name(run_id)
    selector = {"app.kubernetes.io/name": "grpo-vllm-server", "app.kubernetes.io/instance": name}
    policy = network_policy(name, namespace, selector, {RUN_ID_LABEL: run_id}, {RUN_ID_LABEL: run_id})
    return [policy] + server_manifests(
        name,
        namespace,
        job.grpo_vllm_image,
        model_path,
        storage.model_pvc,
        job.grpo_vllm_server_gpus,
        node_selector=dict(job.node_selector),
        tolerations=list(job.tolerations),
        image_pull_secrets=list(job.image_pull_secrets),
        labels={RUN_ID_LABEL: run_id},
        token_secret=weight_sync_secret_name(run_id),
    )


@contextmanager
def generation_server(
    job: JobSettings,
    storage: StorageSettings,
    *,
    run_id: str,
    namespace: str,
    model_path: str,
    model_root: str,
    pending_timeout_seconds: float,
    api_client=None,
    poll_seconds: float | None = None,
    ready_timeout_seconds: float | None = None,
) -> Iterator[str]:
    """Run the stage's vLLM server while the ``with`` block runs; yields its URL (``service_url``).

    Recorded on the model claim (``model_root``) before anything is created, for the exit handler; created (an
    object already there, a retried step's, is kept: 409), waited on until its Deployment has a ready replica, and
    deleted with its record when the block ends, however it ends. Raises RuntimeError naming the pod's reason when it
    cannot start, TimeoutError when it is not ready after ``ready_timeout_seconds`` (``READY_TIMEOUT_SECONDS``);
    polls every ``poll_seconds`` (``POLL_SECONDS``).
    """
    from kubernetes import client as k8s
    from kubernetes.client.rest import ApiException

    from components.kube import call_api, load_api_client
    from components.observe.run_objects import GRPO_SERVER_RECORD, delete_object, forget_objects, record_objects

    api_client = api_client or load_api_client()
    manifests = run_server_manifests(job, storage, run_id=run_id, namespace=namespace, model_path=model_path)
    name = server_name(run_id)
    record_objects(model_root, run_id, GRPO_SERVER_RECORD, manifests)
    core, apps = k8s.CoreV1Api(api_client), k8s.AppsV1Api(api_client)
    create = {
        "NetworkPolicy": k8s.NetworkingV1Api(api_client).create_namespaced_network_policy,
        "ConfigMap": core.create_namespaced_config_map,
        "Deployment": apps.create_namespaced_deployment,
        "Service": core.create_namespaced_service,
    }
    try:
        for manifest in manifests:
            try:
                call_api(create[manifest["kind"]], namespace, manifest)
            except ApiException as exc:
                if exc.status != 409:
                    raise
            if manifest["kind"] == "NetworkPolicy":  # the token next, owned by the policy, before the server's pod
                owner = call_api(
                    k8s.NetworkingV1Api(api_client).read_namespaced_network_policy,
                    manifest["metadata"]["name"],
                    namespace,
                )
                secret = weight_sync_secret(run_id, namespace, api_client.sanitize_for_serialization(owner))
                try:
                    call_api(core.create_namespaced_secret, namespace, secret)
                except ApiException as exc:
                    if exc.status != 409:  # a retried step's: the server it started reads that one
                        raise
        log.info(
            "grpo generation server %s/%s: %s on %d GPU(s) serving %s; waiting until it is ready",
            namespace,
            name,
            job.grpo_vllm_image,
            job.grpo_vllm_server_gpus,
            model_path,
        )
        _wait_ready(
            api_client,
            namespace,
            name,
            pending_timeout_seconds=pending_timeout_seconds,
            poll_seconds=POLL_SECONDS if poll_seconds is None else poll_seconds,
            ready_timeout_seconds=READY_TIMEOUT_SECONDS if ready_timeout_seconds is None else ready_timeout_seconds,
        )
        url = service_url(name, namespace)
        log.info("grpo generation server ready at %s", url)
        yield url
    finally:
        try:
            for manifest in reversed(manifests):
                delete_object(api_client, manifest["kind"], namespace, manifest["metadata"]["name"])
        except Exception as exc:  # the stage's own outcome goes up; the exit handler tries again
            log.warning(
                "could not delete grpo generation server %s/%s (%r): the exit handler will", namespace, name, exc
            )
        else:
            forget_objects(model_root, run_id, GRPO_SERVER_RECORD)
            log.info("deleted grpo generation server %s/%s", namespace, name)


def _wait_ready(
    api_client,
    namespace: str,
    name: str,
    *,
    pending_timeout_seconds: float,
    poll_seconds: float,
    ready_timeout_seconds: float,
) -> None:
    from kubernetes import client as k8s

    from components.kube import call_api, unstartable_pod_reason

    apps, core = k8s.AppsV1Api(api_client), k8s.CoreV1Api(api_client)
    selector = f"app.kubernetes.io/name=grpo-vllm-server,app.kubernetes.io/instance={name}"
    unschedulable_since: dict = {}
    deadline = time.monotonic() + ready_timeout_seconds
    while True:
        deployment = call_api(apps.read_namespaced_deployment, name, namespace)
        if ((deployment.status and deployment.status.ready_replicas) or 0) >= 1:
            return
        pods = call_api(core.list_namespaced_pod, namespace, label_selector=selector).items
        reason = unstartable_pod_reason(pods, unschedulable_since, pending_timeout_seconds)
        if reason:
            raise RuntimeError(f"the grpo generation server {namespace}/{name} cannot start: {reason}")
        if time.monotonic() >= deadline:
            raise TimeoutError(
                f"the grpo generation server {namespace}/{name} is not ready after {ready_timeout_seconds:.0f}s "
                f"(kubectl logs -n {namespace} deployment/{name})"
            )
        time.sleep(poll_seconds)
