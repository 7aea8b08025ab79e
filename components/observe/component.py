"""notify_run as a KFP component: the pipeline's exit handler, which posts how the run ended."""

from kfp import dsl

from components.version import COMPONENTS_IMAGE


@dsl.component(base_image=COMPONENTS_IMAGE, install_kfp_package=False)
def notify_run(status: dsl.PipelineTaskFinalStatus, run_id: str, model_root: str, model_pvc: str, data_root: str):
    """Post the run's outcome (status, the failing task and its error, the last stage's metrics and model URI) to a
    Slack-compatible webhook, when the run's ``alert_webhook_secret`` Secret holds one; never fails the run. First
    delete the TensorBoard Deployments and Services the run's train steps recorded (components/observe/tensorboard.py)
    and the grpo stage's vLLM server a killed train step left (components/observe/run_objects.py).

    The webhook URL comes only from ``ALERT_WEBHOOK_URL``, which the Secret reference fills (on the cluster; in a
    local run, from the environment ``pipelines.run`` runs in): a URL is a credential, never a parameter.

    The KFP backend reports only the exit handler group's state (COMPLETE, FAILED, CANCELED) with no step and no
    error: the failing step and its error come from the records the steps write as they end
    (components/observe/outcome.py).

    Args:
        status: KFP's final status of the pipeline's tasks (state, error, the task it is about).
        run_id: the KFP run id; names the run's folders.
        model_root: where the model volume is mounted in this step (the stages' metrics.json and the TensorBoard
            records are read there).
        model_pvc: the model claim, for the model's ``pvc://`` URI.
        data_root: where the data volume is mounted in this step (the data steps' records are read there).
    """
    from components.observe.notify import notify_run_end
    from components.observe.process import start_step
    from components.observe.run_objects import RECORDS, remove_recorded
    from components.observe.tensorboard import remove_servers

    start_step("notify_run")
    # The TensorBoard Deployments and Services the train steps made where Kubeflow's controller is absent.
    remove_servers(model_root, run_id)
    # The grpo stage's vLLM generation server and the training jobs' NetworkPolicies, when a train step was killed
    # before it could delete them.
    for record in RECORDS:
        remove_recorded(model_root, run_id, record)
    notify_run_end(
        status.state,
        status.pipeline_task_name or "",
        status.error_message or "",
        run_id=run_id,
        model_root=model_root,
        model_pvc=model_pvc,
        data_root=data_root,
    )
