"""The Kubeflow Pipelines client the run commands share (pipelines/runs.py, cleanup.py, logs.py, schedules.py):
connecting as ``python -m pipelines.run --host`` does, getting and listing runs page by page, and reading a run's
tasks and why it failed."""

from __future__ import annotations

import os
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from pipelines.errors import UsageError

if TYPE_CHECKING:  # kfp and the Kubernetes client cost a second to import: --help and bad input never pay it
    import kfp

FINAL_STATES = ("SUCCEEDED", "FAILED", "CANCELED", "SKIPPED")
STATES = ("PENDING", "RUNNING", "CANCELING", "PAUSED", *FINAL_STATES)
_PAGE_SIZE = 100


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
