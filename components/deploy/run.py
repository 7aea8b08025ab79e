"""The deploy step's work (deploy_model, components/deploy/component.py) as a plain function, testable without KFP:
serve what the run chose (components/deploy/serving_plan.py: which models share a server), prove each served name
answers, is the model the evaluation scored and is fast enough (time to first token, output tokens/s: the latency
gates), and say where each is."""

from __future__ import annotations

import logging
import os
from typing import NamedTuple

from components.deploy.serving_plan import Server, plan_servers
from components.deploy.smoke import check_latency, describe_latency
from components.models.logprobs import read_reference, reference_path
from components.settings import Settings
from components.variants.compare import is_adapter

log = logging.getLogger("deploy_model")


class Deployment(NamedTuple):
    """Every served name, and the one of the served (best) model."""

    best: dict  # {"variant", "served_model_name", "endpoint", "smoke_reply", "latency"} of the served (best) model
    served: list[dict]  # the same for every served name


def serve_list(serve: list[dict], *, model_path: str, settings: dict, serving_name: str) -> list[dict]:
    """What to serve: compare_variants' ``serve``, or when it is empty (a run without variants) ``model_path`` alone,
    with its flat ``settings``, as ``serving_name``."""
    return serve or [
        {
            "variant": "",
            "model_path": model_path,
            "settings": settings,
            "adapter": is_adapter(settings),
            "served_model_name": serving_name,
        }
    ]


def deploy_models(s: Settings, serve: list[dict], *, model_path: str, run_id: str) -> Deployment:
    """Serve every item of ``serve`` (``serve_list``) with the deploy settings of ``s`` and smoke-test each served
    name; ``model_path`` is the served (best) variant's final folder, ``run_id`` the label and trace session.

    ``deploy_backend=local`` starts ``transformers serve`` here (vLLM's CPU build for a base with two or more
    adapters, components/deploy/local_server.py); the KServe backends create or update one InferenceService per
    server and roll every one of them back when one fails (components/deploy/rollout.py). Each server must
    reproduce evaluate_model's ``serving_check.json`` beside its model folder, or the step fails. Then each server's
    latency is measured on a few concurrent streamed chat completions (``components.deploy.smoke.measure_latency``),
    put in each entry's ``latency``, and gated on ``max_ttft_seconds`` and ``min_output_tokens_per_second`` (0: not
    gated): a server too slow fails the step (rolled back on a cluster, stopped here). Each smoke test's generation
    goes to Langfuse when langfuse_secret's keys are set.
    """
    servers = plan_servers(serve, s.deploy.serving_name)
    variant_of = {item["served_model_name"]: item["variant"] for item in serve}
    path_of = {item["served_model_name"]: item["model_path"] for item in serve}
    # Written by evaluate_model beside each model folder: what each served model must reproduce.
    references = {name: read_reference(reference_path(path)) for name, path in path_of.items()}
    if s.deploy.deploy_backend == "local":
        served, smoke_prompt = _serve_here(s, servers, variant_of, references)
    else:
        served, smoke_prompt = _serve_on_cluster(s, servers, variant_of, references, run_id=run_id)
    from components.langfuse_trace import trace_smoke_test

    for entry in served:
        log.info("%s at %s answered: %r", entry["served_model_name"], entry["endpoint"], entry["smoke_reply"])
        log.info("%s latency: %s", entry["served_model_name"], describe_latency(entry["latency"]))
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
    return Deployment(best, served)


def _entry(variant: str, name: str, endpoint: str, reply: str, latency: dict) -> dict:
    return {
        "variant": variant,
        "served_model_name": name,
        "endpoint": endpoint,
        "smoke_reply": reply,
        "latency": latency,
    }


def latency_probe(s: Settings, *, temperature: float | None):
    """The probe ``local_server`` runs while its server is up (``probe=``): the latency of a few concurrent streamed
    chat completions, gated as on a cluster (``check_latency``: ``smoke.TooSlow`` names the setting and the measured
    value). The server stays tied to this step (it ends with it) until then, and is stopped after it unless
    ``keep_serving``."""
    d = s.deploy

    def probe(endpoint: str, model: str) -> dict:
        # CPU serving: a generous timeout, the probe's requests share the machine's cores.
        return check_latency(
            endpoint,
            model,
            max_ttft_seconds=d.max_ttft_seconds,
            min_output_tokens_per_second=d.min_output_tokens_per_second,
            timeout=300,
            temperature=temperature,
        )

    return probe


def _serve_here(s: Settings, servers: list[Server], variant_of: dict, references: dict) -> tuple[list[dict], str]:
    """Each server on this machine, smoke-tested and checked; the served names and the smoke test's prompt."""
    from components.deploy import local_server

    keep_serving = s.deploy.keep_serving
    served: list[dict] = []
    for server in servers:
        log_path = os.path.join(
            os.path.dirname(os.path.normpath(server.adapters[0].path if server.adapters else server.model_path)),
            "serve.log",
        )
        if len(server.adapters) > 1:
            # Several adapters of one base: the real vLLM server with each loaded as a LoRA module.
            result = local_server.serve_adapters_locally(
                server,
                log_path,
                keep_serving=keep_serving,
                probe=latency_probe(s, temperature=0),
                max_model_len=s.deploy.max_model_len,
                serving_references={a.served_model_name: references[a.served_model_name] for a in server.adapters},
            )
            for name, check in result["serving_checks"].items():
                log.info(
                    "%s serves the evaluated model: mean |log-probability difference| %.4f nats over %d held-out "
                    "tokens, %d greedy tokens equal",
                    name,
                    check["mean_abs_logprob_diff"],
                    check["tokens"],
                    check["greedy_tokens_compared"],
                )
            latency = result["latency"]
            served += [
                _entry(variant_of.get(name, ""), name, result["endpoint"], reply, latency)
                for name, reply in result["replies"].items()
            ]
        else:
            # One model (or one adapter, which transformers serve loads with its base): as for a single run.
            path = server.adapters[0].path if server.adapters else server.model_path
            name = server.adapters[0].served_model_name if server.adapters else server.served_model_name
            # No temperature: transformers serve decodes greedily by the model's generation config.
            result = local_server.serve_locally(
                path,
                log_path,
                keep_serving=keep_serving,
                serving_reference=references[name],
                probe=latency_probe(s, temperature=None),
            )
            latency = result["latency"]
            served.append(
                _entry(
                    variant_of[name], result["served_model_name"], result["endpoint"], result["smoke_reply"], latency
                )
            )
        if keep_serving:
            log.info("server kept running (pid %s); stop it with: kill %s", result["pid"], result["pid"])
    return served, local_server.SMOKE_PROMPT


def _serve_on_cluster(
    s: Settings, servers: list[Server], variant_of: dict, references: dict, *, run_id: str
) -> tuple[list[dict], str]:
    """One InferenceService per server, rolled out, smoke-tested and checked (every one rolled back when one fails);
    the served names and the smoke test's prompt."""
    import inspect

    from components.deploy import rollout
    from components.deploy.manifest import inference_services_for_servers
    from components.kube import current_namespace

    manifests = inference_services_for_servers(
        servers, s.deploy, s.job, s.network, s.storage, run_id=run_id, namespace=current_namespace()
    )
    results = rollout.deploy_inference_services(
        manifests,
        serving_references=references,
        latency_gates={
            "max_ttft_seconds": s.deploy.max_ttft_seconds,
            "min_output_tokens_per_second": s.deploy.min_output_tokens_per_second,
        },
    )
    served = [
        _entry(variant_of.get(name, ""), name, result["endpoint"], reply, result["latency"])
        for result in results
        for name, reply in (result.get("replies") or {result["served_model_name"]: result["smoke_reply"]}).items()
    ]
    smoke_prompt = inspect.signature(rollout.deploy_inference_service).parameters["smoke_prompt"].default
    return served, smoke_prompt
