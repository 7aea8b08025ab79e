"""The validate_inputs task's work: resolve the settings, check them, then check the cluster.

The checks read what the settings model declares (types, bounds, choices) and each step's rules between settings
(components/validate/rules/); ``python -m pipelines.run`` runs the same ones before it submits a run.
"""

from __future__ import annotations

import logging
from collections import namedtuple

from components.observe.process import start_step
from components.settings import Settings, merge_arguments
from components.validate.rules import check, warnings

log = logging.getLogger("validate_inputs")


def validate(arguments: dict):
    """Every setting from the pipeline's ``arguments`` (plain settings and ``advanced_settings``), checked; a
    ValueError listing every problem, each naming the setting and the fix. Then it asks the judged evaluation's
    judge_endpoint whether it answers, and on a cluster it also runs the preflight."""
    start_step("validate_inputs")  # validate_inputs' process: logging, and no final collection at its exit
    try:
        settings = merge_arguments(arguments)
    except ValueError as e:
        raise ValueError(f"invalid settings: {e}") from None
    errors = check(settings)
    if errors:
        raise ValueError("invalid settings: " + "; ".join(errors))
    log.info("settings are valid: %s", settings)
    for warning in warnings(settings):
        log.warning("%s", warning)
    s = Settings.from_flat(settings)
    # The judge of a judged evaluation answers, asked now (a short connect timeout) and not after training.
    from components.evaluate.judge import endpoint_problem

    if problem := endpoint_problem(s.evaluate.judge_endpoint, s.evaluate.judge_model):
        raise ValueError(f"invalid settings: {problem}")
    if s.job.train_backend == "local" and s.storage.model_store_uri:
        # The object store (model_store_uri) takes this process's credentials: asked now, not after training.
        from components.validate.preflight import store_problem

        if problem := store_problem(s.storage):
            raise ValueError(f"invalid settings: {problem}")
    if s.job.train_backend != "local":
        from components.estimate.plan_text import plan_text

        try:  # the figures python -m pipelines.run --plan prints: seconds per step, tokens/s, bottleneck, GPU-hours
            log.info("%s", plan_text(settings))
        except ValueError as e:  # a Hub model whose config.json is not here: the run does not need it
            log.info("plan: not available: %s", e)
        from components.validate.preflight import preflight  # the Kubernetes client: only to ask a cluster

        problems = preflight(settings)
        if problems:
            raise ValueError("cluster preflight: " + "; ".join(problems))
        log.info("cluster preflight passed")
    return namedtuple("ValidateOutputs", ["settings"])(settings)
