"""Presets, parameter files and -p overrides: typed, checked, with errors that name the fix."""

import pytest

from pipelines import params as P
from pipelines.errors import UsageError


def test_every_preset_resolves_and_passes_the_checks():
    for name in P.preset_names():
        params = P.resolve(name)
        P.check(params)
        assert set(params) == set(P.parameter_specs())
    assert set(P.preset_names()) >= {"qwen3-30b-a3b-full", "qwen3-30b-a3b-lora", "qwen3-32b-qlora", "local-tiny"}


def test_cluster_preset_is_the_seeds_job():
    p = P.resolve("qwen3-30b-a3b-full")
    assert (p["num_nodes"], p["gpus_per_node"], p["method"], p["deepspeed_config"]) == (2, 8, "full", "zero3")
    assert p["max_seq_length"] == 4096 and p["train_backend"] == "pytorchjob"


def test_overrides_are_typed_and_later_sources_win(tmp_path):
    f = tmp_path / "my.yaml"
    f.write_text("learning_rate: 2.0e-5\nnum_nodes: 4\n")
    p = P.resolve(
        "qwen3-30b-a3b-full",
        str(f),
        ["num_nodes=3", "learning_rate=1e-5", 'node_selector={"pool": "h100"}', "keep_serving=true"],
    )
    assert p["num_nodes"] == 3
    assert p["learning_rate"] == 1e-5 and isinstance(p["learning_rate"], float)  # "1e-5" is a string to YAML 1.1
    assert p["node_selector"] == {"pool": "h100"}
    assert p["keep_serving"] is True


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda: P.resolve("nope"), "unknown preset 'nope'; choose one of: local-tiny"),
        (
            lambda: P.resolve("local-tiny", overrides=["learnin_rate=1"]),
            "unknown parameter 'learnin_rate'; did you mean 'learning_rate'?",
        ),
        (lambda: P.resolve("local-tiny", overrides=["learning_rate"]), "is not KEY=VALUE; e.g. -p learning_rate=1e-5"),
        (lambda: P.resolve("local-tiny", overrides=["num_nodes=two"]), "parameter 'num_nodes' expects int, got 'two'"),
        (lambda: P.resolve("local-tiny", overrides=["num_nodes=1.5"]), "parameter 'num_nodes' expects int"),
        (lambda: P.resolve("local-tiny", overrides=["keep_serving=maybe"]), "parameter 'keep_serving' expects bool"),
        (lambda: P.resolve("local-tiny", overrides=["tolerations={}"]), "parameter 'tolerations' expects list"),
        (lambda: P.resolve("local-tiny", params_file="/does/not/exist.yaml"), "--params /does/not/exist.yaml"),
    ],
)
def test_bad_input_is_one_clear_error(call, message):
    with pytest.raises(UsageError, match=None) as e:
        call()
    assert message in str(e.value)


def test_params_file_must_be_a_mapping(tmp_path):
    f = tmp_path / "list.yaml"
    f.write_text("- a\n- b\n")
    with pytest.raises(UsageError, match="expected a mapping"):
        P.resolve("local-tiny", str(f))


@pytest.mark.parametrize(
    "override, message",
    [
        ("data_pvc=My_Data", "data_pvc='My_Data' is not a valid Kubernetes claim name"),
        ("serving_name=1model", "serving_name='1model' is not a valid Kubernetes DNS-1035 name"),
        ("hf_token_secret=HF Token", "hf_token_secret='HF Token' is not a valid Kubernetes Secret name"),
        ("method=dpo", "method='dpo' is not one of full, lora, qlora"),
        ("hf_token_secret=", "hf_token_secret is empty; name a Secret with key HF_TOKEN"),
        ("num_nodes=2", "num_nodes=2 with train_backend=local"),
        ("learning_rate=5", "learning_rate=5.0 must be > 0 and < 1"),
        ("max_model_len=128", "max_model_len=128 is shorter than max_seq_length=512"),
        ("canary_traffic_percent=10", "canary_traffic_percent needs deployment_mode=Knative"),
        ("deployment_mode=Serverless", "deployment_mode='Serverless' is not one of Standard, Knative"),
        ("lm_eval_tasks=[1]", "lm_eval_tasks=[1] must be a list of task names"),
    ],
)
def test_invalid_values_name_the_field(override, message):
    params = P.resolve("local-tiny", overrides=[override])
    with pytest.raises(UsageError) as e:
        P.check(params)
    assert message in str(e.value)
