"""The dpo stage's config class: TRL's ``DPOConfig`` plus ``SFTConfig``'s own fields (the settings the trainer
adds and the run's paths). Its own module, so that only the dpo stage imports TRL (``config_file.config_class``)."""

# No ``from __future__ import annotations``: HfArgumentParser reads these fields' types as real classes.
from dataclasses import dataclass, field

from trl import DPOConfig

from components.train.trainer.arguments import SFTConfig


@dataclass
class DPOStageConfig(DPOConfig, SFTConfig):
    """TRL's ``DPOConfig`` for preference tuning on a prepared dataset of prompt/chosen/rejected rows, plus
    ``SFTConfig``'s own fields. Both build on ``TrainingArguments``; DPOConfig's defaults win where it changes
    TrainingArguments', and the fields below win over both. Trainer pickles it into each checkpoint
    (training_args.bin): it stays importable by this module's path."""

    # TRL's configs default bf16 to True when unset; the train step sets it for GPUs only (as for SFTConfig), and
    # on CPU (the local run, use_cpu) bf16 autocast is not wanted.
    bf16: bool = field(default=False, metadata={"help": "bf16 mixed precision (GPUs)"})
    # DPOConfig has a router_aux_loss_coef of its own (None: the model config's); the run's setting decides, as in
    # SFTConfig, whose field this repeats (a test holds the two equal).
    router_aux_loss_coef: float = field(
        default=0.001,
        metadata={
            "help": ("MoE models: weight of the router load-balancing loss added to the LM loss; 0 turns it off.")
        },
    )
