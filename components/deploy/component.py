"""deploy_model as a KFP component: serve the tuned model and smoke-test it."""

from typing import NamedTuple

from kfp import dsl

from components.version import COMPONENTS_IMAGE


@dsl.component(base_image=COMPONENTS_IMAGE, install_kfp_package=False)
def deploy_model(
    model_path: str,
    settings: dict,
    run_id: str,
) -> NamedTuple("DeployOutputs", [("endpoint", str), ("served_model_name", str), ("smoke_reply", str)]):
    """Serve the tuned model and prove it answers one chat completion and is the model the evaluation scored.

    ``kserve-vllm`` / ``kserve-huggingface`` create (or update in place) an InferenceService whose
    ``storageUri`` is the model's ``pvc://`` URI, wait for Ready, smoke-test the OpenAI route and roll
    back on failure or when the run is cancelled. ``local`` starts ``transformers serve`` on a free localhost port.
    An existing service keeps its deployment mode (changing it is an error: delete the service first); with
    Knative, ``canary_traffic_percent`` sends that share to the new revision and the smoke test goes there.
    Then the server must reproduce evaluate_model's ``serving_check.json`` (beside the model folder): per-token
    log-probabilities of a few held-out rows within 0.05 nats on average and the greedy first tokens
    (components/deploy/logprobs.py; ``local`` compares the greedy answers only); otherwise the service is rolled
    back (local: the server is stopped) and the step fails.

    Args:
        model_path: the last stage's final folder (train_model's ``model_path``), on the model volume.
        settings: every setting, as validate_inputs resolved them (components/settings.py): the deploy settings
            and the GPU pods' node_selector and tolerations.
        run_id: the KFP run id, recorded as a label.

    Returns:
        endpoint: the OpenAI-compatible base URL.
        served_model_name: the model name to put in requests.
        smoke_reply: the smoke test's answer (proof the server generates).
    """
    import logging
    import os
    from collections import namedtuple

    from components.deploy.logprobs import read_reference, reference_path
    from components.settings import Settings

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    log = logging.getLogger("deploy_model")
    s = Settings.from_flat(settings)
    keep_serving = s.deploy.keep_serving
    # Written by evaluate_model beside the model folder: what the served model must reproduce.
    reference = read_reference(reference_path(model_path))
    if s.deploy.deploy_backend == "local":
        from components.deploy.local_server import serve_locally

        log_path = os.path.join(os.path.dirname(model_path), "serve.log")
        result = serve_locally(model_path, log_path, keep_serving=keep_serving, serving_reference=reference)
        if keep_serving:
            log.info("server kept running (pid %s); stop it with: kill %s", result["pid"], result["pid"])
    else:
        from components.deploy.inference_service import deploy_inference_service, inference_service_for_run
        from components.kube import current_namespace
        from components.paths import MODEL_MOUNT, pvc_uri

        manifest = inference_service_for_run(s.deploy, s.cluster, run_id=run_id, namespace=current_namespace(),
                                             storage_uri=pvc_uri(s.cluster.model_pvc, MODEL_MOUNT, model_path))
        result = deploy_inference_service(manifest, serving_reference=reference)
    log.info("endpoint %s answered: %r", result["endpoint"], result["smoke_reply"])
    import inspect

    from components.observe.langfuse_trace import trace_smoke_test

    if s.deploy.deploy_backend == "local":
        from components.deploy.local_server import SMOKE_PROMPT as smoke_prompt
    else:
        smoke_prompt = inspect.signature(deploy_inference_service).parameters["smoke_prompt"].default
    # The smoke test's generation, with the served model's identity, to Langfuse when langfuse_secret's keys are set.
    trace_smoke_test(run_id=run_id, model_path=model_path, served_model_name=result["served_model_name"],
                     endpoint=result["endpoint"], prompt=smoke_prompt, reply=result["smoke_reply"])
    outputs = namedtuple("DeployOutputs", ["endpoint", "served_model_name", "smoke_reply"])
    return outputs(result["endpoint"], result["served_model_name"], result["smoke_reply"])


@dsl.component(base_image=COMPONENTS_IMAGE, install_kfp_package=False)
def skip_deployment(reason: str) -> str:
    """Record that the evaluation gate did not pass, so the run shows why nothing was deployed.

    Args:
        reason: evaluate_model's explanation.

    Returns:
        An empty endpoint.
    """
    print(f"deployment skipped: {reason}")
    return ""
