"""The validate_inputs task's work: resolve the settings, check them, then check the cluster.

The checks themselves come from the settings model (types, bounds) and from each step's rules
(``components.settings.check``); ``python -m pipelines.run`` runs the same ones before it submits a run.
"""

from __future__ import annotations

import logging

log = logging.getLogger("validate_inputs")


def validate(arguments: dict) -> dict:
    """Every setting from the pipeline's ``arguments`` (plain settings and ``advanced_settings``), checked; a
    ValueError listing every problem, each naming the setting and the fix. On a cluster it also runs the preflight."""
    from components.settings import check, merge_arguments

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    try:
        settings = merge_arguments(arguments)
    except ValueError as e:
        raise ValueError(f"invalid settings: {e}") from None
    errors = check(settings)
    if errors:
        raise ValueError("invalid settings: " + "; ".join(errors))
    log.info("settings are valid: %s", settings)
    if settings["train_backend"] != "local":
        from components.validate.preflight import preflight

        problems = preflight(settings)
        if problems:
            raise ValueError("cluster preflight: " + "; ".join(problems))
        log.info("cluster preflight passed")
    return settings
