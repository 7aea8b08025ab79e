"""How a setting is declared: ``setting()``, one dataclass field with its help, bounds and allowed values."""

from __future__ import annotations

import dataclasses
import typing
from dataclasses import field

ADVANCED = "advanced_settings"  # the pipeline parameter that carries every non-plain setting by name

T = typing.TypeVar("T")


def setting(
    default: T,
    help: str,
    *,
    plain: bool = True,
    min: float | None = None,
    max: float | None = None,
    above: float | None = None,
    below: float | None = None,
    choices: tuple[str, ...] = (),
    path_suffix: str = "",
) -> T:
    """A settings field: ``default``, one paragraph of ``help`` (its first sentence is the ``--help`` line),
    ``plain`` (a typed parameter of its own in the KFP UI, else inside ``advanced_settings``), the bounds
    ``min <= value <= max``, ``above < value < below``, and the allowed values ``choices`` (of a list setting: of
    each entry). ``path_suffix``: a value outside ``choices`` may also be a path ending so (``deepspeed_config``:
    a shipped config's name, or a user's ``.json`` on a mounted volume, which only the trainer can read)."""
    metadata = {
        "help": help,
        "plain": plain,
        "min": min,
        "max": max,
        "above": above,
        "below": below,
        "choices": tuple(choices),
        "path_suffix": path_suffix,
    }
    if isinstance(default, (dict, list)):
        return field(default_factory=lambda: type(default)(default), metadata=metadata)
    return field(default=default, metadata=metadata)


def flat_groups(groups: typing.Any) -> dict:
    """Every setting of ``groups`` (a dataclass whose fields are settings groups: ``Settings``, ``TrainerSettings``),
    by name."""
    return {
        name: value
        for group in dataclasses.fields(groups)
        for name, value in dataclasses.asdict(getattr(groups, group.name)).items()
    }
