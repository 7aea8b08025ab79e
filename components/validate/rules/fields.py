"""The checks each setting declares in the settings model (components/settings/): its type, its bounds and its
allowed values, one message per setting that breaks them, naming the setting and what it may be."""

from __future__ import annotations

from collections.abc import Iterable

from components.settings import specs


def _selected(names: Iterable[str] | None):
    all_specs = specs()
    return all_specs.values() if names is None else [all_specs[name] for name in names]


def type_errors(values: dict, names: Iterable[str] | None = None) -> list[str]:
    """The settings (all, or ``names``) whose value is not of the setting's type (an int is a float; a bool is not
    an int)."""
    errors = []
    for spec in _selected(names):
        value = values[spec.name]
        if spec.type is float:
            ok = isinstance(value, (int, float)) and not isinstance(value, bool)
        elif spec.type is int:
            ok = isinstance(value, int) and not isinstance(value, bool)
        else:
            ok = isinstance(value, spec.type)
        if not ok:
            errors.append(f"{spec.name} must be a {spec.type.__name__}, got {value!r}")
    return errors


def bound_errors(values: dict, names: Iterable[str] | None = None) -> list[str]:
    """The settings (all, or ``names``) outside their declared bounds, each naming the setting and its range."""
    errors = []
    for spec in _selected(names):
        value = values[spec.name]
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            continue
        low_ok = (spec.min is None or value >= spec.min) and (spec.above is None or value > spec.above)
        high_ok = (spec.max is None or value <= spec.max) and (spec.below is None or value < spec.below)
        if not (low_ok and high_ok):
            low = f">= {spec.min:g}" if spec.min is not None else f"> {spec.above:g}" if spec.above is not None else ""
            high = f"<= {spec.max:g}" if spec.max is not None else f"< {spec.below:g}" if spec.below is not None else ""
            errors.append(f"{spec.name}={value!r} must be {' and '.join(x for x in (low, high) if x)} ({spec.help})")
    return errors


def choice_errors(values: dict, names: Iterable[str] | None = None) -> list[str]:
    """The settings (all, or ``names``) whose value is not one of their declared choices (a list setting: an entry
    that is not), each naming the setting and the values it takes."""
    errors = []
    for spec in _selected(names):
        if not spec.choices:
            continue
        value, allowed = values[spec.name], ", ".join(spec.choices)
        if spec.type is list:
            if not all(entry in spec.choices for entry in value):
                errors.append(f"{spec.name}={value!r}: each entry is one of {allowed}")
        elif value not in spec.choices and not (
            spec.path_suffix and isinstance(value, str) and value.endswith(spec.path_suffix)
        ):
            also = f" or a {spec.path_suffix} path" if spec.path_suffix else ""
            errors.append(f"{spec.name}={value!r} is not one of {allowed}{also}")
    return errors


def field_errors(values: dict, names: Iterable[str] | None = None) -> list[str]:
    """Every declared check of the settings (all, or ``names``): the types, then, when they hold, bounds and
    choices (which compare values of the declared types)."""
    names = None if names is None else list(names)
    return type_errors(values, names) or bound_errors(values, names) + choice_errors(values, names)
