"""The settings model (components/settings/): one place per setting, and everything derived from it agrees."""

import dataclasses
import inspect
import re

import pytest

from components.settings import ADVANCED, Settings, choices, defaults, merge_arguments, specs, split_arguments
from components.validate.rules import check


def test_every_setting_has_one_name_a_type_a_default_and_help():
    names = [f.name for group in dataclasses.fields(Settings) for f in dataclasses.fields(group.default_factory)]
    assert len(names) == len(set(names)) == len(specs())  # flat names are unique across the steps
    for spec in specs().values():
        assert spec.type in (str, int, float, bool, dict, list), spec.name
        assert isinstance(spec.default, spec.type) or (spec.type is float and isinstance(spec.default, int)), spec.name
        assert spec.help.strip().endswith((".", ")")), f"{spec.name}: help is one or more sentences"
    assert check(defaults()) == []  # the defaults are the reference job, and it is valid


def test_the_pipeline_signature_is_the_plain_settings_then_advanced_settings():
    from pipelines.llm_finetune import build_pipeline

    func = build_pipeline("cluster").pipeline_func
    params = inspect.signature(func).parameters
    plain = [name for name, spec in specs().items() if spec.plain]
    assert list(params) == [*plain, ADVANCED]
    assert all(
        params[name].default == specs()[name].default and params[name].annotation is specs()[name].type
        for name in plain
    )


def test_the_compiled_pipeline_describes_every_parameter():
    import yaml

    from pipelines.compile import COMPILED

    # The YAML users upload (tests/pipelines/test_compile.py holds it equal to a fresh compile).
    spec = next(yaml.safe_load_all(COMPILED.read_text()))
    inputs = spec["root"]["inputDefinitions"]["parameters"]
    assert set(inputs) == {name for name, s in specs().items() if s.plain} | {ADVANCED}
    assert inputs["learning_rate"]["description"].startswith("Peak learning rate")
    assert "lora_r" in inputs[ADVANCED]["description"]


def test_settings_the_pipeline_mounts_or_schedules_by_are_plain_parameters():
    # Platform settings (claims, Secret, node placement, GPU counts) take pipeline parameters, not a step's output.
    for name in ("data_pvc", "model_pvc", "hf_token_secret", "node_selector", "tolerations", "eval_gpus"):
        assert specs()[name].plain, name


def test_split_and_merge_are_inverse_and_advanced_holds_only_what_differs():
    values = {**defaults(), "lora_r": 32, "learning_rate": 1e-5}
    args = split_arguments(values)
    assert args[ADVANCED] == {"lora_r": 32} and args["learning_rate"] == 1e-5 and "lora_r" not in args
    assert merge_arguments(args) == values


@pytest.mark.parametrize(
    "advanced, message",
    [
        ({"lora_rank": 8}, "unknown setting 'lora_rank'; did you mean 'lora_r'?"),
        ({"num_nodes": 4}, "'num_nodes' is a pipeline parameter of its own"),
    ],
)
def test_advanced_settings_name_only_non_plain_settings(advanced, message):
    with pytest.raises(ValueError, match=message):
        merge_arguments({ADVANCED: advanced})


def test_bounds_and_types_name_the_setting():
    assert check({**defaults(), "lora_r": 0})[0].startswith("lora_r=0 must be >= 1")
    assert check({**defaults(), "lora_dropout": 1.0})[0].startswith("lora_dropout=1.0 must be >= 0 and < 1")
    assert check({**defaults(), "merge_lora": "yes"}) == ["merge_lora must be a bool, got 'yes'"]


def test_choices_name_the_setting_and_the_values_it_takes():
    assert check({**defaults(), "method": "dpo"}) == ["method='dpo' is not one of full, lora, qlora"]
    assert check({**defaults(), "report_to": ["tensorboard", "neptune"]}) == [
        "report_to=['tensorboard', 'neptune']: each entry is one of tensorboard, mlflow, wandb"
    ]
    shipped = ", ".join(choices("deepspeed_config"))
    assert check({**defaults(), "deepspeed_config": "zero4"}) == [
        f"deepspeed_config='zero4' is not one of {shipped} or a .json path"
    ]
    assert check({**defaults(), "deepspeed_config": "/mnt/data/ds.json"}) == []  # the trainer reads it


def test_every_choice_is_declared_beside_its_help():
    # What the help says a setting takes is what the checks allow: --help, the KFP UI and docs/settings.md show it.
    declared = {name: spec.choices for name, spec in specs().items() if spec.choices}
    assert {
        "method",
        "deepspeed_config",
        "lr_scheduler_type",
        "report_to",
        "stages",
        "hpo_algorithm",
        "dataset_format",
        "over_length",
        "train_backend",
        "job_cleanup",
        "deploy_backend",
        "deployment_mode",
    } <= set(declared)
    for name, values in declared.items():
        assert len(set(values)) == len(values), name
        assert all(isinstance(v, str) for v in values), name
        for value in values:
            assert re.search(rf"(?<![\w-]){re.escape(value)}(?![\w-])", specs()[name].help), (name, value)
        assert specs()[name].type is list or specs()[name].default in values, name


def test_the_settings_model_is_a_leaf():
    # Every module may read the model: it imports no other module of the package (and no ML or Kubernetes
    # library), so it can never close an import circle.
    import ast
    from pathlib import Path

    import components.settings

    imported = set()
    for module in Path(components.settings.__file__).parent.glob("*.py"):  # the package's modules
        tree = ast.parse(module.read_text())
        imported |= {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
        imported |= {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names}
    own = {m for m in imported if m and m.startswith("components.settings.")}
    assert {m for m in imported - own if m and m.split(".")[0] == "components"} == {"components.version"}
    assert imported - own <= {"__future__", "dataclasses", "difflib", "typing", "components.version"}, imported


def test_whole_floats_from_kfp_become_ints_again():
    # A dict parameter travels as a protobuf Struct: every number is a double.
    s = Settings.from_flat({"num_nodes": 2.0, "lora_r": 8.0, "learning_rate": 1.0})
    assert (s.job.num_nodes, s.model.lora_r, s.train.learning_rate) == (2, 8, 1.0)
    assert isinstance(s.job.num_nodes, int)
    # Also the training settings a stage changes: stage_settings holds settings by name.
    s = Settings.from_flat({"stage_settings": {"dpo": {"lora_r": 8.0, "learning_rate": 1.0}}})
    assert s.stages.stage_settings == {"dpo": {"lora_r": 8, "learning_rate": 1.0}}
    assert isinstance(s.stages.stage_settings["dpo"]["lora_r"], int)


def test_the_derived_files_are_current():
    """`python -m pipelines.compile` writes them; a change to the model without it is caught here and in CI."""
    from pipelines.derive import derived_files

    stale = [str(path) for path, text in derived_files().items() if path.read_text() != text]
    assert stale == [], f"run python -m pipelines.compile: {stale} differ from the settings model"


def test_trainer_settings_take_changes_by_setting_name_and_refuse_a_name_they_do_not_hold():
    """A stage's or a search's changes reach the group that holds each setting; a setting outside the four trainer
    groups is one error naming it (stage_settings' own names are checked earlier, by validate_inputs)."""
    trainer = Settings().trainer().replace(lora_r=8, parallelism="hsdp", learning_rate=1e-4, dpo_beta=0.2)
    assert (trainer.model.lora_r, trainer.compute.parallelism) == (8, "hsdp")
    assert (trainer.train.learning_rate, trainer.preference.dpo_beta) == (1e-4, 0.2)
    assert trainer.flat() == {
        **Settings().trainer().flat(),
        "lora_r": 8,
        "parallelism": "hsdp",
        "learning_rate": 1e-4,
        "dpo_beta": 0.2,
    }
    with pytest.raises(ValueError, match=r"not trainer settings: \['num_nodes'\]"):
        trainer.replace(num_nodes=2)
