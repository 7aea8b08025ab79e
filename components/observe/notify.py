"""The exit handler's work (notify_run, components/observe/component.py) as a plain function, testable without KFP:
how the run ended, from KFP's final state and the records the steps left on the volumes, posted to the run's
webhook."""

from __future__ import annotations

import json
import logging
import os

from components.observe.alerts import WEBHOOK_URL_ENV, RunOutcome, notify_run_outcome
from components.observe.outcome import read_records, run_outcome
from components.paths import pvc_uri, run_dir
from components.stages import STAGES, stage_folder

log = logging.getLogger("notify_run")
# What the alert shows of the last finished stage's metrics.json.
ALERT_METRICS = ("eval_loss", "global_step", "eval_rewards/accuracies")


def last_stage_result(run_id: str, model_root: str, model_pvc: str) -> tuple[dict, str]:
    """The metrics (``ALERT_METRICS``) and final model's ``pvc://`` URI of the run's last stage that finished: the
    stage folder whose ``metrics.json`` is newest (the URI empty when it has no ``final/``); ``({}, "")`` when none
    finished."""
    finished = [os.path.join(run_dir(model_root, run_id), stage_folder(s)) for s in STAGES]
    finished = [d for d in finished if os.path.isfile(os.path.join(d, "metrics.json"))]
    if not finished:
        return {}, ""
    last = max(finished, key=lambda d: os.path.getmtime(os.path.join(d, "metrics.json")))
    with open(os.path.join(last, "metrics.json")) as f:
        metrics = {k: v for k, v in json.load(f).items() if k in ALERT_METRICS}
    final = os.path.join(last, "final")
    return metrics, pvc_uri(model_pvc, model_root, final) if os.path.isdir(final) else ""


def notify_run_end(
    state: str, task_name: str, error_message: str, *, run_id: str, model_root: str, model_pvc: str, data_root: str
) -> None:
    """Post how run ``run_id`` ended to the webhook in ``ALERT_WEBHOOK_URL`` (nothing without one): KFP's final
    ``state`` (with the task and error it names, where it names any), sorted by the steps' own records on the two
    volumes (components/observe/outcome.py), with the last finished stage's metrics and model. Never raises for a
    failed post (components/observe/alerts.py)."""
    if not os.environ.get(WEBHOOK_URL_ENV):
        log.info(
            "no %s (the alert Secret is absent or has no such key): run %s ended %s; nothing posted",
            WEBHOOK_URL_ENV,
            run_id,
            state,
        )
        return
    metrics, model_uri = last_stage_result(run_id, model_root, model_pvc)
    outcome, failed_step, reason = run_outcome(
        state, task_name, error_message, read_records([data_root, model_root], run_id)
    )
    log.info("run %s: KFP state %s -> %s %s", run_id, state, outcome, failed_step)
    notify_run_outcome(
        RunOutcome(
            pipeline="llm-finetune",
            run_id=run_id,
            status=outcome,
            failed_step=failed_step,
            reason=reason,
            metrics=metrics,
            model_uri=model_uri,
        )
    )
