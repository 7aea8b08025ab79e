"""The data step's work (prepare_dataset, components/data/component.py) as a plain function, testable without KFP:
one training stage's data, prepared once per run onto the data volume, with what its artifact and report say."""

from __future__ import annotations

import os
from typing import NamedTuple

from components.data.once import prepare_once
from components.data.report import markdown
from components.paths import pvc_uri, run_dir
from components.settings import Settings
from components.stages import dataset_folder, stage_data


class PreparedStage(NamedTuple):
    """A stage's prepared data: where it is and what it holds."""

    stats: dict  # prepare_once's statistics (the artifact's stats.json)
    metadata: dict  # the dataset artifact's: pvc, path, uri, format, stage, packing, row, example and token counts
    report: str  # Markdown: counts, dropped rows per reason, a length histogram, rendered examples


def _sources(value: str) -> list[str]:
    return [x.strip() for x in value.split(",") if x.strip()]


def prepare_stage_dataset(s: Settings, *, stage: str, data_root: str, run_id: str) -> PreparedStage:
    """Prepare ``stage``'s data (components/stages.py: its source and format) of run ``run_id`` under
    ``<data_root>/runs/<run id>/<stage's dataset folder>``, reusing a prepared copy with the same fingerprint
    (components/data/once.py), tokenized with ``model_name_or_path``'s tokenizer and chat template.

    The grpo stage's reward function (a file on the data volume, which validate_inputs' pod does not mount) is
    checked first: a ValueError names the problem before the training job requests GPUs.
    """
    if stage == "grpo":
        # validate_inputs cannot import a reward function in a file on the data volume, which its pod does not
        # mount: this CPU pod does, and fails before the training job requests GPUs.
        from components.rewards import grpo_function_error

        if problem := grpo_function_error(s):
            raise ValueError(problem)
    data_pvc = s.cluster.data_pvc
    source, data_format = stage_data(s, stage)
    out_dir = os.path.join(run_dir(data_root, run_id), dataset_folder(stage))
    eval_source = s.data.eval_source if stage == "sft" else ""
    # Once per run and stage: the sft stage's slot asks for the data the run's data step prepared (once.py).
    stats = prepare_once(
        out_dir,
        s.train.model_name_or_path,
        os.path.join(data_root, "cache"),
        source=_sources(source),
        max_seq_length=s.train.max_seq_length,
        eval_size=int(s.data.eval_size) if s.data.eval_size >= 1 else s.data.eval_size,
        seed=s.train.seed,
        format=data_format,
        columns={"sft": s.data.column_mapping, "grpo": s.stages.grpo_column_mapping}.get(stage, {}),
        eval_source=_sources(eval_source) or None,
        packing=s.data.packing,
        over_length=s.data.over_length,
        num_proc=s.data.num_proc,
        pvc_mounts={data_pvc: data_root},
        cache_dir=os.path.join(data_root, "cache", "prepared"),
    )
    metadata = {
        "pvc": data_pvc,
        "path": out_dir,
        "uri": pvc_uri(data_pvc, data_root, out_dir),
        "format": stats["format"],
        "stage": stage,
        "packing": stats["packing"],
        "train_rows": stats["train"]["rows"],
        "eval_rows": stats["eval"]["rows"],
        "train_examples": stats["train"]["examples"],
        "eval_examples": stats["eval"]["examples"],
        "cache_hit": stats["cache_hit"],
    }
    if "tokens" in stats["train"]:
        metadata["train_tokens"] = stats["train"]["tokens"]
    if stats["packing"]:
        metadata["packing_efficiency"] = stats["train"]["packing_efficiency"]
    return PreparedStage(stats, metadata, markdown(stats))
