"""Manage runs on Kubeflow Pipelines: status, wait, list, cancel, and clean up finished runs and their folders.

examples:
  python -m pipelines.runs status RUN_ID                 # the run's state and each step's
  python -m pipelines.runs wait RUN_ID --timeout 12h     # stream step states; exit with the run's outcome
  python -m pipelines.runs list --experiment llm-finetune --state FAILED
  python -m pipelines.runs cancel RUN_ID
  python -m pipelines.runs cleanup --older-than 7d       # dry run: what would be deleted
  python -m pipelines.runs cleanup --older-than 7d --yes # delete the runs' folders on the claims, then the runs

The host, token and namespace are submit's: --host (default $KFP_HOST), $KFP_TOKEN or KFP's service-account token
file, --namespace for multi-user Kubeflow. Exit codes: 0 done (wait: the run SUCCEEDED), 1 the run FAILED (wait) or
a cleanup Job failed, 3 the run was CANCELED or SKIPPED (wait), 124 wait's --timeout passed, 130 wait interrupted
(the run goes on), 2 bad input (unknown run, bad duration, no host).

cleanup deletes, for each finished run (SUCCEEDED, FAILED, CANCELED, SKIPPED) it selects, the run's folders on the
two claims (runs/<run id>/ and its variants' runs/<run id>-<variant>/ on the data_pvc and model_pvc the run was
given) with one Kubernetes Job in --namespace (default: kubeflow, where single-user KFP runs the steps) that mounts
the claims, then the run itself from KFP. Nothing is deleted without --yes. A run still going is refused; a run
whose model the run's InferenceService (serving_name) still serves is kept. --keep-folders deletes only the runs.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import re
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

from pipelines.errors import UsageError, exit_code

if TYPE_CHECKING:  # kfp and the Kubernetes client cost a second to import: --help and bad input never pay it
    import kfp

FINAL_STATES = ("SUCCEEDED", "FAILED", "CANCELED", "SKIPPED")
STATES = ("PENDING", "RUNNING", "CANCELING", "PAUSED", *FINAL_STATES)
EXIT_FAILED, EXIT_CANCELED, EXIT_TIMEOUT, EXIT_INTERRUPTED = 1, 3, 124, 130
# KFP run ids are UUIDs; cleanup builds folder names from them, so it accepts nothing else.
_RUN_ID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
_DURATION = re.compile(r"(\d+(?:\.\d+)?)([smhdw]?)")
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
_PAGE_SIZE = 100
# wait outlasts an API server restart or a gateway's 503s for this long before it gives up.
RETRY_WINDOW_SECONDS = 300.0
CLEANUP_LABEL = "app.kubernetes.io/component"
CLEANUP_JOB_PREFIX = "llm-runs-cleanup"
CLAIMS_ROOT = "/mnt/claims"
# The cleanup pod's program: argv is the claims' mount points, "--", then the run ids; it removes <mount>/runs/<id>
# and <mount>/runs/<id>-* (the variants' folders) and prints each path. No shell: nothing is spliced into a line.
CLEANUP_SCRIPT = """\
import shutil, sys
from pathlib import Path
args = sys.argv[1:]
cut = args.index("--")
for root in args[:cut]:
    runs = Path(root, "runs")
    for run_id in args[cut + 1:]:
        for path in [runs / run_id, *sorted(runs.glob(run_id + "-*"))]:
            if path.is_symlink() or path.is_file():
                path.unlink()
            elif path.is_dir():
                shutil.rmtree(path)
            else:
                continue
            print("deleted", path, flush=True)
"""


# ------------------------------------------------------------------------------------------------ input


def parse_duration(text: str, option: str, *, bare_unit: str = "") -> timedelta:
    """``7d``, ``12h``, ``30m``, ``90s``, ``2w`` (a bare number counts in ``bare_unit``; without one it is refused);
    UsageError naming ``option`` otherwise."""
    match = _DURATION.fullmatch(text.strip().lower())
    unit = match.group(2) or bare_unit if match else ""
    if not match or not unit or float(match.group(1)) <= 0:
        raise UsageError(f"{option} {text!r} is not a duration; write a positive number and a unit, e.g. 7d, 12h, 30m")
    return timedelta(seconds=float(match.group(1)) * _UNITS[unit])


def _state(text: str) -> str:
    state = text.strip().upper().replace("CANCELLED", "CANCELED")
    if state not in STATES:
        raise argparse.ArgumentTypeError(f"{text!r} is not a run state; use one of {', '.join(STATES)}")
    return state


# ------------------------------------------------------------------------------------------------ KFP


@dataclass
class Kfp:
    """A connected kfp.Client and what every command needs beside it."""

    client: kfp.Client
    host: str
    namespace: str | None
    multi_user: bool = False

    def url(self, run_id: str) -> str:
        return f"{self.host}/#/runs/details/{run_id}"


def connect(host: str | None, namespace: str | None) -> Kfp:
    """Connect as ``python -m pipelines.run --host`` does (pipelines/submit.py: the host check, the token or the
    service-account token file, a fast healthz probe, one-line errors)."""
    if not host:
        raise UsageError("no KFP host: pass --host URL (e.g. http://localhost:8080) or set KFP_HOST")
    from pipelines import submit as S

    host = S._normalize_host(host)
    token = os.environ.get("KFP_TOKEN") or None
    credentials = S._token_file_credentials() if not token else None
    healthz = S._probe(host, S._authorization_header(token, credentials))
    with S._kfp_chatter_silenced():
        client = S._connect(host, namespace, token, credentials)
        namespace = namespace or client.get_user_namespace() or None
    return Kfp(client, host, namespace, bool(healthz.get("multi_user")))


def _step(kfp_: Kfp, action: str):
    from pipelines.submit import _server_step

    return _server_step(kfp_.host, action)


def get_run(kfp_: Kfp, run_id: str):
    """The run (kfp_server_api V2beta1Run); UsageError when the server has no run with this id."""
    where = f" (namespace {kfp_.namespace})" if kfp_.namespace else ""
    return get_or_usage(
        kfp_,
        f"getting run {run_id}",
        lambda: kfp_.client.get_run(run_id),
        f"run {run_id!r} not found on KFP at {kfp_.host}{where}; python -m pipelines.runs list shows the runs and "
        "their ids",
    )


def get_or_usage(kfp_: Kfp, action: str, get, not_found: str):
    """``get()`` (one KFP Get call) as ``action``; a UsageError saying ``not_found`` when the server has no such
    object (404, or the 400 "not found" some KFP releases answer)."""
    import kfp_server_api

    try:
        with _step(kfp_, action):
            try:
                return get()
            except kfp_server_api.ApiException as exc:
                if exc.status == 404 or (exc.status == 400 and "not found" in str(exc.body).lower()):
                    raise LookupError from exc
                raise
    except LookupError:
        raise UsageError(not_found) from None


def experiment_id(kfp_: Kfp, name: str) -> str:
    """The id of the experiment named ``name``; UsageError when there is none."""
    try:
        with _step(kfp_, f"looking up experiment {name!r}"):
            return kfp_.client.get_experiment(experiment_name=name, namespace=kfp_.namespace).experiment_id
    except UsageError as exc:
        if "No experiment is found" in str(exc):
            raise UsageError(f"no experiment named {name!r} on KFP at {kfp_.host}; check --experiment") from None
        raise


def list_runs(kfp_: Kfp, experiment: str | None = None) -> list:
    """Every run (newest first) of ``experiment``, or of the namespace; all pages."""
    return all_pages(kfp_, "runs", kfp_.client.list_runs, experiment)


def all_pages(kfp_: Kfp, what: str, list_page, experiment: str | None) -> list:
    """Every item (newest first) a KFP List call gives for ``experiment``, or for the namespace, page by page:
    ``list_page`` is the client's method (list_runs, list_recurring_runs) and ``what`` its response's field."""
    if kfp_.multi_user and not kfp_.namespace and not experiment:
        raise UsageError(
            f"KFP at {kfp_.host} runs in multi-user mode; pass --namespace (your Kubeflow profile's namespace)"
        )
    exp_id = experiment_id(kfp_, experiment) if experiment else None
    items: list = []
    token = ""
    while True:
        with _step(kfp_, f"listing {what.replace('_', ' ')}"):
            page = list_page(
                page_token=token,
                page_size=_PAGE_SIZE,
                sort_by="created_at desc",
                experiment_id=exp_id,
                namespace=kfp_.namespace,
            )
        items += getattr(page, what) or []
        token = page.next_page_token or ""
        if not token:
            return items


# ------------------------------------------------------------------------------------------------ reading runs


def _time(value) -> datetime | None:
    """A run's timestamp; None for the unset one (the server sends 1970-01-01 for a run not yet finished)."""
    if value is None:
        return None
    if isinstance(value, str):
        value = datetime.fromisoformat(value.replace("Z", "+00:00"))
    if value.tzinfo is None:
        value = value.replace(tzinfo=UTC)
    return value if value.year > 1970 else None


def _when(value) -> str:
    moment = _time(value)
    return moment.strftime("%Y-%m-%d %H:%M:%SZ") if moment else "-"


def tasks_of(run) -> list:
    """The run's tasks (run_details.task_details), in start order."""
    details = getattr(run, "run_details", None)
    tasks = list(getattr(details, "task_details", None) or [])
    return sorted(tasks, key=lambda t: _time(t.start_time) or _time(t.create_time) or datetime.max.replace(tzinfo=UTC))


def _error_message(status) -> str:
    return " ".join(str(getattr(status, "message", None) or "").split()) if status is not None else ""


def failure_of(run) -> str:
    """Which task failed and why: the failed tasks that no other failed task lies under (the step, not the DAG around
    it), each with its error (the task's, else the last error of its state history, else where its log is)."""
    tasks = tasks_of(run)
    failed = [t for t in tasks if t.state == "FAILED"]
    parents = {t.parent_task_id for t in failed if t.parent_task_id}
    leaves = [t for t in failed if t.task_id not in parents] or failed
    lines = []
    for task in leaves:
        error = _error_message(task.error)
        for status in reversed(task.state_history or []):
            error = error or _error_message(status.error)
        if not error:
            error = "no error recorded" + (f"; its log: kubectl logs {task.pod_name}" if task.pod_name else "")
        lines.append(f"task {task.display_name} failed: {error}")
    run_error = _error_message(getattr(run, "error", None))
    if run_error and not any(run_error in line for line in lines):
        lines.append(f"run error: {run_error}")
    return "\n".join(lines) or "no failed task or error recorded; see the run in the KFP UI"


def describe(kfp_: Kfp, run) -> str:
    """The run's state, times, link and each task's state."""
    lines = [
        f"run {run.run_id} ({run.display_name}): {run.state}",
        f"  created {_when(run.created_at)}, finished {_when(run.finished_at)}",
        f"  {kfp_.url(run.run_id)}",
    ]
    tasks = tasks_of(run)
    width = max((len(t.display_name or "") for t in tasks), default=0)
    lines += [f"  {t.display_name or t.task_id:<{width}}  {t.state}" for t in tasks]
    if run.state == "FAILED":
        lines += ["  " + line for line in failure_of(run).splitlines()]
    return "\n".join(lines)


# ------------------------------------------------------------------------------------------------ commands


def wait(
    kfp_: Kfp,
    run_id: str,
    *,
    timeout: timedelta | None,
    interval: float = 10.0,
    out: Callable[[str], None] = print,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> int:
    """Follow the run until it ends, printing the run's and each task's state as it changes; the exit code.

    kfp.Client.wait_for_run_completion is not used: it does not count CANCELED as an end (it waits out its timeout on
    a cancelled run) and prints nothing on the way.
    """
    deadline = clock() + timeout.total_seconds() if timeout else None
    seen: dict[str, str] = {}
    run = get_run(kfp_, run_id)  # an unknown run, a bad token: at once
    while True:
        stamp = datetime.now(UTC).strftime("%H:%M:%S")
        for task in tasks_of(run):
            if seen.get(task.task_id) != task.state:
                seen[task.task_id] = task.state
                out(f"{stamp}  {task.display_name or task.task_id}: {task.state}")
        if seen.get("") != run.state:
            seen[""] = run.state
            out(f"{stamp}  run {run.display_name}: {run.state}")
        if run.state in FINAL_STATES:
            break
        if deadline is not None and clock() >= deadline:
            out(f"timed out waiting: run {run_id} is still {run.state} ({kfp_.url(run_id)})")
            return EXIT_TIMEOUT
        sleep(interval if deadline is None else max(0.0, min(interval, deadline - clock())))
        run = _poll(kfp_, run_id, out=out, clock=clock, sleep=sleep)
    if run.state == "SUCCEEDED":
        out(f"run {run_id} succeeded ({kfp_.url(run_id)})")
        return 0
    if run.state == "FAILED":
        out(f"run {run_id} FAILED ({kfp_.url(run_id)})\n{failure_of(run)}")
        return EXIT_FAILED
    out(f"run {run_id} ended {run.state} ({kfp_.url(run_id)})")
    return EXIT_CANCELED


def _poll(kfp_: Kfp, run_id: str, *, out, clock, sleep, window: float = RETRY_WINDOW_SECONDS):
    """get_run for a long wait: a server or gateway that answers 5xx or drops the connection (an upgrade, a restart)
    is waited out for ``window`` seconds (a service-account token file is read again on every request: kfp's
    credentials hook)."""
    import kfp_server_api
    import urllib3

    since = None
    while True:
        try:
            return kfp_.client.get_run(run_id)
        except (kfp_server_api.ApiException, urllib3.exceptions.HTTPError) as exc:
            status = getattr(exc, "status", None)
            if since is None:
                since = clock()
                out(f"KFP at {kfp_.host} did not answer ({status or type(exc).__name__}); retrying for {window:.0f}s")
            if (status is not None and status < 500) or clock() - since >= window:
                with _step(kfp_, f"getting run {run_id}"):
                    raise
            sleep(min(10.0, window))


def cancel(kfp_: Kfp, run_id: str) -> str:
    """Ask KFP to terminate a run still going (its pods get SIGTERM; the launchers delete their jobs)."""
    run = get_run(kfp_, run_id)
    if run.state in FINAL_STATES or run.state == "CANCELING":
        return f"run {run_id} is already {run.state}; nothing to cancel"
    with _step(kfp_, f"terminating run {run_id}"):
        kfp_.client.terminate_run(run_id)
    return f"cancelling run {run_id} (was {run.state}); python -m pipelines.runs wait {run_id} follows it to the end"


@dataclass
class Doomed:
    """A run cleanup would delete, and its folders on the claims."""

    run: Any
    claims: list[str]  # data_pvc, model_pvc
    image_pull_secrets: list[str] = field(default_factory=list)
    serving_name: str = ""
    kept: str = ""  # why it is kept after all (its model is served)

    def folders(self) -> list[str]:
        return [f"pvc://{claim}/runs/{self.run.run_id}{suffix}" for claim in self.claims for suffix in ("", "-*")]


def _run_settings(run) -> tuple[list[str], list[str], str]:
    """The claims, pull Secrets and InferenceService name the run was given (its runtime parameters; defaults for
    those it left out)."""
    from components.settings import ADVANCED, specs

    params = dict(getattr(getattr(run, "runtime_config", None), "parameters", None) or {})
    advanced = params.get(ADVANCED)
    advanced = advanced if isinstance(advanced, dict) else {}
    all_specs = specs()

    def value(name: str):
        return params.get(name, advanced.get(name, all_specs[name].default))

    claims = list(dict.fromkeys([str(value("data_pvc")), str(value("model_pvc"))]))
    return claims, [str(s) for s in value("image_pull_secrets") or []], str(value("serving_name") or "")


def pipeline_of(kfp_: Kfp, run) -> str | None:
    """The name of the pipeline ``run`` ran (its spec's ``pipelineInfo.name``: inline when submitted from a package,
    else its pipeline version's); None when the server does not say."""
    spec = getattr(run, "pipeline_spec", None)
    if not isinstance(spec, dict):
        ref = getattr(run, "pipeline_version_reference", None)
        if ref is None or not getattr(ref, "pipeline_id", None):
            return None
        with _step(kfp_, f"reading the pipeline of run {run.run_id}"):
            version = kfp_.client.get_pipeline_version(ref.pipeline_id, ref.pipeline_version_id)
        spec = getattr(version, "pipeline_spec", None)
    info = (spec or {}).get("pipelineInfo") if isinstance(spec, dict) else None
    return str(info["name"]) if isinstance(info, dict) and info.get("name") else None


def select(
    kfp_: Kfp, run_ids: list[str], older_than: timedelta | None, experiment: str | None
) -> tuple[list[Doomed], int]:
    """The runs cleanup takes: those named (each must have ended and be this package's pipeline's) and the finished
    ones of this package's pipeline (``PIPELINE_NAME``) older than ``older_than``; and how many finished runs of
    other pipelines that age were left alone. A run a later run starts from (its ``runs/<id>`` folders in the later
    run's parameters, e.g. ``model_name_or_path``) is marked kept."""
    from pipelines import PIPELINE_NAME

    runs, others = [], 0
    for run_id in dict.fromkeys(run_ids):
        run = get_run(kfp_, run_id)
        if run.state not in FINAL_STATES:
            raise UsageError(
                f"run {run_id} is still {run.state}: cleanup takes only finished runs; "
                f"cancel it first (python -m pipelines.runs cancel {run_id}) and wait for it to end"
            )
        if (name := pipeline_of(kfp_, run)) != PIPELINE_NAME:
            raise UsageError(
                f"run {run_id} is not a run of {PIPELINE_NAME} (its pipeline: {name or 'unknown'}); cleanup deletes "
                "only this package's runs and their folders"
            )
        runs.append(run)
    listed = list_runs(kfp_, experiment) if older_than is not None else []
    if older_than is not None:
        cutoff = datetime.now(UTC) - older_than
        for run in listed:
            ended = _time(run.finished_at) or _time(run.created_at)
            if run.state in FINAL_STATES and ended and ended < cutoff and run.run_id not in run_ids:
                if pipeline_of(kfp_, run) == PIPELINE_NAME:
                    runs.append(run)
                else:
                    others += 1
    doomed = []
    for run in runs:
        if not _RUN_ID.fullmatch(run.run_id or ""):
            raise UsageError(f"run id {run.run_id!r} is not a KFP run id (a UUID); cleanup will not name folders by it")
        claims, secrets, serving = _run_settings(run)
        doomed.append(Doomed(run, claims, secrets, serving))
    # The namespace's listing already in hand where it was the whole namespace's; else one more listing.
    _started_from(doomed, listed if older_than is not None and experiment is None else _all_runs(kfp_, experiment))
    return doomed, others


def _all_runs(kfp_: Kfp, experiment: str | None) -> list:
    """Every run the namespace's listing gives (a later run of any experiment may start from a doomed one); the
    experiment's where multi-user KFP needs a namespace that was not given."""
    try:
        return list_runs(kfp_, None)
    except UsageError:
        return list_runs(kfp_, experiment) if experiment else []


def _started_from(doomed: list[Doomed], runs: list) -> None:
    """Mark the doomed runs whose folders another run's parameters name (a later run's base model, dataset, ...)."""
    ids = {d.run.run_id for d in doomed}
    for other in runs:
        if other.run_id in ids:
            continue
        params = json.dumps(getattr(getattr(other, "runtime_config", None), "parameters", None) or {})
        for d in doomed:
            if not d.kept and f"runs/{d.run.run_id}" in params:
                d.kept = f"kept: run {other.run_id} ({other.display_name}) starts from its folders"


def _still_final(kfp_: Kfp, going: list[Doomed]) -> None:
    """Read each run again right before anything is deleted: one retried since it was listed is running again."""
    for d in going:
        run = get_run(kfp_, d.run.run_id)
        if run.state not in FINAL_STATES:
            d.kept = f"kept: run {d.run.run_id} is {run.state} now (retried since it was listed)"


def cleanup_job(doomed: list[Doomed], namespace: str, image: str) -> dict:
    """The batch/v1 Job (Kubernetes JSON) that removes the runs' folders: each claim mounted once, the script run as
    the steps' user (components/security.py), no shell."""
    from components.security import container_security_context, pod_security_context

    claims = list(dict.fromkeys(claim for d in doomed for claim in d.claims))
    run_ids = sorted(d.run.run_id for d in doomed)
    mounts = [f"{CLAIMS_ROOT}/{i}" for i in range(len(claims))]
    digest = hashlib.sha256(json.dumps([claims, run_ids, time.time_ns()]).encode()).hexdigest()[:10]
    secrets = list(dict.fromkeys(s for d in doomed for s in d.image_pull_secrets))
    labels = {CLEANUP_LABEL: CLEANUP_JOB_PREFIX}
    pod: dict[str, Any] = {
        "restartPolicy": "Never",
        "automountServiceAccountToken": False,  # it deletes files, never calls the API
        "securityContext": pod_security_context(),
        "containers": [
            {
                "name": "cleanup",
                "image": image,
                "command": ["python", "-c", CLEANUP_SCRIPT, *mounts, "--", *run_ids],
                "securityContext": container_security_context(),
                "resources": {"requests": {"cpu": "100m", "memory": "128Mi"}, "limits": {"memory": "256Mi"}},
                "volumeMounts": [{"name": f"claim-{i}", "mountPath": m} for i, m in enumerate(mounts)],
            }
        ],
        "volumes": [{"name": f"claim-{i}", "persistentVolumeClaim": {"claimName": c}} for i, c in enumerate(claims)],
    }
    if secrets:
        pod["imagePullSecrets"] = [{"name": s} for s in secrets]
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": f"{CLEANUP_JOB_PREFIX}-{digest}", "namespace": namespace, "labels": labels},
        "spec": {
            "backoffLimit": 2,
            "ttlSecondsAfterFinished": 86400,
            "template": {"metadata": {"labels": labels}, "spec": pod},
        },
    }


def _served(api_client, namespace: str, doomed: list[Doomed]) -> None:
    """Mark the runs whose folders the InferenceService named by their serving_name serves (its manifest names
    pvc://<model claim>/runs/<run id>...): deleting them would break the endpoint."""
    from kubernetes import client as k8s
    from kubernetes.client.rest import ApiException

    api = k8s.CustomObjectsApi(api_client)
    for name in dict.fromkeys(d.serving_name for d in doomed if d.serving_name):
        try:
            isvc = api.get_namespaced_custom_object(
                "serving.kserve.io", "v1beta1", namespace, "inferenceservices", name
            )
        except ApiException as exc:
            if exc.status == 404:
                continue
            raise
        text = json.dumps(isvc.get("spec", {}))
        for d in doomed:
            if any(f"pvc://{claim}/runs/{d.run.run_id}" in text for claim in d.claims):
                d.kept = f"kept: InferenceService {namespace}/{name} serves its model (delete that first)"


@contextlib.contextmanager
def _kube_step(namespace: str, action: str) -> Iterator[None]:
    """The Kubernetes client's failures as one line: no cluster access is bad input (exit 2), a refusal fails."""
    from kubernetes.client.rest import ApiException
    from kubernetes.config import ConfigException

    try:
        yield
    except ConfigException as exc:
        raise UsageError(
            f"cleanup deletes the runs' folders with a Kubernetes Job and found no cluster access ({exc}); "
            "point KUBECONFIG at the cluster, or pass --keep-folders to delete only the runs"
        ) from None
    except ApiException as exc:
        said = " ".join(str(exc.reason or exc.body or "").split())[:300]
        raise RuntimeError(
            f"Kubernetes refused {action} in namespace {namespace} (HTTP {exc.status}: {said}); you need to create "
            "Jobs and read InferenceServices there (or pass --keep-folders)"
        ) from None


def run_job(api_client, job: dict, *, timeout: float, poll: float = 2.0, sleep=time.sleep, clock=time.monotonic) -> str:
    """Create the Job and wait for it to complete; its name. RuntimeError when it fails or runs past ``timeout``."""
    from kubernetes import client as k8s

    batch = k8s.BatchV1Api(api_client)
    namespace, name = job["metadata"]["namespace"], job["metadata"]["name"]
    batch.create_namespaced_job(namespace, job)
    deadline = clock() + timeout
    while True:
        status = batch.read_namespaced_job(name, namespace).status
        conditions = {c.type: c for c in (status.conditions or []) if c.status == "True"} if status else {}
        if "Complete" in conditions or (status and status.succeeded):
            return name
        if "Failed" in conditions:
            why = conditions["Failed"].message or conditions["Failed"].reason or "failed"
            raise RuntimeError(f"cleanup Job {namespace}/{name} failed ({why}): kubectl -n {namespace} logs job/{name}")
        if clock() >= deadline:
            raise RuntimeError(
                f"cleanup Job {namespace}/{name} did not complete in {timeout:.0f}s: kubectl -n {namespace} describe "
                f"job/{name}"
            )
        sleep(poll)


def cleanup(
    kfp_: Kfp,
    doomed: list[Doomed],
    *,
    yes: bool,
    keep_folders: bool,
    namespace: str,
    image: str,
    api_client=None,
    job_timeout: float = 900.0,
    out: Callable[[str], None] = print,
    **job_knobs,
) -> int:
    """Print what is to be deleted; with ``yes`` delete the folders (one Job) and then the runs. A run is deleted
    only once its folders are: a failed Job leaves every run, so the cleanup can be repeated."""
    if not doomed:
        out("no finished run matches; nothing to delete")
        return 0
    if not keep_folders and yes:
        with _kube_step(namespace, "reading the InferenceServices"):
            from components.kube import load_api_client

            api_client = api_client or load_api_client()
            _served(api_client, namespace, doomed)
    for d in doomed:
        run = d.run
        ended = _when(run.finished_at) if _time(run.finished_at) else f"created {_when(run.created_at)}"
        out(f"run {run.run_id} ({run.display_name}): {run.state}, {ended}")
        if d.kept:
            out(f"  {d.kept}")
        elif not keep_folders:
            out("  folders: " + " ".join(d.folders()))
    if yes:
        _still_final(kfp_, [d for d in doomed if not d.kept])
        for d in doomed:
            if d.kept.startswith(f"kept: run {d.run.run_id} is "):
                out(f"run {d.run.run_id}: {d.kept}")
    going = [d for d in doomed if not d.kept]
    if not yes:
        what = "these runs" if keep_folders else "these runs and their folders (a Job in namespace " + namespace + ")"
        out(f"dry run: nothing deleted; pass --yes to delete {what}")
        return 0
    if going and not keep_folders:
        with _kube_step(namespace, "running the cleanup Job"):
            name = run_job(api_client, cleanup_job(going, namespace, image), timeout=job_timeout, **job_knobs)
        out(f"deleted the folders of {len(going)} runs (Job {namespace}/{name})")
    for d in going:
        with _step(kfp_, f"deleting run {d.run.run_id}"):
            kfp_.client.delete_run(d.run.run_id)
    out(f"deleted {len(going)} runs" + (f"; kept {len(doomed) - len(going)}" if len(going) < len(doomed) else ""))
    return 0


# ------------------------------------------------------------------------------------------------ command line


def make_parser() -> argparse.ArgumentParser:
    """The command line (``--help`` imports neither kfp nor the Kubernetes client)."""
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--host", default=os.environ.get("KFP_HOST"), help="KFP API endpoint (default: $KFP_HOST); token: $KFP_TOKEN"
    )
    common.add_argument("--namespace", help="KFP namespace (multi-user Kubeflow); also where cleanup's Job runs")
    p = argparse.ArgumentParser(
        prog="python -m pipelines.runs",
        description=__doc__.split("\n")[0],
        epilog=__doc__.split("\n", 2)[2],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    s = sub.add_parser("status", parents=[common], help="the run's state and each step's")
    s.add_argument("run_id", metavar="RUN_ID")
    s = sub.add_parser("wait", parents=[common], help="follow a run to its end; exit 0 only if it succeeded")
    s.add_argument("run_id", metavar="RUN_ID")
    s.add_argument("--timeout", help="give up after this long (e.g. 12h, 90m; a bare number is seconds)")
    s.add_argument("--interval", type=float, default=10.0, help="seconds between polls (default: 10)")
    s = sub.add_parser("list", parents=[common], help="runs, newest first")
    s.add_argument("--experiment", help="only this experiment's runs")
    s.add_argument("--state", type=_state, help=f"only runs in this state ({', '.join(STATES)})")
    s.add_argument("--limit", type=int, default=20, help="at most this many (default: 20; 0: all)")
    s = sub.add_parser("cancel", parents=[common], help="terminate a run that is still going")
    s.add_argument("run_id", metavar="RUN_ID")
    s = sub.add_parser("cleanup", parents=[common], help="delete finished runs and their folders (dry run by default)")
    s.add_argument("run_ids", metavar="RUN_ID", nargs="*", help="finished runs to delete")
    s.add_argument("--older-than", help="also every finished run that ended longer ago than this (e.g. 7d)")
    s.add_argument("--experiment", help="with --older-than: only this experiment's runs")
    s.add_argument("--yes", action="store_true", help="delete; without it nothing is deleted (a dry run)")
    s.add_argument("--dry-run", action="store_true", help="print what would be deleted (the default without --yes)")
    s.add_argument("--keep-folders", action="store_true", help="delete only the runs from KFP, not their folders")
    s.add_argument("--image", help="image of the cleanup Job (default: the package's components image)")
    s.add_argument("--job-timeout", default="15m", help="how long the cleanup Job may take (default: 15m)")
    return p


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``python -m pipelines.runs``; returns the exit code (2 for bad input)."""
    args = make_parser().parse_args(argv)
    return exit_code(lambda: _main(args))


def _main(args) -> int:
    # Every argument is checked before the first request.
    timeout = parse_duration(args.timeout, "--timeout", bare_unit="s") if getattr(args, "timeout", None) else None
    older = parse_duration(args.older_than, "--older-than") if getattr(args, "older_than", None) else None
    if args.command == "cleanup":
        if args.yes and args.dry_run:
            raise UsageError("--yes and --dry-run contradict each other; pass one")
        if not args.run_ids and older is None:
            raise UsageError("cleanup needs RUN_ID arguments or --older-than (e.g. --older-than 7d)")
        job_timeout = parse_duration(args.job_timeout, "--job-timeout", bare_unit="s")
    kfp_ = connect(args.host, args.namespace)
    if args.command == "status":
        print(describe(kfp_, get_run(kfp_, args.run_id)))
        return 0
    if args.command == "wait":
        try:
            return wait(kfp_, args.run_id, timeout=timeout, interval=args.interval)
        except KeyboardInterrupt:
            print(f"stopped waiting; run {args.run_id} goes on", file=sys.stderr)
            return EXIT_INTERRUPTED
    if args.command == "list":
        runs = [r for r in list_runs(kfp_, args.experiment) if args.state is None or r.state == args.state]
        print_runs(runs[: args.limit] if args.limit > 0 else runs)
        return 0
    if args.command == "cancel":
        print(cancel(kfp_, args.run_id))
        return 0
    from components.version import COMPONENTS_IMAGE

    doomed, others = select(kfp_, args.run_ids, older, args.experiment)
    if others:
        print(f"{others} finished run{'s' if others > 1 else ''} of other pipelines left alone")
    return cleanup(
        kfp_,
        doomed,
        yes=args.yes,
        keep_folders=args.keep_folders,
        namespace=args.namespace or kfp_.namespace or "kubeflow",
        image=args.image or COMPONENTS_IMAGE,
        job_timeout=job_timeout.total_seconds(),
    )


def print_runs(runs: Iterable) -> None:
    rows = [(r.run_id, r.state or "-", _when(r.created_at), _when(r.finished_at), r.display_name) for r in runs]
    if not rows:
        print("no runs")
        return
    print(f"{'RUN ID':<36}  {'STATE':<9}  {'CREATED':<20}  {'FINISHED':<20}  NAME")
    for row in rows:
        print(f"{row[0]:<36}  {row[1]:<9}  {row[2]:<20}  {row[3]:<20}  {row[4]}")


if __name__ == "__main__":
    sys.exit(main())
