"""A variant's integer settings survive KFP's doubles: KFP carries the ``variants`` list inside the ``settings``
Struct, whose numbers are all doubles, so ``{"lora_r": 8}`` comes back as ``8.0``."""

from __future__ import annotations

from components.settings import defaults
from components.validate.rules import check
from components.variants import expand, variant_values

VARIANTS = [{"lora_r": 8.0, "name": "r8"}, {"lora_r": 16.0, "learning_rate": 0.002, "name": "r16"}]


def test_a_variants_whole_float_is_its_int_setting():
    values = {**defaults(), "variants": VARIANTS}
    assert variant_values(values, 0)["lora_r"] == 8 and isinstance(variant_values(values, 0)["lora_r"], int)
    assert [type(item["settings"]["lora_r"]) for item in expand(values, "run")] == [int, int]
    assert check(values) == []
