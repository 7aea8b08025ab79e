"""prepare_dataset as a KFP component: packed, tokenized train/eval splits onto the data volume."""

from kfp import dsl
from kfp.dsl import Dataset, Markdown, Output

from components.version import COMPONENTS_IMAGE


@dsl.component(base_image=COMPONENTS_IMAGE, install_kfp_package=False)
def prepare_dataset(
    dataset_source: str,
    model_name_or_path: str,
    max_seq_length: int,
    eval_size: float,
    seed: int,
    data_pvc: str,
    data_root: str,
    run_id: str,
    dataset: Output[Dataset],
    report: Output[Markdown],
    dataset_format: str = "auto",
    column_mapping: dict = {},  # noqa: B006 (a KFP parameter default; never mutated)
    eval_source: str = "",
    packing: bool = True,
    over_length: str = "drop",
    num_proc: int = 1,
):
    """Clean, tokenize and pack the instruction data with the model's chat template onto the data volume.

    Large data never goes through KFP's artifact store: the DatasetDict is written under
    ``<data_root>/runs/<run_id>/dataset``; the artifact carries its location and counts. Results are
    kept under ``<data_root>/cache/prepared/<fingerprint>`` so a recurring run with unchanged sources,
    tokenizer and options reuses them (hard links on the same volume) instead of redoing the work.

    Args:
        dataset_source: ``builtin:sample``, a file/folder/glob on a mounted volume, ``pvc://<data_pvc>/path``,
            ``hf://...``, or a Hub id (``org/name?config=C&split=S&revision=R``); several separated by commas.
            Hub sources are cached only with a pinned ``revision``.
        model_name_or_path: the base model whose tokenizer and chat template are used. It is resolved here,
            on a CPU pod before any GPU is requested: a Hub id is downloaded into the HF cache on the data
            volume, and an FP8 checkpoint is dequantised once into the bf16 copy that training and
            evaluation load (``components.models.hub.resolve_model``; both reuse it by fingerprint).
        max_seq_length: the packed row length; longer examples are dropped or truncated (``over_length``).
        eval_size: held-out fraction (< 1) or number of examples (>= 1); ignored with ``eval_source``.
        seed: seeds the deterministic train/eval split.
        data_pvc: the data claim's name, recorded in the artifact's ``pvc://`` URI.
        data_root: where the data volume is mounted in this step.
        run_id: the KFP run id; scopes the output folder.
        dataset_format: ``auto`` (detected from the columns), ``messages``, ``sharegpt``, ``alpaca``,
            ``prompt_completion``, ``text`` or ``preference``.
        column_mapping: the format's column name -> your column name, e.g. ``{"messages": "dialog"}``.
        eval_source: take the eval split from this source (same syntax) instead of holding out ``eval_size``.
        packing: pack examples into rows of exactly ``max_seq_length`` with ``position_ids`` restarting per
            example; off gives one example per row.
        over_length: ``drop`` or ``truncate`` examples longer than ``max_seq_length``.
        num_proc: tokenizer worker processes (up to the pod's CPUs).

    Returns:
        dataset: metadata ``pvc``, ``path``, ``uri`` (``pvc://claim/path``), row and token counts and
            ``packing_efficiency``; the artifact folder holds ``stats.json``.
        report: counts, dropped rows per reason, a length histogram and three rendered examples.
    """
    import json
    import logging
    import os

    from components.data.prepare import prepare
    from components.data.report import markdown
    from components.models.hub import resolve_model
    from components.paths import pvc_uri, run_dir

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    out_dir = os.path.join(run_dir(data_root, run_id), "dataset")
    tokenizer = resolve_model(model_name_or_path, os.path.join(data_root, "cache"))
    stats = prepare(
        [s.strip() for s in dataset_source.split(",") if s.strip()], tokenizer, out_dir, max_seq_length,
        int(eval_size) if eval_size >= 1 else eval_size, seed,
        format=dataset_format, columns=column_mapping,
        eval_source=[s.strip() for s in eval_source.split(",") if s.strip()] or None,
        packing=packing, over_length=over_length, num_proc=num_proc, pvc_mounts={data_pvc: data_root},
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
