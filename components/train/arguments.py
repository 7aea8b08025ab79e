"""``SFTConfig``: Hugging Face ``TrainingArguments`` plus the trainer's own settings (unknown keys are an error).

The fields the trainer adds (method, LoRA, MoE router loss, ...) are ``SFTSettings`` of the settings model
(components/settings.py): declared there once, with their defaults and help, and reachable from a preset, ``-p``
and the pipeline. They are copied here with their help only, because ``HfArgumentParser`` hands a field's
metadata to argparse, which knows nothing of the model's other metadata (bounds, plain).
"""

from __future__ import annotations

import dataclasses
import typing

from transformers import TrainingArguments

from components.settings import SFTSettings


def _copy(f: dataclasses.Field, kind: type) -> tuple[str, type, dataclasses.Field]:
    default = {"default": f.default} if f.default is not dataclasses.MISSING else {"default_factory": f.default_factory}
    return f.name, kind, dataclasses.field(**default, metadata={"help": f.metadata["help"]})


_HINTS = typing.get_type_hints(SFTSettings)
SFTConfig = dataclasses.make_dataclass(
    "SFTConfig",
    [_copy(f, _HINTS[f.name]) for f in dataclasses.fields(SFTSettings)] + [
        # Not settings: the train step fills these in for each run.
        ("dataset_path", str, dataclasses.field(default="", metadata={
            "help": "prepare_dataset's output (save_to_disk folder)"})),
        ("model_cache_dir", str, dataclasses.field(default="", metadata={
            "help": "where Hub downloads and built-in models are cached"})),
    ],
    bases=(TrainingArguments,),
    # Trainer pickles its arguments into each checkpoint (training_args.bin): the class must be importable here.
    namespace={"__module__": __name__, "__doc__": "``TrainingArguments`` for supervised fine-tuning on a prepared "
                                                  "dataset, plus ``SFTSettings``."},
)
