"""The text of the plan as the CLI prints it and validate_inputs logs it: ``plan_text`` (what ``python -m
pipelines.run ... --plan [STATS_JSON]`` prints: the plan, a faster layout or lighter recomputation where one fits, the
grpo stage's plan and one line per stage), ``memory_text`` (each training stage's memory per GPU after ``--render``'s
manifests), ``format_stage_plans`` (a line per stage and the run's total) and ``read_stats`` (a prepared dataset's
statistics). It imports training_plan.py and grpo_plan.py; nothing of theirs imports it.
"""

from __future__ import annotations

import json
from pathlib import Path

from components.estimate.data_prep_time import data_prep_text
from components.estimate.grpo_plan import format_grpo_plan, grpo_plan
from components.estimate.training_plan import (
    _duration,
    architecture,
    faster_layout,
    format_plan,
    lighter_recompute,
    plan,
)
from components.settings import Settings


def read_stats(path: str) -> dict:
    """A prepared dataset's statistics from ``path``: prepare_dataset's stats.json, or its artifact's metadata
    (train_rows, train_tokens, packing_efficiency) saved as JSON. A ValueError says what is wrong."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except OSError as e:
        raise ValueError(f"--plan {path}: {e.strerror}; pass prepare_dataset's stats.json") from None
    except ValueError:
        raise ValueError(f"--plan {path}: not JSON; pass prepare_dataset's stats.json") from None
    if isinstance(data, dict) and isinstance(data.get("train"), dict) and data["train"].get("rows"):
        return data
    if isinstance(data, dict) and data.get("train_rows"):
        return {
            "train": {
                "rows": data["train_rows"],
                "tokens": data.get("train_tokens"),
                "packing_efficiency": data.get("packing_efficiency"),
            }
        }
    raise ValueError(
        f"--plan {path}: no training split's row count (train.rows in stats.json, or train_rows); pass "
        "prepare_dataset's stats.json"
    )


def memory_text(values: dict) -> str:
    """What ``--render`` prints after the manifests: each training stage's GPUs, how the grpo stage generates, and its
    memory per GPU by the fit validate_inputs applies; "" for a local run."""
    s = Settings.from_flat(values)
    if s.job.train_backend == "local":
        return ""
    try:
        config = architecture(s.model.model_name_or_path)
    except ValueError as e:
        return f"memory per GPU: not estimated ({e})"
    lines = []
    for stage in s.stages.stages:
        if stage == "grpo" and s.compute.parallelism == "deepspeed":
            rl = grpo_plan(s, config)
            p, memory, fits, how = rl.train, rl.memory_gib, rl.memory_error is None, f", generation: {rl.backend}"
        else:
            p = plan(s, config, stage=stage)
            memory, fits, how = p.memory_gib["total"], p.fits, ""
        lines.append(
            f"stage {stage}: {p.num_nodes} x {p.gpus_per_node} GPUs{how}, {memory:.1f} GiB per GPU of "
            f"{p.gpu_memory_gib:g} (the fit validate_inputs checks): {'fits' if fits else 'does NOT fit'}"
        )
    return "\n".join(lines)


def plan_text(values: dict, stats_path: str | None = None) -> str:
    """What ``python -m pipelines.run ... --plan [STATS_JSON]`` prints for the resolved settings ``values``: the plan
    and, when another ZeRO-3 layout or micro-batch split is faster here by 10% or more and fits, that one. A
    ValueError names the setting when the model's config cannot be found without a download."""
    from components.stages import stage_resources

    s = Settings.from_flat(values)
    if s.job.train_backend == "local":
        return (
            "plan: this run trains on this machine's CPUs (train_backend=local); the plan is for GPU jobs: "
            "pass a cluster preset, e.g. --preset qwen3-30b-a3b-full --plan"
        )
    config = architecture(s.model.model_name_or_path)
    stats = read_stats(stats_path) if stats_path else None
    text = format_plan(plan(s, config, stats)) + "\n" + data_prep_text(s, stats)
    better = faster_layout(s, config, stats)
    if better:
        over, p = better
        own = plan(s, config, stats)
        args = " ".join(f"-p {key}={value}" for key, value in over.items())
        text += (
            f"\n  faster:   {args}: {p.tokens_per_s_per_gpu:,.0f} tokens/s per GPU "
            f"(x{p.tokens_per_s_per_gpu / own.tokens_per_s_per_gpu:.2f}), bottleneck {p.bottleneck}, "
            f"{p.memory_gib['total']:.1f} GiB per GPU"
        )
    lighter = lighter_recompute(s, config, stats)
    if lighter:
        over, p = lighter
        own = plan(s, config, stats)
        args = " ".join(f"-p {key}={str(value).lower()}" for key, value in over.items())
        text += (
            f"\n  recompute: only what memory needs, {args}: {p.tokens_per_s_per_gpu:,.0f} tokens/s per GPU "
            f"(x{p.tokens_per_s_per_gpu / own.tokens_per_s_per_gpu:.2f}), {p.memory_gib['total']:.1f} GiB per GPU "
            f"of {p.gpu_memory_gib:g}"
        )
    if "grpo" in s.stages.stages and s.compute.parallelism == "deepspeed":
        text += "\n" + format_grpo_plan(grpo_plan(s, config))
    if len(s.stages.stages) > 1 or any(stage_resources(s, stage) for stage in s.stages.stages):
        text += "\n" + format_stage_plans(s, config, stats)
    return text


def format_stage_plans(s: Settings, config: dict, stats: dict | None = None) -> str:
    """One line per stage the run trains, each on its own job (``stage_settings`` may give a stage its own
    ``num_nodes`` and ``gpus_per_node``): GPUs, optimizer steps, wall time, GPU-hours and memory per GPU, and the
    run's total. ``stats`` (the prepared dataset's) sizes the stage the headline plans; the others are sized by
    ``dataset_tokens_estimate`` (the grpo stage: its prompts, ``grpo_plan``)."""
    from components.stages import stage_resources, stage_setting_name

    head = "sft" if "sft" in s.stages.stages else s.stages.stages[0]
    lines = ["stages: each its own job, on its own nodes and GPUs (stage_settings.<stage>.num_nodes, .gpus_per_node)"]
    total = 0.0
    for stage in s.stages.stages:
        if stage == "grpo" and s.compute.parallelism == "deepspeed":
            rl = grpo_plan(s, config)
            p, memory, fits, wall, hours = rl.train, rl.memory_gib, rl.memory_error is None, rl.wall_s, rl.gpu_hours
            per = " per 1,000 prompts" if rl.per_thousand else ""
            steps = f"{rl.steps:,} optimizer steps{per}"
        else:
            p = plan(s, config, stats if stage == head else None, stage=stage)
            memory, fits, wall, hours = p.memory_gib["total"], p.fits, p.wall_s, p.gpu_hours
            steps = f"{p.steps:,} optimizer steps"
        total += hours
        own = stage_resources(s, stage)
        source = (
            ", ".join(f"{stage_setting_name(s, stage, name)}" for name in ("num_nodes", "gpus_per_node") if name in own)
            or "the run's num_nodes, gpus_per_node"
        )
        lines.append(
            f"  {stage + ':':<9} {p.num_nodes} x {p.gpus_per_node} GPUs ({source}), {steps}, {_duration(wall)} wall, "
            f"{hours:,.1f} GPU-hours, {memory:.1f} GiB per GPU: {'fits' if fits else 'does NOT fit'}"
        )
    lines.append(f"  {'total:':<9} {total:,.1f} GPU-hours over {len(s.stages.stages)} stages")
    return "\n".join(lines)
