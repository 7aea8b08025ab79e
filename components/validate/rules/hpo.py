"""The hyper-parameter search's rules: Katib's (components/hpo/space.py), and an sft stage to tune."""

from __future__ import annotations

from components.hpo.space import check_search, typed_search_space
from components.settings import Settings, choices


def check_hpo_settings(s: Settings) -> list[str]:
    """A search that can start, when ``hpo_trials`` asks for one (the search step asks again before it starts)."""
    h = s.hpo
    if h.hpo_trials == 0:
        return []
    # An algorithm outside the declared choices is named by the choice check: judge the ranges alone, as
    # check_search does for an algorithm it does not know.
    algorithm = h.hpo_algorithm if h.hpo_algorithm in choices("hpo_algorithm") else "random"
    # A dict parameter reaches validate_inputs through KFP as a Struct: integer values arrive as doubles.
    errors = check_search(
        typed_search_space(h.hpo_search_space),
        trials=h.hpo_trials,
        parallel_trials=h.hpo_parallel_trials,
        max_failed_trials=h.hpo_max_failed_trials,
        algorithm=algorithm,
        method=s.train.method,
    )
    if "sft" not in s.stages.stages:
        errors.append(
            'hpo_trials > 0 tunes the sft stage, and stages does not run it; add "sft" to stages or set hpo_trials=0'
        )
    return errors
