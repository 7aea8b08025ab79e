"""TensorBoard on a cluster without Kubeflow's Tensorboard controller (a standalone Training Operator or Trainer
install): the Deployment and Service the train step creates in its place, the exit handler that deletes them, and
the preflight that chooses between the two (components/observe/tensorboard.py, components/validate/preflight.py)."""

from __future__ import annotations

import json

from kfp.dsl import PipelineTaskFinalStatus
from kubernetes import client as k8s

from components.kube import job_name_for
from components.observe import tensorboard
from components.observe.component import notify_run
from components.observe.tensorboard import ensure_tensorboard, server_manifests, tensorboard_manifest
from components.validate.preflight import preflight
from tests.fakes.k8s_api import FakeKubeAPI
from tests.helpers.cluster import NS, PARAMS, ready_cluster
from tests.helpers.crd_schema import crd_errors
from tests.helpers.pod_security import violations

RUN_ID = "9c1f4e2a-5b7d-4c3e-8f1a-2d6b0e9a7c35"
NAME = job_name_for(RUN_ID, "tb")
IMAGE = "registry.example/llm/trainer:1.2.3"
DEPLOYMENT = ("apps", "v1", "deployments", NS, NAME)
SERVICE = ("", "v1", "services", NS, NAME)


def board(run_id: str = RUN_ID) -> dict:
    return tensorboard_manifest(job_name_for(run_id, "tb"), NS, "llm-models", run_id)


def _round_trip(obj: dict, model: str) -> dict:
    """``obj`` read into the kubernetes client's typed model and written out again: a field the API does not know
    is dropped, a required one missing raises."""

    class Response:
        data = json.dumps(obj)

    api = k8s.ApiClient()
    return api.sanitize_for_serialization(api.deserialize(Response(), model))


def test_the_deployment_and_service_are_what_the_api_server_and_a_kubelet_take():
    deployment, service = server_manifests(board(), IMAGE)
    # No Kubernetes OpenAPI document is vendored: the pod template is checked against the PodTemplateSpec schema
    # the real PyTorchJob CRD embeds (strict: an unknown field is an error), the rest through the client's models.
    job = {
        "apiVersion": "kubeflow.org/v1",
        "kind": "PyTorchJob",
        "metadata": {"name": "x"},
        "spec": {"pytorchReplicaSpecs": {"Master": {"replicas": 1, "template": deployment["spec"]["template"]}}},
    }
    assert crd_errors(job, "kubeflow.org_pytorchjobs.yaml") == []
    assert _round_trip(deployment, "V1Deployment") == deployment
    assert _round_trip(service, "V1Service") == service
    assert violations(deployment["spec"]["template"]) == []  # a namespace enforcing `restricted` admits it

    template = deployment["spec"]["template"]
    (container,) = template["spec"]["containers"]
    (volume,) = template["spec"]["volumes"]
    (mount,) = container["volumeMounts"]
    # The controller's layout: the claim read-only, the run's folder as the subPath, tensorboard --logdir there.
    assert volume == {"name": "logs", "persistentVolumeClaim": {"claimName": "llm-models", "readOnly": True}}
    assert mount == {"name": "logs", "mountPath": "/tensorboard_logs", "subPath": f"runs/{RUN_ID}", "readOnly": True}
    assert container["image"] == IMAGE and container["command"] == ["tensorboard"]
    assert container["args"] == ["--logdir", "/tensorboard_logs", "--host", "0.0.0.0", "--port", "6006"]
    assert container["ports"] == [{"name": "http", "containerPort": 6006}]
    assert "nvidia.com/gpu" not in json.dumps(container["resources"])
    # The API server refuses a selector its template does not match; the Service must reach the same pods.
    selector = deployment["spec"]["selector"]["matchLabels"]
    assert selector.items() <= template["metadata"]["labels"].items()
    assert service["spec"]["selector"] == selector
    assert service["spec"]["ports"] == [{"name": "http", "port": 6006, "targetPort": "http"}]
    for obj in (deployment, service):
        assert obj["metadata"]["name"] == NAME and obj["metadata"]["namespace"] == NS
        assert obj["metadata"]["labels"]["pipelines.kubeflow.org/run-id"] == RUN_ID
    # The search lists the run's pods by the run id label: TensorBoard's pod must not be among them.
    assert "pipelines.kubeflow.org/run-id" not in template["metadata"]["labels"]
    assert "imagePullSecrets" not in template["spec"]


def test_the_server_pulls_the_trainer_image_with_the_runs_pull_secrets():
    deployment, _ = server_manifests(board(), IMAGE, ["registry-mirror"])
    template = deployment["spec"]["template"]
    assert template["spec"]["imagePullSecrets"] == [{"name": "registry-mirror"}]
    job = {
        "apiVersion": "kubeflow.org/v1",
        "kind": "PyTorchJob",
        "metadata": {"name": "x"},
        "spec": {"pytorchReplicaSpecs": {"Master": {"replicas": 1, "template": template}}},
    }
    assert crd_errors(job, "kubeflow.org_pytorchjobs.yaml") == []
    assert _round_trip(deployment, "V1Deployment") == deployment


def test_render_writes_them_beside_the_tensorboard(tmp_path):
    import yaml

    from tests.helpers.repo import run_cli

    args = ["--preset", "qwen3-30b-a3b-full", "--namespace", "team-a", "-p", f"trainer_image={IMAGE}"]
    result = run_cli("pipelines.run", *args, "--render", str(tmp_path))
    assert result.returncode == 0, result.stderr
    rendered = list(yaml.safe_load_all((tmp_path / "tensorboard-server.yaml").read_text()))
    board = yaml.safe_load((tmp_path / "tensorboard.yaml").read_text())
    assert rendered == list(server_manifests(board, IMAGE))
    assert [d["kind"] for d in rendered] == ["Deployment", "Service"]


def _status(state: str) -> PipelineTaskFinalStatus:
    return PipelineTaskFinalStatus(
        state=state, pipeline_job_resource_name="runs/r", pipeline_task_name="", error_code=None, error_message=""
    )


def _exit_handler(root, run_id: str = RUN_ID) -> None:
    notify_run.python_func(
        status=_status("FAILED"), run_id=run_id, model_root=str(root), model_pvc="llm-models", data_root=str(root)
    )


def test_without_the_controller_the_train_step_serves_it_and_the_exit_handler_deletes_it(tmp_path, monkeypatch, caplog):
    caplog.set_level("INFO")
    with FakeKubeAPI() as api:
        monkeypatch.setattr(tensorboard, "load_api_client", lambda: api.client)
        assert ensure_tensorboard(board(), api_client=api.client, image=IMAGE, model_root=str(tmp_path)) is True
        # A later stage, a retried step: the same objects (409), no second of either.
        assert ensure_tensorboard(board(), api_client=api.client, image=IMAGE, model_root=str(tmp_path)) is True
        assert len(api.requests_for("POST", "/apis/apps/v1/namespaces/team-llm/deployments")) == 2
        assert len(api.requests_for("POST", "/api/v1/namespaces/team-llm/services")) == 2
        assert not api.requests_for("POST", "/tensorboards")
        deployment, service = server_manifests(board(), IMAGE)
        assert api.objects[DEPLOYMENT]["spec"] == deployment["spec"]
        assert api.objects[SERVICE]["spec"] == service["spec"]
        assert f"kubectl port-forward -n {NS} svc/{NAME} 6006:6006" in caplog.text
        assert "http://localhost:6006" in caplog.text

        _exit_handler(tmp_path)
        assert DEPLOYMENT not in api.objects and SERVICE not in api.objects
        assert len(api.requests_for("DELETE", f"/deployments/{NAME}")) == 1
        assert len(api.requests_for("DELETE", f"/services/{NAME}")) == 1
        _exit_handler(tmp_path)  # the record is gone with them: nothing more to delete
        assert len(api.requests_for("DELETE")) == 2


def test_with_the_controller_the_tensorboard_as_before_and_the_exit_handler_deletes_nothing(tmp_path, monkeypatch):
    with FakeKubeAPI() as api:
        monkeypatch.setattr(tensorboard, "load_api_client", lambda: api.client)
        api.install_crd(tensorboard.GROUP, tensorboard.VERSION, tensorboard.PLURAL, tensorboard.KIND)
        assert ensure_tensorboard(board(), api_client=api.client, image=IMAGE, model_root=str(tmp_path)) is True
        key = (tensorboard.GROUP, tensorboard.VERSION, tensorboard.PLURAL, NS, NAME)
        assert api.objects[key]["spec"] == {"logspath": f"pvc://llm-models/runs/{RUN_ID}"}
        assert [k for k in api.objects if k != key] == []
        # The controller's own Deployment is named as ours would be: the exit handler must leave it alone.
        _exit_handler(tmp_path)
        assert not api.requests_for("DELETE") and key in api.objects


def test_the_exit_handler_deletes_every_variants_tensorboard(tmp_path, monkeypatch):
    with FakeKubeAPI() as api:
        monkeypatch.setattr(tensorboard, "load_api_client", lambda: api.client)
        for variant in ("lr-low", "lr-high"):
            ensure_tensorboard(board(f"{RUN_ID}-{variant}"), api_client=api.client, model_root=str(tmp_path))
        assert len([k for k in api.objects if k[2] == "deployments"]) == 2
        _exit_handler(tmp_path)
        assert api.objects == {}


def test_an_exit_handler_that_may_not_delete_warns_with_the_command_and_still_posts(tmp_path, monkeypatch, caplog):
    caplog.set_level("INFO")
    with FakeKubeAPI() as api:
        monkeypatch.setattr(tensorboard, "load_api_client", lambda: api.client)
        ensure_tensorboard(board(), api_client=api.client, model_root=str(tmp_path))
        api.forbid("/deployments/")
        _exit_handler(tmp_path)  # no exception: the run's outcome is still posted
    assert f"(HTTP 403 Forbidden): kubectl delete -n {NS} deployment,service {NAME}" in caplog.text
    assert "nothing posted" in caplog.text


# -- preflight: which of the two, and whether it can work here ------------------------------------------------


def test_preflight_passes_a_cluster_without_the_controller_that_lets_the_runner_serve_it():
    with FakeKubeAPI() as api:
        assert preflight(dict(PARAMS), api_client=ready_cluster(api).client, namespace=NS) == []
        reviewed = [r.body["spec"]["resourceAttributes"] for r in api.requests_for("POST", "selfsubjectaccessreviews")]
        assert {(a["verb"], a.get("group", ""), a["resource"]) for a in reviewed} >= {
            ("create", "apps", "deployments"),
            ("delete", "apps", "deployments"),
            ("create", "", "services"),
            ("delete", "", "services"),
        }
        assert not any(a["resource"] == "tensorboards" for a in reviewed)


def test_preflight_names_the_tensorboard_setting_once_when_neither_can_work():
    with FakeKubeAPI() as api:
        ready_cluster(api).deny("create", "deployments", "apps")
        api.deny("delete", "services")
        problems = preflight(dict(PARAMS), api_client=api.client, namespace=NS)
    (problem,) = problems
    assert problem.startswith("tensorboard=true: this cluster serves no tensorboards.tensorboard.kubeflow.org")
    assert "may not create deployments.apps, delete services in team-llm" in problem
    assert problem.endswith("or set tensorboard=false")


def test_preflight_with_the_controller_reviews_the_tensorboard_as_before():
    with FakeKubeAPI() as api:
        ready_cluster(api).install_crd(tensorboard.GROUP, tensorboard.VERSION, tensorboard.PLURAL, tensorboard.KIND)
        api.deny("create", "deployments", "apps")  # not needed here
        assert preflight(dict(PARAMS), api_client=api.client, namespace=NS) == []
        api.deny("create", "tensorboards", tensorboard.GROUP)
        (problem,) = preflight(dict(PARAMS), api_client=api.client, namespace=NS)
    assert "may not create tensorboards.tensorboard.kubeflow.org" in problem


def test_preflight_turned_off_asks_for_neither():
    with FakeKubeAPI() as api:
        ready_cluster(api).deny("create", "deployments", "apps")
        assert preflight({**PARAMS, "tensorboard": False}, api_client=api.client, namespace=NS) == []


def test_a_claim_tensorboard_cannot_mount_is_one_error_naming_the_setting():
    # TensorBoard mounts model_pvc: a claim that does not exist fails the run in preflight, before any GPU.
    with FakeKubeAPI() as api:
        problems = preflight(
            {**PARAMS, "model_pvc": "no-such-claim"}, api_client=ready_cluster(api).client, namespace=NS
        )
    (problem,) = problems
    assert problem.startswith("model_pvc='no-such-claim': PersistentVolumeClaim not found in namespace team-llm")
