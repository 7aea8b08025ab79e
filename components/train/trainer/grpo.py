"""Reinforcement learning with verifiable rewards, the ``grpo`` stage: TRL's ``GRPOTrainer`` on the prompts
prepare_dataset wrote.

    torchrun ... -m components.train.trainer --config train_config.json        # the config says "stage": "grpo"

The same entry point as every stage (__main__.py), and the same model loading, checkpoints, progress lines and export
(common.py); what differs:

- Data: a ``save_to_disk`` DatasetDict with ``train`` and ``eval`` splits of TRL's conversational prompt layout,
  ``{"prompt": [turns], "answer": "..."}``. TRL applies the chat template and passes every other column (``answer``)
  to the reward functions by name.
- Each step samples ``grpo_num_generations`` completions per prompt (at most ``grpo_max_completion_length`` tokens, at
  ``grpo_temperature``), scores them with the rewards of ``grpo_rewards`` (components/rewards.py: built-in verifiable
  rewards, a reward model, the user's function; TRL sums them with their weights, GRPOConfig ``reward_weights``), and
  raises the likelihood of the completions that beat their group's mean, with a KL penalty of weight ``grpo_beta`` to
  the reference (the stage's starting model: TRL keeps a frozen copy for full fine-tuning, and uses the adapter-off
  model for LoRA). ``per_device_train_batch_size`` counts completions: TRL's generation batch, micro-batch x
  accumulation x processes, must hold whole groups (validate_inputs checks it).
- Generation: transformers' ``generate`` in the training processes on a laptop; on GPUs with vllm installed (the
  trainer image), TRL's vLLM colocate mode (grpo_arguments.vllm_colocate): an engine in each rank shares its GPU.
- Metrics (metrics.json): TRL's sampled evaluation on the eval split (``eval_reward``, each reward's
  ``eval_rewards/<name>/mean``), the first and last logged training rewards (``first_reward``, ``last_reward``), plus
  what every stage reports (common.summary_metrics).
"""

from __future__ import annotations

import logging
import time
from typing import Any

import datasets
from transformers import AutoTokenizer, TrainerCallback
from trl import GRPOTrainer

from components.distributed import global_rank
from components.models.mfu import flops_per_token, peak_flops
from components.models.shape import model_shape
from components.rewards import builtin_reward, load_reward_function
from components.stages import reward_model_dir
from components.train.trainer.callbacks import ProgressCallback
from components.train.trainer.checkpoints import CheckpointMixin
from components.train.trainer.common import (
    checkpoint_callbacks,
    finish_run,
    load_model,
    start_run,
    summary_metrics,
    train_resuming,
    use_progress,
)

log = logging.getLogger("sft.grpo")
# The frozen adapter TRL adds to a PeftModel whose adapter it keeps training (GRPOTrainer.__init__: model.add_adapter(
# "ref", ...)), as dpo.py's; not part of the tuned model.
REF_ADAPTER = "ref"


class GRPOCheckpointTrainer(CheckpointMixin, GRPOTrainer):
    """TRL's ``GRPOTrainer`` whose checkpoints under DeepSpeed are DeepSpeed's sharded state only (checkpoints.py)."""


def reward_sources(cfg) -> list[str]:
    """The reward sources of ``grpo_rewards`` with a non-zero weight, in the order of ``reward_weights``."""
    return [name for name, weight in cfg.grpo_rewards.items() if weight]


def reward_funcs(cfg) -> list:
    """TRL's ``reward_funcs`` for ``cfg``, one per ``reward_sources`` entry: callables for the built-ins and the user's
    function, the reward model's folder or Hub id (TRL loads it as a sequence classifier with one label)."""
    funcs: list = []
    for name in reward_sources(cfg):
        if name == "model":
            funcs.append(cfg.grpo_reward_model or reward_model_dir(cfg.output_dir))
        elif name == "function":
            funcs.append(load_reward_function(cfg.grpo_reward_function))
        else:
            funcs.append(builtin_reward(name, cfg.grpo_answer_pattern, cfg.grpo_length_budget))
    return funcs


class RewardLogCallback(TrainerCallback):
    """One line per logging step on rank 0 with the mean reward and each source's, and the completions' length."""

    def __init__(self, names: list[str]):
        self.names = names
        self.rewards: list[float] = []

    def on_log(self, args, state, control, logs=None, **kwargs):
        if not logs or "reward" not in logs:
            return
        self.rewards.append(logs["reward"])
        if state.is_world_process_zero:
            parts = ", ".join(
                f"{n} {logs[k]:.3f}" for n, k in ((n, f"rewards/{n}/mean") for n in self.names) if k in logs
            )
            log.info(
                "step %d/%d | reward %.3f (%s) | completion length %.1f",
                state.global_step,
                state.max_steps,
                logs["reward"],
                parts,
                logs.get("completions/mean_length", 0.0),
            )


def main(cfg) -> dict:
    """Train with GRPO according to ``cfg`` (a ``GRPOStageConfig``) and return the final metrics (also metrics.json)."""
    started = time.time()
    model_path = start_run(cfg)
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    tokenizer.padding_side = "left"  # TRL generates from the right end of left-padded prompts
    data = datasets.load_from_disk(cfg.dataset_path)
    model = load_model(cfg, model_path)  # a PeftModel for lora/qlora: TRL's reference is then the adapter off
    if model.config.model_type != "qwen3_moe":
        cfg.router_aux_loss_coef = 0.0  # as in dpo.py: TRL refuses a router-loss weight for a model without a router
    funcs = reward_funcs(cfg)
    if global_rank() == 0:
        log.info(
            "grpo: %d train and %d eval prompts, %d completions each, rewards %s (weights %s), generation: %s",
            len(data["train"]),
            len(data["eval"]),
            cfg.num_generations,
            reward_sources(cfg),
            cfg.reward_weights,
            "vLLM colocate" if cfg.use_vllm else "transformers generate",
        )
    datasets.disable_progress_bars()
    callbacks, sigterm = checkpoint_callbacks(cfg)
    trainer = GRPOCheckpointTrainer(
        model=model,
        reward_funcs=funcs,
        args=cfg,
        train_dataset=data["train"],
        eval_dataset=data["eval"],
        processing_class=tokenizer,
        callbacks=callbacks,
    )
    # TRL logs each reward under its function's name, a reward model under its folder's ("final"): under its source's
    # name instead (rewards/<answer|format|length|model|function>/mean), the names grpo_rewards uses.
    trainer.reward_func_names = reward_sources(cfg)
    shape = model_shape(model.config.to_dict())
    # Attention over half a completion and its prompt on average: a rough count for the MFU line (GRPO's rows are
    # generated in the step, so there is no prepared split to count documents in).
    keys = cfg.max_completion_length / 2
    flops = flops_per_token(shape.active, shape.layers, shape.q_dim, keys)
    rewards_log = RewardLogCallback(reward_sources(cfg))
    use_progress(
        trainer,
        ProgressCallback(
            flops, cfg.world_size, peak_flops(), f"{flops / 1e9:.3g} GFLOPs/token (policy forward and backward)"
        ),
    )
    trainer.add_callback(rewards_log)
    result = train_resuming(trainer, sigterm)
    evaluation = trainer.evaluate()
    # TRL's evaluation samples completions for the eval prompts and logs their rewards (GRPOTrainer.log).
    keys_kept = {k: v for k, v in evaluation.items() if k == "eval_reward" or k.startswith("eval_rewards/")}
    history = [e["reward"] for e in trainer.state.log_history if "reward" in e]
    extra = {
        **keys_kept,
        "first_reward": history[0] if history else None,
        "last_reward": history[-1] if history else None,
        "reward_sources": reward_sources(cfg),
        "reward_weights": list(cfg.reward_weights),
    }
    metrics = summary_metrics(trainer, result, extra, started)
    tuned: Any = trainer.model  # the PeftModel for lora/qlora
    if cfg.method != "full" and REF_ADAPTER in getattr(tuned, "peft_config", {}):
        tuned.delete_adapter(REF_ADAPTER)  # adapter/ and the merged final/ hold the trained adapter only (as dpo.py)
    finish_run(trainer, cfg, tokenizer, model_path, metrics)
    return metrics
