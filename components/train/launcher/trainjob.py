"""The same training job as a Kubeflow Trainer v2 ``TrainJob`` (trainer.kubeflow.org/v1alpha1).

The cluster's ClusterTrainingRuntime (``trainjob_runtime``, ``torch-distributed`` by default) supplies the JobSet
(one replicated job ``node`` whose container is ``node``); the TrainJob fills in the image, ``torchrun`` command,
``numNodes``, ``numProcPerNode`` and ``resourcesPerNode``, and a pod patch adds what the runtime cannot
know: the claims, ``/dev/shm``, node placement, labels and the Istio opt-out. The trainer controller injects
``PET_NNODES``, ``PET_NPROC_PER_NODE``, ``PET_NODE_RANK``, ``PET_MASTER_ADDR`` and ``PET_MASTER_PORT`` into the
``node`` container, as the v1 operator does for ``pytorch``.

The pod patch is where Trainer releases differ (``TRAINER_VERSIONS``): Trainer v2.2 and later take it as a
``spec.runtimePatches`` entry (which also carries the pods' grace period and security context) and have
``spec.activeDeadlineSeconds``; Trainer v2.1 takes ``spec.podTemplateOverrides``, which has neither. The API
server prunes the fields a CRD's schema lacks, with only a warning, so a TrainJob rendered for the wrong release
would start its pods without the claims: the launcher and preflight read which release is installed
(``installed_trainer_version``, from the TrainJob schema the API server publishes) and render for it.

Built as a plain dict checked against the CRD (tests/train/launcher/): the ``kubeflow`` SDK (0.5.0) installs and
imports beside kubeflow-training, but its models cannot render Trainer v2.1's ``podTemplateOverrides``.
"""

from __future__ import annotations

from kubernetes import client as k8s
from kubernetes.client.rest import ApiException

from components.jobs.kinds import (
    TRAINJOB_GROUP,
    TRAINJOB_KIND,
    TRAINJOB_NODE,
    TRAINJOB_NODE_RANK_LABEL,
    TRAINJOB_PLURAL,
    TRAINJOB_POD_SELECTOR_LABEL,
    TRAINJOB_VERSION,
)
from components.kube import call_api, load_api_client
from components.train.launcher.pods import trainer_pod_template
from components.train.launcher.spec import (
    TRAINER_V2_1,
    TRAINER_V2_2,
    TrainingJobSpec,
    spec_for_run,
    trainjob_runtime_conflicts,
)

GROUP, VERSION, PLURAL, KIND = TRAINJOB_GROUP, TRAINJOB_VERSION, TRAINJOB_PLURAL, TRAINJOB_KIND
# The runtimes a TrainJob's runtimeRef names (cluster-scoped; kind ClusterTrainingRuntime, the runtimeRef's default).
RUNTIME_PLURAL = "clustertrainingruntimes"
# The gang-scheduling plugins of a runtime's spec.podGroupPolicy (the ClusterTrainingRuntime CRD): the Trainer creates
# the PodGroup of every TrainJob on such a runtime, so the job's pods are placed all at once or not at all.
GANG_PLUGINS = ("coscheduling", "volcano")
# The replicated job and container of the torch runtimes, where the controller injects the PET_* variables.
NODE = TRAINJOB_NODE
# Who owns our entry in spec.runtimePatches (entries are a map keyed by manager).
PATCH_MANAGER = "llm-post-training.kubeflow.org/launcher"
# The Trainer releases whose TrainJob this package renders (spec.TRAINER_V2_1, TRAINER_V2_2), each by the spec field
# that patches the runtime's pods (kubeflow/trainer: podTemplateOverrides in v2.1.0; runtimePatches and
# activeDeadlineSeconds from v2.2.0 on, the same TrainJob spec through v2.3). "v2.2" stands for v2.2 and later.
POD_PATCH_FIELDS = {TRAINER_V2_2: "runtimePatches", TRAINER_V2_1: "podTemplateOverrides"}
TRAINER_VERSIONS = tuple(POD_PATCH_FIELDS)
TRAINER_NAMES = {TRAINER_V2_2: "Trainer v2.2 or later", TRAINER_V2_1: "Trainer v2.1"}
# Pod patch fields of releases this package does not render for: Trainer v2.0's TrainJob.
UNSUPPORTED_PATCH_FIELDS = {"podSpecOverrides": "Trainer v2.0"}
# Where the API server publishes the TrainJob's schema, open to every authenticated account (system:discovery),
# unlike the cluster-scoped CustomResourceDefinition.
OPENAPI_PATH = f"/openapi/v3/apis/{GROUP}/{VERSION}"
# JobSet labels every pod with its JobSet's name, which is the TrainJob's; the Job controller labels
# each pod with its completion index, which the torch runtime makes the node rank.
POD_SELECTOR_LABEL = TRAINJOB_POD_SELECTOR_LABEL
NODE_RANK_LABEL = TRAINJOB_NODE_RANK_LABEL


def _validate(job: TrainingJobSpec) -> None:
    """Raise ValueError, naming the field, for what a TrainJob cannot carry or the Trainer release cannot honour."""
    if conflicts := trainjob_runtime_conflicts(job):
        raise ValueError("; ".join(conflicts))
    job.validate()
    if not job.runtime:
        raise ValueError("runtime must name a ClusterTrainingRuntime, e.g. torch-distributed")
    if job.trainer_version not in TRAINER_VERSIONS:
        raise ValueError(f"trainer_version {job.trainer_version!r} must be one of {', '.join(TRAINER_VERSIONS)}")
    if job.active_deadline_seconds is not None and job.trainer_version == TRAINER_V2_1:
        raise ValueError(unsupported_deadline(job.active_deadline_seconds))
    if job.ipc_lock and job.trainer_version == TRAINER_V2_1:
        raise ValueError(
            "ipc_lock=true: Trainer v2.1's podTemplateOverrides cannot set the container's security context; add "
            "IPC_LOCK to the torch-distributed ClusterTrainingRuntime's node container and set ipc_lock=false, or "
            "use train_backend=pytorchjob or Trainer v2.2"
        )


def _pod_patch(template: k8s.V1PodTemplateSpec, trainer_version: str) -> dict:
    """The TrainJob spec's pod patch for the Trainer release: what of the trainer's pod the ``trainer`` fields cannot
    hold, as ``runtimePatches`` (v2.2 and later) or ``podTemplateOverrides`` (v2.1)."""
    container, pod = template.spec.containers[0], template.spec
    # Trainer v2 owns the container: the TrainJob sets its image, command, env and resources in spec.trainer,
    # and the pod patch (merged by container name) adds only what the trainer fields cannot hold.
    pod_spec = {
        "nodeSelector": pod.node_selector,
        "tolerations": pod.tolerations,
        "affinity": pod.affinity,
        # Both releases' pod patch has imagePullSecrets (the TrainJob CRDs in tests/reference/crds/).
        "imagePullSecrets": pod.image_pull_secrets,
        "volumes": pod.volumes,
        "containers": [{"name": container.name, "volumeMounts": container.volume_mounts}],
    }
    if trainer_version == TRAINER_V2_2:
        # Not in v2.1's podTemplateOverrides. Neither release patches automountServiceAccountToken: the runtime's.
        pod_spec.update(
            terminationGracePeriodSeconds=pod.termination_grace_period_seconds, securityContext=pod.security_context
        )
        pod_spec["containers"][0]["securityContext"] = container.security_context
    pod_template = {
        "metadata": {"labels": template.metadata.labels, "annotations": template.metadata.annotations},
        "spec": {k: v for k, v in pod_spec.items() if v is not None},
    }
    if trainer_version == TRAINER_V2_1:
        # Trainer v2.1 merges it into the named replicated jobs' pod template (a strategic merge patch).
        return {"podTemplateOverrides": [{"targetJobs": [{"name": NODE}], **pod_template}]}
    replicated_jobs = [{"name": NODE, "template": {"spec": {"template": pod_template}}}]
    patch = {"template": {"spec": {"replicatedJobs": replicated_jobs}}}
    return {"runtimePatches": [{"manager": PATCH_MANAGER, "trainingRuntimeSpec": patch}]}


def build_trainjob(job: TrainingJobSpec) -> dict:
    """The TrainJob manifest of ``job`` (a plain dict): the PyTorchJob's pods, run by the Trainer v2 controller on the
    ClusterTrainingRuntime ``job.runtime``, rendered for the Trainer release ``job.trainer_version``.

    Every node runs the same ``torchrun`` command; CPU, memory, GPUs and the RDMA resource are ``resourcesPerNode``'s
    requests and limits, which the Trainer sets on the ``node`` container. The runtime patch cannot declare container
    ports (the TrainJob schema's patch container has none): the metrics port is in the scrape annotations only, and
    the PodMonitor reaches it by relabeling. ``v2.2`` (and later) patches the pods through ``spec.runtimePatches``,
    grace period and security context included; ``v2.1`` through ``spec.podTemplateOverrides``, which has neither, so
    the pods get the runtime's grace period and security context.

    Gang scheduling, priority, restarts and the finished-job TTL are the runtime's policy in Trainer v2, not the
    TrainJob's (gang scheduling: the ClusterTrainingRuntime's ``podGroupPolicy``, coscheduling or Volcano;
    ``gang_scheduling=true`` asks preflight to refuse a runtime without one, ``runtime_gang_plugin``);
    ``run_training_job(cleanup=...)`` deletes finished jobs. The spec's PyTorchJob run policy is not used, and a
    priority class or ``min_nodes`` is refused (``spec.TRAINJOB_RUNTIME_SETTINGS``).

    Raises:
        ValueError: naming the field, for an invalid name, image, node or GPU count, runtime, deadline or Trainer
            version, a deadline or ``ipc_lock`` the Trainer version cannot honour (v2.1 has no
            activeDeadlineSeconds), or a setting the runtime keeps.
    """
    _validate(job)
    template = trainer_pod_template(job, container_name=NODE, nnodes=str(job.num_nodes))
    container = template.spec.containers[0]
    spec: dict = {
        "runtimeRef": {"name": job.runtime},
        "trainer": {
            "image": container.image,
            "command": container.command,
            "args": container.args,
            "env": container.env,
            "numNodes": job.num_nodes,
            "numProcPerNode": job.gpus_per_node,
            "resourcesPerNode": {"requests": container.resources.requests, "limits": container.resources.limits},
        },
        **_pod_patch(template, job.trainer_version),
    }
    if job.active_deadline_seconds is not None:
        spec["activeDeadlineSeconds"] = job.active_deadline_seconds
    manifest = {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": KIND,
        "metadata": {"name": job.name, "namespace": job.namespace, "labels": job.job_labels()},
        "spec": spec,
    }
    return k8s.ApiClient().sanitize_for_serialization(manifest)


def trainjob_for_run(**run) -> dict:
    """The TrainJob of one KFP run's stage, from the pipeline's parameter names (mirrors ``pytorchjob_for_run``)."""
    return build_trainjob(spec_for_run(**run))


def unsupported_deadline(active_deadline_seconds: int) -> str:
    """The error for a deadline on Trainer v2.1, which cannot honour it."""
    return (
        f"active_deadline_seconds={active_deadline_seconds}: Trainer v2.1's TrainJob has no "
        "activeDeadlineSeconds (it arrived in Trainer v2.2.0, and the API server would drop it silently); "
        "set active_deadline_seconds to 0 (no limit), upgrade the Trainer to v2.2 or later, or use "
        "train_backend=pytorchjob"
    )


def trainjob_spec_fields(openapi: dict) -> set[str] | None:
    """The fields of ``TrainJob.spec`` in an OpenAPI v3 document of ``trainer.kubeflow.org/v1alpha1`` as the API
    server publishes it (``OPENAPI_PATH``), or None when the document has no TrainJob."""
    for schema in ((openapi or {}).get("components") or {}).get("schemas", {}).values():
        kinds = schema.get("x-kubernetes-group-version-kind") or []
        if {"group": GROUP, "version": VERSION, "kind": KIND} in kinds:
            return set(((schema.get("properties") or {}).get("spec") or {}).get("properties") or {})
    return None


def trainer_version_for(spec_fields: set[str] | None) -> str:
    """The entry of ``TRAINER_VERSIONS`` whose TrainJob spec has these fields.

    Raises:
        RuntimeError: no TrainJob is served, or it is one this package does not render for (Trainer v2.0), or its
            spec has no known pod patch field; the message names what was found and the fix.
    """
    if spec_fields is None:
        raise RuntimeError(
            f"the API server publishes no TrainJob schema under {OPENAPI_PATH}: install Kubeflow "
            "Trainer v2.1 or later (or use train_backend=pytorchjob)"
        )
    for version, field in POD_PATCH_FIELDS.items():
        if field in spec_fields:
            return version
    for field, release in UNSUPPORTED_PATCH_FIELDS.items():
        if field in spec_fields:
            return _unsupported(f"{release} (its TrainJob patches pods through spec.{field})")
    return _unsupported(
        f"a Trainer whose TrainJob spec has none of {', '.join(sorted(POD_PATCH_FIELDS.values()))} "
        f"(it has: {', '.join(sorted(spec_fields)) or 'nothing'})"
    )


def _unsupported(what: str):
    raise RuntimeError(
        f"this cluster runs {what}: the TrainJob could not mount the claims or /dev/shm; install "
        "Kubeflow Trainer v2.1 or later, or use train_backend=pytorchjob"
    )


def installed_trainer_version(api_client=None) -> str:
    """The Trainer release whose TrainJob this cluster serves (an entry of ``TRAINER_VERSIONS``), read once from the
    TrainJob schema the API server publishes (OpenAPI v3: readable by every authenticated account, so neither the
    launcher nor preflight needs a ClusterRole to read the CustomResourceDefinition).

    Raises:
        RuntimeError: as ``trainer_version_for``.
        ApiException: the API server refused the read for another reason than 404.
    """
    api_client = api_client or load_api_client()
    try:
        document = call_api(
            api_client.call_api,
            OPENAPI_PATH,
            "GET",
            header_params={"Accept": "application/json"},
            auth_settings=["BearerToken"],
            response_type="object",
            _return_http_data_only=True,
        )
    except ApiException as exc:
        if exc.status != 404:
            raise
        document = {}  # the group/version is not served: no Trainer
    return trainer_version_for(trainjob_spec_fields(document))


def runtime_gang_plugin(runtime: dict) -> str:
    """The gang-scheduling plugin of a ClusterTrainingRuntime (an entry of ``GANG_PLUGINS`` set in its
    ``spec.podGroupPolicy``), or "" when its TrainJobs' pods are scheduled one by one."""
    policy = (runtime.get("spec") or {}).get("podGroupPolicy") or {}
    return next((plugin for plugin in GANG_PLUGINS if plugin in policy), "")


def cluster_runtimes(api_client=None) -> dict[str, dict]:
    """The cluster's ClusterTrainingRuntimes by name.

    Raises:
        ApiException: the API server refused the list (403: the account may not list the cluster-scoped runtimes).
    """
    api_client = api_client or load_api_client()
    listed = call_api(k8s.CustomObjectsApi(api_client).list_cluster_custom_object, GROUP, VERSION, RUNTIME_PLURAL)
    return {item["metadata"]["name"]: item for item in listed.get("items") or []}
