"""Parameter checks shared by ``python -m pipelines.run`` (before submitting) and the validate_inputs task.

Each check returns a message that names the parameter and the fix; all problems are reported together.
The choices and the rules between settings belong to the modules that implement them and are imported
from there, so a step and its check cannot disagree.
"""

from __future__ import annotations

import re

from components.data.formats import DATASET_FORMATS
from components.data.tokenizing import OVER_LENGTH
from components.deploy.inference_service import DEPLOY_BACKENDS, DEPLOYMENT_MODES
from components.train.config import DEEPSPEED_CONFIGS, METHODS, check_method_deepspeed
from components.train.launch import CLEANUP_POLICIES

TRAIN_BACKENDS = ("pytorchjob", "trainjob", "local")

# Kubernetes object names: claims and secrets are DNS-1123 subdomains; InferenceService names become
# Service/host names, so they must be DNS-1035 labels (start with a letter) of at most 63 characters.
_DNS1123_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_DNS1035_LABEL = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")


def _name_error(field: str, value: str, pattern: re.Pattern, limit: int, what: str) -> str | None:
    if len(value) <= limit and pattern.match(value):
        return None
    suggestion = re.sub(r"[^a-z0-9-]+", "-", value.lower()).strip("-")[:limit] or "my-name"
    return f"{field}={value!r} is not a valid Kubernetes {what} (lowercase letters, digits, '-', at most {limit}); e.g. {suggestion!r}"


def _choice(params: dict, field: str, choices: tuple) -> str | None:
    if params[field] in choices:
        return None
    return f"{field}={params[field]!r} is not one of {', '.join(choices)}"


def check_parameters(p: dict) -> list[str]:
    """All problems with the pipeline parameters ``p`` (empty when they are fine)."""
    errors = [
        _choice(p, "method", METHODS),
        _choice(p, "train_backend", TRAIN_BACKENDS),
        _choice(p, "deploy_backend", DEPLOY_BACKENDS),
        _name_error("data_pvc", p["data_pvc"], _DNS1123_SUBDOMAIN, 253, "claim name"),
        _name_error("model_pvc", p["model_pvc"], _DNS1123_SUBDOMAIN, 253, "claim name"),
        _name_error("serving_name", p["serving_name"], _DNS1035_LABEL, 63, "DNS-1035 name"),
    ]
    if p["hf_token_secret"]:
        errors.append(_name_error("hf_token_secret", p["hf_token_secret"], _DNS1123_SUBDOMAIN, 253, "Secret name"))
    else:
        # Pods get an optional secretKeyRef: a missing Secret is fine, an empty name is rejected by Kubernetes.
        errors.append("hf_token_secret is empty; name a Secret with key HF_TOKEN (it may be absent: the reference is optional), e.g. 'hf-token'")
    if not (p["deepspeed_config"] in DEEPSPEED_CONFIGS or p["deepspeed_config"].endswith(".json")):
        errors.append(f"deepspeed_config={p['deepspeed_config']!r} is not one of {', '.join(DEEPSPEED_CONFIGS)} or a .json path")
    for field in ("num_nodes", "gpus_per_node", "per_device_train_batch_size", "gradient_accumulation_steps"):
        if p[field] < 1:
            errors.append(f"{field}={p[field]} must be at least 1")
    if p["max_seq_length"] < 64:
        errors.append(f"max_seq_length={p['max_seq_length']} is too short for a chat template; use at least 64")
    if not 0 < p["learning_rate"] < 1:
        errors.append(f"learning_rate={p['learning_rate']} must be between 0 and 1 (typical: 1e-5 full, 1e-4 LoRA)")
    if p["num_train_epochs"] <= 0 and p["max_steps"] <= 0:
        errors.append("num_train_epochs and max_steps are both <= 0; set num_train_epochs > 0 or max_steps > 0")
    if not 0 <= p["warmup_ratio"] < 1:
        errors.append(f"warmup_ratio={p['warmup_ratio']} must be in [0, 1)")
    if p["eval_size"] <= 0 or (p["eval_size"] >= 1 and p["eval_size"] != int(p["eval_size"])):
        errors.append(f"eval_size={p['eval_size']} must be a fraction in (0, 1) or a whole number of conversations")
    if p["save_steps"] < 1 or p["save_total_limit"] < 1:
        errors.append("save_steps and save_total_limit must be at least 1 (checkpoints are how a failed job resumes)")
    if p["gpu_memory_gib"] <= 0:
        errors.append(f"gpu_memory_gib={p['gpu_memory_gib']} must be positive (80 for H100 80GB)")
    if p["eval_gpus"] < 0 or p["serving_gpus"] < 0:
        errors.append("eval_gpus and serving_gpus must be >= 0")
    if p["min_loss_improvement"] < 0 or p["min_loss_improvement"] >= 1:
        errors.append(f"min_loss_improvement={p['min_loss_improvement']} must be a fraction in [0, 1)")
    if p["max_model_len"] < p["max_seq_length"]:
        errors.append(
            f"max_model_len={p['max_model_len']} is shorter than max_seq_length={p['max_seq_length']}; "
            "serve at least the length the model was trained on"
        )
    if p["train_backend"] == "local" and p["num_nodes"] != 1:
        errors.append(f"num_nodes={p['num_nodes']} with train_backend=local: a local run has one node; set num_nodes=1")
    if p["deepspeed_config"] in DEEPSPEED_CONFIGS:
        # A user's JSON lives on a volume this step may not mount: the trainer applies the rule when it reads it.
        errors.append(check_method_deepspeed(p["method"], p["deepspeed_config"]))
    if p["train_backend"] != "local" and p["deploy_backend"] == "local":
        errors.append("deploy_backend=local needs train_backend=local (the model is on the cluster's volume); use kserve-vllm")
    if p["deploy_backend"].startswith("kserve") and p["serving_gpus"] < 1:
        errors.append(f"serving_gpus={p['serving_gpus']} with deploy_backend={p['deploy_backend']}: vLLM needs at least 1 GPU")
    errors.append(_choice(p, "job_cleanup", CLEANUP_POLICIES))
    if p["queue_name"]:
        errors.append(_name_error("queue_name", p["queue_name"], _DNS1123_SUBDOMAIN, 253, "LocalQueue name"))
    if p["priority_class"]:
        errors.append(_name_error("priority_class", p["priority_class"], _DNS1123_SUBDOMAIN, 253, "PriorityClass name"))
    if p["queue_name"] and p["gang_scheduling"]:
        errors.append("queue_name and gang_scheduling both set: Kueue admits the job as a whole already; use one")
    if p["active_deadline_seconds"] < 0 or p["min_nodes"] < 0 or p["max_restarts"] < 0:
        errors.append("active_deadline_seconds, min_nodes and max_restarts must be >= 0 (0 means not set)")
    if p["job_restarts"] < 0:
        errors.append(f"job_restarts={p['job_restarts']} must be >= 0 (0: a failed job fails the step at once)")
    if p["pending_timeout_seconds"] < 60:
        errors.append(f"pending_timeout_seconds={p['pending_timeout_seconds']} must be at least 60: a cluster "
                      "autoscaler needs minutes to add a GPU node")
    if p["min_nodes"] > p["num_nodes"]:
        errors.append(f"min_nodes={p['min_nodes']} is more than num_nodes={p['num_nodes']}; use 0 for a fixed-size job")
    if p["train_backend"] == "trainjob":
        for field in ("priority_class", "gang_scheduling", "min_nodes"):
            if p[field]:
                errors.append(f"{field} with train_backend=trainjob: set it in the ClusterTrainingRuntime "
                              "(Trainer v2 keeps it there), or use train_backend=pytorchjob")
    errors.append(_choice(p, "deployment_mode", DEPLOYMENT_MODES))
    errors.append(_choice(p, "dataset_format", DATASET_FORMATS))
    errors.append(_choice(p, "over_length", OVER_LENGTH))
    if p["dataset_format"] == "preference":
        errors.append("dataset_format=preference is kept for a later preference-tuning stage; SFT needs a chat or text format")
    if p["num_proc"] < 1:
        errors.append(f"num_proc={p['num_proc']} must be at least 1")
    if not 0 <= p["canary_traffic_percent"] < 100:
        errors.append(f"canary_traffic_percent={p['canary_traffic_percent']} must be in [0, 100) (0 sends all traffic to the new model)")
    elif p["canary_traffic_percent"] and p["deployment_mode"] != "Knative":
        errors.append("canary_traffic_percent needs deployment_mode=Knative (KServe splits traffic between Knative revisions)")
    if p["max_new_tokens"] < 1:
        errors.append(f"max_new_tokens={p['max_new_tokens']} must be at least 1")
    if not all(isinstance(t, str) and t.strip() for t in p["lm_eval_tasks"]):
        errors.append(f"lm_eval_tasks={p['lm_eval_tasks']!r} must be a list of task names, e.g. [\"hellaswag\"]")
    if not p["model_name_or_path"].strip():
        errors.append("model_name_or_path is empty; give a Hub id such as Qwen/Qwen3-30B-A3B or a mounted folder")
    if not p["dataset_source"].strip():
        errors.append("dataset_source is empty; give builtin:sample, a file/folder/glob, pvc://claim/path or a Hub dataset id")
    errors = [e for e in errors if e]
    if not errors and p["train_backend"] != "local":
        from components.train.memory import check_memory_fit

        # Last, on parameters known to be valid: an estimate over bad inputs would only add noise.
        errors.append(check_memory_fit(
            p["model_name_or_path"], p["method"], p["deepspeed_config"], p["num_nodes"], p["gpus_per_node"],
            p["max_seq_length"], p["per_device_train_batch_size"], gpu_memory_gib=p["gpu_memory_gib"],
        ))
    return [e for e in errors if e]
