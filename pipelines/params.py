"""A run's settings from presets, ``--params FILE`` and ``-p key=value`` overrides, typed and checked.

The settings model (components/settings/) is the single source of names, types and defaults; any setting can
be set by name, whether the pipeline has it as a parameter of its own or inside ``advanced_settings``
(``components.settings.split_arguments`` makes the pipeline's arguments). Reading files and ``-p`` is
components/settings_input.py's (the launcher's command line reads settings there too). A preset is a YAML file of
overrides; later sources win (preset < params file < -p); a preset's ``stage_settings`` are kept for the stages the
run trains.
Every problem is a UsageError naming the key and the fix.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import yaml

from components.settings_input import SettingsInputError, parse_override, read_params_file, resolve_layers
from components.settings_input import parameter_specs as parameter_specs  # re-exported: the CLI's --help lists them
from pipelines.errors import UsageError

PRESETS_DIR = Path(__file__).with_name("presets")
LOCAL_PRESET = "local-tiny"
CLUSTER_PRESET = "qwen3-30b-a3b-full"
# The account the run's steps run as on a cluster: manifests/rbac/serviceaccount.yaml creates it with the package's
# Role and KFP's own needs only.
RUNNER_SERVICE_ACCOUNT = "llm-post-training-runner"


def preset_names() -> list[str]:
    """Names of the bundled presets."""
    return sorted(p.stem for p in PRESETS_DIR.glob("*.yaml"))


def load_preset(name: str) -> dict:
    """The overrides a preset sets."""
    path = PRESETS_DIR / f"{name}.yaml"
    if not path.exists():
        raise UsageError(f"unknown preset {name!r}; choose one of: {', '.join(preset_names())}")
    return yaml.safe_load(path.read_text()) or {}


def resolve(preset: str, params_file: str | None = None, overrides: Sequence[str] = ()) -> dict:
    """The full parameter set: pipeline defaults, then the preset, the params file, then ``-p`` overrides."""
    try:
        layers = [load_preset(preset)]
        if params_file:
            layers.append(read_params_file(params_file))
        layers.append(dict(parse_override(o) for o in overrides))
        params = resolve_layers(layers)
    except SettingsInputError as exc:
        raise UsageError(str(exc)) from None
    if not any("stage_settings" in layer for layer in layers[1:]):
        params["stage_settings"] = _run_stages_only(params)
    return params


def _run_stages_only(params: dict) -> dict:
    """A preset's ``stage_settings`` for the stages this run (or one of its variants) trains: a preset carries them
    for every stage it has data for, so that ``-p stages=[...]`` finds them; for a stage the run does not train they
    change nothing, and the user did not write them, so the run neither carries them nor warns about them."""
    stages = set(params["stages"])
    for variant in params["variants"]:
        if isinstance(variant, dict) and isinstance(variant.get("stages"), list):
            stages.update(variant["stages"])
    return {stage: over for stage, over in params["stage_settings"].items() if stage in stages}


def check(params: dict) -> None:
    """Raise one UsageError listing every invalid setting (the checks validate_inputs runs)."""
    from components.validate.rules import check as check_settings

    errors = check_settings(params)
    if errors:
        raise UsageError("invalid settings: " + "; ".join(errors))
