"""The run's settings: one typed model, grouped by concern, the single source of every setting's name, type,
default, help text, bounds and allowed values. It declares and nothing more: the checks live in the validate step
(components/validate/rules/), which reads these declarations.

The groups (``Settings``' fields, each a dataclass of about 20 settings at most): what the trainer reads, bundled per
stage as ``TrainerSettings``: ``model`` (the base model, full or adapters, the adapters' shape), ``compute`` (the
parallelism, DeepSpeed, recomputation, the kernels), ``train`` (batches, optimizer, schedule, checkpoints, early
stopping, logging) and ``preference`` (the dpo, rm and grpo stages' own); then ``stages``, ``variants``,
``hpo``, ``data``; where and how the training job runs: ``job`` (backend, nodes,
GPUs, images, placement, the trainer pod's resources), ``scheduling`` (queue, priority, gang scheduling, elastic
restarts, re-runs, deadlines, cleanup), ``network`` (RDMA, NCCL, proxies, the Hub mirror), ``storage`` (the claims,
the Hub token, the object store), ``observability`` (tracking, traces, alerts, Tensorboard, metrics, watchdogs),
``plan`` (the hardware the plan and the memory fit assume); then ``evaluate``, ``deploy`` and ``publish``. A function
takes the groups it reads (``egress_env(s.network)``, ``gpu_watch_for(s.observability, ...)``); a setting's group
shows in the settings table's group column, never in its name (``from_flat``, ``flat()``, presets and ``-p`` use
the flat names).

Everything else derives from it:

- the pipeline's parameters (``pipelines/llm_finetune.py`` builds its signature and docstring from
  ``pipeline_parameters()``): every ``plain`` setting is a typed parameter in the KFP UI; the others go in the one
  ``advanced_settings`` parameter, a JSON object keyed by setting name (``{"lora_r": 32}``);
- ``validate_inputs`` (generated from this model by ``python -m pipelines.compile``): it takes the plain
  parameters and ``advanced_settings``, checks everything (types, bounds and choices as declared here, then the
  rules between settings) and returns the resolved settings, the ``settings`` input of every later step, which
  reads them through this model (``Settings.from_flat(settings).model.method``);
- ``python -m pipelines.run --help``, ``-p NAME=VALUE``, ``--params FILE`` and the presets (any setting by name);
- the trainer: ``build_trainer_config`` writes every field of a stage's ``TrainerSettings`` into the trainer config,
  and ``SFTConfig`` (components/train/trainer/arguments.py) is ``TrainingArguments`` plus the trainer settings that
  ``TrainingArguments`` lacks, written out there again and held to these by a test;
- the code that implements a choice reads its values here (``choices("method")``), or a test holds its own tuple
  to them where that code must not depend on this model;
- the settings table in docs/settings.md (``python -m pipelines.compile`` checks it is current).

The groups live in modules by concern (``training_settings``: model, compute, train, preference, stages, variants,
hpo; ``data_settings``; ``job_settings``: job, scheduling, network, storage, observability, plan; ``step_settings``:
evaluate, deploy, publish; ``declare``: ``setting()``); this module puts them together (``Settings``) and answers
by name (``specs()``, ``defaults()``, the pipeline arguments). Import everything from here. The package imports
nothing but the package version (no ML or Kubernetes library, no other module of the package), so ``--help``
stays fast and every module may read it.

To add a setting: add a field to its group (``setting(default, help, ...)``), use it where a step reads its
settings, and run ``python -m pipelines.compile``.
"""

from __future__ import annotations

import dataclasses
import difflib
import typing
from dataclasses import dataclass, field

from components.settings.data_settings import DataSettings
from components.settings.declare import ADVANCED, flat_groups, setting
from components.settings.job_settings import (
    JobSettings,
    NetworkSettings,
    ObservabilitySettings,
    PlanSettings,
    SchedulingSettings,
    StorageSettings,
)
from components.settings.step_settings import DeploySettings, EvaluateSettings, PublishSettings
from components.settings.training_settings import (
    TRAINER_GROUPS,
    ComputeSettings,
    HpoSettings,
    ModelSettings,
    PreferenceSettings,
    StageSettings,
    TrainerSettings,
    TrainSettings,
    VariantSettings,
    trainer_fields,
)

__all__ = [
    "ADVANCED",
    "TRAINER_GROUPS",
    "ComputeSettings",
    "DataSettings",
    "DeploySettings",
    "EvaluateSettings",
    "HpoSettings",
    "JobSettings",
    "ModelSettings",
    "NetworkSettings",
    "ObservabilitySettings",
    "PlanSettings",
    "PreferenceSettings",
    "PublishSettings",
    "SchedulingSettings",
    "Settings",
    "Spec",
    "StageSettings",
    "StorageSettings",
    "TrainSettings",
    "TrainerSettings",
    "VariantSettings",
    "choices",
    "defaults",
    "merge_arguments",
    "setting",
    "specs",
    "split_arguments",
    "trainer_fields",
    "whole_numbers",
]


@dataclass
class Settings:
    """Every setting of a run, by concern."""

    model: ModelSettings = field(default_factory=ModelSettings)
    compute: ComputeSettings = field(default_factory=ComputeSettings)
    train: TrainSettings = field(default_factory=TrainSettings)
    preference: PreferenceSettings = field(default_factory=PreferenceSettings)
    stages: StageSettings = field(default_factory=StageSettings)
    variants: VariantSettings = field(default_factory=VariantSettings)
    hpo: HpoSettings = field(default_factory=HpoSettings)
    data: DataSettings = field(default_factory=DataSettings)
    job: JobSettings = field(default_factory=JobSettings)
    scheduling: SchedulingSettings = field(default_factory=SchedulingSettings)
    network: NetworkSettings = field(default_factory=NetworkSettings)
    storage: StorageSettings = field(default_factory=StorageSettings)
    observability: ObservabilitySettings = field(default_factory=ObservabilitySettings)
    plan: PlanSettings = field(default_factory=PlanSettings)
    evaluate: EvaluateSettings = field(default_factory=EvaluateSettings)
    deploy: DeploySettings = field(default_factory=DeploySettings)
    publish: PublishSettings = field(default_factory=PublishSettings)

    @classmethod
    def from_flat(cls, values: dict) -> Settings:
        """Settings from a mapping of setting name -> value (missing names keep their defaults; unknown names are
        a ValueError): how every step reads the resolved ``settings`` dict KFP hands it. Values are taken as
        given: the validate step is what checks them (components/validate/rules/)."""
        unknown = sorted(set(values) - set(specs()))
        if unknown:
            raise ValueError(f"unknown settings {unknown}")
        values = whole_numbers(values)
        groups = {}
        for group in dataclasses.fields(cls):
            factory = typing.cast(type, group.default_factory)  # each group is a dataclass
            names = {f.name for f in dataclasses.fields(factory)}
            groups[group.name] = factory(**{k: v for k, v in values.items() if k in names})
        return cls(**groups)

    def trainer(self) -> TrainerSettings:
        """The run's trainer settings (model, compute, train, preference), before any stage's own."""
        return TrainerSettings(self.model, self.compute, self.train, self.preference)

    def flat(self) -> dict:
        """Every setting by name."""
        return flat_groups(self)


@dataclass(frozen=True)
class Spec:
    """One setting as the pipeline, the CLI and the checks see it."""

    name: str
    type: type
    default: object
    help: str
    group: str
    plain: bool
    min: float | None
    max: float | None
    above: float | None
    below: float | None
    choices: tuple[str, ...]  # the allowed values (of each entry, for a list setting); () for any
    path_suffix: str  # with choices: a value outside them may also be a path ending so; "" for none


def specs() -> dict[str, Spec]:
    """Every setting, by name, in the model's order (groups as in ``Settings``)."""
    out = {}
    for group in dataclasses.fields(Settings):
        cls = typing.cast(type, group.default_factory)
        hints = typing.get_type_hints(cls)
        for f in dataclasses.fields(cls):
            default = f.default_factory() if f.default is dataclasses.MISSING else f.default  # type: ignore[operator]
            m = f.metadata
            out[f.name] = Spec(
                f.name,
                hints[f.name],
                default,
                m["help"],
                group.name,
                m["plain"],
                m["min"],
                m["max"],
                m["above"],
                m["below"],
                m["choices"],
                m["path_suffix"],
            )
    return out


def choices(name: str) -> tuple[str, ...]:
    """The allowed values of setting ``name`` (of each entry, for a list setting): what the code that implements
    the choice offers, declared once here."""
    return specs()[name].choices


def defaults() -> dict:
    """Every setting's default, by name."""
    return Settings().flat()


def split_arguments(values: dict) -> dict:
    """Pipeline arguments for ``values`` (setting name -> value): plain settings as themselves, every other
    setting that differs from its default inside ``advanced_settings``."""
    all_specs = specs()
    args = {name: value for name, value in values.items() if all_specs[name].plain}
    advanced = {
        name: value for name, value in values.items() if not all_specs[name].plain and value != all_specs[name].default
    }
    return {**args, ADVANCED: advanced}


def whole_numbers(values: dict) -> dict:
    """``values`` with integer settings that arrive as whole floats (5.0) turned back into ints.

    KFP carries a dict parameter (``advanced_settings``, the ``settings`` every step reads) as a protobuf Struct,
    whose numbers are all doubles: an int setting comes back as 5.0, also inside ``stage_settings`` (settings by
    name, per stage).
    """
    all_specs = specs()
    out = {}
    for name, value in values.items():
        if name == "stage_settings" and isinstance(value, dict):
            value = {stage: whole_numbers(over) if isinstance(over, dict) else over for stage, over in value.items()}
        elif name in all_specs and all_specs[name].type is int and isinstance(value, float) and value.is_integer():
            value = int(value)
        out[name] = value
    return out


def merge_arguments(arguments: dict) -> dict:
    """The flat settings from pipeline arguments (the inverse of ``split_arguments``); a ValueError for an
    ``advanced_settings`` key that is unknown or that is a plain parameter of its own."""
    all_specs = specs()
    values = {name: value for name, value in arguments.items() if name != ADVANCED}
    for name, value in (arguments.get(ADVANCED) or {}).items():
        if name not in all_specs:
            close = difflib.get_close_matches(name, all_specs, n=1)
            raise ValueError(
                f"{ADVANCED}: unknown setting {name!r}"
                + (f"; did you mean {close[0]!r}?" if close else "; python -m pipelines.run --help lists every setting")
            )
        if all_specs[name].plain:
            raise ValueError(
                f"{ADVANCED}: {name!r} is a pipeline parameter of its own; set it there, not in {ADVANCED}"
            )
        values[name] = value
    return {**defaults(), **whole_numbers(values)}
