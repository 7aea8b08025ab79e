"""What the variants' loop reads: one item per variant, each with its stage slots, and the slots step's outputs, one
per possible stage."""

from __future__ import annotations

from components.settings import choices, defaults
from components.variants.component import list_variants, variant_stages

STAGES = choices("stages")


def test_each_item_carries_the_runs_stages_in_every_slot_and_its_own_run_id():
    values = {
        **defaults(),
        "stages": ["sft", "dpo"],
        "dpo_dataset_source": "builtin:preference",
        "variants": [{"learning_rate": 1e-5}, {"learning_rate": 2e-5, "name": "b"}],
    }
    items = list_variants.python_func(settings=values, run_id="r1", tuned={})
    assert [(i["variant"], i["run_id"]) for i in items] == [("v1", "r1-v1"), ("b", "r1-b")]
    for item in items:
        assert [item[f"stage_{n + 1}"] for n in range(len(STAGES))] == ["sft", "dpo"] + [""] * (len(STAGES) - 2)
    # The search's choice reaches a run without variants (validation refuses a search beside variants).
    (own,) = list_variants.python_func(settings={**defaults(), "variants": []}, run_id="r1", tuned={"lora_r": 8})
    assert own["tuned"] == {"lora_r": 8} and own["run_id"] == "r1" and own["variant"] == ""


def test_the_slots_step_has_one_output_per_possible_stage():
    outputs = variant_stages.component_spec.outputs
    assert list(outputs) == [f"stage_{n + 1}" for n in range(len(STAGES))], (
        "add a stage_N output to components/variants/component.py::variant_stages for each stage the settings "
        "model declares"
    )
    item = list_variants.python_func(settings=defaults(), run_id="r1", tuned={})[0]
    assert tuple(variant_stages.python_func(variant=item)) == ("sft",) + ("",) * (len(STAGES) - 1)
