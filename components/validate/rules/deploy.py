"""The deployment step's rules: service name, context length, GPUs, traffic split and where the model is."""

from __future__ import annotations

from components.names import DNS1035_LABEL, name_error
from components.settings import Settings


def check_deploy_settings(s: Settings) -> list[str | None]:
    """Service name, context length against training length, GPUs per backend, canary with Knative."""
    d = s.deploy
    errors = [name_error("serving_name", d.serving_name, DNS1035_LABEL, 63, "DNS-1035 name")]
    if d.max_model_len < s.train.max_seq_length:
        errors.append(f"max_model_len={d.max_model_len} is shorter than max_seq_length={s.train.max_seq_length}; "
                      "serve at least the length the model was trained on")
    if s.cluster.train_backend != "local" and d.deploy_backend == "local":
        errors.append("deploy_backend=local needs train_backend=local (the model is on the cluster's volume); "
                      "use kserve-vllm")
    if d.deploy_backend.startswith("kserve") and d.serving_gpus < 1:
        errors.append(f"serving_gpus={d.serving_gpus} with deploy_backend={d.deploy_backend}: vLLM needs at "
                      "least 1 GPU")
    if d.canary_traffic_percent and d.deployment_mode != "Knative":
        errors.append("canary_traffic_percent needs deployment_mode=Knative (KServe splits traffic between Knative "
                      "revisions)")
    return errors
