"""The evaluation step's rules (validate_inputs and ``pipelines.run`` ask here): one message per problem, naming
the setting and the fix. Bounds of a single setting are declared in the settings model (components/settings.py)."""

from __future__ import annotations


def check_evaluate_settings(p: dict) -> list[str | None]:
    """lm-eval task names."""
    if not all(isinstance(t, str) and t.strip() for t in p["lm_eval_tasks"]):
        return [f"lm_eval_tasks={p['lm_eval_tasks']!r} must be a list of task names, e.g. [\"hellaswag\"]"]
    return []
