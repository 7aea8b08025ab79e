"""The optional registration of the deployed model in Kubeflow Model Registry (``model_registry_url``).

``register_model`` records one version of a model, with the official client (``model-registry`` on PyPI,
``ModelRegistry.register_model``): the registered model (created on its first version), the version (its
description, and custom properties: the metrics, the KFP run id, the base model) and the version's model artifact
(the model's URI and format). The registry stores metadata only: the weights stay where ``uri`` says. The choices:

- The format: ``safetensors``, version ``1`` (``MODEL_FORMAT_NAME``, ``MODEL_FORMAT_VERSION``): the file format of
  the weights the export writes, recorded on the version's model artifact.
- The version's custom properties: each metric as a float (``MetadataDoubleValue``), ``kfp_run_id`` and
  ``base_model`` as strings. A metric may not take one of those two names.
- A version is written once: a version the model already has is refused (the client checks, then raises
  ``StoreError``), as one line naming the version and ``model_registry_url``; nothing is overwritten.
- Authentication: the pod's service-account token as the bearer token (Kubeflow's registry sits behind Istio or
  kube-rbac-proxy, which accept it): read from ``token_path``, else from the file ``$KF_PIPELINES_SA_TOKEN_PATH``
  names (the client's default variable), else the pod's own token
  (``/var/run/secrets/kubernetes.io/serviceaccount/token``). It is never logged nor put in an error message; a plain
  ``http://`` registry without a token is called without one, an ``https://`` one needs it.
- ``server_url`` is ``http(s)://host[:port]`` (no path: the client adds ``/api/model_registry/v1alpha3``); a port left
  out is the scheme's (80, 443) as in any URL, although Kubeflow's ``model-registry-service`` listens on 8080. A
  malformed URL, an unreachable registry, a refused token or an error answer are each one line naming
  ``model_registry_url`` and what to change.
- The client speaks the registry's v1alpha3 REST API (``model-registry`` 0.3.11, the last client release that does;
  0.3.12 and later speak only ``/api/model_registry/v1``, which registries before the v1 API do not serve). The
  client is imported when a registration runs, never with this module; the root logger it configures on import is
  put back, and its coroutines run on a fresh event loop each (``asyncio.run``), so the client's ``nest_asyncio``
  patch of the process's event loop is not applied.

Returns the ids of the registered model, the version and the artifact, and ``ui_path``: where the registry's UI (in
the Kubeflow dashboard) shows the version, ``/model-registry/<registry>/registered-models/<id>/versions/<id>``, the
registry being the first label of the URL's host (the Service's name; Kubeflow's ``model-registry-service`` for an IP
address) unless ``registry_name`` says otherwise.
"""

from __future__ import annotations

import asyncio
import ipaddress
import json
import logging
import math
import os
import re
import warnings
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

log = logging.getLogger("publish.model_registry")

SETTING = "model_registry_url"
MODEL_FORMAT_NAME = "safetensors"
MODEL_FORMAT_VERSION = "1"
AUTHOR = "kubeflow-llm-post-training"  # the version's author and the registered model's owner
RUN_ID_PROPERTY = "kfp_run_id"
BASE_MODEL_PROPERTY = "base_model"
# The client's defaults (model_registry._client DEFAULT_USER_TOKEN_ENVVAR, DEFAULT_K8S_SA_TOKEN_PATH).
TOKEN_PATH_ENV = "KF_PIPELINES_SA_TOKEN_PATH"
POD_TOKEN_PATH = "/var/run/secrets/kubernetes.io/serviceaccount/token"
EXAMPLE_URL = "http://model-registry-service.kubeflow.svc.cluster.local:8080"
_LABEL = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?$")
# What the registry's find-by-name endpoints accept (the spec's `name` parameter: ^[\x20-\x7E]+$).
_PRINTABLE = re.compile(r"^[\x20-\x7E]+$")


class RegistryError(RuntimeError):
    """A registration the registry refused or could not take: one line naming ``model_registry_url``."""


def parse_server_url(server_url: str) -> tuple[str, str, int]:
    """``server_url`` as (scheme, host as written in a URL, port); a ValueError naming ``model_registry_url`` and the
    expected form when it is not ``http(s)://host[:port]``."""
    expected = f"expected http(s)://host[:port], e.g. {EXAMPLE_URL}"
    text = str(server_url).strip()
    try:
        parts = urlsplit(text)
        port = parts.port
    except ValueError as exc:
        raise ValueError(f"{SETTING}={server_url!r}: {exc}; {expected}") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"{SETTING}={server_url!r} is not an http:// or https:// URL with a host; {expected}")
    if parts.username is not None or parts.path.strip("/") or parts.query or parts.fragment:
        raise ValueError(
            f"{SETTING}={server_url!r}: only scheme, host and port are taken (the client adds the API's path); "
            f"{expected}"
        )
    host = parts.hostname
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        if len(host) > 253 or not all(_LABEL.match(label) for label in host.split(".")):
            raise ValueError(f"{SETTING}={server_url!r}: {host!r} is not a host name; {expected}") from None
        url_host = host
    else:
        url_host = f"[{address}]" if address.version == 6 else str(address)
    return parts.scheme, url_host, port or (443 if parts.scheme == "https" else 80)


def _check_text(field: str, value: str) -> None:
    if not isinstance(value, str) or not _PRINTABLE.match(value) or value != value.strip():
        raise ValueError(
            f"model registry {field}={value!r}: printable ASCII without leading or trailing spaces, not empty"
        )


def _custom_properties(metrics: dict[str, float], run_id: str, base_model: str) -> dict[str, Any]:
    """The version's custom properties: the metrics as floats, the run id and the base model as strings."""
    properties: dict[str, Any] = {}
    for key, value in metrics.items():
        if key in (RUN_ID_PROPERTY, BASE_MODEL_PROPERTY) or not isinstance(key, str) or not key:
            raise ValueError(f"metric name {key!r}: not empty, nor {RUN_ID_PROPERTY!r} or {BASE_MODEL_PROPERTY!r}")
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
            raise ValueError(f"metric {key}={value!r} is not a finite number (the registry stores a double)")
        properties[key] = float(value)
    properties.update({RUN_ID_PROPERTY: run_id, BASE_MODEL_PROPERTY: base_model})
    return properties


def _read_token(token_path: str | None) -> str | None:
    """The bearer token: ``token_path``'s file, else ``$KF_PIPELINES_SA_TOKEN_PATH``'s, else the pod's own; None when
    there is none (only the pod's token may be absent). Never logged: only where it came from is."""
    named = token_path or os.environ.get(TOKEN_PATH_ENV)
    path = Path(named or POD_TOKEN_PATH)
    try:
        token = path.read_text().strip()
    except OSError as exc:
        if not named:
            return None
        source = "token_path" if token_path else f"${TOKEN_PATH_ENV}"
        raise RegistryError(
            f"{SETTING}: cannot read the service account token at {source}={str(path)!r} ({exc.strerror})"
        ) from None
    if not token:
        raise RegistryError(f"{SETTING}: the service account token file {str(path)!r} is empty")
    log.info("Model Registry: bearer token from %s", path)
    return token


def _import_client() -> tuple[Any, type[Exception]]:
    """The client's ``ModelRegistry`` and ``StoreError``, imported without keeping the handler ``logging.basicConfig``
    adds to the root logger when ``model_registry`` is first imported."""
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    from model_registry import ModelRegistry
    from model_registry.exceptions import StoreError

    root.handlers[:] = handlers
    root.setLevel(level)
    return ModelRegistry, StoreError


def _default_registry_name(host: str) -> str:
    """The registry's name in the UI's paths: the Service's, the first label of a host name (``model-registry-service``
    of ``model-registry-service.kubeflow.svc.cluster.local``); Kubeflow's default Service name for an IP address."""
    try:
        ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        return host.split(".")[0]
    return "model-registry-service"


def _http_problem(exc: Exception) -> str | None:
    """One line for an error answer of the REST API (mr_openapi's ApiException); None for anything else."""
    status = getattr(exc, "status", None)
    if not isinstance(status, int) or not status:
        return None
    reason = getattr(exc, "reason", None) or ""
    body = getattr(exc, "body", None) or getattr(exc, "data", None) or ""
    message = ""
    if isinstance(body, bytes | str):
        try:
            message = str(json.loads(body).get("message", ""))
        except (ValueError, AttributeError):
            message = str(body)[:200]
    detail = f"{status} {reason}".strip() + (f": {' '.join(message.split())}" if message else "")
    if status in (401, 403):
        return (
            f"the registry refused the service account's token ({detail}); give the pipeline's service account "
            "access to the registry (its Istio AuthorizationPolicy or kube-rbac-proxy's RBAC)"
        )
    if status == 404:
        return f"no Model Registry v1alpha3 REST API there ({detail}); point it at the registry's REST Service"
    return f"the registry answered {detail}"


def register_model(
    *,
    server_url: str,
    name: str,
    version: str,
    uri: str,
    metrics: dict[str, float],
    run_id: str,
    base_model: str,
    description: str = "",
    token_path: str | None = None,
    registry_name: str = "",
) -> dict[str, str]:
    """Register version ``version`` of model ``name`` (its artifact at ``uri``) in the Model Registry at
    ``server_url``; see the module's docstring for the choices.

    Args:
        server_url: The registry's REST address, ``http(s)://host[:port]`` (``model_registry_url``).
        name: The registered model's name (created with its first version).
        version: The new version's name; a version the model already has is an error.
        uri: Where the model's files are (``s3://...``, ``pvc://claim/path``, ``oci://...``, a Hub URL).
        metrics: The evaluation's metrics, stored as the version's float custom properties.
        run_id: The KFP run that produced the model (custom property ``kfp_run_id``).
        base_model: The model it was tuned from (custom property ``base_model``).
        description: The version's description.
        token_path: The file holding the bearer token (default: ``$KF_PIPELINES_SA_TOKEN_PATH``'s, else the pod's).
        registry_name: The registry's name in the UI's paths (default: the first label of the URL's host).

    Returns:
        ``registered_model_id``, ``model_version_id``, ``model_artifact_id``, ``name``, ``version``, ``uri`` and
        ``ui_path``.

    Raises:
        ValueError: a malformed ``server_url``, name, version, URI or metric (before any request).
        RegistryError: the registry is unreachable, refused the token, already has the version, or answered an error.
    """
    scheme, host, port = parse_server_url(server_url)
    _check_text("name", name)
    _check_text("version", version)
    if not str(uri).strip():
        raise ValueError("model registry uri is empty: the deployed model's URI is registered")
    properties = _custom_properties(metrics, run_id, base_model)
    token = _read_token(token_path)
    if token is None and scheme == "https":
        raise RegistryError(
            f"{SETTING}={server_url!r}: an https:// registry needs the service account's token, and none was found "
            f"(token_path, ${TOKEN_PATH_ENV}, {POD_TOKEN_PATH})"
        )
    ModelRegistry, StoreError = _import_client()
    import aiohttp  # the client's transport (a dependency of model-registry)

    where = f"{SETTING}={server_url!r}"
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="User access token is missing")  # plain http without a token
            registry = ModelRegistry(
                f"{scheme}://{host}",
                port,
                author=AUTHOR,
                is_secure=scheme == "https",
                user_token=token,
                log_level=logging.ERROR,  # not its hints about unusual ports
                async_runner=asyncio.run,
            )
        model = registry.register_model(
            name,
            uri,
            model_format_name=MODEL_FORMAT_NAME,
            model_format_version=MODEL_FORMAT_VERSION,
            version=version,
            version_description=description or None,
            metadata=properties,
        )
        model_version = registry.get_model_version(name, version)
        artifact = registry.get_model_artifact(name, version)
    except StoreError as exc:
        if "already exists" in str(exc):
            raise RegistryError(
                f"model {name!r} already has version {version!r} in the Model Registry at {where}; a registered "
                "version is never overwritten: register this model under a new version"
            ) from None
        raise RegistryError(f"{where}: {' '.join(str(exc).split())}") from None
    except (OSError, aiohttp.ClientError) as exc:  # refused, no such host, timed out (TimeoutError is an OSError)
        reason = " ".join(str(exc).split()) or type(exc).__name__
        raise RegistryError(
            f"{where}: the Model Registry does not answer ({reason}); set it to the registry's REST address, "
            f"e.g. {EXAMPLE_URL} (kubectl get svc -A -l component=model-registry)"
        ) from None
    except Exception as exc:
        problem = _http_problem(exc)
        if problem is None:
            raise
        if getattr(exc, "status", None) == 409:
            problem = f"model {name!r} or its version {version!r} was registered meanwhile ({problem})"
        raise RegistryError(f"{where}: {problem}") from None
    if model_version is None or artifact is None or not (model.id and model_version.id and artifact.id):
        raise RegistryError(f"{where}: the registry did not return the version it registered ({name}:{version})")
    registry_label = registry_name or _default_registry_name(host)
    ui_path = f"/model-registry/{registry_label}/registered-models/{model.id}/versions/{model_version.id}"
    log.info("Model Registry: %s version %s registered (%s), %s", name, version, uri, ui_path)
    return {
        "registered_model_id": str(model.id),
        "model_version_id": str(model_version.id),
        "model_artifact_id": str(artifact.id),
        "name": name,
        "version": version,
        "uri": uri,
        "ui_path": ui_path,
    }
