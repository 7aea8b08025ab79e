"""The data step's rules: sources, the sft stage's format and the held-out split."""

from __future__ import annotations

from components.settings import Settings


def check_data_settings(s: Settings) -> list[str | None]:
    """A training source; a chat or text format for the sft data; a held-out fraction or count."""
    d = s.data
    errors: list[str | None] = []
    if not d.dataset_source.strip():
        errors.append(
            "dataset_source is empty; give builtin:sample, a file/folder/glob, pvc://claim/path or a Hub dataset id"
        )
    if d.dataset_format == "preference":
        errors.append(
            "dataset_format=preference: preference pairs are the dpo stage's data; put them in "
            'dpo_dataset_source and add "dpo" to stages (dataset_source is the sft stage\'s chat data)'
        )
    if d.dataset_format == "prompts":
        errors.append(
            "dataset_format=prompts: prompts with reference answers are the grpo stage's data; put them in "
            'grpo_dataset_source and add "grpo" to stages (dataset_source is the sft stage\'s chat data)'
        )
    if d.eval_size <= 0 or (d.eval_size >= 1 and d.eval_size != int(d.eval_size)):
        errors.append(f"eval_size={d.eval_size} must be a fraction in (0, 1) or a whole number of conversations")
    return errors
