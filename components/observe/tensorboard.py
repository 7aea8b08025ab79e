"""The run's Kubeflow ``Tensorboard`` (tensorboard.kubeflow.org/v1alpha1): its training curves in the dashboard.

The trainer writes TensorBoard event files to ``<output_dir>/tensorboard`` (common.start_run sets
``TENSORBOARD_LOGGING_DIR``; the train step's output_dir is ``runs/<run id>/train`` on the model volume,
components/paths.py). The Kubeflow tensorboard controller serves a ``pvc://<claim>/<path>`` logspath by mounting
the claim read-only with ``subPath: <path>`` at ``/tensorboard_logs`` and running ``tensorboard --logdir`` there,
behind ``/tensorboard/<namespace>/<name>/`` on the Kubeflow gateway. Because the path is a subPath mount, it should
exist before the Tensorboard's pod starts: create the Tensorboard once the trainer has begun writing (or the
folder has been made), not before the run.
"""

from __future__ import annotations

import logging

from kubernetes import client as k8s
from kubernetes.client.rest import ApiException

from components.kube import DNS1035_LABEL, DNS1123_SUBDOMAIN, RUN_ID_LABEL, call_api, load_api_client
from components.paths import MODEL_MOUNT, pvc_uri, run_dir

log = logging.getLogger("tensorboard")

GROUP, VERSION, PLURAL, KIND = "tensorboard.kubeflow.org", "v1alpha1", "tensorboards", "Tensorboard"
# The controller names a Deployment, a Service and an Istio VirtualService after the Tensorboard, and labels its
# pod app=<name>: a Service name is a DNS-1035 label, a label value at most 63 characters.
MAX_NAME = 63


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


def ensure_tensorboard(manifest: dict, api_client=None) -> bool:
    """Create the run's Tensorboard unless it exists (a retried step, a later stage); True when it is there.

    Never fails the run: a cluster without Kubeflow's Tensorboard controller (standalone KFP) gets a warning that
    names the ``tensorboard`` setting, and the training goes on.
    """
    custom = k8s.CustomObjectsApi(api_client or load_api_client())
    meta = manifest["metadata"]
    try:
        served = call_api(custom.get_api_resources, GROUP, VERSION).resources
    except ApiException as exc:
        if exc.status != 404:
            raise
        served = []
    if not any(r.name == PLURAL for r in served):
        log.warning(
            "%s.%s/%s is not served by this cluster: no Tensorboard for this run (install Kubeflow's "
            "tensorboard controller, or set tensorboard=false)",
            PLURAL,
            GROUP,
            VERSION,
        )
        return False
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
