"""validate_inputs' rules on the latency gates and the serving replicas (components/validate/rules/): each bad value
is one error naming the setting, before anything runs."""

from __future__ import annotations

import pytest

from components.validate.rules import check
from pipelines import params as P


def cluster(**over) -> dict:
    return {**P.resolve("qwen3-30b-a3b-full"), **over}


def one_error(values: dict, setting: str) -> str:
    errors = check(values)
    assert len(errors) == 1, errors
    assert setting in errors[0], errors
    return errors[0]


def test_the_defaults_and_a_one_to_ten_hpa_pass():
    assert check(cluster()) == []
    assert check(cluster(max_replicas=10, scale_metric="cpu", scale_target=70, max_ttft_seconds=2.5)) == []
    assert check(cluster(deployment_mode="Knative", min_replicas=0, max_replicas=4, scale_metric="rps")) == []
    assert check(cluster(min_output_tokens_per_second=40.0)) == []


@pytest.mark.parametrize("setting", ["max_ttft_seconds", "min_output_tokens_per_second"])
def test_a_negative_latency_gate_is_named(setting):
    assert f"{setting}=-1.0 must be >= 0" in one_error(cluster(**{setting: -1.0}), setting)


def test_min_replicas_above_max_replicas_is_named():
    error = one_error(cluster(min_replicas=4, max_replicas=2), "min_replicas")
    assert "min_replicas=4 is above max_replicas=2" in error


def test_scale_to_zero_needs_knative():
    assert "deployment_mode=Knative" in one_error(cluster(min_replicas=0), "min_replicas=0")


def test_an_unknown_scale_metric_is_named():
    assert "scale_metric='gpu' is not one of auto, cpu" in one_error(cluster(scale_metric="gpu"), "scale_metric")


@pytest.mark.parametrize(
    "mode, metric, hint", [("Standard", "concurrency", "need deployment_mode=Knative"), ("Knative", "memory", "an HPA")]
)
def test_a_scale_metric_the_modes_autoscaler_does_not_use_is_named(mode, metric, hint):
    error = one_error(cluster(deployment_mode=mode, scale_metric=metric), "scale_metric")
    assert f"scale_metric={metric}" in error and hint in error


def test_max_replicas_of_zero_is_named():
    assert "max_replicas=0 must be >= 1" in one_error(cluster(max_replicas=0), "max_replicas")
