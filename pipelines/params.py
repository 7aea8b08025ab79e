"""A run's settings from presets, ``--params FILE`` and ``-p key=value`` overrides, typed and checked.

The settings model (components/settings.py) is the single source of names, types and defaults; any setting can
be set by name, whether the pipeline has it as a parameter of its own or inside ``advanced_settings``
(``components.settings.split_arguments`` makes the pipeline's arguments). A preset is a YAML file of overrides;
later sources win (preset < params file < -p); a preset's ``stage_settings`` are kept for the stages the run trains.
Every problem is a UsageError naming the key and the fix.
"""

from __future__ import annotations

import difflib
import json
from collections.abc import Sequence
from pathlib import Path

import yaml

from pipelines.errors import UsageError

PRESETS_DIR = Path(__file__).with_name("presets")
LOCAL_PRESET = "local-tiny"
CLUSTER_PRESET = "qwen3-30b-a3b-full"


def parameter_specs() -> dict[str, tuple[type, object]]:
    """``{name: (type, default)}`` for every setting, from the settings model."""
    from components.settings import specs

    return {name: (spec.type, spec.default) for name, spec in specs().items()}


def preset_names() -> list[str]:
    """Names of the bundled presets."""
    return sorted(p.stem for p in PRESETS_DIR.glob("*.yaml"))


def load_preset(name: str) -> dict:
    """The overrides a preset sets."""
    path = PRESETS_DIR / f"{name}.yaml"
    if not path.exists():
        raise UsageError(f"unknown preset {name!r}; choose one of: {', '.join(preset_names())}")
    return yaml.safe_load(path.read_text()) or {}


def coerce(name: str, value, specs: dict) -> object:
    """``value`` as the parameter's declared type, or a UsageError that shows an example."""
    if name not in specs:
        close = difflib.get_close_matches(name, specs, n=1)
        hint = f"did you mean {close[0]!r}? " if close else ""
        raise UsageError(f"unknown parameter {name!r}; {hint}(python -m pipelines.run --help lists all {len(specs)})")
    kind, default = specs[name]
    example = f"-p {name}={json.dumps(default) if kind in (dict, list) else default}"
    if kind in (int, float) and isinstance(value, str):
        try:  # YAML 1.1 reads "1e-5" (no dot) as a string
            value = kind(value)
        except ValueError:
            pass
    if kind is str and isinstance(value, (str, int, float)) and not isinstance(value, bool):
        return str(value)
    if kind is bool and isinstance(value, bool):
        return value
    if kind is int and isinstance(value, int) and not isinstance(value, bool):
        return value
    if kind is float and isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    if kind in (dict, list):
        if isinstance(value, str):
            try:
                value = yaml.safe_load(value)
            except yaml.YAMLError:
                pass
        if isinstance(value, kind):
            return value
    raise UsageError(f"parameter {name!r} expects {kind.__name__}, got {value!r}; e.g. {example}")


def parse_override(text: str) -> tuple[str, object]:
    """``key=value`` from ``-p``; the value is read as YAML (numbers, booleans, JSON objects/lists)."""
    key, sep, raw = text.partition("=")
    if not sep or not key.strip():
        raise UsageError(f"-p {text!r} is not KEY=VALUE; e.g. -p learning_rate=1e-5")
    try:
        # JSON first: YAML 1.1 reads 1e-5 (no dot) as a string, also inside an object such as a search space.
        value = json.loads(raw)
    except ValueError:
        try:
            value = yaml.safe_load(raw) if raw.strip() else ""
        except yaml.YAMLError:
            value = raw  # free text (a path with ':' say) stays a string
    if value is None:
        value = ""
    return key.strip(), value


def resolve(preset: str, params_file: str | None = None, overrides: Sequence[str] = ()) -> dict:
    """The full parameter set: pipeline defaults, then the preset, the params file, then ``-p`` overrides."""
    specs = parameter_specs()
    layers = [load_preset(preset)]
    if params_file:
        try:
            data = yaml.safe_load(Path(params_file).read_text())
        except OSError as e:
            raise UsageError(f"--params {params_file}: {e.strerror}; pass an existing YAML file") from None
        except yaml.YAMLError as e:
            raise UsageError(f"--params {params_file}: not valid YAML ({e}); fix the file") from None
        if not isinstance(data, dict):
            raise UsageError(f"--params {params_file}: expected a mapping of parameter: value")
        layers.append(data)
    layers.append(dict(parse_override(o) for o in overrides))
    params = {name: default for name, (_, default) in specs.items()}
    for layer in layers:
        for key, value in layer.items():
            params[key] = coerce(key, value, specs)
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
