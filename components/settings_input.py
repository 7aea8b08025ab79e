"""Settings as people write them: a YAML file of ``name: value`` and ``-p name=value`` overrides, typed and checked
against the settings model (components/settings/: the single source of names, types and defaults).

    resolve_layers([yaml_mapping, ..., overrides]) -> every setting by name   # later layers win

The pipeline's command line (pipelines/params.py adds presets) and the launcher's (components/train/launcher) read
settings here, so the two take the same settings and render the same job. Every problem is a ``SettingsInputError``
naming the key and the fix.
"""

from __future__ import annotations

import difflib
import json
from collections.abc import Iterable
from pathlib import Path

import yaml

from components.settings import specs


class SettingsInputError(ValueError):
    """A setting that cannot be read: the message names it and shows an example."""


def parameter_specs() -> dict[str, tuple[type, object]]:
    """``{name: (type, default)}`` for every setting, from the settings model."""
    return {name: (spec.type, spec.default) for name, spec in specs().items()}


def coerce(name: str, value, specs: dict) -> object:
    """``value`` as the setting's declared type, or a SettingsInputError that shows an example."""
    if name not in specs:
        close = difflib.get_close_matches(name, specs, n=1)
        hint = f"did you mean {close[0]!r}? " if close else ""
        raise SettingsInputError(
            f"unknown parameter {name!r}; {hint}(python -m pipelines.run --help lists all {len(specs)})"
        )
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
    raise SettingsInputError(f"parameter {name!r} expects {kind.__name__}, got {value!r}; e.g. {example}")


def parse_override(text: str) -> tuple[str, object]:
    """``key=value`` from ``-p``; the value is read as YAML (numbers, booleans, JSON objects/lists)."""
    key, sep, raw = text.partition("=")
    if not sep or not key.strip():
        raise SettingsInputError(f"-p {text!r} is not KEY=VALUE; e.g. -p learning_rate=1e-5")
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


def read_params_file(path: str) -> dict:
    """The ``name: value`` mapping of a ``--params`` YAML file (a preset's shape; ``pipelines.run --render`` writes
    one, params.yaml)."""
    try:
        data = yaml.safe_load(Path(path).read_text())
    except OSError as e:
        raise SettingsInputError(f"--params {path}: {e.strerror}; pass an existing YAML file") from None
    except yaml.YAMLError as e:
        raise SettingsInputError(f"--params {path}: not valid YAML ({e}); fix the file") from None
    if not isinstance(data, dict):
        raise SettingsInputError(f"--params {path}: expected a mapping of parameter: value")
    return data


def resolve_layers(layers: Iterable[dict]) -> dict:
    """Every setting by name: the defaults, then each layer in turn (later wins), each value typed."""
    all_specs = parameter_specs()
    params = {name: default for name, (_, default) in all_specs.items()}
    for layer in layers:
        for key, value in layer.items():
            params[key] = coerce(key, value, all_specs)
    return params
