"""Every check of a run's settings, in rooms of their own: what each setting declares in the settings model (type,
bounds, choices: ``fields``), then each step's rules between settings (``train``, ``stages``, ``hpo``, ``data``,
``cluster``, ``evaluate``, ``deploy``, ``publish``), which take the typed ``Settings``; last, whether each stage's
job fits.

    errors = check(values)      # values: every setting by name; [] when the run may start
    for w in warnings(values): ...

validate_inputs (components/validate/checks.py) and ``python -m pipelines.run`` ask here; no Kubernetes client and
no ML library is imported.
"""

from __future__ import annotations

from components.settings import Settings
from components.validate.rules.cluster import check_cluster_settings, network_warnings
from components.validate.rules.data import check_data_settings
from components.validate.rules.deploy import check_deploy_settings
from components.validate.rules.evaluate import check_evaluate_settings
from components.validate.rules.fields import bound_errors, choice_errors, type_errors
from components.validate.rules.hpo import check_hpo_settings
from components.validate.rules.publish import check_publish_settings
from components.validate.rules.stage_rules import check_stage_settings, stage_warnings
from components.validate.rules.train import check_train_settings, memory_errors
from components.validate.rules.variants import check_variant_settings
from components.variants import variant_names, variant_values

# Each step's rules, in the order their messages are listed.
RULES = (
    check_train_settings,
    check_stage_settings,
    check_hpo_settings,
    check_data_settings,
    check_cluster_settings,
    check_evaluate_settings,
    check_deploy_settings,
    check_publish_settings,
    check_variant_settings,
)


def check(values: dict) -> list[str]:
    """Every problem with ``values`` (each setting by name), each naming the setting and the fix: types, then bounds
    and choices as the settings model declares them, then each step's rules; the memory fit last, once everything
    else holds."""
    errors = type_errors(values)
    if errors:
        return errors  # everything below compares values: it assumes the types
    errors = bound_errors(values) + choice_errors(values)
    s = Settings.from_flat(values)
    for rules in RULES:
        errors += [e for e in rules(s) if e]
    if not errors:
        errors = memory_errors(s)
    if not errors:  # each variant is a whole run of its own: its settings must hold as the run's do
        for i, name in enumerate(variant_names(s.variants.variants)):
            errors += [f"variants[{i}] ({name!r}): {e}" for e in check(variant_values(values, i))]
    return errors


def warnings(values: dict) -> list[str]:
    """What runs but is probably not what was meant (valid ``values``): logged by validate_inputs and the CLI."""
    s = Settings.from_flat(values)
    out = stage_warnings(s) + network_warnings(s)
    for i, name in enumerate(variant_names(values.get("variants") or [])):
        own = variant_values(values, i)
        out += [f"variants[{i}] ({name!r}): {w}" for w in warnings(own)]
        if own["dataset_source"] != values["dataset_source"]:
            out.append(
                f"variants[{i}] ({name!r}) trains on dataset_source={own['dataset_source']!r} and is scored, as "
                f"every variant, on the run's held-out split of {values['dataset_source']!r}: rows of one in "
                "the other would flatter it"
            )
    return out
