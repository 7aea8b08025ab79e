"""The rm and grpo stages' rules: a reward source for grpo, known built-in rewards, a user's reward function that
imports and takes ``prompts`` and ``completions``, a reward model to score with, a valid answer format, and groups of
completions that fit the batch. Each is checked with the grpo stage's own settings (``stage_settings``)."""

from __future__ import annotations

import difflib
import os
import re

from components.paths import DATA_MOUNT, MODEL_MOUNT
from components.rewards import REWARD_SOURCES, check_reward_function, grpo_function_error  # noqa: F401 (the grpo rules)
from components.settings import Settings, TrainerSettings
from components.stages import hands_on, stage_gpus, stage_overrides, stage_trainer

EXAMPLE = '{"answer": 1.0, "format": 0.5}'


def _function_error(spec: str, s: Settings) -> str | None:
    """The user's function imported here (validate_inputs, before any GPU), unless it is a file on a volume this step
    does not mount: then the trainer imports it first thing, before any model loads."""
    target = spec.rpartition(":")[0]
    on_volume = target.startswith((DATA_MOUNT + "/", MODEL_MOUNT + "/"))
    if on_volume and s.job.train_backend != "local" and not os.path.exists(target):
        return None
    return check_reward_function(spec)


def check_reward_settings(s: Settings) -> list[str | None]:
    """The rm stage's method; the grpo stage's rewards and generation settings (nothing when grpo does not run)."""
    stages = s.stages.stages
    if "rm" in stages and (method := stage_overrides(s, "rm").get("method", s.model.method)) != "full":
        return [
            f"stage rm: method {method!r}: the reward model trains its new head and the whole model (method full); "
            "remove method from stage_settings.rm"
        ]
    if "grpo" not in stages:
        return []
    grpo = stage_trainer(s, "grpo")  # the grpo stage's own (stage_settings) over the run's
    p = grpo.preference
    errors: list[str | None] = []
    for key, column in s.stages.grpo_column_mapping.items():
        if key not in ("prompt", "answer") or not isinstance(column, str) or not column:
            errors.append(
                f"grpo_column_mapping: {key!r} -> {column!r}: map prompt or answer to your column's name, "
                'e.g. {"prompt": "question"}'
            )
    rewards = p.grpo_rewards
    if not isinstance(rewards, dict):
        return [f"grpo_rewards must map reward names to weights, e.g. {EXAMPLE}"]
    for name, weight in rewards.items():
        if name not in REWARD_SOURCES:
            close = difflib.get_close_matches(str(name), REWARD_SOURCES, n=1)
            errors.append(
                f"grpo_rewards: {name!r} is not a reward; use {', '.join(REWARD_SOURCES[:3])} (built-in), "
                "model (a reward model) or function (grpo_reward_function)"
                + (f"; did you mean {close[0]!r}?" if close else "")
            )
        elif isinstance(weight, bool) or not isinstance(weight, (int, float)):
            errors.append(f"grpo_rewards.{name} must be a number (the reward's weight), got {weight!r}")
    if errors:
        return errors
    used = [name for name, weight in rewards.items() if weight != 0]
    if not used:
        return [
            f"stages includes 'grpo' but grpo_rewards gives no reward a non-zero weight; set at least one, e.g. "
            f"{EXAMPLE} (built-in: answer, format, length; or model, function)"
        ]
    if "model" in used and not p.grpo_reward_model.strip():
        if "rm" not in stages or stages.index("rm") > stages.index("grpo"):
            errors.append(
                'grpo_rewards uses model but there is no reward model: add "rm" before "grpo" in stages '
                "(it trains one on dpo_dataset_source's pairs) or set grpo_reward_model to a Hub id or a "
                "folder"
            )
    if "function" in used:
        if not p.grpo_reward_function.strip():
            errors.append(
                "grpo_rewards uses function but grpo_reward_function is empty; set it to FILE.py:NAME (a "
                "file on a mounted volume) or package.module:NAME"
            )
        else:
            errors.append(_function_error(p.grpo_reward_function.strip(), s))
    if {"answer", "format"} & set(used):
        try:
            re.compile(p.grpo_answer_pattern)
        except re.error as exc:
            errors.append(
                f"grpo_answer_pattern {p.grpo_answer_pattern!r} is not a valid regular expression ({exc}); "
                "write a Python regex whose first group is the answer, e.g. 'Answer:\\s*(-?\\d+)'"
            )
    gpus = stage_gpus(s, "grpo")  # the grpo stage's job: its own nodes and GPUs (stage_settings.grpo) or the run's
    t = grpo.train
    per_step = t.per_device_train_batch_size * t.gradient_accumulation_steps * gpus
    if per_step % p.grpo_num_generations:
        # TRL's GRPOConfig: the generation batch (micro-batch x accumulation x processes) holds whole groups.
        errors.append(
            f"grpo_num_generations={p.grpo_num_generations} must divide the completions of one optimizer "
            f"step, per_device_train_batch_size x gradient_accumulation_steps x GPUs = "
            f"{t.per_device_train_batch_size} x {t.gradient_accumulation_steps} x {gpus} = {per_step}; "
            "change grpo_num_generations or the batch (stage_settings.grpo can set the grpo stage's own)"
        )
    errors.extend(generation_errors(grpo, s))
    return errors


def generation_errors(grpo: TrainerSettings, s: Settings) -> list[str]:
    """grpo_generation_backend vllm-server: a server to reach, and weights it can take (``grpo``: the grpo stage's
    trainer settings): full weights (the server loads checkpoint tensors, not adapters), gathered by
    ZeRO-3 or FSDP2. On a cluster an empty URL is the train step's own server
    (components/train/launcher/generation_server.py), which loads the stage's starting model from the models claim;
    locally the URL is required."""
    p = grpo.preference
    if p.grpo_generation_backend != "vllm-server":
        return []
    errors = []
    url = p.grpo_vllm_server_url.strip()
    if not url and s.job.train_backend == "local":
        errors.append(
            "grpo_generation_backend vllm-server needs grpo_vllm_server_url with train_backend local (on a cluster "
            "the train step runs the server): the http://host:port of a vLLM server from the serving image started "
            "with this package's weight-sync engine (docs/rl.md); or set grpo_generation_backend transformers"
        )
    elif not url:
        stages = list(s.stages.stages)
        trained_before = [st for st in stages[: stages.index("grpo")] if hands_on(st)]
        start = grpo.model.model_name_or_path
        if not trained_before and not start.startswith(MODEL_MOUNT + "/"):
            errors.append(
                "grpo_generation_backend vllm-server with no grpo_vllm_server_url: the train step's vLLM server "
                f"loads the grpo stage's starting model from model_pvc ({MODEL_MOUNT}), and model_name_or_path "
                f"{start!r} is not there: put a stage (sft) before grpo, or start a server yourself and set "
                "grpo_vllm_server_url"
            )
    elif not re.match(r"^https?://[^/\s]+(/v1)?/?$", url):
        errors.append(f"grpo_vllm_server_url {url!r}: write the server's root, http://host:port")
    if grpo.model.method != "full":
        errors.append(
            "grpo_generation_backend vllm-server pushes full weights to the server; method is "
            f"{grpo.model.method!r}: use method full for the grpo stage (stage_settings.grpo) or "
            "grpo_generation_backend transformers"
        )
    if grpo.compute.parallelism == "hsdp_ep":
        errors.append(
            "grpo_generation_backend vllm-server gathers each weight whole, which parallelism hsdp_ep's expert shards "
            "do not support yet: use parallelism deepspeed or hsdp, or grpo_generation_backend transformers"
        )
    return errors


def reward_warnings(s: Settings) -> list[str]:
    """Reward settings that run but are probably not what was meant."""
    stages, warnings = s.stages.stages, []
    if "grpo" in stages and "sft" in stages and stages.index("grpo") < stages.index("sft"):
        warnings.append(
            "stages puts grpo before sft: reinforcement learning usually refines a fine-tuned model, and "
            "sft after it may undo what the rewards taught"
        )
    if "rm" in stages and ("grpo" not in stages or stages.index("grpo") < stages.index("rm")):
        warnings.append(
            "stages runs rm but no grpo after it: the reward model is trained and reported, and nothing scores with it"
        )
    if "grpo" in stages:
        p = stage_trainer(s, "grpo").preference
        rewards = p.grpo_rewards if isinstance(p.grpo_rewards, dict) else {}
        if p.grpo_reward_function.strip() and not rewards.get("function"):
            warnings.append("grpo_reward_function is set but grpo_rewards gives function no weight: it is not used")
        if "rm" in stages and stages.index("rm") < stages.index("grpo") and not rewards.get("model"):
            warnings.append(
                "stages trains a reward model (rm) but grpo_rewards gives model no weight: grpo does not use it"
            )
    return warnings
