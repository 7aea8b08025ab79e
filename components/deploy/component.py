"""deploy_model as a KFP component: serve the tuned model and smoke-test it."""

from typing import NamedTuple

from kfp import dsl

from components.version import COMPONENTS_IMAGE


@dsl.component(base_image=COMPONENTS_IMAGE, install_kfp_package=False)
def deploy_model(
    model_path: str,
    settings: dict,
    run_id: str,
    serve: list,
) -> NamedTuple(
    "DeployOutputs", [("endpoint", str), ("served_model_name", str), ("smoke_reply", str), ("served", list)]
):
    """Serve the tuned model (with ``deploy_variants=all``: every variant that passed) and prove each served name
    answers one chat completion and is the model the evaluation scored.

    ``kserve-vllm`` / ``kserve-huggingface`` create (or update in place) an InferenceService whose
    ``storageUri`` is the model's ``pvc://`` URI, wait for Ready, smoke-test the OpenAI route and roll
    back on failure or when the run is cancelled. ``local`` starts ``transformers serve`` on a free localhost port.
    An existing service keeps its deployment mode (changing it is an error: delete the service first), and gets no
    request for the new model before it passed every check: Standard tests it on a candidate service beside the live
    one first, Knative as a revision at 0% of the traffic, which then gets ``canary_traffic_percent`` (``python -m
    pipelines.run promote|rollback RUN_ID`` finishes the canary).
    Then the server must reproduce evaluate_model's ``serving_check.json`` (beside the model folder): per-token
    log-probabilities of a few held-out rows within 0.05 nats on average and the greedy first tokens
    (components/models/logprobs.py; ``local`` compares the greedy answers only); otherwise the service is rolled
    back (local: the server is stopped) and the step fails. Last, each server's latency: time to first token and
    output tokens/s of 4 concurrent streamed chat completions (components/deploy/smoke.py), reported in ``served``
    and gated on ``max_ttft_seconds`` / ``min_output_tokens_per_second`` (0: not gated; too slow: rolled back too).
    The InferenceService's replicas: ``min_replicas``..``max_replicas``, scaled on ``scale_metric`` to
    ``scale_target`` (Standard: an HPA on cpu or memory; Knative: concurrency or rps).

    Several models (components/deploy/serving_plan.py): each full fine-tune (or merged LoRA) its own InferenceService
    ``<serving_name>-<variant>``; the LoRA adapters of one base (``merge_lora=false``) one vLLM service with the
    base as its model and each adapter a LoRA module under its own name (``kserve-vllm``; locally vLLM's CPU build
    from the serving virtualenv when a base has two or more adapters). Every served name is smoke-tested; when one
    service fails, every service this step changed is rolled back.

    Args:
        model_path: the served (best) variant's final folder (train_model's ``model_path``), on the model volume.
        settings: every setting of it, as validate_inputs resolved them (components/settings/): the deploy
            settings and the GPU pods' node_selector and tolerations.
        run_id: the KFP run id, recorded as a label.
        serve: compare_variants' ``serve``: what to serve, each ``{"variant", "model_path", "settings",
            "served_model_name", "adapter", ...}`` ([]: ``model_path`` alone, as ``serving_name``).

    Returns:
        endpoint: the OpenAI-compatible base URL of the served (best) model.
        served_model_name: the model name to put in requests for it.
        smoke_reply: its smoke test's answer (proof the server generates).
        served: every served name: ``{"variant", "served_model_name", "endpoint", "smoke_reply", "latency"}``;
            ``latency``: its server's ``ttft_seconds_p50``, ``ttft_seconds_max``, ``output_tokens_per_second``,
            ``output_tokens``, ``seconds``, ``requests``, ``max_tokens`` (or ``error`` when not measured).
    """
    from collections import namedtuple

    from components.deploy.run import deploy_models, serve_list
    from components.observe.process import start_step
    from components.settings import Settings

    start_step("deploy_model")
    s = Settings.from_flat(settings)
    deployed = deploy_models(
        s,
        serve_list(serve, model_path=model_path, settings=settings, serving_name=s.deploy.serving_name),
        model_path=model_path,
        run_id=run_id,
    )
    best = deployed.best
    outputs = namedtuple("DeployOutputs", ["endpoint", "served_model_name", "smoke_reply", "served"])
    return outputs(best["endpoint"], best["served_model_name"], best["smoke_reply"], deployed.served)


@dsl.component(base_image=COMPONENTS_IMAGE, install_kfp_package=False)
def skip_deployment(reason: str) -> str:
    """Record that the evaluation gate did not pass, so the run shows why nothing was deployed.

    Args:
        reason: evaluate_model's explanation.

    Returns:
        An empty endpoint.
    """
    from components.quick_exit import freeze_heap_at_exit

    freeze_heap_at_exit()
    print(f"deployment skipped: {reason}")
    return ""
