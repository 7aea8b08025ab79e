"""The evaluation step's rules: lm-eval task names."""

from __future__ import annotations

from components.settings import Settings


def check_evaluate_settings(s: Settings) -> list[str | None]:
    """lm-eval task names are non-empty strings."""
    tasks = s.evaluate.lm_eval_tasks
    if not all(isinstance(t, str) and t.strip() for t in tasks):
        return [f'lm_eval_tasks={tasks!r} must be a list of task names, e.g. ["hellaswag"]']
    return []
