"""The training step's rules: method and DeepSpeed, length of training, trackers; and, last, whether each stage's
job fits in GPU memory."""

from __future__ import annotations

import dataclasses
import importlib.util
from pathlib import Path

from components.settings import Settings
from components.train.config import DEEPSPEED_CONFIGS, check_method_deepspeed, load_deepspeed_config
from components.train.launcher.memory import check_memory_fit
from components.train.stages import stage_overrides


def check_train_settings(s: Settings) -> list[str | None]:
    """Method with DeepSpeed, length of training, trackers this machine can report to."""
    t = s.train
    errors: list[str | None] = []
    if not t.model_name_or_path.strip():
        errors.append("model_name_or_path is empty; give a Hub id such as Qwen/Qwen3-30B-A3B or a mounted folder")
    if t.deepspeed_config in DEEPSPEED_CONFIGS:
        # A user's JSON lives on a volume this step may not mount: the trainer applies the rule when it reads it.
        errors.append(check_method_deepspeed(t.method, t.deepspeed_config))
        # ZeRO++'s secondary partition spans consecutive ranks: a node's GPUs only when its size is gpus_per_node.
        hpz = load_deepspeed_config(t.deepspeed_config).get("zero_optimization", {}).get("zero_hpz_partition_size", 1)
        if hpz > 1 and hpz != s.cluster.gpus_per_node and s.cluster.train_backend != "local":
            errors.append(f"deepspeed_config={t.deepspeed_config} partitions the weights within {hpz} GPUs, and "
                          f"gpus_per_node={s.cluster.gpus_per_node}: copy components/train/deepspeed/"
                          f"{t.deepspeed_config}.json with zero_hpz_partition_size {s.cluster.gpus_per_node} to a "
                          "volume and give its path, or use zero3")
    if t.num_train_epochs <= 0 and t.max_steps <= 0:
        errors.append("num_train_epochs and max_steps are both <= 0; set num_train_epochs > 0 or max_steps > 0")
    if "mlflow" in t.report_to and s.cluster.train_backend == "local" and importlib.util.find_spec("mlflow") is None:
        errors.append("report_to names mlflow and this machine has no mlflow: pip install mlflow-skinny (or take "
                      "mlflow out of report_to)")
    if t.max_steps == 0:
        errors.append("max_steps=0 trains nothing; use -1 to run every epoch, or a positive number of steps")
    return errors


def memory_errors(s: Settings) -> list[str]:
    """The stages whose job would not fit in GPU memory (components/train/launcher/memory.py), each with its own
    settings; none for a local run. Ask on settings known to be valid: an estimate over bad inputs is noise."""
    if s.cluster.train_backend == "local":
        return []
    errors = []
    for stage in s.stages.stages:
        t = dataclasses.replace(s.train, **stage_overrides(s, stage))
        if t.deepspeed_config not in DEEPSPEED_CONFIGS and not Path(t.deepspeed_config).is_file():
            continue  # a user's JSON on a volume this step does not mount: its layout is unknown here
        # DPO runs chosen and rejected of each pair in one forward pass: twice the rows.
        problem = check_memory_fit(
            s.train.model_name_or_path, t.method, t.deepspeed_config, s.cluster.num_nodes, s.cluster.gpus_per_node,
            t.max_seq_length, t.per_device_train_batch_size * (2 if stage == "dpo" else 1),
            gpu_memory_gib=s.cluster.gpu_memory_gib, lora_r=t.lora_r, lora_target_modules=t.lora_target_modules)
        if problem:
            errors.append(f"stage {stage}: {problem}" if len(s.stages.stages) > 1 else problem)
    return errors
