"""notify_run as a KFP component: the pipeline's exit handler, which posts how the run ended."""

from kfp import dsl

from components.version import COMPONENTS_IMAGE


@dsl.component(base_image=COMPONENTS_IMAGE, install_kfp_package=False)
def notify_run(status: dsl.PipelineTaskFinalStatus, run_id: str, model_root: str, model_pvc: str, data_root: str):
    """Post the run's outcome (status, the failing task and its error, the last stage's metrics and model URI) to a
    Slack-compatible webhook, when the run's ``alert_webhook_secret`` Secret holds one; never fails the run.

    The webhook URL comes only from ``ALERT_WEBHOOK_URL``, which the Secret reference fills (on the cluster; in a
    local run, from the environment ``pipelines.run`` runs in): a URL is a credential, never a parameter.

    The KFP backend reports only the exit handler group's state (COMPLETE, FAILED, CANCELED) with no step and no
    error: the failing step and its error come from the records the steps write as they end
    (components/observe/outcome.py).

    Args:
        status: KFP's final status of the pipeline's tasks (state, error, the task it is about).
        run_id: the KFP run id; names the run's folders.
        model_root: where the model volume is mounted in this step (the stages' metrics.json are read there).
        model_pvc: the model claim, for the model's ``pvc://`` URI.
        data_root: where the data volume is mounted in this step (the data steps' records are read there).
    """
    import json
    import logging
    import os

    from components.observe.alerts import WEBHOOK_URL_ENV, RunOutcome, notify_run_outcome
    from components.observe.outcome import read_records, run_outcome
    from components.paths import pvc_uri, run_dir
    from components.train.stages import STAGES, stage_folder

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    log = logging.getLogger("notify_run")
    if not os.environ.get(WEBHOOK_URL_ENV):
        log.info(
            "no %s (the alert Secret is absent or has no such key): run %s ended %s; nothing posted",
            WEBHOOK_URL_ENV,
            run_id,
            status.state,
        )
        return
    metrics, model_uri = {}, ""
    # The newest stage folder with a final model: the last stage that finished.
    finished = [os.path.join(run_dir(model_root, run_id), stage_folder(s)) for s in STAGES]
    finished = [d for d in finished if os.path.isfile(os.path.join(d, "metrics.json"))]
    if finished:
        last = max(finished, key=lambda d: os.path.getmtime(os.path.join(d, "metrics.json")))
        with open(os.path.join(last, "metrics.json")) as f:
            metrics = {
                k: v for k, v in json.load(f).items() if k in ("eval_loss", "global_step", "eval_rewards/accuracies")
            }
        final = os.path.join(last, "final")
        model_uri = pvc_uri(model_pvc, model_root, final) if os.path.isdir(final) else ""
    outcome, failed_step, reason = run_outcome(
        status.state,
        status.pipeline_task_name or "",
        status.error_message or "",
        read_records([data_root, model_root], run_id),
    )
    log.info("run %s: KFP state %s -> %s %s", run_id, status.state, outcome, failed_step)
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
