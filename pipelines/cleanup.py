"""Clean up finished runs: ``python -m pipelines.runs cleanup`` (pipelines/runs.py reads its command line).

It deletes, for each finished run (SUCCEEDED, FAILED, CANCELED, SKIPPED) it selects, the run's folders on the
two claims (runs/<run id>/ and its variants' runs/<run id>-<variant>/ on the data_pvc and model_pvc the run was
given) with one Kubernetes Job in --namespace (default: kubeflow, where single-user KFP runs the steps) that mounts
the claims, then the run itself from KFP. Nothing is deleted without --yes. A run still going is refused; a run
whose model the run's InferenceService (serving_name) still serves is kept. --keep-folders deletes only the runs.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import re
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from pipelines.errors import UsageError
from pipelines.kfp_client import FINAL_STATES, Kfp, _step, _time, _when, get_run, list_runs

# KFP run ids are UUIDs; cleanup builds folder names from them, so it accepts nothing else.
_RUN_ID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
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


# ------------------------------------------------------------------------------------------------ selecting runs


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


# ------------------------------------------------------------------------------------------------ the cleanup Job


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
