"""The trainer's config file: read it, check it and build the stage's config class from it.

    cfg = parse_config("/mnt/models/runs/<id>/train/train_config.json")   # SFTConfig, or the stage's own class

The file is what components/train/config.py (the launcher side) builds and writes: a JSON or YAML mapping of the
config class's fields. Its ``stage`` picks the class (``config_class``: ``SFTConfig`` for sft and cpt, the TRL-based
``DPOStageConfig``, ``RMStageConfig`` and ``GRPOStageConfig`` for dpo, rm and grpo); the fields TRL's configs need
are derived here from the settings the user sets for every stage (``DPO_DERIVED``, ``RM_DERIVED``,
``GRPO_DERIVED``). Every error is a ValueError naming the file and the field, raised before anything is written.
"""

from __future__ import annotations

import dataclasses
import enum
import json
import logging
import re
import types
import typing
from pathlib import Path

import datasets
import yaml
from transformers import HfArgumentParser
from transformers.hf_argparser import DataClassType

from components.stages import STAGES
from components.train.config import (
    DEEPSPEED_CONFIGS,
    METHODS,
    check_combination,
    check_early_stopping_layout,
    deepspeed_config_path,
    early_stopping_arguments,
    early_stopping_on,
)
from components.train.trainer.arguments import DPO_DERIVED, SFTConfig
from components.train.trainer.parallelism import check_parallelism, job_deepspeed_config

log = logging.getLogger("sft")

# The columns each stage's prepared splits must have: tokenized rows with labels, or TRL's preference layout
# (conversational: lists of turns; TRL applies the chat template and masks the prompt itself).
REQUIRED_COLUMNS = {
    "sft": ("input_ids", "labels"),
    "cpt": ("input_ids", "labels"),
    "dpo": ("prompt", "chosen", "rejected"),
    "rm": ("prompt", "chosen", "rejected"),
    "grpo": ("prompt",),
}


def _read_config(path: str) -> dict:
    """The config file's mapping; ValueError naming the file for a missing, empty or unparsable one."""
    try:
        raw = Path(path).read_text()
    except FileNotFoundError:
        raise ValueError(f"{path}: no such file (the trainer config the launcher writes)") from None
    if path.endswith((".yaml", ".yml")):
        try:
            data = yaml.safe_load(raw)
        except yaml.YAMLError as exc:
            raise ValueError(f"{path}: not valid YAML: {' '.join(str(exc).split())}") from None
    else:
        try:
            data = json.loads(raw)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{path}: not valid JSON: {exc}") from None
    if data is None:
        raise ValueError(f"{path}: the config is empty; it must be a mapping of SFTConfig fields")
    if not isinstance(data, dict):
        raise ValueError(f"{path}: the config must be a mapping of SFTConfig fields, not a {type(data).__name__}")
    return data


_TYPE_WORDS = {bool: "true or false", int: "an integer", float: "a number", str: "a string"}


def _type_error(name: str, value, hint) -> str | None:
    """Why ``value`` does not fit the field's annotation ``hint``, or None.

    HfArgumentParser.parse_dict does not check types, and a wrong one surfaces later as a traceback deep in
    the Trainer, after the model has loaded; only plain scalar types are checked here (enums are strings).
    """
    options = typing.get_args(hint) if typing.get_origin(hint) in (typing.Union, types.UnionType) else (hint,)
    words = []
    for option in options:
        origin = typing.get_origin(option) or option
        if option is type(None):
            if value is None:
                return None
        elif option is bool:
            if isinstance(value, bool):
                return None
        elif option in (int, float):
            if isinstance(value, int if option is int else (int, float)) and not isinstance(value, bool):
                return None
        elif option is str or (isinstance(origin, type) and issubclass(origin, enum.Enum)):
            if isinstance(value, str):
                return None
            option = str
        elif isinstance(origin, type):
            if isinstance(value, origin):
                return None
            words.append(f"a {origin.__name__}")
            continue
        else:
            return None  # Any, Literal, ...: not checked
        if option in _TYPE_WORDS and _TYPE_WORDS[option] not in words:
            words.append(_TYPE_WORDS[option])
    return f"{name} must be {' or '.join(words)}, got {value!r}" if words else None


def config_class(stage: str) -> type[SFTConfig]:
    """The config class of a trainer config whose ``stage`` is ``stage`` (one of ``STAGES``)."""
    if stage == "dpo":
        # Lazy: TRL is imported by the stages that use it only (each *_arguments.py imports its part).
        from components.train.trainer.dpo_arguments import DPOStageConfig

        return DPOStageConfig
    if stage == "rm":
        from components.train.trainer.rm_arguments import RMStageConfig

        return RMStageConfig
    if stage == "grpo":
        from components.train.trainer.grpo_arguments import GRPOStageConfig

        return GRPOStageConfig
    return SFTConfig


def _largest_layer(model_name_or_path: str | None) -> int:
    """The model's largest decoder layer in parameters, from its config.json alone; 0 when it cannot be read here
    (ZeRO-3's sizes are then transformers' "auto")."""
    from components.models.resolve import load_model_config
    from components.models.shape import model_shape

    try:
        return model_shape(load_model_config(model_name_or_path or "")).largest_layer
    except Exception as exc:  # noqa: BLE001 - a model that cannot be read fails at load, with its own message
        log.warning("ZeRO-3 sizes left to transformers: the config of %r: %s", model_name_or_path, exc)
        return 0


def _model_config(model_name_or_path: str) -> dict | None:
    """The model's config.json, or None when it cannot be read here (the model's load reports that)."""
    from components.models.resolve import load_model_config

    try:
        return load_model_config(model_name_or_path)
    except Exception as exc:  # noqa: BLE001 - a model that cannot be read fails at load, with its own message
        log.warning("early stopping's layout check skipped: the config of %r: %s", model_name_or_path, exc)
        return None


def parse_config(path: str):
    """Load the config of the file's ``stage`` (``config_class``) from a JSON or YAML file; an unknown stage, unknown
    keys, wrong types, bad combinations and a missing dataset are errors.

    Every error is a ValueError naming the file and the field, raised before TrainingArguments is built
    (which sets up devices and process groups) and before anything is written.
    """
    data = _read_config(path)
    stage = data.get("stage", "sft")
    if stage not in STAGES:
        raise ValueError(f"{path}: stage {stage!r} is not one of {list(STAGES)}")
    config_cls = config_class(stage)
    hints = typing.get_type_hints(config_cls)
    valid = {f.name for f in dataclasses.fields(config_cls)}
    unknown = sorted(set(data) - valid)
    if unknown:
        raise ValueError(f"{path}: unknown keys {unknown}; valid keys are {sorted(valid)}")
    if stage == "dpo":
        derived = sorted(set(data) & set(DPO_DERIVED))
        if derived:
            raise ValueError(
                f"{path}: {derived} are set by the trainer for stage 'dpo'; set "
                f"{[DPO_DERIVED[k] for k in derived]} instead"
            )
        if data.get("train_sampling_strategy") == "group_by_length":
            # TRL tokenizes the preference rows inside the trainer, so the prepared rows have no input_ids to
            # group by and transformers' LengthGroupedSampler would fail after the model has loaded.
            raise ValueError(
                f"{path}: train_sampling_strategy 'group_by_length' cannot sort stage 'dpo' rows "
                "(prompt/chosen/rejected, tokenized by TRL); use 'random'"
            )
    if stage in ("rm", "grpo"):
        _check_rl_keys(path, stage, data)
    for name, value in data.items():
        if why := _type_error(name, value, hints[name]):
            raise ValueError(f"{path}: {why}")
    method = data.get("method", "full")
    if method not in METHODS:
        raise ValueError(f"{path}: method {method!r} is not one of {list(METHODS)}")
    if isinstance(data.get("deepspeed"), str):
        # The launcher writes a setting's name (its image is not this one): resolve it in this install.
        try:
            data["deepspeed"] = deepspeed_config_path(data["deepspeed"])
        except ValueError as exc:
            raise ValueError(f"{path}: {exc}") from None
        if data["deepspeed"] and not Path(data["deepspeed"]).is_file():
            shipped = ", ".join(c for c in DEEPSPEED_CONFIGS if c != "none")
            raise ValueError(
                f"{path}: deepspeed {data['deepspeed']!r}: no such file; use a shipped name "
                f"({shipped}) or a JSON file on a mounted volume"
            )
        if data["deepspeed"]:
            # This job's copy: ZeRO++'s secondary partition is one node's GPUs (not the shipped file's 8), and
            # ZeRO-3 prefetches whole layers of this model (not transformers' hidden-size guess).
            data["deepspeed"] = job_deepspeed_config(data["deepspeed"], _largest_layer(data.get("model_name_or_path")))
    if why := check_parallelism(data):
        raise ValueError(f"{path}: {why}")
    errors = check_combination(data)
    if errors:
        raise ValueError(f"{path}: " + "; ".join(errors))
    dataset_path = data.get("dataset_path", "")
    if not dataset_path or not Path(dataset_path, "dataset_dict.json").exists():
        raise ValueError(f"{path}: dataset_path {dataset_path!r} is not a prepared dataset; run prepare_dataset first")
    _check_dataset(dataset_path, stage)
    if stage == "dpo":
        defaults = {f.name: f.default for f in dataclasses.fields(config_cls)}
        data.update(
            beta=data.get("dpo_beta", defaults["dpo_beta"]),
            max_length=data.get("max_seq_length", defaults["max_seq_length"]),
            # Full fine-tuning: the reference log-probs of every pair are computed once, before training, and TRL
            # then keeps no reference model (no second copy of the weights on the GPUs). LoRA: each step scores the
            # reference with the same model, its adapter off (dpo.py).
            precompute_ref_log_probs=data.get("method", "full") == "full",
        )
    if stage in ("rm", "grpo"):
        _derive_rl_fields(path, stage, data, {f.name: f for f in dataclasses.fields(config_cls)})
    if early_stopping_on(data):
        defaults = {f.name: f.default for f in dataclasses.fields(config_cls)}
        parallelism = data.get("parallelism", defaults["parallelism"])
        if parallelism != "deepspeed":
            model_config = _model_config(data.get("model_name_or_path", defaults["model_name_or_path"]))
            if why := check_early_stopping_layout(data["early_stopping_patience"], parallelism, model_config):
                raise ValueError(f"{path}: {why}")
        data.update(
            early_stopping_arguments(data.get("eval_steps") or 0, data.get("save_steps", defaults["save_steps"]))
        )
    (cfg,) = HfArgumentParser(DataClassType(config_cls)).parse_dict(data)
    return cfg


def _check_rl_keys(path: str, stage: str, data: dict) -> None:
    """The rm and grpo stages' keys the trainer derives (set the settings instead), and the sampler they need."""
    if stage == "grpo":
        from components.train.trainer.grpo_arguments import GRPO_DERIVED as derived_keys
    else:
        from components.train.trainer.rm_arguments import RM_DERIVED as derived_keys
    derived = sorted(set(data) & set(derived_keys))
    if derived:
        raise ValueError(
            f"{path}: {derived} are set by the trainer for stage {stage!r}; set "
            f"{[derived_keys[k] for k in derived]} instead"
        )
    if data.get("train_sampling_strategy") == "group_by_length":
        raise ValueError(
            f"{path}: train_sampling_strategy 'group_by_length' cannot sort stage {stage!r} rows (text, "
            "tokenized by TRL); use 'random'"
        )


def _derive_rl_fields(path: str, stage: str, data: dict, fields: dict) -> None:
    """Fill in TRL's fields of the rm and grpo stages from the settings (``RM_DERIVED``, ``GRPO_DERIVED``); for grpo,
    load the rewards first: an unknown reward, a user function that does not import or cannot take ``prompts`` and
    ``completions``, a missing reward model and a bad answer format are errors before any model loads."""

    def value(name):
        f = fields[name]
        return data.get(name, f.default if f.default is not dataclasses.MISSING else f.default_factory())

    if stage == "rm":
        data["max_length"] = value("max_seq_length")
        return
    from components.rewards import REWARD_SOURCES, RewardFunctionError, load_reward_function
    from components.stages import reward_model_dir
    from components.train.trainer.grpo_arguments import vllm_colocate

    rewards = value("grpo_rewards")
    unknown = sorted(set(rewards) - set(REWARD_SOURCES))
    if unknown:
        raise ValueError(f"{path}: grpo_rewards names {unknown}, which are not rewards; use {list(REWARD_SOURCES)}")
    used = {name: float(weight) for name, weight in rewards.items() if weight}
    if not used:
        raise ValueError(f"{path}: grpo_rewards gives no reward a non-zero weight; set at least one")
    if "function" in used:
        try:
            load_reward_function(value("grpo_reward_function"))
        except RewardFunctionError as exc:
            raise ValueError(f"{path}: {exc}") from None
    if "model" in used and not value("grpo_reward_model"):
        rm = reward_model_dir(data.get("output_dir", ""))
        if not Path(rm, "config.json").exists():
            raise ValueError(
                f"{path}: grpo_rewards uses model and grpo_reward_model is empty, but the run's rm stage "
                f'has no model at {rm}; run stages with "rm" before "grpo" or set grpo_reward_model'
            )
    try:
        re.compile(value("grpo_answer_pattern"))
    except re.error as exc:
        raise ValueError(f"{path}: grpo_answer_pattern is not a valid regular expression ({exc})") from None
    server = value("grpo_generation_backend") == "vllm-server"
    if server and not value("grpo_vllm_server_url"):
        raise ValueError(f"{path}: grpo_generation_backend vllm-server needs grpo_vllm_server_url (http://host:port)")
    if server and value("method") != "full":
        raise ValueError(
            f"{path}: grpo_generation_backend vllm-server syncs full weights, method is {value('method')!r}; "
            "use method full or grpo_generation_backend transformers"
        )
    data.update(
        num_generations=value("grpo_num_generations"),
        num_generations_eval=1,  # grpo_arguments.GRPO_DERIVED
        max_completion_length=value("grpo_max_completion_length"),
        beta=value("grpo_beta"),
        temperature=value("grpo_temperature"),
        reward_weights=list(used.values()),
        **({"use_vllm": False} if server else vllm_colocate()),
        # GRPO's batches hold prompt_ids and completion_ids, no input_ids: the Trainer cannot count their tokens
        # and would warn at every step.
        include_num_input_tokens_seen="no",
    )


def _check_dataset(dataset_path: str, stage: str = "sft") -> None:
    data = datasets.load_from_disk(dataset_path)
    for split in ("train", "eval"):
        if split not in data:
            raise ValueError(f"{dataset_path}: no {split!r} split (found {list(data)}); run prepare_dataset again")
        missing = [c for c in REQUIRED_COLUMNS[stage] if c not in data[split].column_names]
        if missing:
            raise ValueError(
                f"{dataset_path}: split {split!r} lacks columns {missing} (stage {stage!r} needs "
                f"{list(REQUIRED_COLUMNS[stage])}); it must come from prepare_dataset"
            )
