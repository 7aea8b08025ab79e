"""Variants: several models trained in one run, each the run's settings with its own overrides.

``variants`` (components/settings/) is a list of JSON objects, each a set of setting overrides and an optional
``name``. Each variant runs the whole stage chain (its data, each stage's job, its checkpoints and final model) in
its own run folder ``runs/<run id>-<name>`` and jobs named after it; evaluation scores every variant and the base
models on the run's own held-out split, and the gate picks what is served (``deploy_variants``).

What a variant may change is what shapes its training (training settings, each stage's data and settings, the
training data's source, its nodes and their placement). The rest belongs to the run: the chain of ``stages`` (the
pipeline's stage slots are the run's), the held-out split every variant is scored on (``seed``, ``eval_size``,
``eval_source``), the evaluation, serving, volumes, Secrets and the search. A search and variants both choose
training settings, so a run has one or the other.

    names = variant_names(s.variants.variants)           # ["v1", "hi-lr"]
    values = variant_values(flat_settings, 1)             # the second variant's settings, every setting by name

This module reads only the settings model; the checks are in components/validate/rules/variants.py.
"""

from __future__ import annotations

import dataclasses
import re

from components.settings import (
    DataSettings,
    JobSettings,
    PlanSettings,
    SchedulingSettings,
    Settings,
    StageSettings,
    choices,
    trainer_fields,
    whole_numbers,
)

STAGES = choices("stages")  # the pipeline's stage slots, one per possible stage (components/stages.py)

NAME_KEY = "name"
# Short: a variant's name ends its run folder and its jobs' names (components/kube.py keeps those <= 52 characters).
MAX_NAME = 16
NAME = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")

# The held-out split every variant is scored on is drawn with the run's seed (components/data/prepare.py).
_RUN_TRAINING = {"seed"}
_VARIANT_DATA = {"dataset_source", "dataset_format", "column_mapping", "over_length", "packing"}
_VARIANT_JOB = {"num_nodes", "gpus_per_node", "trainer_image", "node_selector", "tolerations", "affinity"}
_VARIANT_SCHEDULING = {"queue_name", "priority_class", "min_nodes", "max_restarts"}
_VARIANT_PLAN = {"gpu_memory_gib", "achieved_tflops_per_gpu"}


def _names(group: type) -> set[str]:
    return {f.name for f in dataclasses.fields(group)}


# What a variant may override, by name.
VARIABLE = frozenset(
    (set(trainer_fields()) - _RUN_TRAINING)
    | (_names(StageSettings) - {"stages"})
    | (_names(DataSettings) & _VARIANT_DATA)
    | (_names(JobSettings) & _VARIANT_JOB)
    | (_names(SchedulingSettings) & _VARIANT_SCHEDULING)
    | (_names(PlanSettings) & _VARIANT_PLAN)
)


def variant_names(variants: list) -> list[str]:
    """Each variant's name: its own ``name``, else ``v<position from 1>``."""
    return [str(v.get(NAME_KEY) or f"v{i + 1}") if isinstance(v, dict) else f"v{i + 1}" for i, v in enumerate(variants)]


def overrides(variant: dict) -> dict:
    """The settings a variant changes (its object without its name)."""
    return {k: v for k, v in variant.items() if k != NAME_KEY}


def variant_values(values: dict, index: int) -> dict:
    """Variant ``index``'s settings, every setting by name: the run's ``values`` with its overrides, and no
    variants of its own."""
    variants = values["variants"]
    # Whole floats back to ints: KFP's Struct carries the list's numbers as doubles ({"lora_r": 8} -> 8.0).
    return {**values, **whole_numbers(overrides(variants[index])), "variants": []}


def expand(values: dict, run_id: str, tuned: dict | None = None) -> list[dict]:
    """What the pipeline's loop runs, one item per variant: ``{"variant", "run_id", "settings", "overrides",
    "tuned", "stage_1", ...}``: its name, the run id that scopes its folders and job names, every setting of it,
    what it changes, the search's choice for its sft stage, and the stage each of the pipeline's stage slots trains
    (the run's ``stages`` in order, "" for an unused slot). A run without variants is one item (its own settings
    under its own run id, named ""), so both take the same steps.

    Everything a loop iteration reads comes in its item: kfp.local (2.17.0) hands an iteration the loop item in
    place of any other task's output parameter (``create_parameter_loop_iteration_task_spec`` in
    kfp/local/orchestrator/task_spec_utils.py), and the item is what both runners resolve alike. Not "name": a KFP
    loop item's ``.name`` is the loop channel's own name, not the item's field."""
    stages = list(values["stages"])
    slots = {f"stage_{i + 1}": stage for i, stage in enumerate(stages + [""] * (len(STAGES) - len(stages)))}
    variants = values.get("variants") or []
    if not variants:
        return [{"variant": "", "run_id": run_id, "settings": values, "overrides": {}, "tuned": tuned or {}, **slots}]
    return [
        {
            "variant": name,
            "run_id": f"{run_id}-{name}",
            "settings": variant_values(values, i),
            "overrides": overrides(variants[i]),
            "tuned": {},
            **slots,
        }
        for i, name in enumerate(variant_names(variants))
    ]


def gpus(values: dict) -> int:
    """GPUs a variant's largest training job holds (``values``: its settings; each stage may have its own nodes and
    GPUs, components/stages.py)."""
    from components.stages import stage_gpus

    s = Settings.from_flat(values)
    run = s.job.num_nodes * s.job.gpus_per_node
    return max((stage_gpus(s, stage) for stage in s.stages.stages), default=run)
