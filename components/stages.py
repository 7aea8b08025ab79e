"""Training stages: continued pretraining (cpt), supervised fine-tuning (sft), preference tuning (dpo), a reward model
(rm) and reinforcement learning with verifiable rewards (grpo).

A run trains the stages of its ``stages`` setting in that order, each from the previous stage's final model, each
in its own folder, through the same launcher and the same trainer entry point (the trainer config's ``stage``
picks the loss: causal LM on every token for cpt, on the assistant's tokens for sft, DPO for dpo, the pairwise
reward-model loss for rm, GRPO for grpo). What differs per stage is the data it reads and, optionally, training
settings and the job's nodes and GPUs (``stage_settings``); this module is the one place that says so.

The rm stage is a side branch: it trains a reward model (a sequence classifier, not a language model) from the
previous stage's model and hands that previous model on unchanged (``hands_on``), so that a following grpo stage
trains the policy and scores it with the reward model (``reward_model_dir``).
"""

from __future__ import annotations

import dataclasses
import os

from components.settings import (
    JobSettings,
    NetworkSettings,
    ObservabilitySettings,
    SchedulingSettings,
    Settings,
    StorageSettings,
    TrainerSettings,
    choices,
    trainer_fields,
)

STAGES = choices("stages")  # ("cpt", "sft", "dpo", "rm", "grpo"), declared in the settings model
# What a stage reads: its data source setting and the format its rows must have (None: the run's dataset_format).
# The reward model learns from the same preference pairs as dpo: one setting for a run's pairs.
STAGE_DATA = {
    "cpt": ("cpt_dataset_source", "text"),
    "sft": ("dataset_source", None),
    "dpo": ("dpo_dataset_source", "preference"),
    "rm": ("dpo_dataset_source", "preference"),
    "grpo": ("grpo_dataset_source", "prompts"),
}
# Preference tuning moves a tuned model a little: rates 10-100x below SFT's (TRL's own default is 1e-6) and one
# epoch (more overfits the pairs). A reward model trains a fresh head on the whole model: TRL's RewardConfig default
# rate (1e-4), one epoch, method full (rm.py). GRPO: TRL's GRPOConfig default rate (1e-6), one pass over the prompts.
# These three run the default 64-sequence global batch as 1 row x 4 micro-steps, not the sft/cpt default 4 x 1: DPO
# and the reward model put chosen and rejected of each pair through one forward (twice the rows), GRPO holds a
# reference model and its generations, and none of them has the chunked loss (Qwen3-30B-A3B at 4 rows: ~93 GiB per
# H100, components/estimate/memory.py). A run's stage_settings override these.
PREFERENCE_MICRO_BATCH = {"per_device_train_batch_size": 1, "gradient_accumulation_steps": 4}
STAGE_DEFAULTS: dict[str, dict] = {
    "dpo": {"learning_rate": 1e-6, "num_train_epochs": 1.0, **PREFERENCE_MICRO_BATCH},
    "rm": {"learning_rate": 1e-4, "num_train_epochs": 1.0, "method": "full", **PREFERENCE_MICRO_BATCH},
    "grpo": {"learning_rate": 1e-6, "num_train_epochs": 1.0, **PREFERENCE_MICRO_BATCH},
}


def stage_folder(stage: str) -> str:
    """The stage's folder under the run's folder on the model volume (sft keeps the name ``train``)."""
    return "train" if stage == "sft" else stage


def hands_on(stage: str) -> bool:
    """Whether the next stage trains from this stage's final model (every stage but rm, whose model is a scorer)."""
    return stage != "rm"


def started_from(stages: list[str], stage_dir) -> dict[str, str | None]:
    """The model each of ``stages`` trains from: the final folder (``stage_dir(stage)/final``) of the last earlier
    stage that hands its model on, or None for the run's base model."""
    policy: str | None = None
    started = {}
    for stage in stages:
        started[stage] = policy
        if hands_on(stage):
            policy = os.path.join(stage_dir(stage), "final")
    return started


def reward_model_dir(output_dir: str) -> str:
    """The run's rm stage's final model, seen from another stage's ``output_dir`` (its sibling folder)."""
    return os.path.join(os.path.dirname(output_dir.rstrip("/")), stage_folder("rm"), "final")


def dataset_folder(stage: str) -> str:
    """The stage's prepared data under the run's folder on the data volume (sft's is the evaluation's too)."""
    return "dataset" if stage == "sft" else f"dataset-{stage}"


def stage_data(s: Settings, stage: str) -> tuple[str, str]:
    """``(source, format)`` the stage's data step reads."""
    source_setting, fmt = STAGE_DATA[stage]
    return s.flat()[source_setting], fmt or s.data.dataset_format


# What stage_settings may set beside training settings: the stage's job shape (JobSettings' fields, checked
# by the same declared rules as the run's). The automation guide trains cpt on 4 GPUs and sft/dpo on 2.
STAGE_RESOURCES = ("num_nodes", "gpus_per_node")
# The settings the trainer config is written from (``build_trainer_config``): the model, compute, train and
# preference groups.
TRAINER_FIELDS = frozenset(trainer_fields())


def stage_overrides(s: Settings, stage: str) -> dict:
    """The trainer settings the stage changes: the stage's defaults, then the run's ``stage_settings`` (its nodes and
    GPUs aside: ``stage_resources``; a name that is neither, validate_inputs names)."""
    over = {**STAGE_DEFAULTS.get(stage, {}), **s.stages.stage_settings.get(stage, {})}
    return {name: value for name, value in over.items() if name in TRAINER_FIELDS}


def stage_trainer(s: Settings, stage: str) -> TrainerSettings:
    """The run's trainer settings with ``stage``'s own (``stage_overrides``) over them."""
    return s.trainer().replace(**stage_overrides(s, stage))


def stage_resources(s: Settings, stage: str) -> dict:
    """The job shape (``num_nodes``, ``gpus_per_node``) the run's ``stage_settings`` give ``stage``, over the run's."""
    own = s.stages.stage_settings.get(stage, {})
    return {name: own[name] for name in STAGE_RESOURCES if isinstance(own, dict) and name in own}


def stage_job(s: Settings, stage: str) -> JobSettings:
    """The job settings ``stage``'s job runs with: the run's, with the stage's own nodes and GPUs."""
    return dataclasses.replace(s.job, **stage_resources(s, stage))


def job_groups(
    s: Settings, stage: str
) -> tuple[JobSettings, SchedulingSettings, NetworkSettings, StorageSettings, ObservabilitySettings]:
    """The settings groups ``stage``'s training job is built from (``job.training_job_for_run``): its own job
    settings (``stage_job``), then the run's scheduling, network, storage and observability settings."""
    return stage_job(s, stage), s.scheduling, s.network, s.storage, s.observability


def stage_setting_name(s: Settings, stage: str, name: str) -> str:
    """How a message names the setting that gives ``stage`` its ``name`` (``num_nodes``, ``gpus_per_node``):
    ``stage_settings.<stage>.<name>`` where the stage sets it, else the run's ``name``."""
    return f"stage_settings.{stage}.{name}" if name in stage_resources(s, stage) else name


def resource_settings(s: Settings, name: str) -> list[tuple[str, int]]:
    """``(setting, value)`` of ``name`` (``num_nodes``, ``gpus_per_node``): the run's, then each of its stages' that
    sets its own (``stage_settings.<stage>.<name>``), for the rules that hold each of them as they hold the run's."""
    own = [(stage, stage_resources(s, stage)) for stage in dict.fromkeys(s.stages.stages)]
    return [(name, getattr(s.job, name))] + [
        (f"stage_settings.{stage}.{name}", over[name])
        for stage, over in own
        if isinstance(over.get(name), int) and not isinstance(over[name], bool)  # else: the stage rules name it
    ]


def stage_gpus(s: Settings, stage: str) -> int:
    """GPUs ``stage``'s job holds: its nodes times its GPUs per node."""
    c = stage_job(s, stage)
    return c.num_nodes * c.gpus_per_node


def stage_train_settings(s: Settings, stage: str, base_model: str, tuned: dict | None = None) -> TrainerSettings:
    """The trainer settings ``stage``'s job runs with, starting from ``base_model``; ``tuned`` (what a
    hyper-parameter search chose, components/hpo/) applies to the sft stage, the one its trials train, over
    everything else."""
    over = (tuned or {}) if stage == "sft" else {}
    return stage_trainer(s, stage).replace(**over, model_name_or_path=base_model)
