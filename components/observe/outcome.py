"""How each step ended, recorded on the run's volume, and how the run ended, as the exit handler tells it.

The KFP v2 backend does not tell an exit handler which step failed or why: its driver fills
``PipelineTaskFinalStatus.state`` with the ML Metadata execution state of the exit handler's group (``COMPLETE``,
``FAILED``, ``CANCELED``; kubeflow/pipelines ``backend/src/v2/driver/resolve.go``), names that group
(``exit-handler-1``) as the task and leaves the error empty. kfp.local reports ``SUCCEEDED``/``FAILED``. Backends
before 2.17.0 can report ``RUNNING`` for a run with nested conditions (kubeflow/pipelines #11979).

So every step that mounts a volume records its own end, ``runs/<run id>/steps/<step>.json`` ``{"step", "state",
"error", "bad_input", "ended"}``, as it ends (``recording_outcome``), and the exit handler reads them (``run_outcome``;
a local run's summary, ``failed_step``):

- a first failed record names the failing step and its error, whatever state KFP reports;
- else the state decides: COMPLETE/SUCCEEDED -> succeeded, FAILED -> failed (the step unknown: one that records
  nothing, validate_inputs, failed, or the pod never started), CANCELED/CANCELLED -> cancelled;
- any other state (RUNNING, #11979) with no failed record -> ``UNKNOWN``: the alert says the run ended and that
  KFP did not report how, and points at the run's page.
"""

from __future__ import annotations

import json
import os
import signal
import time
from contextlib import contextmanager
from pathlib import Path

from components.paths import run_dir

SUCCEEDED, FAILED, CANCELLED, UNKNOWN = "SUCCEEDED", "FAILED", "CANCELLED", "UNKNOWN"
# KFP's states (the backend's ML Metadata states and kfp.local's) -> the run's outcome.
_KFP_STATES = {
    "COMPLETE": SUCCEEDED,
    "SUCCEEDED": SUCCEEDED,
    "FAILED": FAILED,
    "CANCELED": CANCELLED,
    "CANCELLED": CANCELLED,
}
# An error longer than this is cut from the front: the end of a launcher's report (the pod's last lines) tells most.
ERROR_CHARS = 4000


def steps_dir(root: str, run_id: str) -> Path:
    """Where a run's step records live under a volume root."""
    return Path(run_dir(root, run_id)) / "steps"


def _write(root: str, run_id: str, step: str, state: str, error: str = "", bad_input: bool = False) -> None:
    folder = steps_dir(root, run_id)
    folder.mkdir(parents=True, exist_ok=True)
    record = {"step": step, "state": state, "error": error[-ERROR_CHARS:], "bad_input": bad_input, "ended": time.time()}
    tmp = folder / f".{step}.json.tmp"
    tmp.write_text(json.dumps(record))
    os.replace(tmp, folder / f"{step}.json")


@contextmanager
def recording_outcome(step: str, root: str, run_id: str):
    """Record how the block ends as step ``step`` of run ``run_id`` under volume ``root``; the exception goes on.

    SIGTERM (the run was cancelled: the step exits 143) is recorded as cancelled, any other exception as failed
    with its message. A ValueError is bad input (the steps' convention: the message names the setting and the fix),
    recorded as its message alone with ``bad_input``; any other exception with its type. A record that cannot be
    written never hides the step's own outcome.
    """
    try:
        yield
    except BaseException as exc:
        cancelled = isinstance(exc, SystemExit) and exc.code == 128 + signal.SIGTERM
        bad_input = isinstance(exc, ValueError)
        error = "" if cancelled else str(exc) if bad_input else f"{type(exc).__name__}: {exc}"
        try:
            _write(root, run_id, step, CANCELLED if cancelled else FAILED, error, bad_input)
        except OSError:
            pass
        raise
    try:
        _write(root, run_id, step, SUCCEEDED)
    except OSError:
        pass


def read_records(roots: list[str], run_id: str) -> list[dict]:
    """Every step record of the run under these volume roots, its variants' (``runs/<run id>-<variant>/``,
    components/variants/) included, oldest end first (unreadable records skipped)."""
    records = []
    for root in roots:
        folders = [steps_dir(root, run_id), *sorted(Path(run_dir(root, run_id)).parent.glob(f"{run_id}-*/steps"))]
        for path in [p for folder in folders if folder.is_dir() for p in sorted(folder.glob("*.json"))]:
            try:
                records.append(json.loads(path.read_text()))
            except (OSError, ValueError):
                continue
    return sorted(records, key=lambda r: r.get("ended", 0))


def failed_step(roots: list[str], run_id: str) -> dict | None:
    """The run's first failed step record under these volume roots (``read_records``), or None: what a local run's
    summary names as its error."""
    return next((r for r in read_records(roots, run_id) if r.get("state") == FAILED), None)


def run_outcome(state: str, task: str, error: str, records: list[dict]) -> tuple[str, str, str]:
    """``(status, failed_step, reason)`` of a run from KFP's final status and the steps' records.

    ``status`` is one of SUCCEEDED, FAILED, CANCELLED, UNKNOWN (see the module's docstring for the rules).
    """
    status = _KFP_STATES.get(state.upper())
    if status == SUCCEEDED:
        return SUCCEEDED, "", ""
    failed = next((r for r in records if r.get("state") == FAILED), None)
    if failed is not None and status != CANCELLED:
        return FAILED, failed.get("step", ""), failed.get("error", "")
    if status is None:
        return (
            UNKNOWN,
            "",
            (
                f"KFP reported the run's state as {state!r}, not how it ended (a KFP backend before "
                "2.17.0 does so for runs with nested conditions, kubeflow/pipelines#11979), and no "
                "step recorded a failure: see the run's page in the KFP UI"
            ),
        )
    # kfp.local names the failed task and its error; the backend names its exit-handler group and no error.
    real_task = task if error and not task.startswith("exit-handler") else ""
    return status, real_task, error if status == FAILED else ""
