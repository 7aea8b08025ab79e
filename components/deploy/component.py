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
    An existing service keeps its deployment mode (changing it is an error: delete the service first); with
    Knative, ``canary_traffic_percent`` sends that share to the new revision and the smoke test goes there.
    Then the server must reproduce evaluate_model's ``serving_check.json`` (beside the model folder): per-token
    log-probabilities of a few held-out rows within 0.05 nats on average and the greedy first tokens
    (components/deploy/logprobs.py; ``local`` compares the greedy answers only); otherwise the service is rolled
    back (local: the server is stopped) and the step fails.

    Several models (components/deploy/plan.py): each full fine-tune (or merged LoRA) its own InferenceService
    ``<serving_name>-<variant>``; the LoRA adapters of one base (``merge_lora=false``) one vLLM service with the
    base as its model and each adapter a LoRA module under its own name (``kserve-vllm``; locally vLLM's CPU build
    from the serving virtualenv when a base has two or more adapters). Every served name is smoke-tested; when one
    service fails, every service this step changed is rolled back.

    Args:
        model_path: the served (best) variant's final folder (train_model's ``model_path``), on the model volume.
        settings: every setting of it, as validate_inputs resolved them (components/settings.py): the deploy
            settings and the GPU pods' node_selector and tolerations.
        run_id: the KFP run id, recorded as a label.
        serve: compare_variants' ``serve``: what to serve, each ``{"variant", "model_path", "settings",
            "served_model_name", "adapter", ...}`` ([]: ``model_path`` alone, as ``serving_name``).

    Returns:
        endpoint: the OpenAI-compatible base URL of the served (best) model.
        served_model_name: the model name to put in requests for it.
        smoke_reply: its smoke test's answer (proof the server generates).
        served: every served name: ``{"variant", "served_model_name", "endpoint", "smoke_reply"}``.
    """
    import logging
    import os
    from collections import namedtuple

    from components.deploy.logprobs import read_reference, reference_path
    from components.deploy.plan import plan_servers
    from components.settings import Settings
    from components.variants.compare import is_adapter

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    log = logging.getLogger("deploy_model")
    s = Settings.from_flat(settings)
    keep_serving = s.deploy.keep_serving
    serve = serve or [
        {
            "variant": "",
            "model_path": model_path,
            "settings": settings,
            "adapter": is_adapter(settings),
            "served_model_name": s.deploy.serving_name,
        }
    ]
    servers = plan_servers(serve, s.deploy.serving_name)
    variant_of = {item["served_model_name"]: item["variant"] for item in serve}
    path_of = {item["served_model_name"]: item["model_path"] for item in serve}
    # Written by evaluate_model beside each model folder: what each served model must reproduce.
    references = {name: read_reference(reference_path(path)) for name, path in path_of.items()}
    served: list[dict] = []
    if s.deploy.deploy_backend == "local":
        from components.deploy.local_server import SMOKE_PROMPT as smoke_prompt
        from components.deploy.local_server import serve_adapters_locally, serve_locally

        for server in servers:
            log_path = os.path.join(
                os.path.dirname(os.path.normpath(server.adapters[0].path if server.adapters else server.model_path)),
                "serve.log",
            )
            if len(server.adapters) > 1:
                # Several adapters of one base: the real vLLM server with each loaded as a LoRA module.
                result = serve_adapters_locally(
                    server,
                    log_path,
                    keep_serving=keep_serving,
                    max_model_len=s.deploy.max_model_len,
                    serving_references={a.served_model_name: references[a.served_model_name] for a in server.adapters},
                )
                for name, check in result["serving_checks"].items():
                    log.info(
                        "%s serves the evaluated model: mean |log-probability difference| %.4f nats over %d "
                        "held-out tokens, %d greedy tokens equal",
                        name,
                        check["mean_abs_logprob_diff"],
                        check["tokens"],
                        check["greedy_tokens_compared"],
                    )
                served += [
                    {
                        "variant": variant_of.get(name, ""),
                        "served_model_name": name,
                        "endpoint": result["endpoint"],
                        "smoke_reply": reply,
                    }
                    for name, reply in result["replies"].items()
                ]
            else:
                # One model (or one adapter, which transformers serve loads with its base): as for a single run.
                path = server.adapters[0].path if server.adapters else server.model_path
                name = server.adapters[0].served_model_name if server.adapters else server.served_model_name
                result = serve_locally(path, log_path, keep_serving=keep_serving, serving_reference=references[name])
                served.append(
                    {
                        "variant": variant_of[name],
                        "served_model_name": result["served_model_name"],
                        "endpoint": result["endpoint"],
                        "smoke_reply": result["smoke_reply"],
                    }
                )
            if keep_serving:
                log.info("server kept running (pid %s); stop it with: kill %s", result["pid"], result["pid"])
    else:
        import inspect

        from components.deploy.inference_service import (
            deploy_inference_service,
            deploy_inference_services,
            inference_services_for_servers,
        )
        from components.kube import current_namespace

        manifests = inference_services_for_servers(
            servers, s.deploy, s.cluster, run_id=run_id, namespace=current_namespace()
        )
        results = deploy_inference_services(manifests, serving_references=references)
        for result in results:
            for name, reply in (result.get("replies") or {result["served_model_name"]: result["smoke_reply"]}).items():
                served.append(
                    {
                        "variant": variant_of.get(name, ""),
                        "served_model_name": name,
                        "endpoint": result["endpoint"],
                        "smoke_reply": reply,
                    }
                )
        smoke_prompt = inspect.signature(deploy_inference_service).parameters["smoke_prompt"].default
    from components.observe.langfuse_trace import trace_smoke_test

    for entry in served:
        log.info("%s at %s answered: %r", entry["served_model_name"], entry["endpoint"], entry["smoke_reply"])
        # The smoke test's generation, with the served model's identity, to Langfuse when langfuse_secret's keys
        # are set.
        trace_smoke_test(
            run_id=run_id,
            model_path=path_of.get(entry["served_model_name"], entry["served_model_name"]),
            served_model_name=entry["served_model_name"],
            endpoint=entry["endpoint"],
            prompt=smoke_prompt,
            reply=entry["smoke_reply"],
        )
    best = next(
        (
            e
            for e in served
            if path_of.get(e["served_model_name"]) == model_path or e["served_model_name"] == model_path
        ),
        served[0],
    )
    outputs = namedtuple("DeployOutputs", ["endpoint", "served_model_name", "smoke_reply", "served"])
    return outputs(best["endpoint"], best["served_model_name"], best["smoke_reply"], served)


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
