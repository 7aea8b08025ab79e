"""The trainer's config classes: Hugging Face ``TrainingArguments`` (or TRL's ``DPOConfig``) plus the trainer's own
settings; unknown keys are an error.

The fields the trainer adds (method, LoRA, MoE router loss, DPO's beta, ...) are ``SFTSettings`` of the settings
model (components/settings.py): declared there once, with their defaults and help, and reachable from a preset,
``-p`` and the pipeline. They are copied here with their help only, because ``HfArgumentParser`` hands a field's
metadata to argparse, which knows nothing of the model's other metadata (bounds, plain).

A config file's ``stage`` picks the class (``config_class``): ``SFTConfig`` for ``sft`` and ``cpt`` (continued
pretraining is the same causal-LM loss on rows whose every token is a label), ``DPOStageConfig`` for ``dpo``. TRL is
imported only for the latter: ``DPOStageConfig`` is built on first use.
"""

from __future__ import annotations

import dataclasses
import typing

from transformers import TrainingArguments

from components.settings import SFTSettings
from components.train.stages import STAGES


def _copy(f: dataclasses.Field, kind: type) -> tuple[str, type, dataclasses.Field]:
    default = {"default": f.default} if f.default is not dataclasses.MISSING else {"default_factory": f.default_factory}
    return f.name, kind, dataclasses.field(**default, metadata={"help": f.metadata["help"]})


_HINTS = typing.get_type_hints(SFTSettings)
_FIELDS = [_copy(f, _HINTS[f.name]) for f in dataclasses.fields(SFTSettings)] + [
    # Not settings: the train step fills these in for each run.
    ("stage", str, dataclasses.field(default="sft", metadata={
        "help": f"the training stage this run is, one of {', '.join(STAGES)}: picks the config class and the loss"})),
    ("dataset_path", str, dataclasses.field(default="", metadata={
        "help": "prepare_dataset's output (save_to_disk folder)"})),
    ("model_cache_dir", str, dataclasses.field(default="", metadata={
        "help": "where Hub downloads and built-in models are cached"})),
]

SFTConfig = dataclasses.make_dataclass(
    "SFTConfig",
    _FIELDS,
    bases=(TrainingArguments,),
    # Trainer pickles its arguments into each checkpoint (training_args.bin): the class must be importable here.
    namespace={"__module__": __name__, "__doc__": "``TrainingArguments`` for supervised fine-tuning (and continued "
                                                  "pretraining) on a prepared dataset, plus ``SFTSettings``."},
)

# DPOConfig fields the trainer derives from the settings (parse_config fills them in; a config file may not set
# them): one name per knob, as users set it for every stage.
DPO_DERIVED = {"beta": "dpo_beta", "max_length": "max_seq_length", "precompute_ref_log_probs": "method"}


def _dpo_stage_config():
    from trl import DPOConfig

    return dataclasses.make_dataclass(
        "DPOStageConfig",
        _FIELDS + [
            # TRL's configs default bf16 to True when unset; the train step sets it for GPUs only (as for SFTConfig),
            # and on CPU (the local run, use_cpu) bf16 autocast is not wanted.
            ("bf16", bool, dataclasses.field(default=False, metadata={"help": "bf16 mixed precision (GPUs)"})),
        ],
        bases=(DPOConfig,),
        namespace={"__module__": __name__, "__doc__": "TRL's ``DPOConfig`` for preference tuning on a prepared "
                                                      "dataset of prompt/chosen/rejected rows, plus ``SFTSettings``."},
    )


def __getattr__(name: str):
    # ``DPOStageConfig`` is built when first asked for (the dpo stage, or unpickling its training_args.bin), so
    # that the other stages never import TRL.
    if name == "DPOStageConfig":
        globals()[name] = _dpo_stage_config()
        return globals()[name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def config_class(stage: str) -> type:
    """The config class of a trainer config whose ``stage`` is ``stage`` (one of ``STAGES``)."""
    if stage == "dpo":
        from components.train.trainer.arguments import DPOStageConfig

        return DPOStageConfig
    return SFTConfig
