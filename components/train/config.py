"""The trainer's configuration file: what the pipeline writes, and the rules on what goes together.

The pipeline writes one such file per run (JSON) onto the model volume; every pod of the job reads it with
``torchrun -m components.train.trainer --config FILE`` into ``SFTConfig``
(components/train/trainer/arguments.py).
This module imports no ML library (only the settings model): validate_inputs and ``--render`` use its rules without
loading torch.
"""

from __future__ import annotations

import json
from pathlib import Path

from components.settings import TrainerSettings, choices

DEEPSPEED_DIR = Path(__file__).with_name("deepspeed")
METHODS = choices("method")
# The shipped DeepSpeed configs (deepspeed/<name>.json) by name, and none: plain DDP; declared in the settings
# model (a test holds the folder to them).
DEEPSPEED_CONFIGS = choices("deepspeed_config")


def deepspeed_config_path(name: str) -> str | None:
    """The shipped DeepSpeed JSON for ``name`` (``zero2``, ``zero3``, ...: ``DEEPSPEED_CONFIGS``), a user's JSON path,
    or None for ``none``.

    Shipped names resolve inside this process's own install: call it where the file is read (the trainer),
    and write the name, not the result, into configs that another image reads.
    """
    if name in ("", "none"):
        return None
    shipped = DEEPSPEED_DIR / f"{name}.json"
    if shipped.exists():
        return str(shipped)
    if name.endswith(".json"):
        return name
    raise ValueError(
        f"deepspeed_config {name!r} is unknown; use one of {list(DEEPSPEED_CONFIGS)} or a path to a JSON file"
    )


def load_deepspeed_config(name_or_path: str) -> dict:
    """The DeepSpeed JSON behind a name or path, as a dict (empty for ``none``)."""
    path = deepspeed_config_path(name_or_path)
    if path is None:
        return {}
    try:
        return json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise ValueError(f"deepspeed_config {name_or_path!r}: no such file") from None


HPZ_SHIPPED = "zero3_hpz"  # the shipped ZeRO++ config, whose partition the job sets (hpz_partition)


def hpz_partition(num_nodes: int, gpus_per_node: int) -> int:
    """ZeRO++'s secondary partition for a job: one node's GPUs, or 1 (hpZ off) when the job is one node, where
    every gather stays within the node anyway. The one rule: the trainer sets it (trainer/parallelism.py), the
    memory fit and the plan count with it."""
    return gpus_per_node if num_nodes > 1 else 1


# Tokens of logits the chunked causal-LM loss computes at a time (trainer/chunked_loss.py; the memory fit counts it):
# 1,024 x 151,936 fp32 logits are 0.6 GB, ~1.5 GB with their bf16 copy and gradient, and the head's matmul is
# still large enough to run near a GPU's peak.
LOSS_CHUNK_TOKENS = 1024
# DeepSpeed's own floor for the parameters ZeRO-3 keeps gathered at once (stage3_max_live_parameters' default).
ZERO3_MIN_LIVE_PARAMETERS = 10**9
# The ZeRO-3 sizes a DeepSpeed config may leave to "auto", which transformers fills from the hidden size alone
# (reduce_bucket_size h^2, stage3_prefetch_bucket_size 0.9 h^2: 3.8M parameters for hidden 2048).
ZERO3_SIZED = ("stage3_prefetch_bucket_size", "stage3_max_live_parameters", "reduce_bucket_size")


def zero3_sizes(largest_layer: int) -> dict:
    """ZeRO-3's sizes for a model whose largest decoder layer has ``largest_layer`` parameters: prefetch the next
    whole layer while this one computes (for Qwen3-30B-A3B a layer is 624M parameters, its MoE block one ZeRO-3
    leaf gathered at once; transformers' "auto" prefetches 3.8M and leaves every block's 1.2 GB gather on the
    critical path), keep two layers live, reduce gradients one layer at a time. The one rule: the trainer writes
    these into the job's config, the memory fit counts them (components/estimate/memory.py)."""
    return {
        "stage3_prefetch_bucket_size": largest_layer,
        "stage3_max_live_parameters": max(ZERO3_MIN_LIVE_PARAMETERS, 2 * largest_layer),
        "reduce_bucket_size": largest_layer,
    }


def job_zero_config(deepspeed_config: str, num_nodes: int, gpus_per_node: int, largest_layer: int = 0) -> dict:
    """The ``zero_optimization`` section a job of ``num_nodes`` x ``gpus_per_node`` runs with: the config's, with the
    shipped ``zero3_hpz``'s partition set as the trainer sets it (a user's JSON keeps its own), and ZeRO-3's "auto"
    sizes from the model's ``largest_layer`` (``zero3_sizes``; 0: left to transformers)."""
    zero = load_deepspeed_config(deepspeed_config).get("zero_optimization", {})
    if zero.get("stage") == 3 and largest_layer:  # the sizes the trainer fills in where the file says "auto"
        zero = {**zero, **{k: v for k, v in zero3_sizes(largest_layer).items() if zero.get(k, "auto") == "auto"}}
    if deepspeed_config_path(deepspeed_config) == deepspeed_config_path(HPZ_SHIPPED):  # by name or by its path
        zero = {**zero, "zero_hpz_partition_size": hpz_partition(num_nodes, gpus_per_node)}
    return zero


def check_method_deepspeed(method: str, deepspeed_config: str) -> str | None:
    """The error for a method that cannot run under the DeepSpeed config ``deepspeed_config`` (a name or a JSON
    path, as ``deepspeed_config_path`` takes it), else None. The one rule: the trainer and validate_inputs ask here.

    QLoRA under ZeRO-3 is refused. PEFT and accelerate support it only when bitsandbytes stores the packed
    4-bit weights in the model's dtype (``bnb_4bit_quant_storage=torch.bfloat16``, PEFT's DeepSpeed guide), so
    that ZeRO-3 partitions them like any other bf16 parameter. The trainer (common.py) keeps bitsandbytes' default
    uint8 storage. Parameter offload is no way out: with QLoRA it costs more GPU memory, not less (same guide).
    ZeRO-2 and plain DDP work with either storage.
    """
    if method != "qlora":
        return None
    zero = load_deepspeed_config(deepspeed_config).get("zero_optimization", {})
    if zero.get("stage", 0) == 3:
        return (
            f"method 'qlora' cannot run under ZeRO-3 (deepspeed_config {deepspeed_config!r}): the trainer keeps "
            "bitsandbytes' default uint8 storage for 4-bit weights, which ZeRO-3 cannot partition; set "
            "deepspeed_config to 'none' or 'zero2', or use method 'lora' under ZeRO-3"
        )
    return None


# Early stopping (the cpt and sft stages, trainer/sft.py) watches the held-out loss per label token, the figure
# evaluate_model scores (sft.py's compute_metrics reports it as eval_loss_per_token; lower is better).
EARLY_STOPPING_STAGES = ("cpt", "sft")
EARLY_STOPPING_METRIC = "eval_loss_per_token"


def check_early_stopping(patience: int, eval_steps: int, save_steps: int, max_steps: int) -> str | None:
    """The error for early-stopping settings under which the held-out loss is never compared, else None. The one
    rule: the trainer (``check_combination``) and validate_inputs ask here.

    The Trainer picks the best model among checkpoints, so checkpoints must fall on evaluations (``save_steps`` a
    multiple of ``eval_steps``, which transformers requires for ``load_best_model_at_end``); ``max_steps`` short of
    the first evaluation never evaluates. An epoch count's steps are known only once the data is prepared.
    """
    if patience <= 0:
        return None
    every = eval_steps or save_steps
    if save_steps % every:
        return (
            f"eval_steps={eval_steps} with early_stopping_patience={patience}: save_steps={save_steps} must be a "
            "multiple of it (checkpoints fall on evaluations, where the best one is chosen); set eval_steps to a "
            "divisor of save_steps, or 0 to evaluate at every checkpoint"
        )
    if 0 < max_steps < every:
        basis = f"eval_steps={eval_steps}" if eval_steps else f"eval_steps=0: every save_steps={save_steps}"
        return (
            f"early_stopping_patience={patience} never evaluates: the first evaluation, at step {every} ({basis}), "
            f"comes after max_steps={max_steps}; set eval_steps below max_steps, or early_stopping_patience=0"
        )
    return None


def check_early_stopping_layout(patience: int, parallelism: str, model_config: dict | None) -> str | None:
    """The error for early stopping under a layout whose best-checkpoint load would give wrong weights, else None.

    Under ``hsdp``/``hsdp_ep`` the best checkpoint is each rank's shards, loaded into the trained model by
    transformers' ``_load_model_checkpoint_distributed``. For a model whose output head shares the input embedding
    (``tie_word_embeddings``: Qwen3's small dense models) that load after training gives wrong weights (measured on
    the tiny Qwen3: held-out loss 32.8 where the checkpoint had 3.2); untied models (Qwen3-MoE) load exactly.
    """
    if patience <= 0 or parallelism == "deepspeed" or not (model_config or {}).get("tie_word_embeddings"):
        return None
    return (
        f"early_stopping_patience={patience} with parallelism={parallelism}: the best checkpoint of a model with "
        "tied word embeddings does not load correctly from its shards; use parallelism=deepspeed, or "
        "early_stopping_patience=0"
    )


def early_stopping_on(cfg: dict) -> bool:
    """Whether the trainer config ``cfg`` stops early: a cpt or sft stage with ``early_stopping_patience``, and
    checkpoints to keep the best in (a hyper-parameter trial has none, ``save_strategy`` no: it trains its steps)."""
    return (
        cfg.get("stage", "sft") in EARLY_STOPPING_STAGES
        and cfg.get("early_stopping_patience", 0) > 0
        and cfg.get("save_strategy") != "no"
    )


def early_stopping_arguments(eval_steps: int, save_steps: int) -> dict:
    """The ``TrainingArguments`` fields early stopping needs: evaluate every ``eval_steps`` (0: every ``save_steps``),
    track the best ``eval_loss_per_token`` and load the best checkpoint's weights at the end."""
    return {
        "eval_strategy": "steps",
        "eval_steps": eval_steps or save_steps,
        "load_best_model_at_end": True,
        "metric_for_best_model": EARLY_STOPPING_METRIC,
        # transformers guesses from the name's ending ("loss": lower is better); this one ends in "per_token".
        "greater_is_better": False,
    }


def check_combination(cfg: dict) -> list[str]:
    """Errors for settings that cannot work together, each naming the field to change."""
    errors: list[str | None] = []
    if early_stopping_on(cfg):
        errors.append(
            check_early_stopping(
                cfg.get("early_stopping_patience", 0),
                cfg.get("eval_steps") or 0,
                cfg.get("save_steps", 500),  # TrainingArguments' default
                cfg.get("max_steps", -1),
            )
        )
    method = cfg.get("method", "full")
    if method == "qlora" and cfg.get("use_cpu"):
        errors.append("method 'qlora' needs CUDA GPUs (bitsandbytes 4-bit); use method 'lora' or 'full' on CPU")
    if cfg.get("deepspeed"):
        errors.append(check_method_deepspeed(method, cfg["deepspeed"]))
    if cfg.get("use_cpu") and cfg.get("bf16"):
        errors.append("bf16 is for GPUs; set bf16 false when use_cpu is true")
    return [e for e in errors if e]


def build_trainer_config(
    trainer: TrainerSettings,
    *,
    dataset_path: str,
    output_dir: str,
    use_cpu: bool,
    model_cache_dir: str,
    packing: bool = True,
    stage: str = "sft",
) -> dict:
    """The config dict the pipeline writes for the trainer: every setting of ``trainer`` (a stage's
    ``components.settings.TrainerSettings``: the model, compute, train and preference groups) under its own name,
    three renamed (below), plus the run's paths and the policy the package fixes (not settings: they are what makes
    the job correct, not a matter of taste).

    ``packing``: whether prepare_dataset packed the rows (its artifact's metadata says); it picks the sampler.
    ``use_cpu``: torchrun on a laptop (gloo, fp32) instead of GPUs (nccl, bf16).
    ``stage``: ``cpt``, ``sft`` or ``dpo`` (components/stages.py): the trainer's loss and data layout.
    """
    # report_to is a setting: TensorBoard event files go to <output_dir>/tensorboard on the model volume (common.py
    # sets the folder); MLflow and W&B read their address and key from the environment
    # (components/train/launcher/pods.py).
    cfg = trainer.flat()
    # The setting's name (or the user's JSON on a volume), never the path deepspeed_config_path finds here:
    # this runs in the launcher's image and the trainer image installs the package somewhere else.
    deepspeed = cfg.pop("deepspeed_config")
    if deepspeed_config_path(deepspeed):
        cfg["deepspeed"] = deepspeed
    cfg["warmup_steps"] = cfg.pop("warmup_ratio")  # transformers 5: a float < 1 is a ratio of total steps
    # transformers 5.23 takes the layer stride as activation_checkpointing_kwargs["every_n_layers"] (Trainer pops it
    # before the rest reaches torch.utils.checkpoint); 1 is its default.
    cfg["activation_checkpointing_kwargs"] = {"every_n_layers": cfg.pop("recompute_every_n_layers")}
    cfg.update(
        {
            "stage": stage,
            "dataset_path": dataset_path,
            "output_dir": output_dir,
            "model_cache_dir": model_cache_dir,
            "per_device_eval_batch_size": trainer.train.per_device_train_batch_size,
            "save_strategy": "steps",
            "include_num_input_tokens_seen": "non_padding",
            "remove_unused_columns": False,
            # Packed rows all have one length: a random order, which accelerate seeds per epoch, so a job resumed in
            # the middle of an epoch sees the rest of that epoch's order (group_by_length draws its order from the
            # global RNG, which the checkpoint restores as it was after the order was drawn: a mid-epoch resume
            # would skip a different set of rows). Unpacked rows are padded per batch: batching similar lengths
            # halves the padding work, at the price of that resume caveat.
            # DPO and reward-model pairs and GRPO prompts are text until TRL tokenizes them in the trainer: no
            # lengths to group by.
            "train_sampling_strategy": "random" if packing or stage in ("dpo", "rm", "grpo") else "group_by_length",
            # No worker processes: torchrun forwards SIGTERM to each rank's process group, a worker dies of it and
            # the DataLoader raises before the SIGTERM checkpoint is saved; the rows are tokenized and packed already.
            "dataloader_num_workers": 0,
        }
    )
    if use_cpu:
        # torchrun on a laptop: gloo between CPU processes, fp32.
        cfg.update(use_cpu=True, ddp_backend="gloo", ddp_find_unused_parameters=False)
    else:
        cfg.update(bf16=True, ddp_backend="nccl")
    return cfg


def write_trainer_config(cfg: dict, path: str) -> str:
    """Write ``cfg`` as JSON at ``path`` (creating folders) and return the path."""
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps(cfg, indent=2, sort_keys=True))
    return path
