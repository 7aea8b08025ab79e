"""Cluster preflight: will this run's jobs be able to start here? Checked before any GPU is requested.

    problems = preflight(params)   # [] when the cluster is ready for these parameters

What it checks, each failure one message naming the fix:
- the APIs the backends use are installed (PyTorchJob or TrainJob; InferenceService for KServe), by API
  discovery, which every authenticated user may read;
- both claims exist, are Bound and ReadWriteMany (the job's pods on several nodes mount them at once);
- the Hugging Face token Secret has key ``HF_TOKEN`` (a missing Secret is only a warning: public models
  need no token, and the pods reference it as optional);
- with ``train_backend=trainjob``, which Kubeflow Trainer release serves the TrainJob (from the schema the API
  server publishes, components/train/launcher/trainjob.py), and that the settings need nothing it lacks
  (Trainer v2.1 has no ``activeDeadlineSeconds``); that the ClusterTrainingRuntime ``trainjob_runtime`` names
  exists, and with ``gang_scheduling`` that it gang-schedules (``spec.podGroupPolicy``: coscheduling or Volcano);
- with ``hpo_trials > 0``, that the namespace carries Katib's metrics-collector injection label (without it every
  trial's job succeeds, no metric is recorded and Katib requeues the trial forever);
- this service account may do what the launcher and the deployer do (SelfSubjectAccessReview), and with
  ``tensorboard`` what the run's TensorBoard needs: create the Kubeflow Tensorboard where its controller is installed,
  else create and delete the Deployment and Service that stand in for it (one message naming ``tensorboard``); and
  with a grpo stage that generates on its own vLLM server (vllm-server, no ``grpo_vllm_server_url``) what the train
  step does with it: create, read and delete its ConfigMap, Deployment and Service;
- with ``model_store_uri``, that the store takes ``model_store_secret``'s keys (a HEAD on the bucket; locally, and
  with no Secret named, the credentials of this process: its environment or role), run before anything else
  (``store_problem``: a local run checks it too);
- enough schedulable nodes match the node selector, tolerate their taints and have ``gpus_per_node``
  allocatable ``nvidia.com/gpu`` (Nodes are cluster-scoped: without a ClusterRole to list them this
  check is skipped with a warning).
"""

from __future__ import annotations

import base64
import logging

from kubernetes import client as k8s
from kubernetes.client.rest import ApiException

from components.kube import call_api, current_namespace, load_api_client
from components.observe import tensorboard
from components.secrets import HF_TOKEN_KEY, JUDGE_API_KEY, LANGFUSE_KEYS, WEBHOOK_SECRET_KEY
from components.settings import Settings
from components.stages import stage_cluster, stage_setting_name, stage_train_settings
from components.variants import variant_names, variant_values

log = logging.getLogger(__name__)

# (group, version, plural, what installs it) per backend.
TRAIN_APIS = {
    "pytorchjob": ("kubeflow.org", "v1", "pytorchjobs", "the Kubeflow Training Operator (v1)"),
    "trainjob": ("trainer.kubeflow.org", "v1alpha1", "trainjobs", "Kubeflow Trainer (v2)"),
}
SERVING_API = ("serving.kserve.io", "v1beta1", "inferenceservices", "KServe")

# What the launcher (components/train/launcher/job.py) and deployer (components/deploy/inference_service.py)
# call, as (verb, group, resource, subresource); manifests/rbac/role.yaml grants exactly these.
# Every training job's NetworkPolicy (components/train/launcher/job.py::trainer_network): created before the job,
# deleted after it (read first by the exit handler, which deletes only what carries the run's id).
JOB_NETWORK_ACCESS = [
    ("create", "networking.k8s.io", "networkpolicies", ""),
    ("get", "networking.k8s.io", "networkpolicies", ""),
    ("delete", "networking.k8s.io", "networkpolicies", ""),
]
LAUNCHER_ACCESS = {
    "pytorchjob": [
        ("create", "kubeflow.org", "pytorchjobs", ""),
        ("get", "kubeflow.org", "pytorchjobs", ""),
        ("delete", "kubeflow.org", "pytorchjobs", ""),
        *JOB_NETWORK_ACCESS,
    ],
    "trainjob": [
        ("create", "trainer.kubeflow.org", "trainjobs", ""),
        ("get", "trainer.kubeflow.org", "trainjobs", ""),
        ("delete", "trainer.kubeflow.org", "trainjobs", ""),
        *JOB_NETWORK_ACCESS,
    ],
}
POD_ACCESS = [("list", "", "pods", ""), ("get", "", "pods", "log")]
# The train step creates the run's Tensorboard (components/observe/tensorboard.py) when `tensorboard` is on.
TENSORBOARD_ACCESS = [("create", "tensorboard.kubeflow.org", "tensorboards", "")]
# Without Kubeflow's Tensorboard controller it creates a Deployment and a Service instead, and the exit handler
# deletes them.
TENSORBOARD_SERVER_ACCESS = [
    ("create", "apps", "deployments", ""),
    ("get", "apps", "deployments", ""),  # the exit handler reads each object's run label before deleting it
    ("delete", "apps", "deployments", ""),
    ("create", "", "services", ""),
    ("get", "", "services", ""),
    ("delete", "", "services", ""),
]
# The grpo stage's own vLLM server (components/train/launcher/vllm_server.py): the train step creates it, reads its
# Deployment until it is ready (and lists its pods: POD_ACCESS), deletes it, and so may the exit handler.
GRPO_SERVER_ACCESS = [
    ("create", "networking.k8s.io", "networkpolicies", ""),
    ("get", "networking.k8s.io", "networkpolicies", ""),
    ("delete", "networking.k8s.io", "networkpolicies", ""),
    ("create", "", "configmaps", ""),
    ("get", "", "configmaps", ""),
    ("delete", "", "configmaps", ""),
    ("create", "apps", "deployments", ""),
    ("get", "apps", "deployments", ""),
    ("delete", "apps", "deployments", ""),
    ("create", "", "services", ""),
    ("get", "", "services", ""),
    ("delete", "", "services", ""),
    ("create", "", "secrets", ""),  # the server's token, owned by its NetworkPolicy (vllm_server.weight_sync_secret)
]
# The search step (components/hpo/follow.py) when hpo_trials > 0: its Experiment and the Experiment's Trials.
SEARCH_ACCESS = [
    ("create", "kubeflow.org", "experiments", ""),
    ("get", "kubeflow.org", "experiments", ""),
    ("delete", "kubeflow.org", "experiments", ""),
    ("list", "kubeflow.org", "trials", ""),
]
DEPLOYER_ACCESS = [
    ("create", "serving.kserve.io", "inferenceservices", ""),
    ("get", "serving.kserve.io", "inferenceservices", ""),
    ("patch", "serving.kserve.io", "inferenceservices", ""),
    ("delete", "serving.kserve.io", "inferenceservices", ""),
]
GPU = "nvidia.com/gpu"
# Katib's pod webhook injects the metrics collector only into pods of namespaces labelled so.
KATIB_INJECTION_LABEL, KATIB_INJECTION_VALUE = "katib.kubeflow.org/metrics-collector-injection", "enabled"
# The Pod Security Admission label a namespace enforces a profile with.
PSS_ENFORCE_LABEL = "pod-security.kubernetes.io/enforce"


def _missing_api(custom: k8s.CustomObjectsApi, group: str, version: str, plural: str, what: str) -> str | None:
    try:
        resources = call_api(custom.get_api_resources, group, version).resources
    except ApiException as exc:
        if exc.status != 404:
            raise
        resources = []
    if any(r.name == plural for r in resources):
        return None
    return f"{plural}.{group}/{version} is not served by this cluster: install {what}"


def _claim_problem(core: k8s.CoreV1Api, namespace: str, field: str, name: str) -> str | None:
    try:
        pvc = call_api(core.read_namespaced_persistent_volume_claim, name, namespace)
    except ApiException as exc:
        if exc.status == 404:
            return (
                f"{field}={name!r}: PersistentVolumeClaim not found in namespace {namespace}; create it "
                "(manifests/ has a ReadWriteMany claim: kubectl apply -k manifests/)"
            )
        if exc.status == 403:
            return f"{field}={name!r}: may not read PersistentVolumeClaims in {namespace}; apply manifests/rbac"
        raise
    phase = pvc.status.phase if pvc.status else None
    modes = (pvc.status.access_modes if pvc.status and pvc.status.access_modes else pvc.spec.access_modes) or []
    if "ReadWriteMany" not in modes:
        return (
            f"{field}={name!r} has access modes {', '.join(modes) or 'none'}: the job's pods on several nodes "
            "mount it at once, so it must be ReadWriteMany (use an RWX storage class: NFS, CephFS, "
            "a CSI file store)"
        )
    if phase != "Bound":
        return (
            f"{field}={name!r} is {phase}, not Bound: its storage class cannot provision it "
            f"(kubectl describe pvc {name} -n {namespace})"
        )
    return None


# What each optional Secret's key holds, for its message.
_WHAT_KEY = {HF_TOKEN_KEY: "token", JUDGE_API_KEY: "judge's API key"}


def _secret_problem(core: k8s.CoreV1Api, namespace: str, field: str, name: str, key: str, why: str) -> str | None:
    """The problem with the optional Secret ``name`` (setting ``field``) when it exists without a non-empty ``key``;
    a missing Secret (or one the runner may not read) only warns: the pods' references are optional."""
    try:
        secret = call_api(core.read_namespaced_secret, name, namespace)
    except ApiException as exc:
        if exc.status == 404:
            log.warning(
                "%s=%r: Secret not found in %s; %s (kubectl create secret generic %s --from-literal=%s=...)",
                field,
                name,
                namespace,
                why,
                name,
                key,
            )
            return None
        if exc.status == 403:
            log.warning("%s=%r: may not read it to check its key (see manifests/rbac)", field, name)
            return None
        raise
    data = secret.data or {}
    if key not in data:
        return (
            f"{field}={name!r} has no key {key} (it has: {', '.join(sorted(data)) or 'none'}); "
            f"the pods read the {_WHAT_KEY.get(key, 'webhook URL')} from that key"
        )
    if not base64.b64decode(data[key]).strip():
        return f"{field}={name!r}: key {key} is empty"
    return None


# The Secret type of registry credentials, what the kubelet reads from a pod's imagePullSecrets
# (kubectl create secret docker-registry makes one).
DOCKER_CONFIG_JSON = "kubernetes.io/dockerconfigjson"


def _pull_secret_problem(core: k8s.CoreV1Api, namespace: str, name: str) -> str | None:
    """The problem with one of ``image_pull_secrets``: missing, or not registry credentials. Unlike the optional
    references above, a missing pull Secret leaves every pod in ImagePullBackOff (the kubelet pulls without it)."""
    fix = f"kubectl create secret docker-registry {name} -n {namespace} --docker-server=... --docker-username=..."
    try:
        secret = call_api(core.read_namespaced_secret, name, namespace)
    except ApiException as exc:
        if exc.status == 404:
            return f"image_pull_secrets: Secret {name!r} not found in {namespace}; create it ({fix}) or remove it"
        if exc.status == 403:
            log.warning("image_pull_secrets: may not read Secret %r to check it (see manifests/rbac)", name)
            return None
        raise
    if secret.type != DOCKER_CONFIG_JSON:
        return (
            f"image_pull_secrets: Secret {name!r} is of type {secret.type or 'Opaque'}, not {DOCKER_CONFIG_JSON}: "
            f"the kubelet cannot pull with it; re-create it ({fix})"
        )
    return None


# The key each tracker's transformers callback cannot do without, read from tracking_secret by the training pods
# (components/train/launcher/pods.py: TRACKING_KEYS, optional references).
TRACKER_KEYS = {"mlflow": "MLFLOW_TRACKING_URI", "wandb": "WANDB_API_KEY"}


def _tracking_problem(core: k8s.CoreV1Api, namespace: str, name: str, report_to: list[str]) -> str | None:
    """The problem with ``tracking_secret`` when ``report_to`` names mlflow or wandb: the Secret must exist and hold
    each named tracker's key. Unlike the optional Secrets above it is an error: the pods' references are optional,
    so without it the run would fail in the pods at the tracker's first call."""
    needed = {tracker: key for tracker, key in TRACKER_KEYS.items() if tracker in report_to}
    if not needed:
        return None
    trackers = " and ".join(needed)
    try:
        secret = call_api(core.read_namespaced_secret, name, namespace)
    except ApiException as exc:
        if exc.status == 404:
            keys = " ".join(f"--from-literal={key}=..." for key in needed.values())
            return (
                f"tracking_secret={name!r}: Secret not found in {namespace}; report_to names {trackers}, whose "
                f"callback reads its address or key from it (kubectl create secret generic {name} {keys})"
            )
        if exc.status == 403:
            log.warning("tracking_secret=%r: may not read it to check its keys (see manifests/rbac)", name)
            return None
        raise
    data = secret.data or {}
    for tracker, key in needed.items():
        if key not in data or not base64.b64decode(data[key]).strip():
            return (
                f"tracking_secret={name!r} has no key {key} (it has: {', '.join(sorted(data)) or 'none'}); "
                f"report_to names {tracker}, whose callback reads it"
            )
    return None


def _langfuse_problem(core: k8s.CoreV1Api, namespace: str, name: str) -> str | None:
    """The problem with the optional Langfuse Secret ``name`` when it exists without all of ``LANGFUSE_KEYS``, each
    non-empty; a missing Secret (or one the runner may not read) only warns, as for the alert Secret."""
    try:
        secret = call_api(core.read_namespaced_secret, name, namespace)
    except ApiException as exc:
        if exc.status in (403, 404):
            why = (
                f"Secret not found in {namespace}"
                if exc.status == 404
                else "may not read it to check its keys (see manifests/rbac)"
            )
            log.warning(
                "langfuse_secret=%r: %s; runs are not traced in Langfuse (kubectl create secret generic %s %s)",
                name,
                why,
                name,
                " ".join(f"--from-literal={k}=..." for k in LANGFUSE_KEYS),
            )
            return None
        raise
    data = secret.data or {}
    if missing := [k for k in LANGFUSE_KEYS if k not in data]:
        return (
            f"langfuse_secret={name!r} has no key {', '.join(missing)} (it has: {', '.join(sorted(data)) or 'none'}"
            f"); the pods read Langfuse's keys and address from {', '.join(LANGFUSE_KEYS)}"
        )
    for key in LANGFUSE_KEYS:
        if not base64.b64decode(data[key]).strip():
            return f"langfuse_secret={name!r}: key {key} is empty"
    return None


def store_problem(s: Settings, core: k8s.CoreV1Api | None = None, namespace: str = "") -> str | None:
    """The problem with ``model_store_uri`` and its credentials, or None (also None when no store is set): the
    bucket URI must parse, ``model_store_secret`` (read through ``core`` on a cluster) must hold the store's keys, and
    the store must take them (a HEAD on the bucket). Locally, or with no Secret named, the credentials are this
    process's own (environment variables, ``~/.aws``, the pod's role). Checked before any GPU is requested."""
    from components import storage

    c = s.cluster
    if not c.model_store_uri:
        return None
    try:
        uri = storage.parse_store_uri(c.model_store_uri)
    except ValueError as exc:
        return str(exc)
    credentials, who = None, "model_store_secret is empty, and the credentials of this process"
    if c.model_store_secret and core is not None:
        try:
            credentials = storage.secret_credentials(core, c.model_store_secret, namespace)
        except ValueError as exc:
            return str(exc)
        who = f"model_store_secret={c.model_store_secret!r}"
    elif c.model_store_secret:
        who = f"model_store_secret={c.model_store_secret!r} is for a cluster; locally the environment's keys"
    return storage.access_problem(uri, c.model_store_endpoint, credentials, who=who)


def _namespace_labels(core: k8s.CoreV1Api, namespace: str) -> dict | None:
    """The namespace's labels; None (with a warning) when this account may not read its namespace."""
    try:
        return call_api(core.read_namespace, namespace).metadata.labels or {}
    except ApiException as exc:
        if exc.status == 404:  # the claims' checks name the missing namespace
            return None
        if exc.status != 403:
            raise
        log.warning(
            "may not read namespace %s to check its labels: apply manifests/rbac (kubectl apply -k "
            "manifests/) for the pipeline runner",
            namespace,
        )
        return None


def _katib_injection_problem(labels: dict | None, namespace: str) -> str | None:
    fix = f"kubectl label namespace {namespace} {KATIB_INJECTION_LABEL}={KATIB_INJECTION_VALUE}"
    if labels is None:
        log.warning(
            "hpo_trials > 0: could not check that namespace %s has the label %s=%s, without which Katib "
            "records no metric and every trial runs forever; if it lacks it: %s",
            namespace,
            KATIB_INJECTION_LABEL,
            KATIB_INJECTION_VALUE,
            fix,
        )
        return None
    if labels.get(KATIB_INJECTION_LABEL) == KATIB_INJECTION_VALUE:
        return None
    found = f" (it is {labels[KATIB_INJECTION_LABEL]!r})" if KATIB_INJECTION_LABEL in labels else ""
    return (
        f"hpo_trials > 0: namespace {namespace} lacks the label {KATIB_INJECTION_LABEL}={KATIB_INJECTION_VALUE}"
        f"{found}, so Katib injects no metrics collector: every trial's job would succeed with no metric "
        f"recorded and Katib would requeue the trial forever; add it: {fix}"
    )


def _trainer_problem(api_client, active_deadline_seconds: int, labels) -> str | None:
    """What the installed Trainer cannot do for these settings (``labels``: a function returning the namespace's)."""
    from components.train.launcher import trainjob

    try:
        version = trainjob.installed_trainer_version(api_client)
    except RuntimeError as exc:
        return f"train_backend=trainjob: {exc}"
    log.info(
        "train_backend=trainjob: %s (TrainJob spec.%s)",
        trainjob.TRAINER_NAMES[version],
        trainjob.POD_PATCH_FIELDS[version],
    )
    if version != trainjob.TRAINER_V2_1:
        return None
    log.warning(
        "Trainer v2.1: the TrainJob cannot set its pods' grace period or security context, so they get the "
        "ClusterTrainingRuntime's: an evicted pod may be killed before its checkpoint is saved, and a "
        "namespace enforcing the Pod Security Standards' restricted profile admits the pods only if the "
        "runtime sets it; Trainer v2.2 or later, or train_backend=pytorchjob, sets both"
    )
    if (labels() or {}).get(PSS_ENFORCE_LABEL) == "restricted":
        log.warning(
            "the namespace enforces the restricted Pod Security Standard: unless the ClusterTrainingRuntime "
            "gives its pods a restricted security context, Trainer v2.1's TrainJob pods will be refused"
        )
    return trainjob.unsupported_deadline(active_deadline_seconds) if active_deadline_seconds else None


def _runtime_problem(api_client, c) -> str | None:
    """The problem with ``trainjob_runtime``: no ClusterTrainingRuntime by that name, or (``gang_scheduling``) one
    without a ``podGroupPolicy``. The TrainJob cannot ask for gang scheduling itself: in Trainer v2 it is the
    runtime's. Runtimes are cluster-scoped: an account that may not list them gets a warning, not a failure."""
    from components.train.launcher import trainjob

    field = f"trainjob_runtime={c.trainjob_runtime!r}"
    try:
        runtimes = trainjob.cluster_runtimes(api_client)
    except ApiException as exc:
        if exc.status not in (403, 404):
            raise
        why = (
            "may not list the ClusterTrainingRuntimes (grant list on clustertrainingruntimes.trainer.kubeflow.org)"
            if exc.status == 403
            else "the API server serves no ClusterTrainingRuntimes (is Kubeflow Trainer fully installed?)"
        )
        log.warning("%s: %s: neither the runtime nor its gang scheduling is checked", field, why)
        return None
    runtime = runtimes.get(c.trainjob_runtime)
    if runtime is None:
        return (
            f"{field}: this cluster has no ClusterTrainingRuntime of that name (it has: "
            f"{', '.join(sorted(runtimes)) or 'none'}); name one of them, or install it "
            "(kubectl get clustertrainingruntimes)"
        )
    plugin = trainjob.runtime_gang_plugin(runtime)
    log.info("%s: gang scheduling %s", field, f"by {plugin}" if plugin else "none (no spec.podGroupPolicy)")
    if c.gang_scheduling and not plugin:
        return (
            f"gang_scheduling=true with train_backend=trainjob: the ClusterTrainingRuntime {c.trainjob_runtime} has "
            "no spec.podGroupPolicy, and Trainer v2 gang-schedules only through the runtime's; add "
            f"podGroupPolicy (coscheduling or volcano) to it, name a runtime that has one in trainjob_runtime, use "
            "Kueue (queue_name), or set gang_scheduling=false"
        )
    return None


def _access_problems(authz: k8s.AuthorizationV1Api, namespace: str, wanted: list[tuple]) -> list[str]:
    problems = []
    for verb, group, resource, subresource in wanted:
        review = k8s.V1SelfSubjectAccessReview(
            spec=k8s.V1SelfSubjectAccessReviewSpec(
                resource_attributes=k8s.V1ResourceAttributes(
                    namespace=namespace, verb=verb, group=group, resource=resource, subresource=subresource or None
                )
            )
        )
        if not call_api(authz.create_self_subject_access_review, review).status.allowed:
            what = f"{resource}/{subresource}" if subresource else resource
            problems.append(
                f"this service account may not {verb} {what}{'.' + group if group else ''} in {namespace}: "
                "apply manifests/rbac (kubectl apply -k manifests/) for the pipeline runner"
            )
    return problems


def _tensorboard_problem(authz: k8s.AuthorizationV1Api, namespace: str) -> str | None:
    """Without Kubeflow's Tensorboard controller: whether this account may create and delete the Deployment and
    Service that serve the run's TensorBoard instead (components/observe/tensorboard.py); one message for all."""
    if not (denied := _access_problems(authz, namespace, TENSORBOARD_SERVER_ACCESS)):
        return None
    what = ", ".join(p.removeprefix("this service account may not ").partition(" in ")[0] for p in denied)
    return (
        "tensorboard=true: this cluster serves no tensorboards.tensorboard.kubeflow.org (no Kubeflow Tensorboard "
        "controller), so the train step serves TensorBoard from a Deployment and a Service and the exit handler "
        f"deletes them, but this service account may not {what} in {namespace}: apply manifests/rbac (kubectl "
        "apply -k manifests/) for the pipeline runner, or set tensorboard=false"
    )


def _tolerates(tolerations: list, taint: dict) -> bool:
    for tol in tolerations:
        if tol.get("effect") and tol["effect"] != taint.get("effect"):
            continue
        if tol.get("operator") == "Exists":
            if not tol.get("key") or tol["key"] == taint.get("key"):
                return True
        elif tol.get("key") == taint.get("key") and tol.get("value", "") == taint.get("value", ""):
            return True
    return False


def _usable_nodes(
    core: k8s.CoreV1Api, node_selector: dict, tolerations: list, gpus_per_node: int, also: dict | None = None
) -> tuple[dict[str, int], int] | None:
    """The schedulable nodes matching ``node_selector`` whose taints ``tolerations`` tolerate and that have
    ``gpus_per_node`` allocatable GPUs (and ``also``: resource -> count), with those GPUs, and how many nodes
    matched; None when Nodes may not be listed (a warning is logged)."""
    selector = ",".join(f"{k}={v}" for k, v in sorted(node_selector.items()))
    try:
        nodes = call_api(core.list_node, label_selector=selector or None).items
    except ApiException as exc:
        if exc.status != 403:
            raise
        log.warning(
            "may not list Nodes (cluster-scoped): GPU capacity not checked; a cluster admin can "
            "grant it with kubectl apply -k manifests/cluster"
        )
        return None
    usable = {}
    for node in nodes:
        taints = [t.to_dict() for t in node.spec.taints or [] if t.effect in ("NoSchedule", "NoExecute")]
        allocatable = node.status.allocatable or {}
        gpus = int(allocatable.get(GPU, "0"))
        offers = all(int(allocatable.get(name, "0")) >= count for name, count in (also or {}).items())
        if (
            not node.spec.unschedulable
            and gpus >= gpus_per_node
            and offers
            and all(_tolerates(tolerations, t) for t in taints)
        ):
            usable[node.metadata.name] = gpus
    return usable, len(nodes)


def _gpu_node_problem(
    core: k8s.CoreV1Api,
    node_selector: dict,
    tolerations: list,
    num_nodes: int,
    gpus_per_node: int,
    names: tuple[str, str] = ("num_nodes", "gpus_per_node"),
) -> str | None:
    """Whether ``num_nodes`` of the nodes the job may use offer ``gpus_per_node`` allocatable GPUs each; ``names``:
    the settings that give the job its nodes and GPUs (a stage's own: ``stage_settings.<stage>.gpus_per_node``)."""
    found = _usable_nodes(core, node_selector, tolerations, gpus_per_node)
    if found is None or len(found[0]) >= num_nodes:
        return None
    usable, matched = found
    where = f"matching node_selector {node_selector}" if node_selector else "in the cluster"
    nodes_name, gpus_name = names
    return (
        f"{nodes_name}={num_nodes} x {gpus_name}={gpus_per_node}: only {len(usable)} of {matched} nodes "
        f"{where} are schedulable, tolerated and have >= {gpus_per_node} allocatable {GPU}; "
        f"check node_selector, tolerations and {gpus_name} against kubectl get nodes -L nvidia.com/gpu.product"
    )


def _job_shapes(s: Settings) -> list[tuple[int, int, tuple[str, str]]]:
    """The training jobs the run creates, once per shape: ``(num_nodes, gpus_per_node, the settings that give
    them)``, each stage with its own nodes and GPUs (``stage_settings``) over the run's."""
    shapes: dict = {}
    for stage in s.stages.stages or ["sft"]:
        c = stage_cluster(s, stage)
        names = (stage_setting_name(s, stage, "num_nodes"), stage_setting_name(s, stage, "gpus_per_node"))
        shapes.setdefault((c.num_nodes, c.gpus_per_node, names), None)
    return list(shapes)


def _training_gpu_problems(core: k8s.CoreV1Api, s: Settings) -> list[str | None]:
    """Each training job's nodes (``_job_shapes``) against the GPU nodes the job may use."""
    c = s.cluster
    return [_gpu_node_problem(core, c.node_selector, c.tolerations, m, g, names) for m, g, names in _job_shapes(s)]


def _rdma_node_problem(core: k8s.CoreV1Api, c) -> str | None:
    """Whether ``num_nodes`` of the GPU nodes the job may use offer ``rdma_per_pod`` of ``rdma_resource``: a pod
    requesting a resource no node advertises stays Pending for ever."""
    gpu_nodes = _usable_nodes(core, c.node_selector, c.tolerations, c.gpus_per_node)
    found = _usable_nodes(core, c.node_selector, c.tolerations, c.gpus_per_node, {c.rdma_resource: c.rdma_per_pod})
    if gpu_nodes is None or found is None or len(found[0]) >= c.num_nodes or len(gpu_nodes[0]) < c.num_nodes:
        return None  # Nodes unreadable (warned), or too few GPU nodes at all (that problem is named on its own)
    return (
        f"rdma_resource={c.rdma_resource} x rdma_per_pod={c.rdma_per_pod}: only {len(found[0])} of the "
        f"{len(gpu_nodes[0])} GPU nodes the job may use offer it (allocatable), and num_nodes={c.num_nodes}; "
        "install the cluster's RDMA device plugin, correct the name (kubectl get nodes -o "
        "jsonpath='{.items[*].status.allocatable}'), or leave rdma_resource empty to run NCCL over TCP"
    )


# Pod Security levels that forbid adding IPC_LOCK: baseline allows only its short list of capabilities
# (AUDIT_WRITE ... SYS_CHROOT), restricted only NET_BIND_SERVICE (kubernetes.io/docs/concepts/security/
# pod-security-standards, "Capabilities").
IPC_LOCK_FORBIDDEN = ("baseline", "restricted")


def _ipc_lock_problem(labels: dict | None, namespace: str) -> str | None:
    level = (labels or {}).get(PSS_ENFORCE_LABEL, "")
    if level not in IPC_LOCK_FORBIDDEN:
        return None
    return (
        f"ipc_lock=true: namespace {namespace} enforces the {level} Pod Security Standard ({PSS_ENFORCE_LABEL}), "
        "which rejects pods adding the IPC_LOCK capability; run the job in a namespace labelled "
        f"{PSS_ENFORCE_LABEL}=privileged, or set ipc_lock=false (NCCL then cannot pin memory for InfiniBand)"
    )


def _variant_gpu_problems(core: k8s.CoreV1Api, params: dict) -> list[str | None]:
    """Each variant's nodes, as for a run, and the GPUs of the ``variants_parallel`` largest variants together
    against the allocatable GPUs of the nodes the variants may use (components/variants.py)."""
    variants = params.get("variants") or []
    names = variant_names(variants)
    problems: list[str | None] = []
    nodes: dict[str, int] = {}
    sizes = []
    for i, name in enumerate(names):
        own = Settings.from_flat(variant_values(params, i))
        c, shapes = own.cluster, _job_shapes(own)
        problems += [p and f"variants[{i}] ({name!r}): {p}" for p in _training_gpu_problems(core, own)]
        found = _usable_nodes(core, c.node_selector, c.tolerations, min(g for _, g, _ in shapes))
        if found is None:
            return problems
        nodes.update(found[0])
        sizes.append((max(m * g for m, g, _ in shapes), name))  # its largest stage's job
    at_once = Settings.from_flat(params).variants.variants_parallel
    largest = sorted(sizes, reverse=True)[:at_once]
    wanted, have = sum(g for g, _ in largest), sum(nodes.values())
    if at_once > 1 and wanted > have:
        who = ", ".join(f"{n!r} ({g})" for g, n in largest)
        problems.append(
            f"variants_parallel={at_once} trains up to {at_once} variants at once, and {who} hold "
            f"{wanted} {GPU} together; the nodes they may use have {have} allocatable: lower "
            "variants_parallel, or num_nodes / gpus_per_node of the largest variants"
        )
    return problems


def preflight(params: dict, api_client=None, namespace: str | None = None) -> list[str]:
    """Every reason this cluster cannot run the pipeline with ``params`` (empty when it can).

    Args:
        params: the run's settings by name (missing ones take their defaults), read through the settings model:
            the backends, claims, Secrets, node count, GPUs per node, node selector and tolerations, and whether
            a Tensorboard or a search runs.
        api_client: a ``kubernetes.client.ApiClient``; default: in-cluster config, else kubeconfig.
        namespace: where the run's jobs go; default: this pod's namespace.

    Returns:
        One message per problem, each naming the parameter or resource and the fix. Warnings (an absent
        optional Secret, Nodes or the namespace that may not be read, what Trainer v2.1 cannot set) are logged,
        not returned.
    """
    s = Settings.from_flat(params)
    c = s.cluster
    train, deploy = c.train_backend, s.deploy.deploy_backend
    if train == "local" and deploy == "local":
        return [p for p in [store_problem(s)] if p]
    api_client = api_client or load_api_client()
    namespace = namespace or current_namespace()
    custom, core = k8s.CustomObjectsApi(api_client), k8s.CoreV1Api(api_client)
    authz = k8s.AuthorizationV1Api(api_client)
    problems: list = [store_problem(s, core if train in TRAIN_APIS else None, namespace)]
    wanted: list = []
    read: dict = {}

    def labels() -> dict | None:  # the namespace's, read once, when a check needs them
        if "labels" not in read:
            read["labels"] = _namespace_labels(core, namespace)
        return read["labels"]

    if train in TRAIN_APIS:
        missing = _missing_api(custom, *TRAIN_APIS[train])
        problems.append(missing)
        if train == "trainjob" and missing is None:
            problems.append(_trainer_problem(api_client, c.active_deadline_seconds, labels))
            problems.append(_runtime_problem(api_client, c))
        wanted += LAUNCHER_ACCESS[train] + POD_ACCESS
        if c.tensorboard:  # the Tensorboard where Kubeflow's controller serves it, else a Deployment and Service
            if tensorboard.served(api_client):
                wanted += TENSORBOARD_ACCESS
            else:
                problems.append(_tensorboard_problem(authz, namespace))
        if "grpo" in s.stages.stages:
            from components.train.launcher.vllm_server import runs_own_server

            if runs_own_server("grpo", stage_train_settings(s, "grpo", s.train.model_name_or_path), c):
                wanted += GRPO_SERVER_ACCESS
        if s.hpo.hpo_trials:
            problems.append(_missing_api(custom, "kubeflow.org", "v1beta1", "experiments", "Katib"))
            problems.append(_katib_injection_problem(labels(), namespace))
            wanted += SEARCH_ACCESS
    if deploy.startswith("kserve"):
        problems.append(_missing_api(custom, *SERVING_API))
        wanted += DEPLOYER_ACCESS + [("list", "", "pods", "")]  # it waits on the predictor's pods
    problems.append(_claim_problem(core, namespace, "data_pvc", c.data_pvc))
    problems.append(_claim_problem(core, namespace, "model_pvc", c.model_pvc))
    problems += [_pull_secret_problem(core, namespace, str(name)) for name in dict.fromkeys(c.image_pull_secrets)]
    if train in TRAIN_APIS:
        problems.append(
            _secret_problem(
                core,
                namespace,
                "hf_token_secret",
                c.hf_token_secret,
                HF_TOKEN_KEY,
                "fine for public models, gated ones will fail to download",
            )
        )
        problems.append(
            _secret_problem(
                core,
                namespace,
                "alert_webhook_secret",
                c.alert_webhook_secret,
                WEBHOOK_SECRET_KEY,
                "runs end without an alert",
            )
        )
        problems.append(_langfuse_problem(core, namespace, c.langfuse_secret))
        if s.evaluate.judge_endpoint:  # the judged evaluation's key (checks.py asked whether the judge answers)
            problems.append(
                _secret_problem(
                    core,
                    namespace,
                    "judge_api_key_secret",
                    s.evaluate.judge_api_key_secret,
                    JUDGE_API_KEY,
                    "the judge is asked without a key (fine for an in-cluster judge)",
                )
            )
        problems.append(_tracking_problem(core, namespace, c.tracking_secret, s.train.report_to))
    problems += _access_problems(authz, namespace, list(dict.fromkeys(wanted)))
    if train in TRAIN_APIS:
        if s.variants.variants:  # each variant's job in place of the run's
            problems += _variant_gpu_problems(core, params)
        else:  # each stage's job: its own nodes and GPUs (stage_settings) over the run's
            problems += _training_gpu_problems(core, s)
        if c.rdma_resource:
            problems.append(_rdma_node_problem(core, c))
        if c.ipc_lock:
            problems.append(_ipc_lock_problem(labels(), namespace))
    return [p for p in problems if p]
