"""One place per choice and per rule: validate_inputs checks with the definitions of the modules that implement
them, so the check before any GPU is requested and the step that runs later cannot disagree."""

import pytest

from components.data import formats, tokenizing
from components.deploy import inference_service
from components.train import config
from components.train.launcher import job as launch
from components.train.config import check_combination, check_method_deepspeed
from components.data import rules as data_rules
from components.deploy import rules as deploy_rules
from components.train import rules as train_rules
from pipelines import params as P
from pipelines.errors import UsageError


def test_validate_checks_the_choices_the_steps_implement():
    # The rules import each choice from the module that implements it: nothing is defined twice.
    assert train_rules.METHODS is config.METHODS
    assert train_rules.DEEPSPEED_CONFIGS is config.DEEPSPEED_CONFIGS
    assert train_rules.CLEANUP_POLICIES is launch.CLEANUP_POLICIES
    assert train_rules.TRAIN_BACKENDS is launch.TRAIN_BACKENDS
    assert deploy_rules.DEPLOYMENT_MODES is inference_service.DEPLOYMENT_MODES
    assert deploy_rules.DEPLOY_BACKENDS is inference_service.DEPLOY_BACKENDS
    assert data_rules.DATASET_FORMATS is formats.DATASET_FORMATS
    assert data_rules.OVER_LENGTH is tokenizing.OVER_LENGTH


@pytest.mark.parametrize("choice, value", [
    ("method", "dpo"), ("train_backend", "slurm"), ("job_cleanup", "never"), ("deploy_backend", "triton"),
    ("deployment_mode", "Serverless"), ("dataset_format", "csv"), ("over_length", "split"),
    ("deepspeed_config", "zero4"),
])
def test_every_choice_is_checked_naming_the_setting(choice, value):
    params = P.resolve("local-tiny", overrides=[f"{choice}={value}"])
    with pytest.raises(UsageError, match=f"{choice}='{value}' is not one of"):
        P.check(params)


def test_every_deepspeed_choice_resolves_in_the_trainer():
    for name in config.DEEPSPEED_CONFIGS:
        path = config.deepspeed_config_path(name)
        assert (path is None) == (name == "none")


@pytest.mark.parametrize("deepspeed_config", ["zero3", "zero3_offload"])
def test_qlora_under_zero3_is_refused_before_the_job_and_by_the_trainer_alike(deepspeed_config):
    rule = check_method_deepspeed("qlora", deepspeed_config)
    assert "set deepspeed_config to 'none' or 'zero2'" in rule
    params = P.resolve("qwen3-32b-qlora", overrides=[f"deepspeed_config={deepspeed_config}"])
    with pytest.raises(UsageError) as e:
        P.check(params)
    assert rule in str(e.value)
    assert check_combination({"method": "qlora", "deepspeed": deepspeed_config, "bf16": True}) == [rule]


@pytest.mark.parametrize("method, deepspeed_config", [("qlora", "zero2"), ("qlora", "none"), ("lora", "zero3"),
                                                      ("full", "zero3_offload")])
def test_the_combinations_that_work_pass_both(method, deepspeed_config):
    assert check_method_deepspeed(method, deepspeed_config) is None
    assert check_combination({"method": method, "deepspeed": deepspeed_config, "bf16": True}) == []


def test_a_users_zero3_json_is_refused_with_qlora_where_it_is_read(tmp_path):
    # validate_inputs may not mount the volume a user's JSON is on; the trainer reads it and applies the rule.
    path = tmp_path / "mine.json"
    path.write_text('{"zero_optimization": {"stage": 3}}')
    assert check_combination({"method": "qlora", "deepspeed": str(path)}) == [check_method_deepspeed("qlora", str(path))]
