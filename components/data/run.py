"""The data step's work (prepare_dataset, components/data/component.py) as a plain function, testable without KFP:
one training stage's data, prepared once per run onto the data volume, with what its artifact and report say."""

from __future__ import annotations

import os
from typing import NamedTuple

from components.data.formats import DataError, Options
from components.data.once import prepare_once
from components.data.report import markdown
from components.paths import pvc_uri, run_dir
from components.settings import Settings
from components.stages import STAGE_DATA, dataset_folder, stage_data

# The setting that maps each stage's columns (the others read their format's own names).
COLUMN_MAPPINGS = {"sft": "column_mapping", "grpo": "grpo_column_mapping"}
# The stages whose data is tokenized in the data step, and so may be in data_shards shards (components/data/shards.py).
SHARDED_STAGES = ("sft", "cpt")


class PreparedStage(NamedTuple):
    """A stage's prepared data: where it is and what it holds."""

    stats: dict  # prepare_once's statistics (the artifact's stats.json)
    metadata: dict  # the dataset artifact's: pvc, path, uri, format, stage, packing, row, example and token counts
    report: str  # Markdown: counts, dropped rows per reason, a length histogram, rendered examples


def _sources(value: str) -> list[str]:
    return [x.strip() for x in value.split(",") if x.strip()]


def stage_options(stage: str) -> Options:
    """What the data step's errors call the options of ``stage``'s data: the pipeline's settings (its source
    setting, dataset_format unless the stage's format is fixed, its column mapping if it has one, max_bad_rows)."""
    source_setting, fixed_format = STAGE_DATA[stage]
    return Options(
        source=source_setting,
        format="" if fixed_format else "dataset_format",
        columns=COLUMN_MAPPINGS.get(stage, ""),
        max_bad_rows="max_bad_rows",
        eval_size="eval_size",
        flags=False,
    )


def _eval_prompts_problem(s: Settings, data_root: str) -> str | None:
    """eval_prompts on the data volume that is not there: evaluate_model would fail on it after training. (A local
    run's validate_inputs reads the file itself; on a cluster only this step and evaluation mount the volume.)"""
    path = s.evaluate.eval_prompts
    on_volume = os.path.normpath(path).startswith(os.path.normpath(data_root) + os.sep)
    if on_volume and not os.path.isfile(path):
        return (
            f"eval_prompts={path!r} is not a file on the data volume; pass a JSONL file of "
            '{"messages": [...]} lines, or builtin:sample for the bundled prompts'
        )
    return None


def source_env(s: Settings, stage: str) -> dict[str, str]:
    """What reading ``stage``'s sources from an object store (``s3://``, ``gs://``) needs in this process's
    environment, which boto3 reads: ``AWS_ENDPOINT_URL`` from model_store_endpoint, and in a pod the keys of
    model_store_secret, read through the Kubernetes API as the train step reads them (components/storage/);
    ``{}`` when no source is in an object store."""
    from components import storage

    source, _ = stage_data(s, stage)
    if not any(storage.is_store_uri(x) for x in _sources(source) + _sources(s.data.eval_source)):
        return {}
    env = {"AWS_ENDPOINT_URL": s.storage.model_store_endpoint} if s.storage.model_store_endpoint else {}
    if s.storage.model_store_secret and os.environ.get("KUBERNETES_SERVICE_HOST"):
        from kubernetes import client as k8s

        from components.kube import current_namespace, load_api_client

        core = k8s.CoreV1Api(load_api_client())
        try:
            env.update(storage.secret_credentials(core, s.storage.model_store_secret, current_namespace()))
        except ValueError as e:  # the Secret missing, unreadable or without a key: one line naming it
            raise DataError(str(e)) from None
    return env


def sharded(s: Settings, stage: str) -> int:
    """How many shards ``stage``'s data is tokenized in (``prepare``'s ``shards``): data_shards for the stages whose
    data is tokenized here (sft, cpt) when it is above 1, else 0 (one pass in the data step)."""
    return s.data.data_shards if s.data.data_shards > 1 and stage in SHARDED_STAGES else 0


def stage_request(s: Settings, stage: str, data_root: str) -> dict:
    """``prepare``'s options for ``stage``'s data (components/stages.py: its source and format): what the data step
    and each data shard pod (``prepare_stage_shard``) ask for alike, so they name the same shards."""
    from components.data.filters import NoiseFilters

    source, data_format = stage_data(s, stage)
    eval_source = s.data.eval_source if stage == "sft" else ""
    filters = NoiseFilters.from_settings(s.data)
    return {
        "source": _sources(source),
        "max_seq_length": s.train.max_seq_length,
        "eval_size": int(s.data.eval_size) if s.data.eval_size >= 1 else s.data.eval_size,
        "seed": s.train.seed,
        "format": data_format,
        "columns": {"sft": s.data.column_mapping, "grpo": s.stages.grpo_column_mapping}.get(stage, {}),
        "eval_source": _sources(eval_source) or None,
        "packing": s.data.packing,
        # cpt trains on whole books and manuals: a long document is cut into chunks, not dropped or truncated.
        "over_length": "chunk" if stage == "cpt" else s.data.over_length,
        "chunk_overlap": s.data.cpt_chunk_overlap if stage == "cpt" else 0,
        "near_dedup_threshold": s.data.near_dedup_threshold,
        "num_proc": s.data.num_proc,
        "max_bad_rows": s.data.max_bad_rows,
        "pvc_mounts": {s.storage.data_pvc: data_root},
        "cache_dir": os.path.join(data_root, "cache", "prepared"),
        "names": stage_options(stage),
        "shards": sharded(s, stage),
        "filters": filters if filters.active else None,
    }


def prepare_stage_shard(s: Settings, *, stage: str, shard: int, data_root: str, run_id: str) -> dict:
    """Shard ``shard`` of ``stage``'s data (data_shards of them) read and tokenized into the data volume's shard
    cache, where the run's data step finds it complete; its stats (rows, seconds, the folder). A shard pod's work."""
    from components.data.prepare import PrepareOptions, prepare
    from components.models.resolve import resolve_model

    request = stage_request(s, stage, data_root)
    source = request.pop("source")
    tokenizer = resolve_model(s.model.model_name_or_path, os.path.join(data_root, "cache"))
    out_dir = os.path.join(run_dir(data_root, run_id), dataset_folder(stage))  # the join's, which reads the shard
    return prepare(source, tokenizer, out_dir, PrepareOptions(**request, only_shard=shard))


def prepare_stage_dataset(s: Settings, *, stage: str, data_root: str, run_id: str) -> PreparedStage:
    """Prepare ``stage``'s data (components/stages.py: its source and format) of run ``run_id`` under
    ``<data_root>/runs/<run id>/<stage's dataset folder>``, reusing a prepared copy with the same fingerprint
    (components/data/once.py), tokenized with ``model_name_or_path``'s tokenizer and chat template.

    What validate_inputs' pod cannot see, on the data volume this step mounts, is checked first: the sft stage's
    ``eval_prompts`` file and the grpo stage's reward function; a DataError names the problem before the training
    job requests GPUs. The data's own errors (DataErrors too) name the stage's settings (``stage_options``).
    """
    if stage == "sft" and (problem := _eval_prompts_problem(s, data_root)):
        raise DataError(problem)
    if stage == "grpo":
        # validate_inputs cannot import a reward function in a file on the data volume, which its pod does not
        # mount: this CPU pod does, and fails before the training job requests GPUs.
        from components.rewards import grpo_function_error

        if problem := grpo_function_error(s):
            raise DataError(problem)
    data_pvc = s.storage.data_pvc
    out_dir = os.path.join(run_dir(data_root, run_id), dataset_folder(stage))
    # Once per run and stage: the sft stage's slot asks for the data the run's data step prepared (once.py).
    stats = prepare_once(
        out_dir, s.model.model_name_or_path, os.path.join(data_root, "cache"), **stage_request(s, stage, data_root)
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
