"""prepare_dataset as a KFP component: packed, tokenized train/eval splits onto the data volume."""

from kfp import dsl
from kfp.dsl import Dataset, Markdown, Output

from components.version import COMPONENTS_IMAGE


@dsl.component(base_image=COMPONENTS_IMAGE, install_kfp_package=False)
def prepare_dataset(
    settings: dict,
    stage: str,
    data_root: str,
    run_id: str,
    dataset: Output[Dataset],
    report: Output[Markdown],
):
    """Clean, tokenize and pack the instruction data with the model's chat template onto the data volume.

    Large data never goes through KFP's artifact store: the DatasetDict is written under
    ``<data_root>/runs/<run_id>/dataset``; the artifact carries its location and counts. Results are
    kept under ``<data_root>/cache/prepared/<fingerprint>`` so a recurring run with unchanged sources,
    tokenizer and options reuses them (hard links on the same volume) instead of redoing the work.

    The base model (``model_name_or_path``) is resolved here, on a CPU pod before any GPU is requested: a Hub id
    is downloaded into the HF cache on the data volume, and an FP8 checkpoint is dequantised once into the bf16
    copy that training and evaluation load (``components.models.resolve.resolve_model``; both reuse it by fingerprint).

    Args:
        settings: every setting, as validate_inputs resolved them (components/settings/): the data settings
            (dataset_source, dataset_format, column_mapping, eval_source, over_length, packing, num_proc,
            eval_size), and model_name_or_path (tokenizer and chat template), max_seq_length, seed, data_pvc.
        stage: the training stage whose data this is (components/stages.py): ``sft`` reads dataset_source
            (its eval split is also what evaluate_model scores), ``cpt`` reads cpt_dataset_source as plain text,
            ``dpo`` reads dpo_dataset_source as preference pairs (prompt, chosen, rejected; kept as text: the
            trainer applies the chat template).
        data_root: where the data volume is mounted in this step.
        run_id: the KFP run id; scopes the output folder.

    Returns:
        dataset: metadata ``pvc``, ``path``, ``uri`` (``pvc://claim/path``), row and token counts and
            ``packing_efficiency``; the artifact folder holds ``stats.json``.
        report: counts, dropped rows per reason, a length histogram and three rendered examples.
    """
    import json
    import os
    import sys

    from components.kube import egress_env
    from components.observe.outcome import recording_outcome
    from components.observe.process import start_step
    from components.settings import Settings

    start_step("prepare_dataset")
    s = Settings.from_flat(settings)
    # The Hub mirror and proxies reach this step's own downloads too (the base model, a Hub dataset), not only the
    # pods the package creates; huggingface_hub reads HF_ENDPOINT when it is first imported: before data.run is.
    os.environ.update(egress_env(s.network))
    from components.data.formats import DataError
    from components.data.run import prepare_stage_dataset, source_env

    try:
        # How this step ended, for the run's exit handler (components/observe/outcome.py).
        with recording_outcome(f"prepare_dataset[{stage}]", data_root, run_id):
            os.environ.update(source_env(s, stage))  # an object-store source's endpoint and keys
            prepared = prepare_stage_dataset(s, stage=stage, data_root=data_root, run_id=run_id)
            os.makedirs(dataset.path, exist_ok=True)
            with open(os.path.join(dataset.path, "stats.json"), "w") as f:
                json.dump(prepared.stats, f, indent=2, ensure_ascii=False)
            with open(report.path, "w", encoding="utf-8") as f:
                f.write(prepared.report)
            dataset.metadata.update(prepared.metadata)
    except DataError as e:
        # Bad data (recorded above): the one line that names the row, the setting and the fix, not a traceback.
        print(f"error: {e}", file=sys.stderr, flush=True)
        raise SystemExit(2) from None


@dsl.component(base_image=COMPONENTS_IMAGE, install_kfp_package=False)
def list_data_shards(settings: dict) -> list:
    """The items the pipeline's data shards loop runs: one per shard of each stage whose data is tokenized in the
    data step (sft, and cpt when the run has it), ``data_shards`` of each; with ``data_shards`` 1, one item that
    does nothing (stage ""): a loop is never empty, which KFP's backends treat alike.

    Each item carries the settings: an iteration reads everything from its item, as the variants' loop does
    (components/variants/__init__.py: kfp.local 2.17 hands a loop's item to a step's dict input from outside it).

    Args:
        settings: every setting, as validate_inputs resolved them.

    Returns:
        ``[{"stage": "sft", "shard": 0, "settings": {...}}, ...]``.
    """
    from components.data.run import SHARDED_STAGES
    from components.quick_exit import freeze_heap_at_exit

    freeze_heap_at_exit()
    shards = int(settings["data_shards"])  # a KFP struct's numbers arrive as floats
    if shards <= 1:
        return [{"stage": "", "shard": 0, "settings": settings}]
    stages = [stage for stage in SHARDED_STAGES if stage == "sft" or stage in settings["stages"]]
    return [{"stage": stage, "shard": i, "settings": settings} for stage in stages for i in range(shards)]


@dsl.component(base_image=COMPONENTS_IMAGE, install_kfp_package=False)
def prepare_data_shard(item: dict, data_root: str, run_id: str):
    """Read and tokenize one shard of a stage's data (``data_shards``; components/data/shards.py) onto the data
    volume, kept by fingerprint: the run's data step (prepare_dataset) then joins the shards, drops duplicates
    across them and packs. A shard already complete (a retry, another run with the same files) is not redone.

    Args:
        item: the loop's item (list_data_shards): the stage, the shard's index and the settings; stage "" does
            nothing.
        data_root: where the data volume is mounted in this step.
        run_id: the KFP run id (where the data step will write what it joins).
    """
    import json
    import os
    import sys

    from components.observe.process import start_step

    start_step("prepare_data_shard")
    if not item["stage"]:  # data_shards=1: the data step reads and tokenizes the data itself
        return
    from components.kube import egress_env
    from components.settings import Settings

    s = Settings.from_flat(item["settings"])
    os.environ.update(egress_env(s.network))
    from components.data.formats import DataError
    from components.data.run import prepare_stage_shard, source_env

    stage, shard = item["stage"], int(item["shard"])
    try:
        os.environ.update(source_env(s, stage))
        stats = prepare_stage_shard(s, stage=stage, shard=shard, data_root=data_root, run_id=run_id)
    except DataError as e:
        print(f"error: {e}", file=sys.stderr, flush=True)
        raise SystemExit(2) from None
    print(json.dumps({k: stats[k] for k in ("shard", "kind", "documents", "seconds", "folder")}))
