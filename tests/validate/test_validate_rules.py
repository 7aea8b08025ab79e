"""One place per choice and per rule: the settings model declares each setting's allowed values, the modules that
implement a choice read them there or hold their own tuple to them, and validate_inputs checks with them, so the
check before any GPU is requested and the step that runs later cannot disagree."""

import subprocess
import sys

import pytest

from components import stages
from components.data import formats, tokenizing
from components.deploy import manifest
from components.hpo import space
from components.settings import choices, defaults
from components.train import config
from components.train.config import check_combination, check_method_deepspeed
from components.train.launcher import job as launch
from components.validate.rules import check
from pipelines import params as P
from pipelines.errors import UsageError


def test_the_steps_implement_the_declared_choices():
    # Read from the settings model where the code may depend on it ...
    assert config.METHODS is choices("method")
    assert config.DEEPSPEED_CONFIGS is choices("deepspeed_config")
    assert stages.STAGES is choices("stages")
    # ... and held to it where the implementing module keeps its own table.
    assert launch.CLEANUP_POLICIES == choices("job_cleanup")
    assert launch.TRAIN_BACKENDS == choices("train_backend")
    assert manifest.DEPLOYMENT_MODES == choices("deployment_mode")
    assert manifest.DEPLOY_BACKENDS == choices("deploy_backend")
    assert formats.DATASET_FORMATS == choices("dataset_format")
    assert tokenizing.OVER_LENGTH == choices("over_length")
    assert tuple(space.ALGORITHMS) == choices("hpo_algorithm")


def test_the_shipped_deepspeed_configs_are_the_declared_names():
    shipped = {p.stem for p in config.DEEPSPEED_DIR.glob("*.json")}
    assert shipped | {"none"} == set(config.DEEPSPEED_CONFIGS)


def test_every_declared_schedule_is_one_the_trainer_builds_from_the_settings_alone():
    import torch
    from transformers import SchedulerType, get_scheduler

    optimizer = torch.optim.SGD(torch.nn.Linear(2, 2).parameters(), lr=0.1)
    for name in choices("lr_scheduler_type"):
        assert SchedulerType(name)
        get_scheduler(name, optimizer, num_warmup_steps=1, num_training_steps=10)  # no lr_scheduler_kwargs needed


@pytest.mark.parametrize(
    "choice, value",
    [
        ("method", "dpo"),
        ("train_backend", "slurm"),
        ("job_cleanup", "never"),
        ("deploy_backend", "triton"),
        ("deployment_mode", "Serverless"),
        ("dataset_format", "csv"),
        ("over_length", "split"),
        ("deepspeed_config", "zero4"),
        ("hpo_algorithm", "magic"),
        ("lr_scheduler_type", "cosine_with_min_lr"),
        ("attn_implementation", "flash_attention_3"),
    ],
)
def test_every_choice_is_checked_naming_the_setting(choice, value):
    params = P.resolve("local-tiny", overrides=[f"{choice}={value}"])
    with pytest.raises(UsageError, match=f"{choice}='{value}' is not one of"):
        P.check(params)


def test_a_bad_algorithm_is_named_once_with_a_search_on():
    errors = check({**defaults(), "hpo_trials": 4, "hpo_algorithm": "magic"})
    assert [e for e in errors if "magic" in e] == [
        "hpo_algorithm='magic' is not one of random, tpe, multivariate-tpe, bayesianoptimization, grid, cmaes, sobol"
    ]


def test_a_search_over_schedules_the_trainer_cannot_build_is_refused_before_any_trial():
    # cosine_with_min_lr needs lr_scheduler_kwargs, which no setting gives: every trial drawing it would fail.
    space_ = {"lr_scheduler_type": {"values": ["cosine", "cosine_with_min_lr"]}}
    errors = check({**defaults(), "hpo_trials": 4, "hpo_search_space": space_})
    assert errors == [
        "hpo_search_space.lr_scheduler_type.values: ['cosine_with_min_lr'] are not among "
        "lr_scheduler_type's choices (cosine, linear, cosine_with_restarts, polynomial, constant, "
        "constant_with_warmup, inverse_sqrt)"
    ]


def test_a_stages_own_settings_are_checked_like_the_runs():
    errors = check({**defaults(), "stage_settings": {"sft": {"deepspeed_config": "zero4", "method": "ppo"}}})
    assert "stage_settings.sft: method='ppo' is not one of full, lora, qlora" in errors
    assert any(e.startswith("stage_settings.sft: deepspeed_config='zero4' is not one of") for e in errors)


def test_qlora_under_zero3_is_named_once_for_the_run_and_once_per_stage_that_changes_it():
    errors = check({**defaults(), "method": "qlora", "deepspeed_config": "zero3"})
    assert errors == [check_method_deepspeed("qlora", "zero3")]
    errors = check({**defaults(), "stage_settings": {"sft": {"method": "qlora"}}})
    assert errors == [f"stage sft: {check_method_deepspeed('qlora', 'zero3')}"]


def test_a_users_deepspeed_json_on_a_volume_passes_validation_for_a_cluster_run():
    # validate_inputs does not mount the volume: the trainer reads the file (and applies its rules) where it is.
    # The memory estimate needs the file's ZeRO layout; without it the estimate is skipped, not a crash.
    params = P.resolve("qwen3-30b-a3b-full", overrides=["deepspeed_config=/mnt/data/configs/ds.json"])
    P.check(params)


def test_the_checks_import_no_kubernetes_or_ml_library():
    # validate_inputs checks settings before it asks a cluster (preflight is what imports the client), and
    # pipelines.run checks them before it submits.
    probe = (
        "import sys\nfrom components.settings import defaults\nfrom components.validate.rules import check\n"
        "assert check({**defaults(), 'hpo_trials': 4}) == []\n"
        "print(sorted(m for m in ('kubernetes', 'kubeflow', 'torch', 'transformers', 'kfp') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


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


@pytest.mark.parametrize(
    "method, deepspeed_config", [("qlora", "zero2"), ("qlora", "none"), ("lora", "zero3"), ("full", "zero3_offload")]
)
def test_the_combinations_that_work_pass_both(method, deepspeed_config):
    assert check_method_deepspeed(method, deepspeed_config) is None
    assert check_combination({"method": method, "deepspeed": deepspeed_config, "bf16": True}) == []


def test_a_users_zero3_json_is_refused_with_qlora_where_it_is_read(tmp_path):
    # validate_inputs may not mount the volume a user's JSON is on; the trainer reads it and applies the rule.
    path = tmp_path / "mine.json"
    path.write_text('{"zero_optimization": {"stage": 3}}')
    rule = check_method_deepspeed("qlora", str(path))
    assert check_combination({"method": "qlora", "deepspeed": str(path)}) == [rule]


def test_hierarchical_partitioning_follows_the_gpus_of_a_node_without_a_file_of_its_own():
    # zero3_hpz.json keeps a secondary copy of the weights within zero_hpz_partition_size ranks: DeepSpeed takes them
    # as consecutive ranks, which are one node's only when the size is gpus_per_node. The trainer now sets the shipped
    # file's size to torchrun's LOCAL_WORLD_SIZE (tests/train/trainer/test_parallelism.py), so any gpus_per_node runs.
    shipped = config.load_deepspeed_config("zero3_hpz")["zero_optimization"]["zero_hpz_partition_size"]
    params = P.resolve("qwen3-30b-a3b-full", overrides=["deepspeed_config=zero3_hpz"])
    P.check(params)
    assert check({**params, "gpus_per_node": shipped // 2, "num_nodes": 4}) == []


def test_pull_secrets_are_secret_names_and_the_proxies_and_hub_mirror_http_urls():
    good = {
        "image_pull_secrets": ["registry-mirror"],
        "http_proxy": "http://proxy.corp.example:3128",
        "https_proxy": "https://proxy.corp.example",
        "no_proxy": ".svc,10.0.0.0/8",
        "hf_endpoint": "https://hf-mirror.corp.example",
    }
    assert check({**defaults(), **good}) == []
    bad = {
        "image_pull_secrets": ["Registry_Mirror"],
        "http_proxy": "proxy.corp.example:3128",
        "https_proxy": "socks5://proxy.corp.example",
        "hf_endpoint": "hf-mirror.corp.example",
    }
    assert check({**defaults(), **bad}) == [
        "image_pull_secrets='Registry_Mirror' is not a valid Kubernetes Secret name (lowercase letters, digits, '-', "
        "at most 253); e.g. 'registry-mirror'",
        "http_proxy='proxy.corp.example:3128' is not an http(s) URL; e.g. 'http://proxy.example.com:3128', or "
        "leave it empty",
        "https_proxy='socks5://proxy.corp.example' is not an http(s) URL; e.g. 'http://proxy.example.com:3128', or "
        "leave it empty",
        "hf_endpoint='hf-mirror.corp.example' is not an http(s) URL; e.g. 'https://hf-mirror.example.com', or "
        "leave it empty",
    ]


def test_the_host_memory_fit_is_checked_against_the_trainer_pods_own_memory_limit():
    """zero3_offload keeps the optimizer states in each pod's memory (412 GiB per pod for the reference model on
    2 x 8): the fit must use trainer_memory_limit, the limit the pods get, not the default's 128 GiB."""
    offload = ["deepspeed_config=zero3_offload"]
    with pytest.raises(UsageError) as e:
        P.check(P.resolve("qwen3-30b-a3b-full", overrides=[*offload, "trainer_memory_limit=256Gi"]))
    assert "of host memory per pod" in str(e.value) and "a pod has 256 GiB (trainer_memory_limit)" in str(e.value)
    roomy = P.resolve("qwen3-30b-a3b-full", overrides=[*offload, "trainer_memory_limit=600Gi"])
    try:
        P.check(roomy)
    except UsageError as err:
        assert "of host memory per pod" not in str(err), err
