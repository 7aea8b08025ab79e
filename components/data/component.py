"""prepare_dataset as a KFP component: tokenized train/eval splits onto the data volume."""

from kfp import dsl
from kfp.dsl import Dataset, Output

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
):
    """Tokenize the conversations with the model's chat template and split train/eval on the data volume.

    Large data never goes through KFP's artifact store: the DatasetDict is written under
    ``<data_root>/runs/<run_id>/dataset`` and the artifact carries its location and counts.

    Args:
        dataset_source: ``builtin:sample``, a JSONL path on a mounted volume, or a Hub dataset id.
        model_name_or_path: the base model whose tokenizer and chat template are used.
        max_seq_length: conversations longer than this many tokens are dropped (counted).
        eval_size: held-out fraction (< 1) or number of conversations (>= 1).
        seed: seeds the deterministic train/eval split.
        data_pvc: the data claim's name, recorded in the artifact's ``pvc://`` URI.
        data_root: where the data volume is mounted in this step.
        run_id: the KFP run id; scopes the output folder.

    Returns:
        dataset: metadata ``pvc``, ``path``, ``uri`` (``pvc://claim/path``) and the split sizes; the
        artifact folder holds ``stats.json``.
    """
    import json
    import logging
    import os

    from components.data.prepare import prepare
    from components.models.tiny import resolve_model
    from components.paths import pvc_uri, run_dir

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    out_dir = os.path.join(run_dir(data_root, run_id), "dataset")
    tokenizer = resolve_model(model_name_or_path, os.path.join(data_root, "cache"))
    stats = prepare(dataset_source, tokenizer, out_dir, max_seq_length, eval_size, seed)

    os.makedirs(dataset.path, exist_ok=True)
    with open(os.path.join(dataset.path, "stats.json"), "w") as f:
        json.dump(stats, f, indent=2)
    dataset.metadata.update({
        "pvc": data_pvc,
        "path": out_dir,
        "uri": pvc_uri(data_pvc, data_root, out_dir),
        "train_rows": stats["train"]["rows"],
        "eval_rows": stats["eval"]["rows"],
        "train_tokens": stats["train"]["tokens"],
    })
