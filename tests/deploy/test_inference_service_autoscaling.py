"""The InferenceService's replica bounds and autoscaling (predictor ``minReplicas``, ``maxReplicas``, ``scaleMetric``,
``scaleTarget``; Standard mode's HPA), against KServe's CRD, and the errors of ``InferenceServiceSpec``."""

from __future__ import annotations

import pytest

from components.deploy.manifest import inference_service_for_run
from components.settings import DeploySettings, Settings
from tests.helpers.crd_schema import crd_errors
from tests.helpers.inference_service import CRD, NS, STORAGE, isvc

# KServe's annotation for the autoscaler of a Standard-mode service (an HPA by default there).
AUTOSCALER_CLASS_ANNOTATION = "serving.kserve.io/autoscalerClass"


def _groups(**settings):
    """The job, network and storage settings the InferenceService reads."""
    s = Settings.from_flat(settings)
    return s.job, s.network, s.storage


def test_standard_mode_scales_one_to_ten_replicas_with_an_hpa_and_matches_the_crd():
    manifest = isvc(min_replicas=1, max_replicas=10, scale_metric="cpu", scale_target=70)
    predictor = manifest["spec"]["predictor"]
    assert (predictor["minReplicas"], predictor["maxReplicas"]) == (1, 10)
    assert (predictor["scaleMetric"], predictor["scaleTarget"]) == ("cpu", 70)
    assert manifest["metadata"]["annotations"][AUTOSCALER_CLASS_ANNOTATION] == "hpa"
    assert crd_errors(manifest, CRD) == []


@pytest.mark.parametrize("runtime", ["kserve-vllm", "kserve-huggingface"])
def test_knative_scales_on_concurrency_from_zero_and_matches_the_crd(runtime):
    manifest = isvc(
        runtime, deployment_mode="Knative", min_replicas=0, max_replicas=4, scale_metric="concurrency", scale_target=8
    )
    predictor = manifest["spec"]["predictor"]
    assert (predictor["minReplicas"], predictor["maxReplicas"], predictor["scaleMetric"]) == (0, 4, "concurrency")
    assert AUTOSCALER_CLASS_ANNOTATION not in manifest["metadata"]["annotations"]  # Knative's own autoscaler
    assert crd_errors(manifest, CRD) == []


def test_the_deploy_settings_reach_the_rendered_service():
    deploy = DeploySettings(
        deploy_backend="kserve-vllm", serving_gpus=4, max_replicas=10, scale_metric="memory", scale_target=80
    )
    manifest = inference_service_for_run(
        deploy, *_groups(node_selector={}, tolerations=[]), run_id="r1", namespace=NS, storage_uri=STORAGE
    )
    predictor = manifest["spec"]["predictor"]
    assert (predictor["minReplicas"], predictor["maxReplicas"]) == (1, 10)
    assert (predictor["scaleMetric"], predictor["scaleTarget"]) == ("memory", 80)
    assert crd_errors(manifest, CRD) == []
    # the defaults: one replica, KServe's default metric and target, no autoscaler class named
    plain = inference_service_for_run(DeploySettings(), *_groups(), run_id="r1", namespace=NS, storage_uri=STORAGE)
    assert (plain["spec"]["predictor"]["minReplicas"], plain["spec"]["predictor"]["maxReplicas"]) == (1, 1)
    assert "scaleMetric" not in plain["spec"]["predictor"] and "scaleTarget" not in plain["spec"]["predictor"]
    assert crd_errors(plain, CRD) == []


@pytest.mark.parametrize(
    "overrides, field",
    [
        ({"min_replicas": 3, "max_replicas": 2}, "max_replicas"),
        ({"min_replicas": 0}, "min_replicas"),  # Standard mode: an HPA cannot scale to zero
        ({"scale_metric": "rps"}, "scale_metric"),  # Knative's metric
        ({"deployment_mode": "Knative", "scale_metric": "cpu"}, "scale_metric"),
        ({"scale_metric": "gpu"}, "scale_metric"),
        ({"scale_target": -1}, "scale_target"),
    ],
)
def test_bad_replica_bounds_and_metrics_are_named(overrides, field):
    with pytest.raises(ValueError, match=field):
        isvc(**overrides)
