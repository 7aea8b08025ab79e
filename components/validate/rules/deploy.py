"""The deployment step's rules: service name, context length, GPUs, traffic split, replicas and autoscaling, and
where the model is."""

from __future__ import annotations

from components.names import DNS1035_LABEL, name_error
from components.settings import Settings


def check_deploy_settings(s: Settings) -> list[str | None]:
    """Service name, context length against training length, GPUs per backend, canary with Knative, replica bounds
    and the scale metric of the deployment mode's autoscaler."""
    d = s.deploy
    errors = [name_error("serving_name", d.serving_name, DNS1035_LABEL, 63, "DNS-1035 name")]
    if d.max_model_len < s.train.max_seq_length:
        errors.append(
            f"max_model_len={d.max_model_len} is shorter than max_seq_length={s.train.max_seq_length}; "
            "serve at least the length the model was trained on"
        )
    if s.job.train_backend != "local" and d.deploy_backend == "local":
        errors.append(
            "deploy_backend=local needs train_backend=local (the model is on the cluster's volume); use kserve-vllm"
        )
    if d.deploy_backend.startswith("kserve") and d.serving_gpus < 1:
        errors.append(
            f"serving_gpus={d.serving_gpus} with deploy_backend={d.deploy_backend}: vLLM needs at least 1 GPU"
        )
    if d.canary_traffic_percent and d.deployment_mode != "Knative":
        errors.append(
            "canary_traffic_percent needs deployment_mode=Knative (KServe splits traffic between Knative revisions)"
        )
    return errors + _replicas(s) + _tensor_parallel(s) + _adapter_serving(s) + _variant_serving(s)


def _replicas(s: Settings) -> list[str | None]:
    """KServe's replica bounds and scale metric (components/deploy/serving_plan.py, SCALE_METRICS): at least
    one replica in Standard mode (only Knative scales to zero), max_replicas >= min_replicas, a metric the mode's
    autoscaler scales on (an HPA on cpu or memory; Knative's on concurrency or rps)."""
    from components.deploy.serving_plan import SCALE_METRICS

    d = s.deploy
    errors: list[str | None] = []
    if d.min_replicas > d.max_replicas >= 1:  # max_replicas < 1: its bound's own error
        errors.append(
            f"min_replicas={d.min_replicas} is above max_replicas={d.max_replicas}; raise max_replicas to at least "
            f"{d.min_replicas} or lower min_replicas"
        )
    if d.min_replicas == 0 and d.deployment_mode != "Knative":
        errors.append(
            f"min_replicas=0 (scale to zero) needs deployment_mode=Knative; {d.deployment_mode} mode keeps at least 1"
        )
    metrics = SCALE_METRICS.get(d.deployment_mode, ())
    known = {m for ms in SCALE_METRICS.values() for m in ms}  # another value: its choices' own error
    if d.scale_metric in known and metrics and d.scale_metric not in metrics:
        errors.append(
            f"scale_metric={d.scale_metric} is not a metric KServe's {d.deployment_mode} mode autoscales on: use "
            f"{' or '.join(metrics)}"
            + (" (concurrency and rps need deployment_mode=Knative)" if d.deployment_mode == "Standard" else "")
            + (" (cpu and memory need deployment_mode=Standard, an HPA)" if d.deployment_mode == "Knative" else "")
        )
    return errors


def tensor_parallel_sizes(heads: int, kv_heads: int, most: int = 8) -> list[int]:
    """vLLM's tensor-parallel sizes up to ``most`` for a model of ``heads`` attention and ``kv_heads`` key-value
    heads. vLLM refuses a size that does not divide the attention heads (``ModelConfig.verify_with_parallel_config``,
    vllm/config/model.py: "Total number of attention heads (...) must be divisible by tensor parallel size"), and
    ``QKVParallelLinear`` (vllm/model_executor/layers/linear.py) splits the key-value heads over the GPUs when there
    are more heads than GPUs (``divide(total_num_kv_heads, tp_size)``) or replicates each on as many GPUs
    (``divide(tp_size, total_num_kv_heads)``): ``divide`` asserts that the division is exact."""
    return [
        tp
        for tp in range(1, most + 1)
        if heads % tp == 0 and (kv_heads % tp == 0 if tp < kv_heads else tp % kv_heads == 0)
    ]


def _tensor_parallel(s: Settings) -> list[str | None]:
    """serving_gpus is vLLM's tensor-parallel size (both KServe backends pass it): one it accepts for the model's
    attention heads (``tensor_parallel_sizes``), when the model's config.json is known here."""
    from components.models.shape import load_architecture

    d, model = s.deploy, s.model.model_name_or_path
    if not d.deploy_backend.startswith("kserve") or d.serving_gpus < 1:
        return []
    config = load_architecture(model)
    if config is None or "num_attention_heads" not in config:
        return []
    heads = config["num_attention_heads"]
    kv_heads = config.get("num_key_value_heads") or heads
    if d.serving_gpus in tensor_parallel_sizes(heads, kv_heads, d.serving_gpus):
        return []
    sizes = ", ".join(map(str, tensor_parallel_sizes(heads, kv_heads)))
    if heads % d.serving_gpus:
        why = f"which must divide {model}'s {heads} attention heads"
    else:
        why = (
            f"which must divide {model}'s {kv_heads} key-value heads or be a multiple of them (vLLM splits them "
            "over the GPUs, or replicates each on as many)"
        )
    return [f"serving_gpus={d.serving_gpus} is vLLM's tensor-parallel size, {why}; use one of {sizes}"]


def _adapter_serving(s: Settings) -> list[str | None]:
    """A LoRA adapter served unmerged (method lora/qlora, merge_lora=false): vLLM's own server, a rank it loads."""
    from components.deploy.serving_plan import LORA_RANKS

    if s.model.method not in ("lora", "qlora") or s.model.merge_lora:
        return []
    errors: list[str | None] = []
    if s.deploy.deploy_backend == "kserve-huggingface":
        errors.append(
            f"method={s.model.method} with merge_lora=false serves the adapter with vLLM's LoRA modules "
            "(--enable-lora --lora-modules), which deploy_backend=kserve-huggingface does not pass on: use "
            "deploy_backend=kserve-vllm, or merge_lora=true"
        )
    if s.model.lora_r > LORA_RANKS[-1]:
        errors.append(
            f"lora_r={s.model.lora_r} with merge_lora=false: vLLM loads adapters of rank <= "
            f"{LORA_RANKS[-1]} (its largest --max-lora-rank); set lora_r <= {LORA_RANKS[-1]} or "
            "merge_lora=true"
        )
    return errors


def _variant_serving(s: Settings) -> list[str | None]:
    """With variants: each served name fits a service name; locally, several adapters need vLLM's CPU build."""
    from components.deploy.serving_plan import BASE_SUFFIX
    from components.variants import variant_names, variant_values
    from components.variants.compare import is_adapter

    variants = s.variants.variants
    if not variants or not all(isinstance(v, dict) for v in variants):
        return []
    flat = s.flat()
    names = variant_names(variants)
    adapters = [name for i, name in enumerate(names) if is_adapter(variant_values(flat, i))]
    errors: list[str | None] = []
    for i, name in enumerate(names):
        served = f"{s.deploy.serving_name}-{name}"
        if len(served) > 63:
            errors.append(
                f"variants[{i}] ({name!r}) is served as {served!r}, longer than a service name may be (63): "
                f"shorten serving_name or the variant's name"
            )
        if adapters and s.variants.deploy_variants == "all" and name == BASE_SUFFIX.lstrip("-"):
            errors.append(
                f"variants[{i}] ({name!r}): with LoRA variants and deploy_variants=all the adapters' base "
                f"is served as {s.deploy.serving_name}{BASE_SUFFIX}; give this variant another name"
            )
    if s.variants.deploy_variants == "all" and len(adapters) > 1 and s.deploy.deploy_backend == "local":
        from components.deploy.local_server import vllm_python

        try:
            vllm_python()
        except FileNotFoundError as exc:
            errors.append(f"variants {adapters}: {exc}")
    return errors
