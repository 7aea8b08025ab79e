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
- Generation: transformers' ``generate`` in the training processes, on a laptop and in the trainer image alike (it
  has no vllm: components/estimate/memory.py TRAINER_IMAGE_HAS_VLLM); on GPUs where vllm is installed, TRL's vLLM
  colocate mode (grpo_arguments.vllm_colocate): an engine in each rank shares its GPU.
  With ``grpo_generation_backend=vllm-server``, a vLLM server of its own (vllm_client.py): each rank's completions come
  from it, and the trainer pushes its weights to it every ``grpo_weight_sync_steps`` steps
  (GRPOCheckpointTrainer._generate_single_turn).
- Rewards that are None or NaN (TRL: "not applicable"): counted per source and step (``rewards/<source>/unscored``,
  the progress line, a warning naming the source's setting); a training step with no reward at all stops the run with
  NoRewardError naming each source's setting (GRPOCheckpointTrainer).
- Metrics (metrics.json): TRL's sampled evaluation on the eval split, one completion per prompt (``eval_reward``, each
  reward's ``eval_rewards/<name>/mean``), the first and last logged training rewards (``first_reward``,
  ``last_reward``), plus what every stage reports (common.summary_metrics).
"""

from __future__ import annotations

import logging
import time
from typing import Any

import datasets
import torch
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
from components.train.trainer.vllm_client import ServerGeneration

log = logging.getLogger("sft.grpo")
# The frozen adapter TRL adds to a PeftModel whose adapter it keeps training (GRPOTrainer.__init__: model.add_adapter(
# "ref", ...)), as dpo.py's; not part of the tuned model.
REF_ADAPTER = "ref"


class NoRewardError(RuntimeError):
    """A training step in which no completion got a reward from any source: GRPO has nothing to learn from."""


class GRPOCheckpointTrainer(CheckpointMixin, GRPOTrainer):
    """TRL's ``GRPOTrainer`` whose checkpoints under DeepSpeed are DeepSpeed's sharded state only (checkpoints.py), and
    which counts the rewards that are None or NaN.

    TRL reads a reward function's None as "not applicable" (NaN; the source's mean and the weighted sum leave it out,
    and a completion that no source scores gets advantage 0), so a source that skips some completions is normal (the
    answer reward without a reference); each step logs, per source, how many completions of its generation batch it
    left unscored (``rewards/<source>/unscored``, averaged over the logging window as TRL averages its metrics). A
    training step in which no completion has any reward stops the run with NoRewardError naming each source's setting.
    """

    reward_settings: dict[str, str] = {}  # source -> the setting that defines it (reward_settings(cfg))
    server: ServerGeneration | None = None  # grpo_generation_backend=vllm-server (vllm_client.py)

    def _generate_single_turn(self, prompt_ids, images, multimodal_fields, num_generations, has_tool_images=False):
        # TRL 1.16: one completion per entry of prompt_ids (this rank's prompts, each repeated num_generations times
        # by the sampler), as token ids, and each token's log-probability (or None).
        if self.server is None:
            return super()._generate_single_turn(
                prompt_ids, images, multimodal_fields, num_generations, has_tool_images
            )
        return self.server.generate(self, prompt_ids)

    def _calculate_rewards(self, inputs, prompts, completions, completion_ids_list):
        # TRL 1.16: one column per reward source, every process's completions gathered, None as NaN: the same tensor on
        # every rank, so that every rank stops at the same step.
        rewards = super()._calculate_rewards(inputs, prompts, completions, completion_ids_list)
        missing = torch.isnan(rewards)
        mode = "train" if self.model.training else "eval"
        for name, count in zip(self.reward_func_names, missing.sum(dim=0).tolist(), strict=True):
            self._metrics[mode][f"rewards/{name}/unscored"].append(float(count))
        if mode == "train" and bool(missing.all()):
            sources = ", ".join(f"{n} ({self.reward_settings.get(n, n)})" for n in self.reward_func_names)
            raise NoRewardError(
                f"grpo step {self.state.global_step + 1}: every completion of the step has no reward: all "
                f"{rewards.shape[0]} were None or NaN from each of {sources}; GRPO has nothing to learn from. Make the "
                "reward function return a number for the completions it can score, or give another reward a weight "
                "in grpo_rewards"
            )
        return rewards


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


def reward_settings(cfg) -> dict[str, str]:
    """Each reward source of ``cfg`` -> the setting that defines it, as the messages about its rewards name it."""
    return {
        "answer": f"grpo_rewards answer (None without a reference), grpo_answer_pattern {cfg.grpo_answer_pattern!r}",
        "format": f"grpo_rewards format, grpo_answer_pattern {cfg.grpo_answer_pattern!r}",
        "length": f"grpo_rewards length, grpo_length_budget {cfg.grpo_length_budget}",
        "model": f"grpo_reward_model {cfg.grpo_reward_model or reward_model_dir(cfg.output_dir)!r}",
        "function": f"grpo_reward_function {cfg.grpo_reward_function!r}",
    }


def generation_backend(cfg) -> str:
    """Where the stage's completions come from, as its first line says."""
    if cfg.grpo_generation_backend == "vllm-server":
        return (
            f"the vLLM server at {cfg.grpo_vllm_server_url} (weights pushed every {cfg.grpo_weight_sync_steps} steps)"
        )
    return "vLLM colocate" if cfg.use_vllm else "transformers generate"


def _value(x: float | None) -> str:
    """A logged mean as the progress line shows it: TRL logs None for a source with no reward in the window."""
    return "n/a" if x is None else f"{x:.3f}"


class RewardLogCallback(TrainerCallback):
    """One line per logging step on rank 0 with the mean reward and each source's, how many completions per generation
    batch a source left unscored (None or NaN: GRPOCheckpointTrainer), and the completions' length; a warning naming the
    source's setting the first time a source leaves completions unscored."""

    def __init__(self, names: list[str], settings: dict[str, str], batch: int):
        self.names = names
        self.settings = settings
        self.batch = batch  # completions per generation batch, every process's
        self.warned: set[str] = set()

    def _source(self, name: str, logs: dict) -> str:
        unscored = logs.get(f"rewards/{name}/unscored") or 0.0
        counted = f" (None/NaN {unscored:g}/{self.batch})" if unscored else ""
        return f"{name} {_value(logs.get(f'rewards/{name}/mean'))}{counted}"

    def on_log(self, args, state, control, logs=None, **kwargs):
        if not logs or "reward" not in logs or not state.is_world_process_zero:
            return
        for name in self.names:
            unscored = logs.get(f"rewards/{name}/unscored") or 0.0
            if unscored and name not in self.warned:
                self.warned.add(name)
                log.warning(
                    "reward %s (%s) returned None or NaN for %g of the %d completions of a step: TRL leaves them out "
                    "of its mean and of the sum (not applicable); the progress lines count them from here on",
                    name,
                    self.settings.get(name, name),
                    unscored,
                    self.batch,
                )
        log.info(
            "step %d/%d | reward %s (%s) | completion length %.1f",
            state.global_step,
            state.max_steps,
            _value(logs["reward"]),
            ", ".join(self._source(n, logs) for n in self.names if f"rewards/{n}/mean" in logs),
            logs.get("completions/mean_length") or 0.0,
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
            generation_backend(cfg),
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
    trainer.reward_settings = reward_settings(cfg)
    if cfg.grpo_generation_backend == "vllm-server":
        device = torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else "cpu"
        trainer.server = ServerGeneration(cfg.grpo_vllm_server_url, cfg.grpo_weight_sync_steps, global_rank(), device)
    shape = model_shape(model.config.to_dict())
    # Attention over half a completion and its prompt on average: a rough count for the MFU line (GRPO's rows are
    # generated in the step, so there is no prepared split to count documents in).
    keys = cfg.max_completion_length / 2
    flops = flops_per_token(shape.active, shape.layers, shape.q_dim, keys)
    rewards_log = RewardLogCallback(reward_sources(cfg), reward_settings(cfg), cfg.generation_batch_size)
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
    history = [e["reward"] for e in trainer.state.log_history if e.get("reward") is not None]
    extra = {
        **keys_kept,
        "first_reward": history[0] if history else None,
        "last_reward": history[-1] if history else None,
        "reward_sources": reward_sources(cfg),
        "reward_weights": list(cfg.reward_weights),
    }
    if trainer.server is not None and trainer.server.syncs:
        extra["weight_syncs"] = len(trainer.server.syncs)
        extra["weight_sync_seconds"] = round(sum(s["seconds"] for s in trainer.server.syncs), 3)
    metrics = summary_metrics(trainer, result, extra, started)
    tuned: Any = trainer.model  # the PeftModel for lora/qlora
    if cfg.method != "full" and REF_ADAPTER in getattr(tuned, "peft_config", {}):
        tuned.delete_adapter(REF_ADAPTER)  # adapter/ and the merged final/ hold the trained adapter only (as dpo.py)
    finish_run(trainer, cfg, tokenizer, model_path, metrics)
    return metrics
