"""The KServe InferenceService (serving.kserve.io/v1beta1) that serves the tuned model, and its rollout.

Two runtimes, both KServe ClusterServingRuntimes that read the model KServe mounts read-only at
``/mnt/models`` from ``storageUri: pvc://claim/path``:

- ``kserve-vllm``: ``kserve-vllmserver`` runs vLLM's own OpenAI server (``vllm.entrypoints.openai.api_server``),
  so its OpenAI routes are ``/v1/...``.
- ``kserve-huggingface``: ``kserve-huggingfaceserver``, KServe's model server with the vLLM backend, serves
  them under ``/openai/v1/...``.

KServe appends the InferenceService's ``args`` to the runtime's, so ours come last and win over the
runtime's defaults (``--served-model-name={{.Name}}`` / ``--model_name={{.Name}}``).

LoRA adapters of one base (components/deploy/plan.py) are served by one ``kserve-vllm`` service without merging:
``storageUri`` is the base, the model claim is mounted read-only at ``ADAPTER_MOUNT`` (a ``persistentVolumeClaim``
volume in the predictor's pod spec and a ``volumeMounts`` entry on its model container, both fields of the
InferenceService CRD's predictor), and vLLM loads each adapter from there as a LoRA module with its own name.

Deployment modes (annotation ``serving.kserve.io/deploymentMode``): ``Standard`` (a Deployment, Service
and HPA; KServe's default, formerly RawDeployment) and ``Knative`` (a Knative Service, formerly
Serverless; revisions, so ``canaryTrafficPercent`` can send part of the traffic to the new model while the
previous one keeps the rest). KServe cannot switch an existing service between modes.

Replicas: the predictor's ``minReplicas``/``maxReplicas`` bound the autoscaler, ``scaleMetric``/``scaleTarget`` say
what it watches. In Standard mode KServe's autoscaler is a HorizontalPodAutoscaler (annotation
``serving.kserve.io/autoscalerClass: hpa``), which scales on ``cpu`` or ``memory`` (utilisation in % of the
requests); in Knative mode it is Knative's, which scales on ``concurrency`` or ``rps`` and to zero with
``minReplicas: 0`` (SCALE_METRICS).
"""

from __future__ import annotations

import json
import os
import re
import time
from dataclasses import dataclass

from kubernetes import client as k8s
from kubernetes.client.rest import ApiException

from components.deploy.plan import SCALE_METRICS, lora_args
from components.deploy.smoke import TooSlow, chat_completion, check_latency, describe_latency
from components.kube import (
    DNS1035_LABEL,
    RUN_ID_LABEL,
    CustomResourceRunner,
    call_api,
    egress_env,
    unstartable_pod_reason,
)
from components.models.logprobs import ServingMismatch, check_server
from components.paths import MODEL_MOUNT, pvc_uri
from components.security import container_security_context
from components.storage import parse_store_uri

GROUP, VERSION, PLURAL, KIND = "serving.kserve.io", "v1beta1", "inferenceservices", "InferenceService"
# KServe labels every pod of a service with its name.
POD_LABEL = "serving.kserve.io/inferenceservice"
# Per GPU of the predictor: vLLM's CPU side (tokenizer, scheduler, one worker process per GPU) and the
# host memory a safetensors load passes through. The runtimes' own 1 CPU / 2Gi would OOM on a 30B model.
CPU_PER_GPU = 4
MEMORY_GI_PER_GPU = 40
DEPLOYMENT_MODE_ANNOTATION = "serving.kserve.io/deploymentMode"
DEPLOYMENT_MODES = ("Standard", "Knative")
# What KServe still accepts and normalises to the current names.
LEGACY_DEPLOYMENT_MODES = {"RawDeployment": "Standard", "Serverless": "Knative"}
# Knative gives each revision tagged URLs ("latest", "prev"), so a canary's smoke test reaches the new model.
TAG_ROUTING_ANNOTATION = "serving.kserve.io/enable-tag-routing"
# Loading 60 GB of weights from a network volume, then CUDA graph capture: allow 30 minutes, as KServe's
# vLLM runtime does in its own startupProbe (60 x 30 s).
STARTUP_PROBE = {"failureThreshold": 60, "periodSeconds": 30, "timeoutSeconds": 10, "initialDelaySeconds": 30}
# Knative fails a revision that is not Ready within its progress deadline (10 minutes by default).
PROGRESS_DEADLINE_ANNOTATION = "serving.knative.dev/progress-deadline"
# Where a LoRA service's predictor mounts the model claim (read-only) to load the adapters from: not /mnt/models,
# where KServe puts the base model from storageUri.
ADAPTER_MOUNT = "/mnt/adapters"
ADAPTER_VOLUME = "adapters"
# While the rollout waits for Ready (up to the startup probe's 30 minutes): a line this often with the time waited,
# the predictor pods' phase and the last lines of the model server's log (KServe names its container so).
PROGRESS_SECONDS = 60.0
PREDICTOR_CONTAINER = "kserve-container"
PROGRESS_LOG_LINES = 3
AUTOSCALER_CLASS_ANNOTATION = "serving.kserve.io/autoscalerClass"
# A Hugging Face Hub id (owner/name), as KServe's hf:// storage URIs take it.
HUB_ID = re.compile(r"^[A-Za-z0-9][-\w.]*/[-\w.]+$")


@dataclass(frozen=True)
class Runtime:
    """A KServe serving runtime as this package uses it."""

    runtime: str  # ClusterServingRuntime name
    model_format: str  # predictor.model.modelFormat.name it supports
    openai_route: str  # where its OpenAI-compatible API lives under the service URL
    served_name_flag: str  # the argument naming the model in requests
    has_startup_probe: bool  # the runtime's container already gives a slow model load time


RUNTIMES = {
    "kserve-vllm": Runtime("kserve-vllmserver", "vLLM", "/v1", "--served-model-name", True),
    "kserve-huggingface": Runtime("kserve-huggingfaceserver", "huggingface", "/openai/v1", "--model_name", False),
}
# The pipeline's deploy_backend: a KServe runtime above, or local (components/deploy/local_server.py).
DEPLOY_BACKENDS = (*RUNTIMES, "local")


def _runtime_args(runtime: str, gpus: int, max_model_len: int, served_model_name: str) -> list[str]:
    if runtime == "kserve-vllm":
        return [
            f"--served-model-name={served_model_name}",
            f"--tensor-parallel-size={gpus}",
            f"--max-model-len={max_model_len}",
        ]
    # KServe's own flags, then vLLM engine flags, which its server accepts with the vLLM backend.
    return [
        "--backend=vllm",
        f"--model_name={served_model_name}",
        f"--max_model_len={max_model_len}",
        f"--tensor-parallel-size={gpus}",
    ]


def build_inference_service(
    *,
    name: str,
    namespace: str,
    storage_uri: str,
    runtime: str,
    gpus: int,
    max_model_len: int,
    served_model_name: str,
    node_selector: dict,
    tolerations: list,
    labels: dict | None = None,
    deployment_mode: str = "Standard",
    canary_traffic_percent: int = 0,
    lora_modules: list[tuple[str, str]] | None = None,
    max_lora_rank: int = 16,
    adapter_claim: str = "",
    min_replicas: int = 1,
    max_replicas: int = 1,
    scale_metric: str = "auto",
    scale_target: int = 0,
    env: dict | None = None,
    image_pull_secrets: list | None = None,
    service_account: str = "",
) -> dict:
    """The InferenceService manifest (a plain dict) serving ``storage_uri`` with one of ``RUNTIMES``.

    Args:
        name: service name, a DNS-1035 label (KServe's rule; it also names the pods and the URL).
        namespace: where it runs (the model claim must be in the same namespace).
        storage_uri: ``pvc://claim/path`` of the model folder (config, weights, tokenizer); s3://, gs://, hf://
            work too.
        runtime: a key of ``RUNTIMES``.
        gpus: GPUs per replica, vLLM's tensor-parallel size (must divide the model's attention heads).
        max_model_len: longest prompt + completion in tokens; bounds the KV cache vLLM reserves.
        served_model_name: the ``model`` clients put in requests.
        node_selector: node labels for the predictor pods.
        tolerations: tolerations for the predictor pods, as Kubernetes JSON.
        labels: put on the InferenceService.
        deployment_mode: ``Standard`` (Deployment + Service) or ``Knative`` (revisions, scale to zero, canary).
        canary_traffic_percent: Knative only: the share of traffic (1-99) the new model gets while the
            previous revision keeps the rest; 0 sends it all traffic. Promote later by removing the field.
        lora_modules: ``kserve-vllm`` only: (served name, adapter folder under ``ADAPTER_MOUNT``) of each LoRA
            adapter served beside the base model ``storage_uri`` names (``lora_args``).
        max_lora_rank: vLLM's ``--max-lora-rank`` with ``lora_modules``.
        adapter_claim: the claim the adapters are on, mounted read-only at ``ADAPTER_MOUNT`` with ``lora_modules``.
        min_replicas: fewest predictor replicas (0, scale to zero: Knative only).
        max_replicas: most predictor replicas the autoscaler may run (>= ``min_replicas``); above ``min_replicas``
            in Standard mode the HPA autoscaler class is named explicitly.
        scale_metric: what the autoscaler scales on, one of the mode's ``SCALE_METRICS``; ``auto`` for KServe's
            default (cpu in Standard mode, concurrency in Knative).
        scale_target: the metric's target per replica; 0 for KServe's default.
        env: variables added to the model container's (the proxies and Hub mirror, ``components.kube.egress_env``).
            KServe's storage initializer is its own init container: an ``hf://`` download there does not get them.
        image_pull_secrets: Secret names the predictor pods pull their images with; empty: none.
        service_account: the predictor pods' ServiceAccount; for an ``s3://`` ``storage_uri`` KServe's storage
            initializer takes the store's keys (and endpoint) from the Secret attached to it. Empty: the namespace's
            default.

    Raises:
        ValueError: naming the field, for a bad name, runtime, GPU count, length, storage URI, deployment
            mode, canary percentage, replica bounds or scale metric.
    """
    if not DNS1035_LABEL.match(name) or len(name) > 63:
        raise ValueError(
            f"name {name!r} must be a DNS-1035 label (lowercase letters, digits, '-'; starts with a letter; <= 63)"
        )
    if runtime not in RUNTIMES:
        raise ValueError(f"runtime {runtime!r} is not one of {sorted(RUNTIMES)}")
    if gpus < 1:
        raise ValueError(f"gpus must be >= 1 (vLLM's tensor-parallel size), got {gpus}")
    if max_model_len < 1:
        raise ValueError(f"max_model_len must be >= 1, got {max_model_len}")
    if "://" not in storage_uri:
        raise ValueError(f"storage_uri {storage_uri!r} must be a URI such as pvc://claim/path")
    if not served_model_name:
        raise ValueError("served_model_name must not be empty")
    if deployment_mode not in DEPLOYMENT_MODES:
        hint = f" (KServe's new name for {deployment_mode!r})" if deployment_mode in LEGACY_DEPLOYMENT_MODES else ""
        raise ValueError(
            f"deployment_mode {deployment_mode!r} is not one of {list(DEPLOYMENT_MODES)}; use "
            f"{LEGACY_DEPLOYMENT_MODES.get(deployment_mode, 'Standard')!r}{hint}"
        )
    if not 0 <= canary_traffic_percent <= 99:
        raise ValueError(f"canary_traffic_percent must be 0 (no canary) to 99, got {canary_traffic_percent}")
    if canary_traffic_percent and deployment_mode != "Knative":
        raise ValueError(
            f"canary_traffic_percent={canary_traffic_percent} needs deployment_mode='Knative' "
            "(Standard mode has one Deployment and no traffic split); set it to 0"
        )
    if lora_modules and runtime != "kserve-vllm":
        raise ValueError(
            f"lora_modules need runtime 'kserve-vllm' (vLLM's own server and its --lora-modules), not {runtime!r}"
        )
    if lora_modules and not adapter_claim:
        raise ValueError("lora_modules need adapter_claim: the claim the adapters are on")
    if min_replicas < (0 if deployment_mode == "Knative" else 1):
        raise ValueError(
            f"min_replicas must be >= 1 in {deployment_mode} mode (0, scale to zero, needs Knative), got {min_replicas}"
        )
    if max_replicas < max(min_replicas, 1):
        raise ValueError(f"max_replicas ({max_replicas}) must be >= min_replicas ({min_replicas}) and >= 1")
    if scale_metric != "auto" and scale_metric not in SCALE_METRICS[deployment_mode]:
        raise ValueError(
            f"scale_metric {scale_metric!r} is not 'auto' or one of {list(SCALE_METRICS[deployment_mode])}, what "
            f"KServe's {deployment_mode} mode autoscales on"
        )
    if scale_target < 0:
        raise ValueError(f"scale_target must be >= 0 (0: KServe's default), got {scale_target}")
    rt = RUNTIMES[runtime]
    resources = {"cpu": str(CPU_PER_GPU * gpus), "memory": f"{MEMORY_GI_PER_GPU * gpus}Gi", "nvidia.com/gpu": str(gpus)}
    predictor: dict = {
        "minReplicas": min_replicas,
        "maxReplicas": max_replicas,
        "model": {
            "modelFormat": {"name": rt.model_format},
            "runtime": rt.runtime,
            "storageUri": storage_uri,
            "args": _runtime_args(runtime, gpus, max_model_len, served_model_name),
            "resources": {"requests": dict(resources), "limits": dict(resources)},  # two objects: no YAML anchors
        },
    }
    if lora_modules:
        # Knative (deployment_mode=Knative) admits a persistentVolumeClaim volume only with its config-features flag
        # kubernetes.podspec-persistent-volume-claim enabled (knative.dev/docs/serving/services/storage); read-only
        # needs no kubernetes.podspec-persistent-volume-write.
        predictor["model"]["args"] += lora_args(lora_modules, max_lora_rank)
        predictor["volumes"] = [
            {"name": ADAPTER_VOLUME, "persistentVolumeClaim": {"claimName": adapter_claim, "readOnly": True}}
        ]
        predictor["model"]["volumeMounts"] = [{"name": ADAPTER_VOLUME, "mountPath": ADAPTER_MOUNT, "readOnly": True}]
    if not rt.has_startup_probe:
        # Also keeps the pod un-Ready until the OpenAI route answers: the runtime has no readiness probe.
        predictor["model"]["startupProbe"] = {
            "httpGet": {"path": rt.openai_route + "/models", "port": 8080},
            **STARTUP_PROBE,
        }
    if scale_metric != "auto":
        predictor["scaleMetric"] = scale_metric
    if scale_target:
        predictor["scaleTarget"] = scale_target
    annotations = {DEPLOYMENT_MODE_ANNOTATION: deployment_mode}
    if deployment_mode == "Standard" and max_replicas > min_replicas:
        annotations[AUTOSCALER_CLASS_ANNOTATION] = "hpa"  # KServe's default in this mode, named: the HPA scales it
    if deployment_mode == "Knative":
        wait = STARTUP_PROBE["initialDelaySeconds"] + STARTUP_PROBE["failureThreshold"] * STARTUP_PROBE["periodSeconds"]
        predictor["annotations"] = {PROGRESS_DEADLINE_ANNOTATION: f"{wait}s"}
    if canary_traffic_percent:
        predictor["canaryTrafficPercent"] = canary_traffic_percent
        annotations[TAG_ROUTING_ANNOTATION] = "true"
    if node_selector:
        predictor["nodeSelector"] = dict(node_selector)
    if tolerations:
        predictor["tolerations"] = list(tolerations)
    # The Pod Security Standards' `restricted` profile (components/security.py), whichever runtime serves, all of it
    # on the container: Knative (deployment_mode=Knative) refuses a pod-level securityContext unless its
    # kubernetes.podspec-securitycontext feature is on. vLLM's image runs as root unless told otherwise and its home
    # is not writable by another user, so HOME (vLLM's, Triton's and torch's caches) goes to /tmp. The server never
    # calls the Kubernetes API: no token (Knative admits automountServiceAccountToken: false).
    predictor["automountServiceAccountToken"] = False
    predictor["model"]["securityContext"] = container_security_context(user=True)
    predictor["model"]["env"] = [{"name": "HOME", "value": "/tmp"}] + [
        {"name": k, "value": v} for k, v in (env or {}).items()
    ]
    if image_pull_secrets:
        predictor["imagePullSecrets"] = [{"name": n} for n in image_pull_secrets]
    if service_account:
        predictor["serviceAccountName"] = service_account
    metadata = {"name": name, "namespace": namespace, "annotations": annotations}
    if labels:
        metadata["labels"] = dict(labels)
    return {"apiVersion": f"{GROUP}/{VERSION}", "kind": KIND, "metadata": metadata, "spec": {"predictor": predictor}}


def served_from_store(deploy, cluster, storage_uri: str) -> str:
    """``storage_uri`` (``pvc://<model_pvc>/<path>``), or the train step's uploaded copy of it when the model store
    serves (``model_store_uri`` and ``serving_service_account`` set; components/train/model_store.py uploads each
    final model to ``<model_store_uri>/<path>``). The URI is ``s3://`` for a ``gs://`` store too: KServe's storage
    initializer reads GCS's XML API with the HMAC keys of the account's Secret (its ``s3-endpoint`` annotation
    ``storage.googleapis.com``)."""
    claim = f"pvc://{cluster.model_pvc}/"
    if not (cluster.model_store_uri and deploy.serving_service_account and storage_uri.startswith(claim)):
        return storage_uri
    store = parse_store_uri(cluster.model_store_uri).join(storage_uri.removeprefix(claim))
    return f"s3://{store.bucket}/{store.prefix}"


def store_settings(deploy, cluster) -> dict:
    """The predictor's ServiceAccount when it serves from the model store (``served_from_store``)."""
    serving = bool(cluster.model_store_uri and deploy.serving_service_account)
    return {"service_account": deploy.serving_service_account if serving else ""}


def inference_service_for_run(deploy, cluster, *, run_id: str, namespace: str, storage_uri: str) -> dict:
    """The InferenceService of one KFP run from its deploy and cluster settings (``components.settings``; the
    deploy step and ``--render`` call this): the predictor goes on the GPU nodes the job's selector names, and serves
    the model store's copy of ``storage_uri`` where the store serves (``served_from_store``)."""
    return build_inference_service(
        name=deploy.serving_name,
        namespace=namespace,
        storage_uri=served_from_store(deploy, cluster, storage_uri),
        runtime=deploy.deploy_backend,
        gpus=deploy.serving_gpus,
        max_model_len=deploy.max_model_len,
        served_model_name=deploy.serving_name,
        node_selector=cluster.node_selector,
        tolerations=cluster.tolerations,
        labels={RUN_ID_LABEL: run_id},
        deployment_mode=deploy.deployment_mode,
        canary_traffic_percent=deploy.canary_traffic_percent,
        **replica_settings(deploy),
        **egress_settings(cluster),
        **store_settings(deploy, cluster),
    )


def egress_settings(cluster) -> dict:
    """``build_inference_service``'s pull secrets and proxy and Hub-mirror variables from the cluster settings."""
    return dict(env=egress_env(cluster), image_pull_secrets=list(cluster.image_pull_secrets))


def replica_settings(deploy) -> dict:
    """``build_inference_service``'s replica bounds and scale metric from the deploy settings."""
    return dict(
        min_replicas=deploy.min_replicas,
        max_replicas=deploy.max_replicas,
        scale_metric=deploy.scale_metric,
        scale_target=deploy.scale_target,
    )


def base_storage_uri(server, claim: str, mount: str) -> str:
    """The ``storageUri`` of a LoRA server's base (``components.deploy.plan.Server``): the folder on the model claim
    its adapters' stage started from, else the Hub id it was resolved from (``hf://``, KServe's storage
    initializer downloads it).

    Raises:
        ValueError: a base neither on the claim nor a Hub id, naming model_name_or_path.
    """
    if os.path.relpath(server.model_path, mount).split(os.sep)[0] != "..":
        return pvc_uri(claim, mount, server.model_path)
    ids = []
    for adapter in server.adapters:
        card = os.path.join(adapter.path, "model.json")
        if os.path.isfile(card):
            with open(card) as f:
                ids.append(str(json.load(f).get("base_model") or ""))
    hub_id = next((i for i in ids if HUB_ID.match(i)), None)
    if hub_id is None:
        raise ValueError(
            f"the base of LoRA variants {[a.variant for a in server.adapters]} ({server.model_path}) is "
            f"neither on the model claim ({mount}) nor a Hugging Face Hub id, so the server cannot load "
            "it: set model_name_or_path to a Hub id or a folder on the model volume, or merge_lora=true"
        )
    return f"hf://{hub_id}"


def inference_services_for_servers(
    servers, deploy, cluster, *, run_id: str, namespace: str, mount: str | None = None
) -> list[dict]:
    """One InferenceService per server of ``components.deploy.plan.plan_servers``: a full model from its folder on
    the model claim; a LoRA server from its base (``base_storage_uri``) with the claim mounted read-only at
    ``ADAPTER_MOUNT`` and each adapter a LoRA module under its served name. ``mount``: where the deploy step
    mounts the model claim (``MODEL_MOUNT``)."""
    mount = mount or MODEL_MOUNT
    manifests = []
    for server in servers:
        common = dict(
            runtime=deploy.deploy_backend,
            gpus=deploy.serving_gpus,
            max_model_len=deploy.max_model_len,
            node_selector=cluster.node_selector,
            tolerations=cluster.tolerations,
            labels={RUN_ID_LABEL: run_id},
            deployment_mode=deploy.deployment_mode,
            canary_traffic_percent=deploy.canary_traffic_percent,
            **replica_settings(deploy),
            **egress_settings(cluster),
        )
        if not server.adapters:
            manifests.append(
                build_inference_service(
                    name=server.name,
                    namespace=namespace,
                    served_model_name=server.served_model_name,
                    storage_uri=served_from_store(
                        deploy, cluster, pvc_uri(cluster.model_pvc, mount, server.model_path)
                    ),
                    **common,
                    **store_settings(deploy, cluster),
                )
            )
            continue
        modules = [
            (a.served_model_name, os.path.join(ADAPTER_MOUNT, os.path.relpath(a.path, mount))) for a in server.adapters
        ]
        outside = [a.variant for a in server.adapters if os.path.relpath(a.path, mount).startswith("..")]
        if outside:
            raise ValueError(f"LoRA variants {outside}: their adapters are not on the model volume ({mount})")
        manifests.append(
            build_inference_service(
                name=server.name,
                namespace=namespace,
                served_model_name=server.served_model_name,
                storage_uri=base_storage_uri(server, cluster.model_pvc, mount),
                lora_modules=modules,
                max_lora_rank=server.max_lora_rank(),
                adapter_claim=cluster.model_pvc,
                **common,
            )
        )
    return manifests


def merge_patch_to(current, desired):
    """The RFC 7386 merge patch that turns ``current`` into ``desired`` (keys ``desired`` lacks become null)."""
    if not isinstance(current, dict) or not isinstance(desired, dict):
        return desired
    patch = {key: None for key in current if key not in desired}
    for key, value in desired.items():
        if key not in current:
            patch[key] = value
        elif current[key] != value:
            patch[key] = merge_patch_to(current[key], value)
    return patch


def _progress(core, runner: CustomResourceRunner, pods: list, isvc: dict) -> str:
    """Where a rollout that is not Ready is: each predictor pod's phase and whether its model server is ready, the
    service's conditions that are not True, then the last ``PROGRESS_LOG_LINES`` lines of each pod's model server
    log (a model download or a weight load tells its progress there), indented, one a line."""
    states, logs = [], []
    for pod in pods:
        name = pod.metadata.name
        server = next((c for c in pod.status.container_statuses or [] if c.name == PREDICTOR_CONTAINER), None)
        waiting = server.state.waiting if server and server.state else None
        detail = (
            "not started"
            if server is None
            else f"{PREDICTOR_CONTAINER} waiting: {waiting.reason}"
            if waiting
            else f"{PREDICTOR_CONTAINER} {'ready' if server.ready else 'not ready'}, {server.restart_count} restarts"
        )
        states.append(f"pod {name} {pod.status.phase} ({detail})")
        if server is None or waiting:
            continue
        try:
            text = call_api(
                core.read_namespaced_pod_log,
                name,
                runner.namespace,
                container=PREDICTOR_CONTAINER,
                tail_lines=PROGRESS_LOG_LINES,
                _preload_content=False,  # raw text: the client would json-decode a log line that is valid JSON
                retry_delay=runner.retry_delay,
            ).data.decode("utf-8", errors="replace")
        except ApiException as exc:
            if exc.status not in (400, 404):  # not started yet, or gone: nothing to show this time
                raise
            continue
        logs += [f"  [{name}] {line}" for line in text.splitlines() if line.strip()]
    where = "; ".join(states) or "no predictor pod yet"
    return "\n".join([f"{where}; {_not_ready_reasons(isvc)}", *logs])


def _served_name(manifest: dict, rt: Runtime) -> str:
    flag = rt.served_name_flag + "="
    named = [a[len(flag) :] for a in manifest["spec"]["predictor"]["model"].get("args", []) if a.startswith(flag)]
    return named[-1] if named else manifest["metadata"]["name"]  # the runtimes default to the service name


def _ready(isvc: dict, generation: int) -> bool:
    status = isvc.get("status") or {}
    # A Ready left over from the previous spec says nothing about ours.
    if status.get("observedGeneration", generation) < generation:
        return False
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in status.get("conditions") or [])


def _not_ready_reasons(isvc: dict) -> str:
    status = isvc.get("status") or {}
    reasons = [
        f"{c['type']}={c.get('status')} ({c.get('reason', '')}): {c.get('message', '')}".replace(" (): ", ": ")
        for c in status.get("conditions") or []
        if c.get("status") != "True"
    ]
    failure = (status.get("modelStatus") or {}).get("lastFailureInfo") or {}
    if failure:
        reasons.append(f"model: {failure.get('reason', '')}: {failure.get('message', '')}")
    return "; ".join(reasons) or "no status conditions yet"


def deploy_inference_service(
    manifest: dict,
    *,
    timeout_seconds: float = 1800.0,
    poll_seconds: float = 10.0,
    api_client=None,
    smoke_prompt: str = "Hello",
    pending_timeout_seconds: float = 900.0,
    serving_reference: dict | None = None,
    serving_references: dict[str, dict] | None = None,
    progress_seconds: float = PROGRESS_SECONDS,
    latency_gates: dict | None = None,
) -> dict:
    """Create, or patch in place when it exists; wait for Ready; smoke-test; prove it serves the evaluated model;
    roll back on any failure.

    Waits until the service is Ready for this spec (``status.observedGeneration``), failing fast on pods
    that cannot start (bad image, crash loop, Unschedulable past ``pending_timeout_seconds``). The smoke
    test is one chat completion (``components.deploy.smoke.chat_completion``) on the runtime's OpenAI route for
    every model name the service serves (its served name and each LoRA module's, ``served_names``) under the
    in-cluster address (``status.address.url``, else ``status.url``). On failure the previous
    spec is restored (merge patch), or the new service is deleted, and the error says which. With
    ``serving_reference`` (the evaluate step's, components/models/logprobs.py) the same address must then
    reproduce the evaluated model's per-token log-probabilities on held-out rows and its greedy first tokens. With
    ``latency_gates``, last, its latency: a few concurrent streamed chat completions to the served name
    (``components.deploy.smoke.check_latency``: time to first token, output tokens/s), gated on the deploy settings
    ``max_ttft_seconds`` and ``min_output_tokens_per_second`` (0: measured, not gated); a service too slow is rolled
    back the same way.

    Args:
        manifest: from ``build_inference_service``.
        timeout_seconds: how long the rollout may take to become Ready (model download and load included).
        poll_seconds: interval between status polls.
        api_client: a ``kubernetes.client.ApiClient``; default: in-cluster config, else kubeconfig.
        smoke_prompt: the user message of the smoke test.
        pending_timeout_seconds: how long a predictor pod may stay Unschedulable.
        serving_reference: from ``components.models.logprobs.read_reference``; None skips that check.
        serving_references: more references by served name (a LoRA module's, checked under its name).
        progress_seconds: while not Ready, print this often how long it has waited, the predictor pods' phase and
            the last lines of the model server's log.
        latency_gates: ``{"max_ttft_seconds": ..., "min_output_tokens_per_second": ...}`` (0: no gate), the
            ``check_latency`` keyword arguments; None skips the latency probe.

    Returns:
        ``{"endpoint": <status.url + OpenAI route>, "served_model_name": ..., "smoke_reply": ...}``, with
        ``latency_gates`` ``"latency"`` (``check_latency``'s figures), and
        ``"serving_check"`` (check_server's summary) with a ``serving_reference``; a service with LoRA modules
        adds ``"replies"`` (served name -> smoke reply) and ``"serving_checks"`` (served name -> summary).

    With a canary (``canaryTrafficPercent``, Knative) on an existing service, the smoke test goes to the new
    revision's tagged URL. SIGTERM (the KFP run cancelled) rolls back the same way and exits with 143.

    Raises:
        ValueError: the existing service runs in another deployment mode (nothing is changed).
        RuntimeError: a pod cannot start, the smoke test failed, the server is not the evaluated model or is slower
            than the latency gates allow (after the rollback).
        TimeoutError: not Ready within ``timeout_seconds``, with the status conditions' reasons (after the rollback).
        SystemExit: 143 after SIGTERM, once rolled back.
    """
    result, _ = _roll_out(
        manifest,
        timeout_seconds=timeout_seconds,
        poll_seconds=poll_seconds,
        api_client=api_client,
        smoke_prompt=smoke_prompt,
        pending_timeout_seconds=pending_timeout_seconds,
        serving_reference=serving_reference,
        serving_references=serving_references,
        progress_seconds=progress_seconds,
        latency_gates=latency_gates,
    )
    return result


def deploy_inference_services(manifests: list[dict], **kwargs) -> list[dict]:
    """``deploy_inference_service`` for each of ``manifests`` in turn (keyword arguments as for it; the references
    by served name), all or none: when one fails (or the run is cancelled), every service this call changed
    before it is rolled back too (restored, or deleted when it was new), and the error says so.

    Returns:
        Each service's result, in order.
    """
    results: list[dict] = []
    undo: list[tuple[str, object]] = []
    try:
        for manifest in manifests:
            result, roll_back = _roll_out(manifest, **kwargs)
            results.append(result)
            undo.append(
                (f"{manifest['kind']} {manifest['metadata']['namespace']}/{manifest['metadata']['name']}", roll_back)
            )
    except BaseException as exc:
        undone = "; ".join(f"{what}: {roll_back()}" for what, roll_back in reversed(undo))  # type: ignore[operator]
        if not undone:
            raise
        if isinstance(exc, SystemExit):
            print(f"the run was cancelled (SIGTERM); also rolled back {undone}", flush=True)
            raise
        if isinstance(exc, (RuntimeError, TimeoutError, ValueError)):
            raise type(exc)(f"{exc}; the services deployed before it were rolled back too: {undone}") from exc
        raise
    return results


def _roll_out(
    manifest: dict,
    *,
    timeout_seconds: float = 1800.0,
    poll_seconds: float = 10.0,
    api_client=None,
    smoke_prompt: str = "Hello",
    pending_timeout_seconds: float = 900.0,
    serving_reference: dict | None = None,
    serving_references: dict[str, dict] | None = None,
    progress_seconds: float = PROGRESS_SECONDS,
    latency_gates: dict | None = None,
):
    """deploy_inference_service's work: its result, and a function that rolls the service back (for a later
    service's failure)."""
    model = manifest["spec"]["predictor"]["model"]
    rt = next((r for r in RUNTIMES.values() if r.runtime == model.get("runtime")), None)
    if rt is None:
        raise ValueError(f"runtime {model.get('runtime')!r} is not one of {[r.runtime for r in RUNTIMES.values()]}")
    # The runner's deadline bounds the rollout; on it the service is rolled back, not deleted (on_deadline below).
    runner = CustomResourceRunner(
        manifest,
        PLURAL,
        api_client=api_client,
        poll_seconds=poll_seconds,
        timeout_seconds=timeout_seconds,
        controller="KServe's controller",
    )
    core = k8s.CoreV1Api(runner.api_client)
    name, namespace, what = runner.name, runner.namespace, runner.what
    previous = runner.read()
    wanted_mode = manifest["metadata"].get("annotations", {}).get(DEPLOYMENT_MODE_ANNOTATION)
    if previous is not None and (running := _deployment_mode(previous)) and wanted_mode and running != wanted_mode:
        raise ValueError(
            f"InferenceService {namespace}/{name} runs in deployment mode {running}, and KServe cannot "
            f"change an existing service's mode to {wanted_mode}: pass deployment_mode={running!r}, "
            f"or delete it first (kubectl delete inferenceservice -n {namespace} {name})"
        )

    def roll_back() -> str:
        if previous is None:
            runner.delete("rolling back: it did not exist before this step")
            return "deleted the new InferenceService"
        runner.patch({"spec": merge_patch_to(runner.get()["spec"], previous["spec"])})
        return "restored the previous spec"

    def cancelled() -> None:
        # KFP cancelled the run mid-rollout: leave the service as it was before this step.
        print(f"the run was cancelled (SIGTERM); {what}: {roll_back()}", flush=True)

    with runner.cancel_on_sigterm(on_cancel=cancelled):
        # Create or update in place, never re-attach: a retried step must roll out this spec, whatever is there.
        if previous is None:
            applied = call_api(
                runner.custom.create_namespaced_custom_object, *runner.ref, manifest, retry_delay=runner.retry_delay
            )
            print(f"created {what}", flush=True)
        else:
            applied = runner.patch(
                {
                    "metadata": {key: manifest["metadata"].get(key, {}) for key in ("labels", "annotations")},
                    "spec": merge_patch_to(previous["spec"], manifest["spec"]),
                }
            )
            print(f"patched {what} (generation {applied['metadata'].get('generation')})", flush=True)
        try:
            isvc = _wait_ready(
                runner,
                core,
                generation=applied["metadata"].get("generation", 1),
                pending_timeout_seconds=pending_timeout_seconds,
                progress_seconds=progress_seconds,
            )
        except (RuntimeError, TimeoutError) as exc:
            raise type(exc)(f"{what} {exc}; {roll_back()}") from exc
        status, served = isvc["status"], _served_name(manifest, rt)
        names = served_names(manifest)
        references = dict(serving_references or {})
        if serving_reference is not None:
            references[served] = serving_reference
        canary = "canaryTrafficPercent" in manifest["spec"]["predictor"] and previous is not None
        base_url = _smoke_url(status, canary) + rt.openai_route
        replies: dict[str, str] = {}
        for name in names:  # every model the service answers to: the model itself, then each LoRA module
            try:
                replies[name] = chat_completion(base_url, name, smoke_prompt)
            except (RuntimeError, OSError) as exc:  # OSError: refused, reset, timed out
                label = "" if len(names) == 1 else f" for model {name!r}"
                raise RuntimeError(f"{what} is Ready but failed the smoke test{label}: {exc}; {roll_back()}") from exc
        checks: dict[str, dict] = {}
        for name in names:
            if name not in references:
                continue
            try:
                check = checks[name] = check_server(base_url, name, references[name])
            except (ServingMismatch, OSError) as exc:
                label = "" if name == served else f" as {name!r}"
                raise RuntimeError(
                    f"{what} is Ready but does not serve the evaluated model{label}: {exc}; {roll_back()}"
                ) from exc
            print(
                f"{what} serves the evaluated model{'' if name == served else f' as {name!r}'}: mean "
                f"|log-probability difference| {check['mean_abs_logprob_diff']:.4f} nats over {check['tokens']} "
                f"held-out tokens (tolerance {check['logprob_tolerance']}), {check['greedy_tokens_compared']} "
                "greedy tokens equal",
                flush=True,
            )
        latency = None
        if latency_gates is not None:
            try:
                latency = check_latency(base_url, served, **latency_gates)
            except TooSlow as exc:
                raise RuntimeError(f"{what} is Ready but too slow to serve: {exc}; {roll_back()}") from exc
            print(f"{what} latency: {describe_latency(latency)}", flush=True)
    print(
        f"{what} is Ready and answered the smoke test"
        + (f" as each of {names}" if len(names) > 1 else "")
        + (
            f" on its canary revision ({manifest['spec']['predictor']['canaryTrafficPercent']}% of traffic)"
            if canary
            else ""
        ),
        flush=True,
    )
    result: dict = {
        "endpoint": status["url"].rstrip("/") + rt.openai_route,
        "served_model_name": served,
        "smoke_reply": replies[served],
    }
    if latency is not None:
        result["latency"] = latency
    if served in checks:
        result["serving_check"] = checks[served]
    if len(names) > 1:
        result["replies"], result["serving_checks"] = replies, checks
    return result, roll_back


def served_names(manifest: dict) -> list[str]:
    """Every model name the InferenceService serves: its served name, then each LoRA module's (``lora_args``)."""
    model = manifest["spec"]["predictor"]["model"]
    rt = next(r for r in RUNTIMES.values() if r.runtime == model.get("runtime"))
    args = model.get("args", [])
    modules: list[str] = []
    if "--lora-modules" in args:
        for arg in args[args.index("--lora-modules") + 1 :]:
            if arg.startswith("--"):
                break
            modules.append(arg.split("=", 1)[0])
    return [_served_name(manifest, rt), *modules]


def _deployment_mode(isvc: dict) -> str | None:
    """The mode KServe runs ``isvc`` in (status first, as KServe decides), in current names; None if unknown."""
    mode = (isvc.get("status") or {}).get("deploymentMode") or (
        (isvc.get("metadata") or {}).get("annotations") or {}
    ).get(DEPLOYMENT_MODE_ANNOTATION)
    return LEGACY_DEPLOYMENT_MODES.get(mode, mode) if mode is not None else None


def _smoke_url(status: dict, canary: bool) -> str:
    """Where the smoke test goes: a canary's own revision (tag ``latest``, with tag routing), else the
    in-cluster address (this step runs in the cluster, where the external URL may not resolve)."""
    if canary:
        traffic = ((status.get("components") or {}).get("predictor") or {}).get("traffic") or []
        latest = next((t["url"] for t in traffic if t.get("tag") == "latest" and t.get("url")), None)
        if latest:
            return latest.rstrip("/")
    return ((status.get("address") or {}).get("url") or status["url"]).rstrip("/")


def _wait_ready(
    runner: CustomResourceRunner,
    core,
    *,
    generation: int,
    pending_timeout_seconds: float,
    progress_seconds: float = PROGRESS_SECONDS,
) -> dict:
    """The service once Ready for ``generation`` with a URL; RuntimeError for a pod that cannot start,
    TimeoutError past the runner's deadline (both without the service's name: the caller adds it and the rollback).
    Every ``progress_seconds`` of waiting it prints where the rollout is (``_progress``)."""
    unschedulable_since: dict = {}
    started = time.monotonic()
    reported = [started]

    def ready(isvc: dict) -> dict | None:
        if _ready(isvc, generation) and (isvc.get("status") or {}).get("url"):
            return isvc
        pods = call_api(
            core.list_namespaced_pod,
            runner.namespace,
            label_selector=f"{POD_LABEL}={runner.name}",
            retry_delay=runner.retry_delay,
        ).items
        if why := unstartable_pod_reason(pods, unschedulable_since, pending_timeout_seconds):
            raise RuntimeError(f"cannot start: {why}")
        now = time.monotonic()
        if now - reported[0] >= progress_seconds:
            reported[0] = now
            progress = _progress(core, runner, pods, isvc)
            print(f"{runner.what} is not Ready yet after {now - started:.0f}s: {progress}", flush=True)
        return None

    def not_ready(isvc: dict) -> None:
        raise TimeoutError(f"was not Ready after {runner.timeout_seconds:.0f}s: {_not_ready_reasons(isvc)}")

    return runner.follow(ready, on_deadline=not_ready)
