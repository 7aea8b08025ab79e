"""Submit a compiled pipeline to a Kubeflow Pipelines v2 API server as a run or a recurring run.

Every submission uploads the compiled YAML as a new version of a named pipeline, so the KFP UI keeps
the history of what ran, and binds the run (or recurring run) to that exact version.
All talk to the server goes through ``kfp.Client``; this module adds what the client lacks for a
command-line tool: a fast reachability/auth probe, one-line errors and cron validation before any request.
"""

from __future__ import annotations

import contextlib
import datetime
import io
import json
import os
import re
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import certifi
import kfp
import kfp_server_api
import urllib3
from kfp.client import KF_PIPELINES_SA_TOKEN_ENV, KF_PIPELINES_SA_TOKEN_PATH, ServiceAccountTokenVolumeCredentials

from components.version import __version__
from pipelines.errors import UsageError
from pipelines.schedule import validate_cron

# The probe must fail fast on a black-holed host; a healthy KFP answers healthz in milliseconds.
_PROBE_TIMEOUT = urllib3.Timeout(connect=5.0, read=5.0)
_HEALTHZ_PATH = "/apis/v2beta1/healthz"
_AUTH_FIX = (
    "set a valid KFP bearer token (or a token file in "
    f"{KF_PIPELINES_SA_TOKEN_ENV}), or reach the API with your kubeconfig through "
    "kubectl -n kubeflow port-forward svc/ml-pipeline-ui 8080:80"
)
# Two submissions within the same second would get the same version name; the server answers 409.
_MAX_VERSION_NAME_ATTEMPTS = 5


@dataclass(frozen=True)
class Submission:
    """What was created on the KFP server.

    Attributes:
        kind: ``"run"`` or ``"recurring_run"``.
        id: The run id or the recurring run id.
        url: The KFP UI page of the run or recurring run.
        pipeline_id: The pipeline the version belongs to.
        version_id: The pipeline version uploaded by this submission and bound to the run.
        experiment_id: The experiment holding the run.
    """

    kind: str
    id: str
    url: str
    pipeline_id: str
    version_id: str
    experiment_id: str


def submit(
    *,
    host: str,
    package_path: str,
    pipeline_name: str,
    params: dict,
    experiment: str,
    run_name: str,
    namespace: str | None = None,
    schedule: str | None = None,
    existing_token: str | None = None,
    description: str = "",
    service_account: str = "",
) -> Submission:
    """Upload a compiled pipeline as a new version and start a run or a recurring run of that version.

    The first submission of ``pipeline_name`` creates the pipeline (the upload creates the pipeline and
    its first version, which the server names after the pipeline); later ones add a version named
    ``v<package version>-<UTC yyyymmdd-HHMMSS>``. The experiment is reused when it exists.

    Args:
        host: KFP API endpoint including scheme and any path prefix, e.g. ``http://localhost:8080``
            (port-forwarded ml-pipeline-ui) or ``https://kubeflow.example.com/pipeline``.
        package_path: The compiled pipeline YAML.
        pipeline_name: Pipeline to add the version to; created on first use.
        params: Runtime parameters of the run (name -> JSON-able value), sent as the run's
            ``runtime_config.parameters``.
        experiment: Experiment name; created when missing.
        run_name: Display name of the run or recurring run.
        namespace: Kubeflow profile namespace on a multi-user KFP. The experiment is created there and
            the pipeline is private to it; without a namespace the pipeline is shared.
        schedule: 6-field cron (see ``validate_cron``). When set, a recurring run is created instead
            of a run: enabled, at most 1 concurrent run, no catch-up of missed intervals.
        existing_token: Bearer token for the KFP API. Without it, a service-account token file
            (``KF_PIPELINES_SA_TOKEN_PATH`` or KFP's default path inside a pod) is used when present.
        description: Description of the pipeline, the version and the recurring run.
        service_account: The Kubernetes ServiceAccount the run's steps run as
            (``pipelines.params.RUNNER_SERVICE_ACCOUNT``, which manifests/ creates); empty: KFP's default
            (default-editor in a Kubeflow profile, pipeline-runner in standalone KFP).

    Returns:
        The created run or recurring run with its UI URL and the ids it is bound to.

    Raises:
        UsageError: Invalid schedule or package path (before any request), unreachable host, failed
            authentication, wrong URL or path prefix, missing namespace on multi-user KFP, or a
            request the server refused or failed; the message names the host and the fix.
    """
    if schedule is not None:
        schedule = " ".join(schedule.split())
        validate_cron(schedule)
    host = _normalize_host(host)
    if not Path(package_path).is_file():
        raise UsageError(
            f"pipeline package {package_path} does not exist; compile the pipeline first (python -m pipelines.compile)"
        )
    credentials = _token_file_credentials() if not existing_token else None
    healthz = _probe(host, _authorization_header(existing_token, credentials))

    with _kfp_chatter_silenced():
        client = _connect(host, namespace, existing_token, credentials)
        # kfp falls back to the namespace saved in ~/.config/kfp/context.json; honour it the same way.
        namespace = namespace or client.get_user_namespace() or None
        if healthz.get("multi_user") and not namespace:
            raise UsageError(
                f"KFP at {host} runs in multi-user mode; pass the namespace of your "
                "Kubeflow profile (e.g. kubeflow-user-example-com)"
            )
        pipeline_id, version_id = _upload_version(client, host, package_path, pipeline_name, namespace, description)
        with _server_step(host, f"getting or creating experiment {experiment!r}"):
            experiment_id = client.create_experiment(experiment, namespace=namespace).experiment_id
        if schedule is None:
            with _server_step(host, f"creating run {run_name!r} of pipeline version {version_id}"):
                run = client.run_pipeline(
                    experiment_id=experiment_id,
                    job_name=run_name,
                    params=params,
                    pipeline_id=pipeline_id,
                    version_id=version_id,
                    service_account=service_account or None,
                )
            return Submission(
                kind="run",
                id=run.run_id,
                url=f"{host}/#/runs/details/{run.run_id}",
                pipeline_id=pipeline_id,
                version_id=version_id,
                experiment_id=experiment_id,
            )
        with _server_step(host, f"creating recurring run {run_name!r} of pipeline version {version_id}"):
            recurring = client.create_recurring_run(
                experiment_id=experiment_id,
                job_name=run_name,
                description=description or None,
                cron_expression=schedule,
                max_concurrency=1,
                no_catchup=True,
                enabled=True,
                params=params,
                pipeline_id=pipeline_id,
                version_id=version_id,
                service_account=service_account or None,
            )
    return Submission(
        kind="recurring_run",
        id=recurring.recurring_run_id,
        url=f"{host}/#/recurringrun/details/{recurring.recurring_run_id}",
        pipeline_id=pipeline_id,
        version_id=version_id,
        experiment_id=experiment_id,
    )


def _normalize_host(host: str) -> str:
    host = host.strip().rstrip("/")
    # kfp.Client would silently prepend https://, which fails confusingly against a port-forward.
    if not re.match(r"https?://[^/]", host):
        raise UsageError(
            f"KFP host {host!r} must be a URL with scheme, e.g. http://localhost:8080 "
            "or https://kubeflow.example.com/pipeline"
        )
    return host


def _token_file_credentials() -> ServiceAccountTokenVolumeCredentials | None:
    """KFP's projected service-account token, when this process runs where one is mounted.

    kfp.Client only reads the token file by itself when it is given no host; with an explicit
    host (always the case here) it has to be handed over as ``credentials``.
    """
    if os.environ.get(KF_PIPELINES_SA_TOKEN_ENV) or os.path.exists(KF_PIPELINES_SA_TOKEN_PATH):
        return ServiceAccountTokenVolumeCredentials()
    return None


def _authorization_header(
    existing_token: str | None, credentials: ServiceAccountTokenVolumeCredentials | None
) -> dict[str, str]:
    """The header kfp.Client will send, so that the probe sees what the real requests will see."""
    if existing_token:
        return {"Authorization": f"Bearer {existing_token}"}
    if credentials is None:
        return {}
    config = kfp_server_api.Configuration()
    try:
        credentials.refresh_api_key_hook(config)
    except OSError as exc:
        path = os.environ.get(KF_PIPELINES_SA_TOKEN_ENV) or KF_PIPELINES_SA_TOKEN_PATH
        raise UsageError(
            f"cannot read the KFP service-account token file {path} ({exc.strerror}); "
            f"fix or unset {KF_PIPELINES_SA_TOKEN_ENV}"
        ) from exc
    return {"Authorization": f"Bearer {config.api_key['authorization']}"}


def _probe(host: str, headers: dict[str, str]) -> dict[str, Any]:
    """GET healthz once, without retries, and turn every way it can fail into one UsageError.

    kfp.Client's own healthz call retries HTTP errors 5 times with 5 s sleeps, and urllib3 has no
    timeout by default, so a bad host or token would otherwise hang the CLI for 25 s or more.

    Returns:
        The healthz response (``multi_user``, ...).
    """
    # certifi, as kfp_server_api uses it: the probe must trust exactly what kfp.Client will trust.
    http = urllib3.PoolManager(
        cert_reqs="CERT_REQUIRED", ca_certs=certifi.where(), retries=False, timeout=_PROBE_TIMEOUT
    )
    try:
        with http:
            response = http.request("GET", host + _HEALTHZ_PATH, headers=headers, redirect=False)
    except urllib3.exceptions.SSLError as exc:
        raise UsageError(
            f"TLS handshake with KFP at {host} failed ({_reason(exc)}); check the URL "
            "scheme (http vs https) and the server certificate"
        ) from exc
    except urllib3.exceptions.HTTPError as exc:
        raise UsageError(
            f"cannot reach KFP at {host} ({_reason(exc)}); check the URL, or "
            "port-forward the UI: kubectl -n kubeflow port-forward svc/ml-pipeline-ui "
            "8080:80 and use --host http://localhost:8080"
        ) from exc
    status = response.status
    if status in (401, 403):
        raise UsageError(f"KFP at {host} refused the request: authentication failed (HTTP {status}); {_AUTH_FIX}")
    if 300 <= status < 400:
        location = (response.headers.get("Location") or "").split("?")[0]
        raise UsageError(
            f"KFP at {host} redirected the API request to {location or 'elsewhere'}: "
            f"authentication required (a login page) or a different URL; {_AUTH_FIX}, "
            "or use the redirect target as host"
        )
    if status == 404:
        raise UsageError(
            f"KFP API not found at {host} (HTTP 404 on {_HEALTHZ_PATH}); wrong URL or "
            "missing path prefix: behind the Kubeflow gateway use "
            "https://<kubeflow-host>/pipeline"
        )
    if status >= 400:
        raise UsageError(
            f"KFP at {host} is unhealthy (HTTP {status} on {_HEALTHZ_PATH}); check the "
            "ml-pipeline deployment (kubectl -n kubeflow logs deploy/ml-pipeline) and retry"
        )
    try:
        healthz = json.loads(response.data)
    except ValueError:
        healthz = None
    if not isinstance(healthz, dict):
        raise UsageError(
            f"{host} answered {_HEALTHZ_PATH} with something that is not the KFP API "
            "(no JSON); check the URL and path prefix, e.g. https://<kubeflow-host>/pipeline"
        )
    return healthz


def _reason(exc: urllib3.exceptions.HTTPError) -> str:
    """The innermost cause of a urllib3 error, e.g. "Connection refused", in one line."""
    reason = getattr(exc, "reason", None) or exc  # MaxRetryError wraps the cause
    text = str(reason.args[-1]) if reason.args else str(reason)
    # urllib3 starts messages with the connection or pool: "HTTPConnection(host=..., port=...): ...".
    return " ".join(re.sub(r"^<?HTTPS?Connection\w*\([^)]*\)[^:]*: ", "", text).split())


@contextlib.contextmanager
def _kfp_chatter_silenced() -> Iterator[None]:
    """Keep kfp.Client's prints ("Run details: ...") and version FutureWarning off the CLI's output.

    The CLI reports the Submission itself; kfp's links would repeat it, on stdout.
    """
    with contextlib.redirect_stdout(io.StringIO()), warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        yield


def _connect(
    host: str,
    namespace: str | None,
    existing_token: str | None,
    credentials: ServiceAccountTokenVolumeCredentials | None,
) -> kfp.Client:
    with _server_step(host, "connecting"):
        # kfp.Client reads "kubeflow", its default, as "no namespace given".
        return kfp.Client(
            host=host, namespace=namespace or "kubeflow", existing_token=existing_token, credentials=credentials
        )


@contextlib.contextmanager
def _server_step(host: str, action: str) -> Iterator[None]:
    """Turn kfp/urllib3 failures of one step into a UsageError naming the step, the host and the fix."""
    try:
        yield
    except kfp_server_api.ApiException as exc:
        raise _api_error(host, action, exc) from exc
    except urllib3.exceptions.HTTPError as exc:
        raise UsageError(
            f"lost the connection to KFP at {host} while {action} ({_reason(exc)}); "
            "check that the server is up and retry"
        ) from exc
    except ValueError as exc:  # kfp's own checks, e.g. two pipelines or experiments with one name
        raise UsageError(f"KFP at {host}, while {action}: {exc}; rename or delete the duplicate") from exc


def _api_error(host: str, action: str, exc: kfp_server_api.ApiException) -> UsageError:
    status = exc.status
    said = _server_message(exc)
    if status in (401, 403):
        return UsageError(
            f"KFP at {host} refused {action}: authentication/authorization failed (HTTP {status}: {said}); {_AUTH_FIX}"
        )
    if status == 0:  # kfp_server_api reports TLS failures as status 0
        return UsageError(
            f"TLS error talking to KFP at {host} while {action} ({said}); check the "
            "URL scheme and the server certificate"
        )
    if status < 500:
        return UsageError(
            f"KFP at {host} rejected {action} (HTTP {status}: {said}); fix the input named in the message and retry"
        )
    return UsageError(
        f"KFP at {host} failed while {action} (HTTP {status}: {said}); check the "
        "ml-pipeline logs (kubectl -n kubeflow logs deploy/ml-pipeline) and retry"
    )


def _server_message(exc: kfp_server_api.ApiException) -> str:
    """The server's own error text: grpc-gateway sends {"message"}, the upload handler {"error_message"}."""
    try:
        body = json.loads(exc.body)
    except (TypeError, ValueError):
        body = None
    said = body.get("message") or body.get("error_message") if isinstance(body, dict) else None
    return " ".join(str(said or exc.reason or "no details").split())[:300]


def _upload_version(
    client: kfp.Client, host: str, package_path: str, pipeline_name: str, namespace: str | None, description: str
) -> tuple[str, str]:
    """Upload the package as a new version of ``pipeline_name``, creating the pipeline on first use.

    Returns:
        (pipeline_id, version_id) of the uploaded version.
    """
    with _server_step(host, f"looking up pipeline {pipeline_name!r}"):
        pipeline_id = _find_pipeline(client, pipeline_name, namespace)
    if pipeline_id is None:
        with _server_step(host, f"uploading new pipeline {pipeline_name!r}"):
            pipeline_id = client.upload_pipeline(
                package_path, pipeline_name=pipeline_name, description=description or None, namespace=namespace
            ).pipeline_id
            # The upload response is the pipeline only; its single version has to be looked up.
            versions = client.list_pipeline_versions(pipeline_id).pipeline_versions or []
        if len(versions) != 1:
            raise UsageError(
                f"KFP at {host} created pipeline {pipeline_name!r} ({pipeline_id}) with "
                f"{len(versions)} versions instead of 1; check it in the UI and resubmit"
            )
        return pipeline_id, versions[0].pipeline_version_id

    base_name = f"v{__version__}-{datetime.datetime.now(datetime.UTC):%Y%m%d-%H%M%S}"
    for attempt in range(1, _MAX_VERSION_NAME_ATTEMPTS + 1):
        version_name = base_name if attempt == 1 else f"{base_name}-{attempt}"
        with _server_step(host, f"uploading version {version_name!r} of pipeline {pipeline_name!r}"):
            try:
                version = client.upload_pipeline_version(
                    package_path, version_name, pipeline_id=pipeline_id, description=description or None
                )
            except kfp_server_api.ApiException as exc:
                if exc.status == 409:  # name taken by a submission in the same second
                    continue
                raise
        return pipeline_id, version.pipeline_version_id
    raise UsageError(
        f"KFP at {host} already has versions {base_name} to {base_name}-"
        f"{_MAX_VERSION_NAME_ATTEMPTS} of pipeline {pipeline_name!r}; wait a second and retry"
    )


def _find_pipeline(client: kfp.Client, name: str, namespace: str | None) -> str | None:
    """The id of the pipeline named ``name`` (in ``namespace``, or shared), or None."""
    # kfp.Client.get_pipeline_id cannot look inside a namespace, so list with the same filter it uses
    # (operation 1 is EQUALS).
    name_filter = json.dumps({"predicates": [{"operation": 1, "key": "display_name", "stringValue": name}]})
    pipelines = client.list_pipelines(filter=name_filter, namespace=namespace).pipelines or []
    if len(pipelines) > 1:
        raise ValueError(f"{len(pipelines)} pipelines are named {name!r}")
    return pipelines[0].pipeline_id if pipelines else None
