"""The data step's rules (validate_inputs and ``pipelines.run`` ask here): one message per problem, naming the
setting and the fix. Bounds of a single setting are declared in the settings model (components/settings.py)."""

from __future__ import annotations

from components.data.formats import DATASET_FORMATS
from components.data.tokenizing import OVER_LENGTH


def check_data_settings(p: dict) -> list[str | None]:
    """Sources, format, over-length policy and the held-out split."""
    errors = []
    if not p["dataset_source"].strip():
        errors.append("dataset_source is empty; give builtin:sample, a file/folder/glob, pvc://claim/path or a Hub "
                      "dataset id")
    if p["dataset_format"] not in DATASET_FORMATS:
        errors.append(f"dataset_format={p['dataset_format']!r} is not one of {', '.join(DATASET_FORMATS)}")
    elif p["dataset_format"] == "preference":
        errors.append("dataset_format=preference: preference pairs are the dpo stage's data; put them in "
                      "dpo_dataset_source and add \"dpo\" to stages (dataset_source is the sft stage's chat data)")
    if p["over_length"] not in OVER_LENGTH:
        errors.append(f"over_length={p['over_length']!r} is not one of {', '.join(OVER_LENGTH)}")
    if p["eval_size"] <= 0 or (p["eval_size"] >= 1 and p["eval_size"] != int(p["eval_size"])):
        errors.append(f"eval_size={p['eval_size']} must be a fraction in (0, 1) or a whole number of conversations")
    return errors
