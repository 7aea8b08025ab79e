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
    copy that training and evaluation load (``components.models.hub.resolve_model``; both reuse it by fingerprint).

    Args:
        settings: every setting, as validate_inputs resolved them (components/settings.py): the data settings
            (dataset_source, dataset_format, column_mapping, eval_source, over_length, packing, num_proc,
            eval_size), and model_name_or_path (tokenizer and chat template), max_seq_length, seed, data_pvc.
        stage: the training stage whose data this is (components/train/stages.py): ``sft`` reads dataset_source
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
    import logging
    import os

    from components.data.once import prepare_once
    from components.data.report import markdown
    from components.observe.outcome import recording_outcome
    from components.paths import pvc_uri, run_dir
    from components.settings import Settings
    from components.train.stages import dataset_folder, stage_data

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    # How this step ended, for the run's exit handler (components/observe/outcome.py).
    with recording_outcome(f"prepare_dataset[{stage}]", data_root, run_id):
        s = Settings.from_flat(settings)
        if stage == "grpo":
            # validate_inputs cannot import a reward function in a file on the data volume, which its pod does not
            # mount: this CPU pod does, and fails before the training job requests GPUs.
            from components.validate.rules.rewards import grpo_function_error

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
            source=[x.strip() for x in source.split(",") if x.strip()],
            max_seq_length=s.train.max_seq_length,
            eval_size=int(s.data.eval_size) if s.data.eval_size >= 1 else s.data.eval_size,
            seed=s.train.seed,
            format=data_format,
            columns={"sft": s.data.column_mapping, "grpo": s.stages.grpo_column_mapping}.get(stage, {}),
            eval_source=[x.strip() for x in eval_source.split(",") if x.strip()] or None,
            packing=s.data.packing,
            over_length=s.data.over_length,
            num_proc=s.data.num_proc,
            pvc_mounts={data_pvc: data_root},
            cache_dir=os.path.join(data_root, "cache", "prepared"),
        )

        os.makedirs(dataset.path, exist_ok=True)
        with open(os.path.join(dataset.path, "stats.json"), "w") as f:
            json.dump(stats, f, indent=2, ensure_ascii=False)
        with open(report.path, "w", encoding="utf-8") as f:
            f.write(markdown(stats))
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
        dataset.metadata.update(metadata)
