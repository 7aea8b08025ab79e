"""The run's Kubeflow Tensorboard (components/observe/tensorboard.py) against the real CRD and the run's folders."""

from __future__ import annotations

import pytest

from components.kube import job_name_for
from components.observe.tensorboard import dashboard_path, logs_path, tensorboard_manifest
from components.paths import MODEL_MOUNT, pvc_uri, run_dir
from tests.helpers.crd_schema import crd_errors

RUN_ID = "9c1f4e2a-5b7d-4c3e-8f1a-2d6b0e9a7c35"


def test_the_tensorboard_conforms_to_the_crd():
    manifest = tensorboard_manifest(job_name_for(RUN_ID, "tb"), "team-a", "llm-models", RUN_ID)
    assert crd_errors(manifest, "tensorboard.kubeflow.org_tensorboards.yaml") == []
    assert manifest["metadata"] == {
        "name": job_name_for(RUN_ID, "tb"),
        "namespace": "team-a",
        "labels": {"pipelines.kubeflow.org/run-id": RUN_ID},
    }


def test_logspath_is_the_folder_the_trainer_writes_its_events_to():
    manifest = tensorboard_manifest("tb-run-1", "team-a", "llm-models", "run-1")
    assert manifest["spec"] == {"logspath": "pvc://llm-models/runs/run-1"}
    # Every stage's output_dir (components/stages.py) lies under the run's folder, and the trainer's event
    # folder under that (sft.py: TENSORBOARD_LOGGING_DIR = <output_dir>/tensorboard): TensorBoard finds them all.
    from components.stages import STAGES, stage_folder

    for stage in STAGES:
        events = pvc_uri(
            "llm-models", MODEL_MOUNT, f"{run_dir(MODEL_MOUNT, 'run-1')}/{stage_folder(stage)}/tensorboard"
        )
        assert events.startswith(logs_path("llm-models", "run-1") + "/")


def test_the_controller_finds_the_claim_and_the_subpath():
    # tensorboard-controller's extractPVCName / extractPVCSubPath: claim up to the first '/', the rest is a subPath.
    path = logs_path("llm-models", RUN_ID).removeprefix("pvc://")
    claim, _, sub_path = path.partition("/")
    assert claim == "llm-models" and sub_path == f"runs/{RUN_ID}"


@pytest.mark.parametrize(
    "name, pvc, run_id, message",
    [
        ("TB_1", "llm-models", "run-1", "name 'TB_1' must be a DNS-1035 label"),
        ("1tb", "llm-models", "run-1", "name '1tb' must be a DNS-1035 label"),
        ("t" * 64, "llm-models", "run-1", "at most 63 characters"),
        ("tb-1", "LLM models", "run-1", "model_pvc 'LLM models' is not a valid claim name"),
        ("tb-1", "llm-models", "", "run_id '' is not a valid folder name"),
        ("tb-1", "llm-models", "a/b", "run_id 'a/b' is not a valid folder name"),
    ],
)
def test_bad_names_are_refused_naming_the_argument(name, pvc, run_id, message):
    with pytest.raises(ValueError, match=message):
        tensorboard_manifest(name, "team-a", pvc, run_id)


def test_the_dashboard_path_is_the_controllers_route():
    assert dashboard_path("team-a", "tb-run-1") == "/tensorboard/team-a/tb-run-1/"


def test_the_train_step_creates_it_once_where_the_controller_is(tmp_path):
    from components.observe.tensorboard import GROUP, PLURAL, VERSION, ensure_tensorboard
    from tests.fakes.k8s_api import FakeKubeAPI

    manifest = tensorboard_manifest("tb-run-1", "team-a", "llm-models", "run-1")
    with FakeKubeAPI() as api:
        api.install_crd(GROUP, VERSION, PLURAL, "Tensorboard")
        assert ensure_tensorboard(manifest, api_client=api.client, model_root=str(tmp_path)) is True
        # a later stage, a retried step: 409
        assert ensure_tensorboard(manifest, api_client=api.client, model_root=str(tmp_path)) is True
        assert len(api.requests_for("POST", f"/{PLURAL}")) == 2
        assert api.objects[(GROUP, VERSION, PLURAL, "team-a", "tb-run-1")]["spec"] == manifest["spec"]
    # Without the controller: a Deployment and a Service instead (tests/observe/test_tensorboard_server.py).
