"""The deployment step's rules (validate_inputs and ``pipelines.run`` ask here): one message per problem, naming
the setting and the fix. Bounds of a single setting are declared in the settings model (components/settings.py)."""

from __future__ import annotations

from components.deploy.inference_service import DEPLOY_BACKENDS, DEPLOYMENT_MODES
from components.kube import DNS1035_LABEL, name_error


def check_deploy_settings(p: dict) -> list[str | None]:
    """Backend, service name, GPUs, context length and traffic split."""
    errors = [
        None if p["deploy_backend"] in DEPLOY_BACKENDS else
        f"deploy_backend={p['deploy_backend']!r} is not one of {', '.join(DEPLOY_BACKENDS)}",
        None if p["deployment_mode"] in DEPLOYMENT_MODES else
        f"deployment_mode={p['deployment_mode']!r} is not one of {', '.join(DEPLOYMENT_MODES)}",
        name_error("serving_name", p["serving_name"], DNS1035_LABEL, 63, "DNS-1035 name"),
    ]
    if p["max_model_len"] < p["max_seq_length"]:
        errors.append(f"max_model_len={p['max_model_len']} is shorter than max_seq_length={p['max_seq_length']}; "
                      "serve at least the length the model was trained on")
    if p["train_backend"] != "local" and p["deploy_backend"] == "local":
        errors.append("deploy_backend=local needs train_backend=local (the model is on the cluster's volume); "
                      "use kserve-vllm")
    if p["deploy_backend"].startswith("kserve") and p["serving_gpus"] < 1:
        errors.append(f"serving_gpus={p['serving_gpus']} with deploy_backend={p['deploy_backend']}: vLLM needs at "
                      "least 1 GPU")
    if p["canary_traffic_percent"] and p["deployment_mode"] != "Knative":
        errors.append("canary_traffic_percent needs deployment_mode=Knative (KServe splits traffic between Knative "
                      "revisions)")
    return errors
