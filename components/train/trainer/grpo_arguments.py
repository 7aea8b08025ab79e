"""The grpo stage's config class: TRL's ``GRPOConfig`` plus ``SFTConfig``'s own fields. Its own module, so that only the
grpo stage imports TRL's GRPO (``config_file.config_class``)."""

# No ``from __future__ import annotations``: HfArgumentParser reads these fields' types as real classes.
import importlib.util
from dataclasses import dataclass, field

from trl import GRPOConfig

from components.train.trainer.arguments import SFTConfig

# GRPOConfig fields the trainer derives from the settings (parse_config fills them in; a config file may not set them):
# one name per knob, as users set it for the stage.
GRPO_DERIVED = {
    "num_generations": "grpo_num_generations",
    "max_completion_length": "grpo_max_completion_length",
    "beta": "grpo_beta",
    "temperature": "grpo_temperature",
    "reward_weights": "grpo_rewards",
    # TRL's final evaluation samples num_generations_eval completions per held-out prompt (default: num_generations).
    # Groups only matter for training's advantages; the held-out mean reward is a mean over prompts, so one completion
    # each: an eighth of the generation at the default 8, on the cluster's GPUs as on a laptop's CPU (48 prompts x 8:
    # 23 of the local RL run's 98 s of grpo). The evaluate step scores the greedy answers on its own.
    "num_generations_eval": "the trainer (one completion per held-out prompt)",
    "use_vllm": "the machine (CUDA and vllm present; the trainer image has no vllm)",
    "vllm_mode": "the machine (vllm_colocate)",
}


@dataclass
class GRPOStageConfig(GRPOConfig, SFTConfig):
    """TRL's ``GRPOConfig`` for reinforcement learning on a prepared dataset of prompt rows (an optional ``answer``
    column), plus ``SFTConfig``'s own fields. Both build on ``TrainingArguments``; GRPOConfig's defaults win where it
    changes TrainingArguments', and the fields below win over both. Trainer pickles it into each checkpoint
    (training_args.bin): it stays importable by this module's path."""

    # TRL's configs default bf16 to True when unset; the train step sets it for GPUs only (as for SFTConfig).
    bf16: bool = field(default=False, metadata={"help": "bf16 mixed precision (GPUs)"})
    # GRPOConfig has a router_aux_loss_coef of its own (None: the model config's); the run's setting decides.
    router_aux_loss_coef: float = field(
        default=0.001,
        metadata={
            "help": ("MoE models: weight of the router load-balancing loss added to the LM loss; 0 turns it off.")
        },
    )


def vllm_colocate() -> dict:
    """TRL's generation backend for this machine: vLLM inside the training processes (``vllm_mode="colocate"``: each
    rank's engine shares its GPU, ``vllm_gpu_memory_utilization`` of it, TRL 1.16's default 0.3) where CUDA and vllm
    are present (an image that adds vllm; the package's trainer image has none), else transformers' ``generate``."""
    import torch

    if torch.cuda.is_available() and importlib.util.find_spec("vllm") is not None:
        return {"use_vllm": True, "vllm_mode": "colocate"}
    return {"use_vllm": False}
