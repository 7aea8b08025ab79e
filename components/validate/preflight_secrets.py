"""Preflight (components/validate/preflight.py) of the Secrets the run's pods read: the optional ones (Hugging Face
token, alert webhook, Langfuse, the judge's API key) warn when absent and fail when present without their keys; the
image pull Secrets and the tracking Secret that ``report_to`` needs fail when absent; and the model store's
credentials (``store_problem``, which a local run checks too)."""

from __future__ import annotations

import base64
import logging

from kubernetes import client as k8s
from kubernetes.client.rest import ApiException

from components.kube import call_api
from components.secrets import HF_TOKEN_KEY, JUDGE_API_KEY, LANGFUSE_KEYS, WEBHOOK_SECRET_KEY
from components.settings import Settings, StorageSettings

# One logger for the whole preflight, whichever of its modules warns: what a logging configuration names.
log = logging.getLogger("components.validate.preflight")


def pod_secret_problems(core: k8s.CoreV1Api, namespace: str, s: Settings) -> list[str | None]:
    """The Secrets the steps' and the jobs' pods read, each reference optional: the Hugging Face token, the alert
    webhook, Langfuse's keys, the judge's API key (with a ``judge_endpoint``) and the trackers' keys (``report_to``)."""
    problems = [
        secret_problem(
            core,
            namespace,
            "hf_token_secret",
            s.storage.hf_token_secret,
            HF_TOKEN_KEY,
            "fine for public models, gated ones will fail to download",
        ),
        secret_problem(
            core,
            namespace,
            "alert_webhook_secret",
            s.observability.alert_webhook_secret,
            WEBHOOK_SECRET_KEY,
            "runs end without an alert",
        ),
        langfuse_problem(core, namespace, s.observability.langfuse_secret),
    ]
    if s.evaluate.judge_endpoint:  # the judged evaluation's key (checks.py asked whether the judge answers)
        problems.append(
            secret_problem(
                core,
                namespace,
                "judge_api_key_secret",
                s.evaluate.judge_api_key_secret,
                JUDGE_API_KEY,
                "the judge is asked without a key (fine for an in-cluster judge)",
            )
        )
    problems.append(tracking_problem(core, namespace, s.observability.tracking_secret, s.train.report_to))
    return problems


# What each optional Secret's key holds, for its message.
_WHAT_KEY = {HF_TOKEN_KEY: "token", JUDGE_API_KEY: "judge's API key"}


def secret_problem(core: k8s.CoreV1Api, namespace: str, field: str, name: str, key: str, why: str) -> str | None:
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


def pull_secret_problem(core: k8s.CoreV1Api, namespace: str, name: str) -> str | None:
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


def tracking_problem(core: k8s.CoreV1Api, namespace: str, name: str, report_to: list[str]) -> str | None:
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


def langfuse_problem(core: k8s.CoreV1Api, namespace: str, name: str) -> str | None:
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


def store_problem(store: StorageSettings, core: k8s.CoreV1Api | None = None, namespace: str = "") -> str | None:
    """The problem with ``model_store_uri`` and its credentials, or None (also None when no store is set): the
    bucket URI must parse, ``model_store_secret`` (read through ``core`` on a cluster) must hold the store's keys, and
    the store must take them (a HEAD on the bucket). Locally, or with no Secret named, the credentials are this
    process's own (environment variables, ``~/.aws``, the pod's role). Checked before any GPU is requested."""
    from components import storage

    if not store.model_store_uri:
        return None
    try:
        uri = storage.parse_store_uri(store.model_store_uri)
    except ValueError as exc:
        return str(exc)
    credentials, who = None, "model_store_secret is empty, and the credentials of this process"
    if store.model_store_secret and core is not None:
        try:
            credentials = storage.secret_credentials(core, store.model_store_secret, namespace)
        except ValueError as exc:
            return str(exc)
        who = f"model_store_secret={store.model_store_secret!r}"
    elif store.model_store_secret:
        who = f"model_store_secret={store.model_store_secret!r} is for a cluster; locally the environment's keys"
    return storage.access_problem(uri, store.model_store_endpoint, credentials, who=who)
