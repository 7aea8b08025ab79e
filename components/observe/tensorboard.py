"""The run's Kubeflow ``Tensorboard`` (tensorboard.kubeflow.org/v1alpha1): its training curves in the dashboard.

The trainer writes TensorBoard event files to ``<output_dir>/tensorboard`` (common.start_run sets
``TENSORBOARD_LOGGING_DIR``; the train step's output_dir is ``runs/<run id>/train`` on the model volume,
components/paths.py). The Kubeflow tensorboard controller serves a ``pvc://<claim>/<path>`` logspath by mounting
the claim read-only with ``subPath: <path>`` at ``/tensorboard_logs`` and running ``tensorboard --logdir`` there,
behind ``/tensorboard/<namespace>/<name>/`` on the Kubeflow gateway. Because the path is a subPath mount, it should
exist before the Tensorboard's pod starts: create the Tensorboard once the trainer has begun writing (or the
folder has been made), not before the run.

A cluster without that controller (a standalone Training Operator or Trainer install: no
``tensorboards.tensorboard.kubeflow.org`` served) gets what the controller would have made, a Deployment and a
Service named after the Tensorboard (``server_manifests``: the same claim read-only, the same subPath, the same
``tensorboard --logdir``), reached with ``kubectl port-forward`` (the train step logs the command). The train step
records them on the model claim (``runs/<run id>/tensorboard.json``) and the run's exit handler deletes them
(``remove_servers``): nothing else would, and the pod would hold its claim and its node's memory for ever.
Preflight makes the same discovery and reviews the access the path it finds needs.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

from kubernetes import client as k8s
from kubernetes.client.rest import ApiException

from components.kube import DNS1035_LABEL, DNS1123_SUBDOMAIN, RUN_ID_LABEL, call_api, load_api_client
from components.paths import MODEL_MOUNT, pvc_uri, run_dir
from components.security import container_security_context, pod_security_context
from components.version import TRAINER_IMAGE

log = logging.getLogger("tensorboard")

GROUP, VERSION, PLURAL, KIND = "tensorboard.kubeflow.org", "v1alpha1", "tensorboards", "Tensorboard"
# The controller names a Deployment, a Service and an Istio VirtualService after the Tensorboard, and labels its
# pod app=<name>: a Service name is a DNS-1035 label, a label value at most 63 characters.
MAX_NAME = 63
# Without the controller: TensorBoard's own default port, the controller's mount point for the logs, and the record
# the exit handler reads to delete what the train step created.
PORT = 6006
LOGS_MOUNT = "/tensorboard_logs"
RECORD = "tensorboard.json"


def logs_path(model_pvc: str, run_id: str) -> str:
    """``pvc://<model_pvc>/runs/<run id>``: the run's folder; each stage's trainer writes its event files under it
    (``<stage folder>/tensorboard``), and TensorBoard shows every stage as a run of its own."""
    return pvc_uri(model_pvc, MODEL_MOUNT, run_dir(MODEL_MOUNT, run_id))


def tensorboard_manifest(name: str, namespace: str, model_pvc: str, run_id: str) -> dict:
    """The Tensorboard custom resource that shows run ``run_id``'s training curves.

    Args:
        name: the Tensorboard's name, a DNS-1035 label of at most 63 characters (``job_name_for(run_id, "tb")``
            gives one); it names the dashboard's path ``/tensorboard/<namespace>/<name>/``.
        namespace: the run's namespace (where the model claim is).
        model_pvc: the model claim the trainer writes to; the Tensorboard mounts it read-only.
        run_id: the KFP run id, which names the run's folder on the claim.

    Returns:
        The manifest as a plain dict, labelled with the run id, ``spec.logspath`` = ``logs_path(...)``.

    Raises:
        ValueError: naming the argument, for a name or claim Kubernetes would refuse, or an empty run id.
    """
    if not DNS1035_LABEL.match(name) or len(name) > MAX_NAME:
        raise ValueError(
            f"name {name!r} must be a DNS-1035 label of at most {MAX_NAME} characters (lowercase "
            "letters, digits, '-'; starts with a letter); e.g. job_name_for(run_id, 'tb')"
        )
    if not DNS1123_SUBDOMAIN.match(model_pvc) or len(model_pvc) > 253:
        raise ValueError(f"model_pvc {model_pvc!r} is not a valid claim name (lowercase letters, digits, '-', '.')")
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": KIND,
        "metadata": {"name": name, "namespace": namespace, "labels": {RUN_ID_LABEL: run_id}},
        "spec": {"logspath": logs_path(model_pvc, run_id)},
    }


def dashboard_path(namespace: str, name: str) -> str:
    """The Tensorboard's path on the Kubeflow gateway (its controller's VirtualService prefix), for reports."""
    return f"/tensorboard/{namespace}/{name}/"


def served(api_client) -> bool:
    """Whether this cluster serves ``tensorboards.tensorboard.kubeflow.org/v1alpha1`` (Kubeflow's controller is
    installed), by API discovery, which every authenticated account may read."""
    custom = k8s.CustomObjectsApi(api_client)
    try:
        resources = call_api(custom.get_api_resources, GROUP, VERSION).resources
    except ApiException as exc:
        if exc.status != 404:
            raise
        resources = []
    return any(r.name == PLURAL for r in resources)


def server_manifests(board: dict, image: str, image_pull_secrets: list | None = None) -> tuple[dict, dict]:
    """The Deployment and Service that show the Tensorboard ``board`` (``tensorboard_manifest``) on a cluster without
    Kubeflow's controller, made as the controller makes them: the claim of its ``pvc://`` logspath mounted read-only
    with the rest of the path as ``subPath`` at ``/tensorboard_logs``, ``tensorboard --logdir`` there.

    Args:
        board: the run's Tensorboard manifest; its name, namespace, run id label and logspath are used.
        image: an image with the ``tensorboard`` program that runs as a non-root user: the trainer image has both
            (images/trainer/Dockerfile).
        image_pull_secrets: Secret names the pod pulls ``image`` with (the ``image_pull_secrets`` setting).

    Returns:
        ``(deployment, service)`` as plain dicts, both named and labelled as the Tensorboard. The pod carries no run
        id label: pods of the run are its jobs' (the search finds its trials' pods by that label).
    """
    meta = board["metadata"]
    name, namespace = meta["name"], meta["namespace"]
    claim, _, sub_path = board["spec"]["logspath"].removeprefix("pvc://").partition("/")
    selector = {"app.kubernetes.io/name": "tensorboard", "app.kubernetes.io/instance": name}
    labels = {**meta["labels"], **selector}
    container = {
        "name": "tensorboard",
        "image": image,
        "command": ["tensorboard"],
        # All addresses: the Service's traffic reaches the pod's IP, not its loopback.
        "args": ["--logdir", LOGS_MOUNT, "--host", "0.0.0.0", "--port", str(PORT)],
        "ports": [{"name": "http", "containerPort": PORT}],
        "volumeMounts": [{"name": "logs", "mountPath": LOGS_MOUNT, "subPath": sub_path, "readOnly": True}],
        "readinessProbe": {"httpGet": {"path": "/", "port": "http"}, "periodSeconds": 10},
        # TensorBoard holds the scalars of every stage in memory: small for curves, no GPU.
        "resources": {"requests": {"cpu": "250m", "memory": "1Gi"}, "limits": {"memory": "4Gi"}},
        "securityContext": container_security_context(),
    }
    deployment = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "namespace": namespace, "labels": labels},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": selector},
            "template": {
                "metadata": {"labels": selector},
                "spec": {
                    "automountServiceAccountToken": False,  # it reads files, never the API
                    "securityContext": pod_security_context(),
                    "containers": [container],
                    "volumes": [{"name": "logs", "persistentVolumeClaim": {"claimName": claim, "readOnly": True}}],
                    **({"imagePullSecrets": [{"name": n} for n in image_pull_secrets]} if image_pull_secrets else {}),
                },
            },
        },
    }
    service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": name, "namespace": namespace, "labels": labels},
        "spec": {"selector": selector, "ports": [{"name": "http", "port": PORT, "targetPort": "http"}]},
    }
    return deployment, service


def port_forward_command(namespace: str, name: str) -> str:
    """The command that reaches the Service ``name`` from the user's machine at ``http://localhost:6006``."""
    return f"kubectl port-forward -n {namespace} svc/{name} {PORT}:{PORT}"


def ensure_tensorboard(
    manifest: dict,
    api_client=None,
    *,
    image: str = TRAINER_IMAGE,
    model_root: str = MODEL_MOUNT,
    image_pull_secrets: list | None = None,
) -> bool:
    """Show the run's training curves, once (a retried step, a later stage find them there); True when they are.

    With Kubeflow's Tensorboard controller: the Tensorboard ``manifest`` (the controller builds its pod: no pull
    Secrets). Without it: the Deployment and Service of ``server_manifests(manifest, image, image_pull_secrets)``,
    recorded under the run's folder of ``model_root`` for the exit handler to delete, and the ``kubectl port-forward``
    command logged. Preflight has reviewed the access either needs (an
    ApiException other than 409, AlreadyExists, goes up).
    """
    api_client = api_client or load_api_client()
    if not served(api_client):
        return _ensure_server(manifest, api_client, image, model_root, image_pull_secrets)
    meta = manifest["metadata"]
    custom = k8s.CustomObjectsApi(api_client)
    try:
        call_api(custom.create_namespaced_custom_object, GROUP, VERSION, meta["namespace"], PLURAL, manifest)
        log.info(
            "Tensorboard %s/%s shows %s at %s",
            meta["namespace"],
            meta["name"],
            manifest["spec"]["logspath"],
            dashboard_path(meta["namespace"], meta["name"]),
        )
    except ApiException as exc:
        if exc.status != 409:
            raise
    return True


def _ensure_server(board: dict, api_client, image: str, model_root: str, image_pull_secrets: list | None) -> bool:
    deployment, service = server_manifests(board, image, image_pull_secrets)
    meta = board["metadata"]
    namespace, name = meta["namespace"], meta["name"]
    # Recorded first: a step killed between the two creations still leaves the exit handler what to delete.
    _write_record(model_root, meta["labels"][RUN_ID_LABEL], namespace, name)
    for create, body in (
        (k8s.AppsV1Api(api_client).create_namespaced_deployment, deployment),
        (k8s.CoreV1Api(api_client).create_namespaced_service, service),
    ):
        try:
            call_api(create, namespace, body)
        except ApiException as exc:
            if exc.status != 409:
                raise
    log.info(
        "no Kubeflow Tensorboard controller here: TensorBoard runs as Deployment and Service %s/%s (%s, deleted "
        "when the run ends); to see the curves: %s  then open http://localhost:%d",
        namespace,
        name,
        board["spec"]["logspath"],
        port_forward_command(namespace, name),
        PORT,
    )
    return True


def _write_record(model_root: str, run_id: str, namespace: str, name: str) -> None:
    folder = Path(run_dir(model_root, run_id))
    folder.mkdir(parents=True, exist_ok=True)
    tmp = folder / f".{RECORD}.tmp"
    tmp.write_text(json.dumps({"namespace": namespace, "name": name}))
    os.replace(tmp, folder / RECORD)


def remove_servers(model_root: str, run_id: str, api_client=None) -> list[str]:
    """The exit handler's part: delete the TensorBoard Deployments and Services the run's train steps recorded
    (its variants' too, ``runs/<run id>-<variant>/``); returns ``namespace/name`` of each deleted. Nothing recorded
    (a Kubeflow Tensorboard, ``tensorboard=false``, a local run): nothing to do. Never raises: what it could not
    delete is a warning with the ``kubectl delete`` command; what does not carry this run's label is left in place with
    a warning (``run_objects.delete_run_object``)."""
    from components.observe.run_objects import delete_run_object

    root = Path(run_dir(model_root, run_id))
    records = [root / RECORD, *sorted(root.parent.glob(f"{run_id}-*/{RECORD}"))]
    removed = []
    for record in (r for r in records if r.is_file()):
        try:
            found = json.loads(record.read_text())
            namespace, name = found["namespace"], found["name"]
        except (OSError, ValueError, KeyError) as exc:
            log.warning("cannot read %s (%s): its TensorBoard is left in place", record, exc)
            continue
        try:
            api_client = api_client or load_api_client()
            # Only what carries this run's label, and only the object checked (run_objects: records on the claim
            # are not authority to delete).
            for kind in ("Deployment", "Service"):
                delete_run_object(api_client, kind, namespace, name, run_id)
        except PermissionError as exc:
            log.warning("left in place: %s", exc)
            record.unlink(missing_ok=True)
            continue
        except Exception as exc:  # the exit handler must still post the run's outcome
            log.warning(
                "could not delete TensorBoard %s/%s (%s): kubectl delete -n %s deployment,service %s",
                namespace,
                name,
                f"HTTP {exc.status} {exc.reason}" if isinstance(exc, ApiException) else repr(exc),
                namespace,
                name,
            )
            continue
        record.unlink(missing_ok=True)
        log.info("deleted TensorBoard Deployment and Service %s/%s", namespace, name)
        removed.append(f"{namespace}/{name}")
    return removed
