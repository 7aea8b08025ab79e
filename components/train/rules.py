"""The rules between training and cluster settings (validate_inputs and ``pipelines.run`` ask here).

Each function takes every setting by name (``components.settings``) and returns one message per problem, each
naming the setting and the fix. Bounds of a single setting are declared in the settings model.
"""

from __future__ import annotations

from components.kube import DNS1123_SUBDOMAIN, name_error
from components.train.config import DEEPSPEED_CONFIGS, METHODS, check_method_deepspeed
from components.train.launch import CLEANUP_POLICIES, TRAIN_BACKENDS


def choice_error(p: dict, name: str, choices: tuple) -> str | None:
    """The error for a setting whose value is not one of ``choices``."""
    return None if p[name] in choices else f"{name}={p[name]!r} is not one of {', '.join(choices)}"


def check_train_settings(p: dict) -> list[str | None]:
    """The training step's rules: method, DeepSpeed config, length of training."""
    errors = [choice_error(p, "method", METHODS)]
    if not p["model_name_or_path"].strip():
        errors.append("model_name_or_path is empty; give a Hub id such as Qwen/Qwen3-30B-A3B or a mounted folder")
    if not (p["deepspeed_config"] in DEEPSPEED_CONFIGS or p["deepspeed_config"].endswith(".json")):
        errors.append(f"deepspeed_config={p['deepspeed_config']!r} is not one of {', '.join(DEEPSPEED_CONFIGS)} "
                      "or a .json path")
    elif p["deepspeed_config"] in DEEPSPEED_CONFIGS:
        # A user's JSON lives on a volume this step may not mount: the trainer applies the rule when it reads it.
        errors.append(check_method_deepspeed(p["method"], p["deepspeed_config"]))
    if p["num_train_epochs"] <= 0 and p["max_steps"] <= 0:
        errors.append("num_train_epochs and max_steps are both <= 0; set num_train_epochs > 0 or max_steps > 0")
    if p["max_steps"] == 0:
        errors.append("max_steps=0 trains nothing; use -1 to run every epoch, or a positive number of steps")
    return errors


def check_cluster_settings(p: dict) -> list[str | None]:
    """Where the job runs: backend, Kubernetes names, scheduling options and what each backend supports."""
    errors = [
        choice_error(p, "train_backend", TRAIN_BACKENDS),
        choice_error(p, "job_cleanup", CLEANUP_POLICIES),
        name_error("data_pvc", p["data_pvc"], DNS1123_SUBDOMAIN, 253, "claim name"),
        name_error("model_pvc", p["model_pvc"], DNS1123_SUBDOMAIN, 253, "claim name"),
    ]
    if p["hf_token_secret"]:
        errors.append(name_error("hf_token_secret", p["hf_token_secret"], DNS1123_SUBDOMAIN, 253, "Secret name"))
    else:
        # Pods get an optional secretKeyRef: a missing Secret is fine, an empty name is rejected by Kubernetes.
        errors.append("hf_token_secret is empty; name a Secret with key HF_TOKEN (it may be absent: the reference "
                      "is optional), e.g. 'hf-token'")
    if p["queue_name"]:
        errors.append(name_error("queue_name", p["queue_name"], DNS1123_SUBDOMAIN, 253, "LocalQueue name"))
    if p["priority_class"]:
        errors.append(name_error("priority_class", p["priority_class"], DNS1123_SUBDOMAIN, 253, "PriorityClass name"))
    if p["queue_name"] and p["gang_scheduling"]:
        errors.append("queue_name and gang_scheduling both set: Kueue admits the job as a whole already; use one")
    if p["min_nodes"] > p["num_nodes"]:
        errors.append(f"min_nodes={p['min_nodes']} is more than num_nodes={p['num_nodes']}; use 0 for a fixed-size job")
    if p["train_backend"] == "local" and p["num_nodes"] != 1:
        errors.append(f"num_nodes={p['num_nodes']} with train_backend=local: a local run has one node; set num_nodes=1")
    if p["train_backend"] == "trainjob":
        for name in ("priority_class", "gang_scheduling", "min_nodes"):
            if p[name]:
                errors.append(f"{name} with train_backend=trainjob: set it in the ClusterTrainingRuntime "
                              "(Trainer v2 keeps it there), or use train_backend=pytorchjob")
    return errors
