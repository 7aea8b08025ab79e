"""deploy_model as a KFP component: serve the tuned model and smoke-test it."""

from typing import NamedTuple

from kfp import dsl
from kfp.dsl import Input, Model

from components.version import COMPONENTS_IMAGE


@dsl.component(base_image=COMPONENTS_IMAGE, install_kfp_package=False)
def deploy_model(
    model: Input[Model],
    deploy_backend: str,
    serving_name: str,
    serving_gpus: int,
    max_model_len: int,
    keep_serving: bool,
    node_selector: dict,
    tolerations: list,
    run_id: str,
    deployment_mode: str = "Standard",
    canary_traffic_percent: int = 0,
) -> NamedTuple("DeployOutputs", [("endpoint", str), ("served_model_name", str), ("smoke_reply", str)]):
    """Serve the tuned model and prove it answers one chat completion.

    ``kserve-vllm`` / ``kserve-huggingface`` create (or update in place) an InferenceService whose
    ``storageUri`` is the model's ``pvc://`` URI, wait for Ready, smoke-test the OpenAI route and roll
    back on failure or when the run is cancelled. ``local`` starts ``transformers serve`` on a free localhost port.

    Args:
        model: train_model's output (metadata ``uri`` and ``path``).
        deploy_backend: ``kserve-vllm``, ``kserve-huggingface`` or ``local``.
        serving_name: InferenceService name (DNS-1035), also the served model name.
        serving_gpus: GPUs per replica; vLLM's tensor-parallel size.
        max_model_len: context length the server accepts.
        keep_serving: local only: leave the server running after the smoke test (its pid is logged).
        node_selector: node labels for the predictor pods (JSON object).
        tolerations: tolerations for the predictor pods (JSON list).
        run_id: the KFP run id, recorded as a label.
        deployment_mode: KServe's ``Standard`` (Deployment + Service) or ``Knative`` (revisions, scale to zero,
            canary); an existing service keeps its mode (changing it is an error: delete the service first).
        canary_traffic_percent: Knative only: share of traffic (1-99) for the new model while the previous
            revision keeps the rest; the smoke test goes to the new revision. 0: all traffic at once.

    Returns:
        endpoint: the OpenAI-compatible base URL.
        served_model_name: the model name to put in requests.
        smoke_reply: the smoke test's answer (proof the server generates).
    """
    import logging
    import os
    from collections import namedtuple

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    log = logging.getLogger("deploy_model")
    if deploy_backend == "local":
        from components.deploy.local_server import serve_locally

        log_path = os.path.join(os.path.dirname(model.metadata["path"]), "serve.log")
        result = serve_locally(model.metadata["path"], log_path, keep_serving=keep_serving)
        if keep_serving:
            log.info("server kept running (pid %s); stop it with: kill %s", result["pid"], result["pid"])
    else:
        from components.deploy.inference_service import deploy_inference_service, inference_service_for_run
        from components.kube import current_namespace

        manifest = inference_service_for_run(
            run_id=run_id, namespace=current_namespace(), storage_uri=model.metadata["uri"],
            deploy_backend=deploy_backend, serving_name=serving_name, serving_gpus=serving_gpus,
            max_model_len=max_model_len, node_selector=node_selector, tolerations=tolerations,
            deployment_mode=deployment_mode, canary_traffic_percent=canary_traffic_percent,
        )
        result = deploy_inference_service(manifest)
    log.info("endpoint %s answered: %r", result["endpoint"], result["smoke_reply"])
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
