"""publish_model as a KFP component: the deployed model to the Model Registry and the Hub, its evaluation to the
run's tracker."""

from kfp import dsl
from kfp.dsl import Input, Markdown, Metrics

from components.version import COMPONENTS_IMAGE


@dsl.component(base_image=COMPONENTS_IMAGE, install_kfp_package=False)
def publish_model(
    model_path: str,
    model_uri: str,
    settings: dict,
    run_id: str,
    endpoint: str,
    metrics: Input[Metrics],
    report: Input[Markdown],
) -> list:
    """Publish the deployed model where the settings ask, each optional: register it in Kubeflow Model Registry
    (``model_registry_url``: the model ``model_registry_model_name`` or ``serving_name``, a version named after the
    run it trained in, its URI and the evaluation's metrics), push its files to the Hugging Face Hub (``hub_repo_id``,
    private by default, the token from ``hub_token_secret``), and add the evaluation, the report and the model's URI
    to the stage's run on the tracker (``report_to`` mlflow or wandb). Nothing set: nothing done.

    Args:
        model_path: the deployed (best) variant's final folder on the model volume (compare_variants').
        model_uri: its URI (``pvc://...``, or the object store's copy).
        settings: the variant's settings as validate_inputs resolved them.
        run_id: the KFP run id.
        endpoint: where it is served (deploy_model's), recorded with it.
        metrics: compare_variants' metrics.
        report: compare_variants' report.

    Returns:
        One line per target published to.
    """
    import os

    from components.observe.process import start_step
    from components.publish.run import publish, read_secret
    from components.secrets import HF_TOKEN_KEY, TRACKING_KEYS
    from components.settings import Settings

    start_step("publish_model")
    s = Settings.from_flat(settings)
    hub_token = ""
    if s.publish.hub_repo_id:  # read through the API: no pod spec names a Secret this step may not need
        hub_token = read_secret(s.publish.hub_token_secret, (HF_TOKEN_KEY,), "hub_token_secret", required=True).get(
            HF_TOKEN_KEY, ""
        )
    if {"mlflow", "wandb"} & set(s.train.report_to) and s.observability.tracking_secret:
        os.environ.update(
            read_secret(s.observability.tracking_secret, TRACKING_KEYS, "tracking_secret", required=False)
        )
    done = publish(
        s,
        run_id=run_id,
        model_path=model_path,
        model_uri=model_uri,
        metrics=dict(metrics.metadata or {}),
        report_path=report.path,
        hub_token=hub_token,
    )
    return [*done, f"served at {endpoint}"] if done else []
