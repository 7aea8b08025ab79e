"""Variants (issue 23): what a user may list, each bad list refused with one error naming the variant and the setting,
each variant checked as a whole run, and their GPUs counted together by preflight against the fake API server."""

from __future__ import annotations

import pytest

from components import kube
from components.settings import defaults
from components.validate.preflight import preflight
from components.validate.rules import check, warnings
from components.variants import VARIABLE, expand, variant_names
from tests.fakes.k8s_api import FakeKubeAPI
from tests.helpers.cluster import GPU_TAINT, NS, PARAMS, ready_cluster

TWO = [{"learning_rate": 1e-5}, {"learning_rate": 5e-5, "name": "hi-lr"}]


def errors(variants, **run) -> list[str]:
    return check({**defaults(), **run, "variants": variants})


def test_two_distinct_variants_are_valid_and_named():
    assert errors(TWO) == []
    assert variant_names(TWO) == ["v1", "hi-lr"]


@pytest.mark.parametrize(
    "variants,needle",
    [
        ([{"learning_rate": 1e-5}], "variants has 1 entry; give two or more"),
        ([{"learning_rate": 1e-5}, "lr=5e-5"], "variants must be a list of JSON objects"),
        (
            [{"learning_rate": 1e-5}, {"learning_rate": 1e-5}],
            "variants[1] ('v2'): the same settings as variants[0] ('v1')",
        ),
        (
            [{"learning_rate": 1e-5, "name": "a"}, {"learning_rate": 2e-5, "name": "a"}],
            "variants[1] ('a'): the name 'a' is also variants[0]'s",
        ),
        (
            [{"learning_rate": 1e-5, "name": "Big_Model"}, {"learning_rate": 2e-5}],
            "variants[0] ('Big_Model'): name must be lowercase letters",
        ),
        (
            [{"learning_rate": 1e-5}, {"learning_rat": 2e-5}],
            "variants[1] ('v2'): 'learning_rat' is not a setting; did you mean 'learning_rate'?",
        ),
        (
            [{"learning_rate": 1e-5}, {"eval_size": 10}],
            "variants[1] ('v2'): eval_size cannot vary per variant: it draws the held-out split",
        ),
        ([{"learning_rate": 1e-5}, {"seed": 7}], "variants[1] ('v2'): seed cannot vary per variant"),
        (
            [{"learning_rate": 1e-5}, {"serving_name": "x"}],
            "variants[1] ('v2'): serving_name cannot vary per variant: the run serves its variants together",
        ),
        ([{"learning_rate": 1e-5}, {"data_pvc": "other"}], "variants[1] ('v2'): data_pvc cannot vary per variant"),
        (
            [{"learning_rate": 1e-5}, {"learning_rate": 3.0}],
            "variants[1] ('v2'): learning_rate=3.0 must be > 0 and < 1",
        ),
        (
            [{"learning_rate": 1e-5}, {"per_device_train_batch_size": 64}],
            "variants[1] ('v2'): full fine-tuning of Qwen/Qwen3-30B-A3B-Thinking-2507-FP8 needs about",
        ),
    ],
)
def test_each_bad_list_is_one_error_naming_the_variant_and_the_setting(variants, needle):
    (error,) = errors(variants)
    assert error.startswith(needle), error


def test_a_search_and_variants_are_one_or_the_other():
    (error,) = errors(TWO, hpo_trials=4)
    assert "variants and hpo_trials > 0" in error and "hpo_trials=0" in error


def test_more_parallel_variants_than_variants_is_refused():
    (error,) = errors(TWO, variants_parallel=3)
    assert error.startswith("variants_parallel=3 is more than the 2 variants")


def test_what_may_vary_shapes_training_and_what_may_not_is_the_runs():
    assert {
        "learning_rate",
        "method",
        "lora_r",
        "model_name_or_path",
        "stage_settings",
        "num_nodes",
        "gpus_per_node",
        "dataset_source",
    } <= VARIABLE
    assert (
        not {
            "stages",
            "seed",
            "eval_size",
            "eval_source",
            "serving_name",
            "data_pvc",
            "train_backend",
            "hpo_trials",
            "variants",
            "min_loss_improvement",
        }
        & VARIABLE
    )


def test_a_variant_on_other_data_is_warned_that_it_is_scored_on_the_runs_split():
    values = {**defaults(), "variants": [{"learning_rate": 1e-5}, {"dataset_source": "extra.jsonl"}]}
    assert check(values) == []
    (warning,) = warnings(values)
    assert warning.startswith("variants[1] ('v2') trains on dataset_source='extra.jsonl'")


def test_expand_gives_each_variant_its_settings_and_its_own_run_id():
    values = {**defaults(), "variants": TWO}
    items = expand(values, "run-1")
    assert [(i["variant"], i["run_id"]) for i in items] == [("v1", "run-1-v1"), ("hi-lr", "run-1-hi-lr")]
    assert [i["settings"]["learning_rate"] for i in items] == [1e-5, 5e-5]
    assert all(i["settings"]["variants"] == [] for i in items)
    # Without variants the run is its own one item: the same steps run either way.
    (own,) = expand(defaults(), "run-1")
    assert (own["variant"], own["run_id"], own["settings"], own["overrides"]) == ("", "run-1", defaults(), {})


@pytest.fixture(autouse=True)
def short_api_outages(monkeypatch):
    monkeypatch.setattr(kube, "API_RETRY_WINDOW_SECONDS", 3.0)


def preflight_problems(api: FakeKubeAPI, **overrides) -> list[str]:
    return preflight({**PARAMS, **overrides}, api_client=api.client, namespace=NS)


def test_variants_that_fit_one_at_a_time_pass_and_together_are_named_with_their_gpus():
    big = [{"learning_rate": 1e-5, "name": "big"}, {"learning_rate": 2e-5, "num_nodes": 1, "name": "small"}]
    with FakeKubeAPI() as api:  # two 8-GPU nodes: 16 GPUs
        ready_cluster(api)
        assert preflight_problems(api, variants=big, variants_parallel=1) == []
        (problem,) = preflight_problems(api, variants=big, variants_parallel=2)
    assert problem == (
        "variants_parallel=2 trains up to 2 variants at once, and 'big' (16), 'small' (8) hold 24 "
        "nvidia.com/gpu together; the nodes they may use have 16 allocatable: lower variants_parallel, "
        "or num_nodes / gpus_per_node of the largest variants"
    )


def test_a_variant_larger_than_the_cluster_is_named():
    with FakeKubeAPI() as api:
        ready_cluster(api)
        (problem,) = preflight_problems(api, variants=[{"learning_rate": 1e-5}, {"num_nodes": 3, "name": "wide"}])
    assert problem.startswith("variants[1] ('wide'): num_nodes=3 x gpus_per_node=8: only 2 of 2 nodes")


def test_a_variant_placed_on_other_nodes_counts_those():
    a100 = {"nvidia.com/gpu.product": "NVIDIA-A100"}
    variants = [{"learning_rate": 1e-5}, {"learning_rate": 2e-5, "node_selector": a100, "num_nodes": 1}]
    with FakeKubeAPI() as api:
        ready_cluster(api).add_node("a100-0", a100, gpus=8, taints=[GPU_TAINT])
        # v1 on the two H100 nodes (the run's selector), v2 on the A100 one: 16 + 8 of 24 GPUs.
        assert preflight_problems(api, variants=variants, variants_parallel=2) == []


def test_a_variant_of_another_base_model_is_one_error_naming_it():
    # Scored on the run's held-out split tokenized with the run's tokenizer, another model's would be scored wrongly.
    run_model = defaults()["model_name_or_path"]
    same = [{"model_name_or_path": run_model, "learning_rate": 1e-5}, {"learning_rate": 5e-5}]
    assert errors(same) == []
    (error,) = errors([{"model_name_or_path": "Qwen/Qwen3-8B"}, {"learning_rate": 5e-5}])
    assert error.startswith("variants[0] ('v1'): model_name_or_path='Qwen/Qwen3-8B' is not the run's")
    assert "compare base models in separate runs" in error
