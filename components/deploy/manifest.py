"""The KServe InferenceService (serving.kserve.io/v1beta1) that serves the tuned model: its manifest, built from
an ``InferenceServiceSpec`` or from a run's settings (components/deploy/rollout.py rolls it out).

Two runtimes, both KServe ClusterServingRuntimes that read the model KServe mounts read-only at
``/mnt/models`` from ``storageUri: pvc://claim/path``:

- ``kserve-vllm``: ``kserve-vllmserver`` runs vLLM's own OpenAI server (``vllm.entrypoints.openai.api_server``),
  so its OpenAI routes are ``/v1/...``.
- ``kserve-huggingface``: ``kserve-huggingfaceserver``, KServe's model server with the vLLM backend, serves
  them under ``/openai/v1/...``.

KServe appends the InferenceService's ``args`` to the runtime's, so ours come last and win over the
runtime's defaults (``--served-model-name={{.Name}}`` / ``--model_name={{.Name}}``).

LoRA adapters of one base (components/deploy/serving_plan.py) are served by one ``kserve-vllm`` service without merging:
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
from dataclasses import dataclass

from components.deploy.serving_plan import SCALE_METRICS, lora_args
from components.kube import DNS1035_LABEL, RUN_ID_LABEL, egress_env
from components.paths import MODEL_MOUNT, pvc_uri
from components.security import container_security_context
from components.settings import DeploySettings, JobSettings, NetworkSettings, StorageSettings
from components.storage import parse_store_uri

GROUP, VERSION, PLURAL, KIND = "serving.kserve.io", "v1beta1", "inferenceservices", "InferenceService"
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


@dataclass(frozen=True, kw_only=True)
class InferenceServiceSpec:
    """What one InferenceService serves and how (``build_inference_service``), checked when made.

    Attributes:
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
            mode, canary percentage, LoRA setting, replica bounds or scale metric.
    """

    name: str
    namespace: str
    storage_uri: str
    runtime: str
    gpus: int
    max_model_len: int
    served_model_name: str
    node_selector: dict
    tolerations: list
    labels: dict | None = None
    deployment_mode: str = "Standard"
    canary_traffic_percent: int = 0
    lora_modules: list[tuple[str, str]] | None = None
    max_lora_rank: int = 16
    adapter_claim: str = ""
    min_replicas: int = 1
    max_replicas: int = 1
    scale_metric: str = "auto"
    scale_target: int = 0
    env: dict | None = None
    image_pull_secrets: list | None = None
    service_account: str = ""

    def __post_init__(self) -> None:
        _validate(self)


def _validate(spec: InferenceServiceSpec) -> None:
    """A ValueError naming the first field that KServe or vLLM would refuse, and the fix."""
    if not DNS1035_LABEL.match(spec.name) or len(spec.name) > 63:
        raise ValueError(
            f"name {spec.name!r} must be a DNS-1035 label (lowercase letters, digits, '-'; starts with a letter; <= 63)"
        )
    if spec.runtime not in RUNTIMES:
        raise ValueError(f"runtime {spec.runtime!r} is not one of {sorted(RUNTIMES)}")
    if spec.gpus < 1:
        raise ValueError(f"gpus must be >= 1 (vLLM's tensor-parallel size), got {spec.gpus}")
    if spec.max_model_len < 1:
        raise ValueError(f"max_model_len must be >= 1, got {spec.max_model_len}")
    if "://" not in spec.storage_uri:
        raise ValueError(f"storage_uri {spec.storage_uri!r} must be a URI such as pvc://claim/path")
    if not spec.served_model_name:
        raise ValueError("served_model_name must not be empty")
    mode = spec.deployment_mode
    if mode not in DEPLOYMENT_MODES:
        hint = f" (KServe's new name for {mode!r})" if mode in LEGACY_DEPLOYMENT_MODES else ""
        raise ValueError(
            f"deployment_mode {mode!r} is not one of {list(DEPLOYMENT_MODES)}; use "
            f"{LEGACY_DEPLOYMENT_MODES.get(mode, 'Standard')!r}{hint}"
        )
    if not 0 <= spec.canary_traffic_percent <= 99:
        raise ValueError(f"canary_traffic_percent must be 0 (no canary) to 99, got {spec.canary_traffic_percent}")
    if spec.canary_traffic_percent and mode != "Knative":
        raise ValueError(
            f"canary_traffic_percent={spec.canary_traffic_percent} needs deployment_mode='Knative' "
            "(Standard mode has one Deployment and no traffic split); set it to 0"
        )
    if spec.lora_modules and spec.runtime != "kserve-vllm":
        raise ValueError(
            f"lora_modules need runtime 'kserve-vllm' (vLLM's own server and its --lora-modules), not {spec.runtime!r}"
        )
    if spec.lora_modules and not spec.adapter_claim:
        raise ValueError("lora_modules need adapter_claim: the claim the adapters are on")
    if spec.min_replicas < (0 if mode == "Knative" else 1):
        raise ValueError(
            f"min_replicas must be >= 1 in {mode} mode (0, scale to zero, needs Knative), got {spec.min_replicas}"
        )
    if spec.max_replicas < max(spec.min_replicas, 1):
        raise ValueError(f"max_replicas ({spec.max_replicas}) must be >= min_replicas ({spec.min_replicas}) and >= 1")
    if spec.scale_metric != "auto" and spec.scale_metric not in SCALE_METRICS[mode]:
        raise ValueError(
            f"scale_metric {spec.scale_metric!r} is not 'auto' or one of {list(SCALE_METRICS[mode])}, what "
            f"KServe's {mode} mode autoscales on"
        )
    if spec.scale_target < 0:
        raise ValueError(f"scale_target must be >= 0 (0: KServe's default), got {spec.scale_target}")


def _model(spec: InferenceServiceSpec) -> dict:
    """The predictor's ``model``: the runtime, the model's URI and arguments, resources by GPU, the adapters' mount,
    a startup probe where the runtime has none, and the container's security context and environment."""
    rt = RUNTIMES[spec.runtime]
    gpus = spec.gpus
    resources = {"cpu": str(CPU_PER_GPU * gpus), "memory": f"{MEMORY_GI_PER_GPU * gpus}Gi", "nvidia.com/gpu": str(gpus)}
    model: dict = {
        "modelFormat": {"name": rt.model_format},
        "runtime": rt.runtime,
        "storageUri": spec.storage_uri,
        "args": _runtime_args(spec.runtime, gpus, spec.max_model_len, spec.served_model_name),
        "resources": {"requests": dict(resources), "limits": dict(resources)},  # two objects: no YAML anchors
    }
    if spec.lora_modules:
        model["args"] += lora_args(spec.lora_modules, spec.max_lora_rank)
        model["volumeMounts"] = [{"name": ADAPTER_VOLUME, "mountPath": ADAPTER_MOUNT, "readOnly": True}]
    if not rt.has_startup_probe:
        # Also keeps the pod un-Ready until the OpenAI route answers: the runtime has no readiness probe.
        model["startupProbe"] = {"httpGet": {"path": rt.openai_route + "/models", "port": 8080}, **STARTUP_PROBE}
    # The Pod Security Standards' `restricted` profile (components/security.py), whichever runtime serves, all of it
    # on the container: Knative (deployment_mode=Knative) refuses a pod-level securityContext unless its
    # kubernetes.podspec-securitycontext feature is on. vLLM's image runs as root unless told otherwise and its home
    # is not writable by another user, so HOME (vLLM's, Triton's and torch's caches) goes to /tmp.
    model["securityContext"] = container_security_context(user=True)
    model["env"] = [{"name": "HOME", "value": "/tmp"}] + [{"name": k, "value": v} for k, v in (spec.env or {}).items()]
    return model


def _predictor(spec: InferenceServiceSpec) -> dict:
    """The InferenceService's ``spec.predictor``: replicas and autoscaling, the model (``_model``), where its pods
    run and what they run as."""
    predictor: dict = {"minReplicas": spec.min_replicas, "maxReplicas": spec.max_replicas, "model": _model(spec)}
    if spec.lora_modules:
        # Knative (deployment_mode=Knative) admits a persistentVolumeClaim volume only with its config-features flag
        # kubernetes.podspec-persistent-volume-claim enabled (knative.dev/docs/serving/services/storage); read-only
        # needs no kubernetes.podspec-persistent-volume-write.
        predictor["volumes"] = [
            {"name": ADAPTER_VOLUME, "persistentVolumeClaim": {"claimName": spec.adapter_claim, "readOnly": True}}
        ]
    if spec.scale_metric != "auto":
        predictor["scaleMetric"] = spec.scale_metric
    if spec.scale_target:
        predictor["scaleTarget"] = spec.scale_target
    if spec.deployment_mode == "Knative":
        wait = STARTUP_PROBE["initialDelaySeconds"] + STARTUP_PROBE["failureThreshold"] * STARTUP_PROBE["periodSeconds"]
        predictor["annotations"] = {PROGRESS_DEADLINE_ANNOTATION: f"{wait}s"}
    if spec.canary_traffic_percent:
        predictor["canaryTrafficPercent"] = spec.canary_traffic_percent
    if spec.node_selector:
        predictor["nodeSelector"] = dict(spec.node_selector)
    if spec.tolerations:
        predictor["tolerations"] = list(spec.tolerations)
    # The server never calls the Kubernetes API: no token (Knative admits automountServiceAccountToken: false).
    predictor["automountServiceAccountToken"] = False
    if spec.image_pull_secrets:
        predictor["imagePullSecrets"] = [{"name": n} for n in spec.image_pull_secrets]
    if spec.service_account:
        predictor["serviceAccountName"] = spec.service_account
    return predictor


def build_inference_service(spec: InferenceServiceSpec) -> dict:
    """The InferenceService manifest (a plain dict) serving ``spec.storage_uri`` with one of ``RUNTIMES``."""
    annotations = {DEPLOYMENT_MODE_ANNOTATION: spec.deployment_mode}
    if spec.deployment_mode == "Standard" and spec.max_replicas > spec.min_replicas:
        annotations[AUTOSCALER_CLASS_ANNOTATION] = "hpa"  # KServe's default in this mode, named: the HPA scales it
    if spec.canary_traffic_percent:
        annotations[TAG_ROUTING_ANNOTATION] = "true"
    metadata = {"name": spec.name, "namespace": spec.namespace, "annotations": annotations}
    if spec.labels:
        metadata["labels"] = dict(spec.labels)
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": KIND,
        "metadata": metadata,
        "spec": {"predictor": _predictor(spec)},
    }


def served_from_store(deploy: DeploySettings, storage: StorageSettings, storage_uri: str) -> str:
    """``storage_uri`` (``pvc://<model_pvc>/<path>``), or the train step's uploaded copy of it when the model store
    serves (``model_store_uri`` and ``serving_service_account`` set; components/train/launcher/model_store.py uploads
    each final model to ``<model_store_uri>/<path>``). The URI is ``s3://`` for a ``gs://`` store too: KServe's storage
    initializer reads GCS's XML API with the HMAC keys of the account's Secret (its ``s3-endpoint`` annotation
    ``storage.googleapis.com``)."""
    claim = f"pvc://{storage.model_pvc}/"
    if not (storage.model_store_uri and deploy.serving_service_account and storage_uri.startswith(claim)):
        return storage_uri
    store = parse_store_uri(storage.model_store_uri).join(storage_uri.removeprefix(claim))
    return f"s3://{store.bucket}/{store.prefix}"


def store_settings(deploy: DeploySettings, storage: StorageSettings) -> dict:
    """The predictor's ServiceAccount when it serves from the model store (``served_from_store``)."""
    serving = bool(storage.model_store_uri and deploy.serving_service_account)
    return {"service_account": deploy.serving_service_account if serving else ""}


def _settings(deploy: DeploySettings, job: JobSettings, network: NetworkSettings, run_id: str) -> dict:
    """The ``InferenceServiceSpec`` fields every service of a run takes from its deploy, job and network settings
    (``components.settings``): the runtime and its size, the GPU nodes the job's selector names, the deployment mode
    and replicas, the run's label, the pull secrets and the proxy and Hub-mirror variables."""
    return dict(
        runtime=deploy.deploy_backend,
        gpus=deploy.serving_gpus,
        max_model_len=deploy.max_model_len,
        node_selector=job.node_selector,
        tolerations=job.tolerations,
        labels={RUN_ID_LABEL: run_id},
        deployment_mode=deploy.deployment_mode,
        canary_traffic_percent=deploy.canary_traffic_percent,
        min_replicas=deploy.min_replicas,
        max_replicas=deploy.max_replicas,
        scale_metric=deploy.scale_metric,
        scale_target=deploy.scale_target,
        env=egress_env(network),
        image_pull_secrets=list(job.image_pull_secrets),
    )


def inference_service_for_run(
    deploy: DeploySettings,
    job: JobSettings,
    network: NetworkSettings,
    storage: StorageSettings,
    *,
    run_id: str,
    namespace: str,
    storage_uri: str,
) -> dict:
    """The InferenceService of one KFP run from its deploy, job, network and storage settings
    (``components.settings``; the deploy step and ``--render`` call this): the predictor goes on the GPU nodes the
    job's selector names, and serves the model store's copy of ``storage_uri`` where the store serves
    (``served_from_store``)."""
    spec = InferenceServiceSpec(
        name=deploy.serving_name,
        namespace=namespace,
        storage_uri=served_from_store(deploy, storage, storage_uri),
        served_model_name=deploy.serving_name,
        **_settings(deploy, job, network, run_id),
        **store_settings(deploy, storage),
    )
    return build_inference_service(spec)


def base_storage_uri(server, claim: str, mount: str) -> str:
    """The ``storageUri`` of a LoRA server's base (``components.deploy.serving_plan.Server``): the folder on the model
    claim its adapters' stage started from, else the Hub id it was resolved from (``hf://``, KServe's storage
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
    servers,
    deploy: DeploySettings,
    job: JobSettings,
    network: NetworkSettings,
    storage: StorageSettings,
    *,
    run_id: str,
    namespace: str,
    mount: str | None = None,
) -> list[dict]:
    """One InferenceService per server of ``components.deploy.serving_plan.plan_servers``: a full model from its folder
    on the model claim; a LoRA server from its base (``base_storage_uri``) with the claim mounted read-only at
    ``ADAPTER_MOUNT`` and each adapter a LoRA module under its served name. ``mount``: where the deploy step
    mounts the model claim (``MODEL_MOUNT``)."""
    mount = mount or MODEL_MOUNT
    manifests = []
    for server in servers:
        named = dict(name=server.name, namespace=namespace, served_model_name=server.served_model_name)
        if not server.adapters:
            storage_uri = served_from_store(deploy, storage, pvc_uri(storage.model_pvc, mount, server.model_path))
            spec = InferenceServiceSpec(
                **named,
                storage_uri=storage_uri,
                **_settings(deploy, job, network, run_id),
                **store_settings(deploy, storage),
            )
            manifests.append(build_inference_service(spec))
            continue
        modules = [
            (a.served_model_name, os.path.join(ADAPTER_MOUNT, os.path.relpath(a.path, mount))) for a in server.adapters
        ]
        outside = [a.variant for a in server.adapters if os.path.relpath(a.path, mount).startswith("..")]
        if outside:
            raise ValueError(f"LoRA variants {outside}: their adapters are not on the model volume ({mount})")
        spec = InferenceServiceSpec(
            **named,
            storage_uri=base_storage_uri(server, storage.model_pvc, mount),
            lora_modules=modules,
            max_lora_rank=server.max_lora_rank(),
            adapter_claim=storage.model_pvc,
            **_settings(deploy, job, network, run_id),
        )
        manifests.append(build_inference_service(spec))
    return manifests


def runtime_of(manifest: dict) -> Runtime | None:
    """The ``RUNTIMES`` entry whose ClusterServingRuntime ``manifest``'s model names; None for another."""
    runtime = manifest["spec"]["predictor"]["model"].get("runtime")
    return next((r for r in RUNTIMES.values() if r.runtime == runtime), None)


def served_name(manifest: dict, rt: Runtime) -> str:
    """The name the service's model answers to: its served-name argument, else the service's name."""
    flag = rt.served_name_flag + "="
    named = [a[len(flag) :] for a in manifest["spec"]["predictor"]["model"].get("args", []) if a.startswith(flag)]
    return named[-1] if named else manifest["metadata"]["name"]  # the runtimes default to the service name


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
    return [served_name(manifest, rt), *modules]
