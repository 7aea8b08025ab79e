"""The variants' rules (components/variants.py): a list of two or more distinct, named objects of settings a variant
may change, and no search beside them. Each variant's own settings are then checked as a whole run
(components/validate/rules/__init__.py), and preflight counts their GPUs together (components/validate/preflight.py).
"""

from __future__ import annotations

import difflib
import json

from components.settings import Settings, specs
from components.variants import MAX_NAME, NAME, NAME_KEY, VARIABLE, overrides, variant_names

EXAMPLE = '[{"learning_rate": 1e-5}, {"learning_rate": 5e-5}]'


def _label(i: int, name: str) -> str:
    return f"variants[{i}] ({name!r})"


def check_variant_settings(s: Settings) -> list[str]:
    """Problems with the ``variants`` list itself, each naming the variant and the setting."""
    variants = s.variants.variants
    if not variants:
        return []
    if len(variants) < 2:
        return [
            f"variants has {len(variants)} entry; give two or more to compare (e.g. {EXAMPLE}), or set the "
            "one variant's settings on the run and variants=[]"
        ]
    if not all(isinstance(v, dict) for v in variants):
        return [f"variants must be a list of JSON objects of setting overrides, e.g. {EXAMPLE}"]
    errors: list[str] = []
    names = variant_names(variants)
    all_specs = specs()
    seen: dict[str, int] = {}
    for i, (variant, name) in enumerate(zip(variants, names, strict=True)):
        label = _label(i, name)
        if NAME_KEY in variant and (
            not isinstance(variant[NAME_KEY], str)
            or not NAME.match(variant[NAME_KEY])
            or len(variant[NAME_KEY]) > MAX_NAME
        ):
            errors.append(
                f"{label}: name must be lowercase letters, digits and '-', starting with a letter, at "
                f"most {MAX_NAME} characters (it names the variant's folders, jobs and served model)"
            )
        if name in seen:
            errors.append(f"{label}: the name {name!r} is also variants[{seen[name]}]'s; give each variant its own")
        seen.setdefault(name, i)
        for key in overrides(variant):
            if key not in all_specs:
                close = difflib.get_close_matches(key, all_specs, n=1)
                errors.append(
                    f"{label}: {key!r} is not a setting"
                    + (
                        f"; did you mean {close[0]!r}?"
                        if close
                        else "; python -m pipelines.run --help lists every setting"
                    )
                )
            elif key not in VARIABLE:
                errors.append(
                    f"{label}: {key} cannot vary per variant: {_why_fixed(key)}; set it for the run, outside variants"
                )
    for i, (variant, name) in enumerate(zip(variants, names, strict=True)):
        model = overrides(variant).get("model_name_or_path")
        if model is not None and model != s.model.model_name_or_path:
            # Issue 40: the comparison scores every variant on the run's held-out split, tokenized once with the
            # run's model's tokenizer (pipelines/llm_finetune.py: evaluate_model gets the run's data step's dataset),
            # and ranks them by loss per token: another tokenizer's ids would be scored wrongly, silently.
            errors.append(
                f"{_label(i, name)}: model_name_or_path={model!r} is not the run's ({s.model.model_name_or_path!r}): "
                "every variant is scored on the run's held-out split, tokenized with the run's model's tokenizer, "
                "and compared by loss per token, which another model's tokenizer would make wrong; compare base "
                "models in separate runs (one per model), and vary training settings within a run"
            )
    canonical: dict[str, int] = {}
    for i, (variant, name) in enumerate(zip(variants, names, strict=True)):
        key = json.dumps(overrides(variant), sort_keys=True)
        if key in canonical:
            j = canonical[key]
            errors.append(
                f"{_label(i, name)}: the same settings as variants[{j}] ({names[j]!r}); each variant must "
                "change something the others do not"
            )
        canonical.setdefault(key, i)
    if s.hpo.hpo_trials > 0:
        errors.append(
            "variants and hpo_trials > 0 both choose training settings; run the search without variants "
            "(then compare its result as a variant), or set hpo_trials=0"
        )
    if s.variants.variants_parallel > len(variants):
        errors.append(
            f"variants_parallel={s.variants.variants_parallel} is more than the {len(variants)} variants; "
            f"set it to at most {len(variants)}"
        )
    return errors


def _why_fixed(name: str) -> str:
    """Why a setting belongs to the run rather than to a variant."""
    group = specs()[name].group
    if name == "seed" or name in ("eval_size", "eval_source"):
        return "it draws the held-out split every variant is scored on"
    if name == "stages":
        return "every variant trains the run's chain of stages (stage_settings may differ per variant)"
    return {
        "evaluate": "every variant is evaluated the same way, in one comparison",
        "deploy": "the run serves its variants together (deploy_variants picks which)",
        "hpo": "a search and variants both choose training settings",
        "variants": "variants do not nest",
    }.get(group, "it is the run's (volumes, Secrets, backend and the run's own machinery)")
