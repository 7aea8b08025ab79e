"""The rm stage's config class: TRL's ``RewardConfig`` plus ``SFTConfig``'s own fields. Its own module, so that only the
rm stage imports TRL's reward trainer (``config_file.config_class``)."""

# No ``from __future__ import annotations``: HfArgumentParser reads these fields' types as real classes.
from dataclasses import dataclass, field

from trl import RewardConfig

from components.train.trainer.arguments import SFTConfig

# RewardConfig fields the trainer derives from the settings (parse_config fills them in).
RM_DERIVED = {"max_length": "max_seq_length"}


@dataclass
class RMStageConfig(RewardConfig, SFTConfig):
    """TRL's ``RewardConfig`` for a reward model (a sequence classifier with one label) on prompt/chosen/rejected pairs,
    plus ``SFTConfig``'s own fields. Trainer pickles it into each checkpoint: it stays importable by this path."""

    # TRL's configs default bf16 to True when unset; the train step sets it for GPUs only (as for SFTConfig).
    bf16: bool = field(default=False, metadata={"help": "bf16 mixed precision (GPUs)"})
