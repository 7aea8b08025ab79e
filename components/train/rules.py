"""The rules between training and cluster settings (validate_inputs and ``pipelines.run`` ask here).

Each function takes every setting by name (``components.settings``) and returns one message per problem, each
naming the setting and the fix. Bounds of a single setting are declared in the settings model.
"""

from __future__ import annotations

import importlib.util

from components.kube import DNS1123_SUBDOMAIN, name_error
from components.train.config import DEEPSPEED_CONFIGS, METHODS, check_method_deepspeed
from components.train.launcher.job import CLEANUP_POLICIES, TRAIN_BACKENDS
from components.train.stages import STAGE_DATA, STAGES, stage_overrides


# The trackers the trainer reports to (transformers' integrations the images install).
REPORT_TO = ("tensorboard", "mlflow", "wandb")


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
    unknown = [r for r in p["report_to"] if r not in REPORT_TO]
    if unknown or not all(isinstance(r, str) for r in p["report_to"]):
        errors.append(f"report_to={p['report_to']!r}: each entry is one of {', '.join(REPORT_TO)}")
    elif "mlflow" in p["report_to"] and p["train_backend"] == "local" and importlib.util.find_spec("mlflow") is None:
        errors.append("report_to names mlflow and this machine has no mlflow: pip install mlflow-skinny (or take "
                      "mlflow out of report_to)")
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
    if p["tracking_secret"]:
        errors.append(name_error("tracking_secret", p["tracking_secret"], DNS1123_SUBDOMAIN, 253, "Secret name"))
    if p["alert_webhook_secret"]:
        errors.append(name_error("alert_webhook_secret", p["alert_webhook_secret"], DNS1123_SUBDOMAIN, 253,
                                 "Secret name"))
    else:
        errors.append("alert_webhook_secret is empty; name a Secret with key ALERT_WEBHOOK_URL (it may be absent: "
                      "the reference is optional), e.g. 'llm-alerts'")
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


def check_stage_settings(p: dict) -> list[str | None]:
    """The stages: known, each once, each with its data, and their own training settings valid."""
    from components.settings import bound_errors, specs, type_errors

    stages, errors = p["stages"], []
    if not stages:
        return [f"stages is empty; list the stages to run, in order, from {', '.join(STAGES)}, e.g. [\"sft\"]"]
    for stage in stages:
        if stage not in STAGES:
            errors.append(f"stages: {stage!r} is not a stage; choose from {', '.join(STAGES)}")
        elif stages.count(stage) > 1:
            errors.append(f"stages lists {stage!r} {stages.count(stage)} times; each stage runs once")
        elif not p[STAGE_DATA[stage][0]].strip():
            errors.append(f"stages includes {stage!r} but {STAGE_DATA[stage][0]} is empty; give the stage its data "
                          f"(e.g. builtin:{'domain-text' if stage == 'cpt' else 'preference'} to try it)")
    trainable = {name for name, spec in specs().items() if spec.group == "train"} - {"model_name_or_path"}
    for stage, overrides in p["stage_settings"].items():
        if stage not in STAGES or not isinstance(overrides, dict):
            errors.append(f"stage_settings: {stage!r} must be a stage ({', '.join(STAGES)}) mapping to training "
                          "settings, e.g. {\"dpo\": {\"learning_rate\": 5e-7}}")
            continue
        unknown = sorted(set(overrides) - trainable)
        if unknown:
            errors.append(f"stage_settings.{stage}: {unknown} are not training settings a stage can change "
                          "(model_name_or_path comes from the previous stage)")
            continue
        merged = {**p, **overrides}
        errors += [f"stage_settings.{stage}: {e}" for e in type_errors(merged) + bound_errors(merged)
                   if e.split("=")[0].split(" ")[0] in overrides]
    if not errors:
        for stage in stages:
            v = {**p, **stage_overrides(p, stage)}
            if v["method"] not in METHODS:
                errors.append(f"stage_settings.{stage}: method={v['method']!r} is not one of {', '.join(METHODS)}")
            elif v["deepspeed_config"] in DEEPSPEED_CONFIGS and (e := check_method_deepspeed(v["method"],
                                                                                               v["deepspeed_config"])):
                errors.append(f"stage {stage}: {e}")
    return errors


def stage_warnings(p: dict) -> list[str]:
    """Stage orders and settings that run but are probably not what was meant."""
    stages, warnings = p["stages"], []
    if "dpo" in stages and "sft" in stages and stages.index("dpo") < stages.index("sft"):
        warnings.append("stages puts dpo before sft: preference tuning usually refines a fine-tuned model, and sft "
                        "after it may undo what it learned")
    if "cpt" in stages and stages.index("cpt") > 0:
        warnings.append("stages puts cpt after another stage: continued pretraining on raw text usually comes first")
    unused = sorted(set(p["stage_settings"]) - set(stages))
    if unused:
        warnings.append(f"stage_settings has settings for {unused}, which stages does not run")
    return warnings


def check_hpo_settings(p: dict) -> list[str | None]:
    """A hyper-parameter search that can start: Katib's rules (components/hpo/katib.py), and an sft stage to tune."""
    if p["hpo_trials"] == 0:
        return []
    from components.hpo.katib import check_search, typed_search_space

    # A dict parameter reaches validate_inputs through KFP as a Struct: integer values arrive as doubles.
    errors = check_search(typed_search_space(p["hpo_search_space"]), trials=p["hpo_trials"], parallel_trials=p["hpo_parallel_trials"],
                          max_failed_trials=p["hpo_max_failed_trials"], algorithm=p["hpo_algorithm"],
                          method=p["method"])
    if "sft" not in p["stages"]:
        errors.append("hpo_trials > 0 tunes the sft stage, and stages does not run it; add \"sft\" to stages or "
                      "set hpo_trials=0")
    return errors
