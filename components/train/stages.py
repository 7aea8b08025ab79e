"""Training stages: continued pretraining (cpt), supervised fine-tuning (sft), preference tuning (dpo).

A run trains the stages of its ``stages`` setting in that order, each from the previous stage's final model, each
in its own folder, through the same launcher and the same trainer entry point (the trainer config's ``stage``
picks the loss: causal LM on every token for cpt, on the assistant's tokens for sft, DPO for dpo). What differs
per stage is the data it reads and, optionally, training settings (``stage_settings``); this module is the one
place that says so.
"""

from __future__ import annotations

import dataclasses

from components.settings import Settings, TrainSettings, choices

STAGES = choices("stages")  # ("cpt", "sft", "dpo"), declared in the settings model
# What a stage reads: its data source setting and the format its rows must have (None: the run's dataset_format).
STAGE_DATA = {"cpt": ("cpt_dataset_source", "text"), "sft": ("dataset_source", None),
              "dpo": ("dpo_dataset_source", "preference")}
# Preference tuning moves a tuned model a little: rates 10-100x below SFT's (TRL's own default is 1e-6) and one
# epoch (more overfits the pairs). A run's stage_settings override these.
STAGE_DEFAULTS = {"dpo": {"learning_rate": 1e-6, "num_train_epochs": 1.0}}


def stage_folder(stage: str) -> str:
    """The stage's folder under the run's folder on the model volume (sft keeps the name ``train``)."""
    return "train" if stage == "sft" else stage


def dataset_folder(stage: str) -> str:
    """The stage's prepared data under the run's folder on the data volume (sft's is the evaluation's too)."""
    return "dataset" if stage == "sft" else f"dataset-{stage}"


def stage_data(s: Settings, stage: str) -> tuple[str, str]:
    """``(source, format)`` the stage's data step reads."""
    source_setting, fmt = STAGE_DATA[stage]
    return s.flat()[source_setting], fmt or s.data.dataset_format


def stage_overrides(s: Settings, stage: str) -> dict:
    """The training settings the stage changes: the stage's defaults, then the run's ``stage_settings``."""
    return {**STAGE_DEFAULTS.get(stage, {}), **s.stages.stage_settings.get(stage, {})}


def stage_train_settings(s: Settings, stage: str, base_model: str, tuned: dict | None = None) -> TrainSettings:
    """The run's training settings for ``stage``, starting from ``base_model``; ``tuned`` (what a hyper-parameter
    search chose, components/hpo/) applies to the sft stage, the one its trials train, over everything else."""
    over = {**stage_overrides(s, stage), **((tuned or {}) if stage == "sft" else {})}
    return dataclasses.replace(s.train, **over, model_name_or_path=base_model)
