"""The publish step's work: the deployed model to the Model Registry and the Hub, its evaluation to the tracker.

Each target is optional and independent (``model_registry_url``, ``hub_repo_id``, ``report_to`` naming mlflow or
wandb); with none set the step does nothing. What identifies the model comes from the pipeline's own outputs (the
chosen variant's folder and URI, its settings, the KFP run id), never from a file on a claim.
"""

from __future__ import annotations

import logging
import os
import re

from components.settings import Settings

log = logging.getLogger("publish")


def trained_run_id(model_path: str, run_id: str) -> str:
    """The run id the chosen model trained under: a variant's (``<run id>-<variant>``, its folder ``runs/<it>/``)
    or the run's own."""
    match = re.search(r"/runs/([^/]+)/", model_path)
    return match.group(1) if match and match.group(1).startswith(run_id) else run_id


def read_secret(name: str, keys: tuple[str, ...], setting: str, *, required: bool) -> dict[str, str]:
    """The ``keys`` Secret ``name`` holds in this pod's namespace, read through the Kubernetes API with the step's
    token (as the launcher reads the object store's keys): no pod spec names it, so an absent optional Secret costs
    nothing. A missing or unreadable Secret is one line naming ``setting`` when ``required``, else a warning and
    ``{}``."""
    import base64

    from kubernetes import client
    from kubernetes.client.rest import ApiException

    from components.kube import current_namespace, load_api_client

    namespace = current_namespace()
    try:
        secret = client.CoreV1Api(load_api_client()).read_namespaced_secret(name, namespace)
    except ApiException as exc:
        if exc.status not in (403, 404):
            raise
        why = (
            f"Secret not found in {namespace} (kubectl create secret generic {name} -n {namespace} "
            + " ".join(f"--from-literal={k}=..." for k in keys[:2])
            + ")"
            if exc.status == 404
            else f"this service account may not read it in {namespace}; add its name to the Secret rule's "
            "resourceNames in manifests/rbac/role.yaml and apply it"
        )
        if required:
            raise ValueError(f"{setting}={name!r}: {why}") from None
        log.warning("%s=%r: %s", setting, name, why)
        return {}
    return {k: base64.b64decode(v).decode().strip() for k, v in (secret.data or {}).items() if k in keys}


def publish(
    s: Settings,
    *,
    run_id: str,
    model_path: str,
    model_uri: str,
    metrics: dict,
    report_path: str = "",
    hub_token: str = "",
) -> list[str]:
    """Register, push and record the deployed model as ``s`` asks; one line per target done. ``hub_token``: the
    token hub_token_secret holds; the tracker's address and key are the environment's (MLFLOW_*, WANDB_*)."""
    floats = {k: float(v) for k, v in metrics.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
    stage, done = s.stages.stages[-1], []
    base = s.model.model_name_or_path
    if s.publish.model_registry_url:
        from components.publish.model_registry import register_model

        registered = register_model(
            server_url=s.publish.model_registry_url,
            name=s.publish.model_registry_model_name or s.deploy.serving_name,
            version=trained_run_id(model_path, run_id),
            uri=model_uri,
            metrics=floats,
            run_id=run_id,
            base_model=base,
            description=f"{stage} of {base}, KFP run {run_id}",
        )
        done.append(f"model registry: {registered['name']} version {registered['version']} ({registered['ui_path']})")
    if s.publish.hub_repo_id:
        from components.publish.hub_push import push_to_hub

        if not hub_token:
            raise ValueError(
                f"hub_repo_id={s.publish.hub_repo_id!r}: hub_token_secret={s.publish.hub_token_secret!r} holds no "
                "HF_TOKEN (kubectl create secret generic <it> --from-literal=HF_TOKEN=hf_...)"
            )
        url = push_to_hub(
            folder=model_path,
            repo_id=s.publish.hub_repo_id,
            token=hub_token,
            private=s.publish.hub_private,
            commit_message=f"{stage} of {base} (KFP run {run_id})",
            endpoint=s.publish.hub_endpoint or None,
        )
        done.append(f"hub: {url}")
    trackers = [t for t in s.train.report_to if t in ("mlflow", "wandb")]
    if trackers:
        from components.publish.tracker import record_evaluation
        from components.secrets import TRACKING_NAMES

        for key, value in TRACKING_NAMES.items():  # the experiment and project the trainer's pods log into
            os.environ.setdefault(key, value)
        done += record_evaluation(
            trackers,
            run_id=trained_run_id(model_path, run_id),
            stage=stage,
            evaluation=floats,
            model_uri=model_uri,
            report_path=report_path,
        )
    for line in done:
        log.info("%s", line)
    return done
