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

import logging

from kubernetes import client as k8s
from kubernetes.client.rest import ApiException

from components.kube import call_api, current_namespace, load_api_client
from components.observe import tensorboard
from components.settings import JobSettings, SchedulingSettings, Settings
from components.stages import stage_trainer
from components.validate.preflight_access import (
    DEPLOYER_ACCESS,
    GRPO_SERVER_ACCESS,
    LAUNCHER_ACCESS,
    POD_ACCESS,
    SEARCH_ACCESS,
    TENSORBOARD_ACCESS,
    access_problems,
    tensorboard_problem,
)
from components.validate.preflight_nodes import rdma_node_problem, training_gpu_problems, variant_gpu_problems
from components.validate.preflight_secrets import pod_secret_problems, pull_secret_problem, store_problem

log = logging.getLogger(__name__)

# (group, version, plural, what installs it) per backend.
TRAIN_APIS = {
    "pytorchjob": ("kubeflow.org", "v1", "pytorchjobs", "the Kubeflow Training Operator (v1)"),
    "trainjob": ("trainer.kubeflow.org", "v1alpha1", "trainjobs", "Kubeflow Trainer (v2)"),
}
SERVING_API = ("serving.kserve.io", "v1beta1", "inferenceservices", "KServe")
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


def _runtime_problem(api_client, job: JobSettings, scheduling: SchedulingSettings) -> str | None:
    """The problem with ``trainjob_runtime``: no ClusterTrainingRuntime by that name, or (``gang_scheduling``) one
    without a ``podGroupPolicy``. The TrainJob cannot ask for gang scheduling itself: in Trainer v2 it is the
    runtime's. Runtimes are cluster-scoped: an account that may not list them gets a warning, not a failure."""
    from components.train.launcher import trainjob

    field = f"trainjob_runtime={job.trainjob_runtime!r}"
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
    runtime = runtimes.get(job.trainjob_runtime)
    if runtime is None:
        return (
            f"{field}: this cluster has no ClusterTrainingRuntime of that name (it has: "
            f"{', '.join(sorted(runtimes)) or 'none'}); name one of them, or install it "
            "(kubectl get clustertrainingruntimes)"
        )
    plugin = trainjob.runtime_gang_plugin(runtime)
    log.info("%s: gang scheduling %s", field, f"by {plugin}" if plugin else "none (no spec.podGroupPolicy)")
    if scheduling.gang_scheduling and not plugin:
        return (
            f"gang_scheduling=true with train_backend=trainjob: the ClusterTrainingRuntime {job.trainjob_runtime} has "
            "no spec.podGroupPolicy, and Trainer v2 gang-schedules only through the runtime's; add "
            f"podGroupPolicy (coscheduling or volcano) to it, name a runtime that has one in trainjob_runtime, use "
            "Kueue (queue_name), or set gang_scheduling=false"
        )
    return None


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
    train, deploy = s.job.train_backend, s.deploy.deploy_backend
    if train == "local" and deploy == "local":
        return [p for p in [store_problem(s.storage)] if p]
    api_client = api_client or load_api_client()
    namespace = namespace or current_namespace()
    custom, core = k8s.CustomObjectsApi(api_client), k8s.CoreV1Api(api_client)
    authz = k8s.AuthorizationV1Api(api_client)
    problems: list = [store_problem(s.storage, core if train in TRAIN_APIS else None, namespace)]
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
            problems.append(_trainer_problem(api_client, s.scheduling.active_deadline_seconds, labels))
            problems.append(_runtime_problem(api_client, s.job, s.scheduling))
        wanted += LAUNCHER_ACCESS[train] + POD_ACCESS
        if (
            s.observability.tensorboard
        ):  # the Tensorboard where Kubeflow's controller serves it, else a Deployment and Service
            if tensorboard.served(api_client):
                wanted += TENSORBOARD_ACCESS
            else:
                problems.append(tensorboard_problem(authz, namespace))
        if "grpo" in s.stages.stages:
            from components.train.launcher.generation_server import runs_own_server

            if runs_own_server("grpo", stage_trainer(s, "grpo").preference, s.job):
                wanted += GRPO_SERVER_ACCESS
        if s.hpo.hpo_trials:
            problems.append(_missing_api(custom, "kubeflow.org", "v1beta1", "experiments", "Katib"))
            problems.append(_katib_injection_problem(labels(), namespace))
            wanted += SEARCH_ACCESS
    if deploy.startswith("kserve"):
        problems.append(_missing_api(custom, *SERVING_API))
        wanted += DEPLOYER_ACCESS + [("list", "", "pods", "")]  # it waits on the predictor's pods
    problems.append(_claim_problem(core, namespace, "data_pvc", s.storage.data_pvc))
    problems.append(_claim_problem(core, namespace, "model_pvc", s.storage.model_pvc))
    problems += [pull_secret_problem(core, namespace, str(name)) for name in dict.fromkeys(s.job.image_pull_secrets)]
    if train in TRAIN_APIS:
        problems += pod_secret_problems(core, namespace, s)
    problems += access_problems(authz, namespace, list(dict.fromkeys(wanted)))
    if train in TRAIN_APIS:
        if s.variants.variants:  # each variant's job in place of the run's
            problems += variant_gpu_problems(core, params)
        else:  # each stage's job: its own nodes and GPUs (stage_settings) over the run's
            problems += training_gpu_problems(core, s)
        if s.network.rdma_resource:
            problems.append(rdma_node_problem(core, s.job, s.network))
        if s.network.ipc_lock:
            problems.append(_ipc_lock_problem(labels(), namespace))
    return [p for p in problems if p]
