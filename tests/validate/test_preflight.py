"""Cluster preflight against the fake API server, through the real kubernetes client."""

from __future__ import annotations

import logging

import pytest

from components import kube
from components.validate.preflight import preflight
from tests.fakes.k8s_api import FakeKubeAPI
from tests.helpers.cluster import GPU_TAINT, H100, NS, PARAMS, ready_cluster


@pytest.fixture(autouse=True)
def short_api_outages(monkeypatch):
    monkeypatch.setattr(kube, "API_RETRY_WINDOW_SECONDS", 3.0)


def check(api: FakeKubeAPI, **overrides) -> list[str]:
    return preflight({**PARAMS, **overrides}, api_client=api.client, namespace=NS)


def test_a_ready_cluster_passes():
    with FakeKubeAPI() as api:
        assert check(ready_cluster(api)) == []
        assert check(api, train_backend="trainjob") == []
        assert check(api, deploy_backend="local", train_backend="pytorchjob") == []


def test_a_local_run_asks_nothing_of_a_cluster():
    assert preflight({**PARAMS, "train_backend": "local", "deploy_backend": "local"}, api_client=object()) == []


@pytest.mark.parametrize(
    "backend,missing,needle",
    [
        (
            "pytorchjob",
            ("kubeflow.org", "v1"),
            "pytorchjobs.kubeflow.org/v1 is not served by this cluster: install the Kubeflow Training Operator",
        ),
        (
            "trainjob",
            ("trainer.kubeflow.org", "v1alpha1"),
            "trainjobs.trainer.kubeflow.org/v1alpha1 is not served by this cluster: install Kubeflow Trainer",
        ),
        (
            "pytorchjob",
            ("serving.kserve.io", "v1beta1"),
            "inferenceservices.serving.kserve.io/v1beta1 is not served by this cluster: install KServe",
        ),
    ],
)
def test_missing_apis_are_named(backend, missing, needle):
    with FakeKubeAPI() as api:
        del ready_cluster(api).crds[missing]
        (problem,) = check(api, train_backend=backend)
        assert problem.startswith(needle)


def test_claims_must_exist_be_bound_and_read_write_many():
    with FakeKubeAPI() as api:
        ready_cluster(api)
        del api.core[("persistentvolumeclaims", NS, "llm-data")]
        api.add_pvc(NS, "llm-models", access_modes=("ReadWriteOnce",))
        api.add_pvc(NS, "pending", phase="Pending")
        problems = check(api) + check(api, model_pvc="pending")
    assert len(problems) == 4, problems  # llm-data missing (twice), llm-models RWO, pending
    assert problems[0].startswith("data_pvc='llm-data': PersistentVolumeClaim not found in namespace team-llm")
    assert problems[1].startswith("model_pvc='llm-models' has access modes ReadWriteOnce")
    assert "ReadWriteMany" in problems[1]
    assert problems[3].startswith("model_pvc='pending' is Pending, not Bound")


def test_absent_token_secret_is_a_warning_and_a_wrong_key_a_failure(caplog):
    with FakeKubeAPI() as api:
        ready_cluster(api)
        with caplog.at_level(logging.WARNING):
            assert check(api, hf_token_secret="no-such-secret") == []
        assert "hf_token_secret='no-such-secret': Secret not found" in caplog.text
        api.add_secret(NS, "wrong-key", {"token": "hf_abc"})
        api.add_secret(NS, "empty", {"HF_TOKEN": " "})
        assert check(api, hf_token_secret="wrong-key") == [
            "hf_token_secret='wrong-key' has no key HF_TOKEN (it has: token); the pods read the token from that key"
        ]
        assert check(api, hf_token_secret="empty") == ["hf_token_secret='empty': key HF_TOKEN is empty"]


def test_an_alert_secret_without_its_key_fails_and_an_absent_one_warns(caplog):
    with FakeKubeAPI() as api:
        ready_cluster(api)
        with caplog.at_level(logging.WARNING):
            assert check(api, alert_webhook_secret="llm-alerts") == []  # absent: runs end without an alert
        assert "alert_webhook_secret='llm-alerts': Secret not found" in caplog.text
        api.add_secret(NS, "llm-alerts", {"url": "https://hooks.example.com/T/B/x"})
        assert check(api) == [
            "alert_webhook_secret='llm-alerts' has no key ALERT_WEBHOOK_URL (it has: url); "
            "the pods read the webhook URL from that key"
        ]
        api.add_secret(NS, "llm-alerts-ok", {"ALERT_WEBHOOK_URL": "https://hooks.example.com/T/B/x"})
        assert check(api, alert_webhook_secret="llm-alerts-ok") == []


def test_the_secret_value_never_appears_in_messages_or_logs(caplog):
    with FakeKubeAPI() as api:
        ready_cluster(api)
        api.add_secret(NS, "other", {"TOKEN": "hf_live_secret_value"})
        with caplog.at_level(logging.DEBUG):
            problems = check(api, hf_token_secret="other")
    assert "hf_live_secret_value" not in " ".join(problems) + caplog.text


def test_missing_permissions_are_each_named():
    with FakeKubeAPI() as api:
        ready_cluster(api)
        api.deny("create", "pytorchjobs", group="kubeflow.org")
        api.deny("get", "pods", subresource="log")
        api.deny("patch", "inferenceservices", group="serving.kserve.io")
        problems = check(api)
    assert problems == [
        "this service account may not create pytorchjobs.kubeflow.org in team-llm: apply manifests/rbac "
        "(kubectl apply -k manifests/) for the pipeline runner",
        "this service account may not get pods/log in team-llm: apply manifests/rbac "
        "(kubectl apply -k manifests/) for the pipeline runner",
        "this service account may not patch inferenceservices.serving.kserve.io in team-llm: apply manifests/rbac "
        "(kubectl apply -k manifests/) for the pipeline runner",
    ]


def test_reviews_ask_about_the_runs_namespace_and_the_backends_resources():
    with FakeKubeAPI() as api:
        check(ready_cluster(api), train_backend="trainjob", deploy_backend="local")
        reviews = [r.body["spec"]["resourceAttributes"] for r in api.requests_for("POST", "selfsubjectaccessreviews")]
    assert {r["namespace"] for r in reviews} == {NS}
    assert {(r["verb"], r["resource"], r.get("subresource", "")) for r in reviews} == {
        ("create", "trainjobs", ""),
        ("get", "trainjobs", ""),
        ("delete", "trainjobs", ""),
        # The job's NetworkPolicy, created before it, read and deleted after it.
        ("create", "networkpolicies", ""),
        ("get", "networkpolicies", ""),
        ("delete", "networkpolicies", ""),
        ("list", "pods", ""),
        ("get", "pods", "log"),
        # No Kubeflow Tensorboard controller here: the Deployment and Service that stand in for it, each read (its run
        # label) before the exit handler deletes it.
        ("create", "deployments", ""),
        ("get", "deployments", ""),
        ("delete", "deployments", ""),
        ("create", "services", ""),
        ("get", "services", ""),
        ("delete", "services", ""),
    }
    with FakeKubeAPI() as api:  # without the run's Tensorboard, the step does not need to create one
        check(ready_cluster(api), train_backend="trainjob", deploy_backend="local", tensorboard=False)
        reviews = [r.body["spec"]["resourceAttributes"] for r in api.requests_for("POST", "selfsubjectaccessreviews")]
    assert not {"tensorboards", "deployments", "services"} & {r["resource"] for r in reviews}


@pytest.mark.parametrize(
    "change,expect",
    [
        (lambda api: api.add_node("gpu-1", H100, gpus=4, taints=[GPU_TAINT]), "only 1 of 2 nodes"),
        (lambda api: api.add_node("gpu-1", H100, gpus=8, taints=[GPU_TAINT], unschedulable=True), "only 1 of 2 nodes"),
        (
            lambda api: api.add_node(
                "gpu-1", H100, gpus=8, taints=[{"key": "dedicated", "value": "infer", "effect": "NoSchedule"}]
            ),
            "only 1 of 2 nodes",
        ),
        (lambda api: api.add_node("gpu-1", {"nvidia.com/gpu.product": "NVIDIA-A100"}, gpus=8), "only 1 of 1 nodes"),
    ],
)
def test_too_few_matching_gpu_nodes_fail_with_the_counts(change, expect):
    with FakeKubeAPI() as api:
        change(ready_cluster(api))
        (problem,) = check(api)
    assert problem.startswith("num_nodes=2 x gpus_per_node=8: " + expect)
    assert "node_selector" in problem and ">= 8 allocatable nvidia.com/gpu" in problem


def test_a_prefer_no_schedule_taint_does_not_block():
    with FakeKubeAPI() as api:
        ready_cluster(api).add_node(
            "gpu-1", H100, gpus=8, taints=[GPU_TAINT, {"key": "x", "effect": "PreferNoSchedule"}]
        )
        assert check(api) == []


def test_nodes_the_runner_may_not_list_are_a_warning(caplog):
    with FakeKubeAPI() as api:
        ready_cluster(api).forbid("/api/v1/nodes")
        with caplog.at_level(logging.WARNING):
            assert check(api, num_nodes=64) == []
    assert "may not list Nodes" in caplog.text


def test_transient_errors_are_retried():
    with FakeKubeAPI() as api:
        ready_cluster(api)
        api.fail_next(2, status=503, path_contains="/persistentvolumeclaims/")
        api.drop_next(1, path_contains="selfsubjectaccessreviews")
        assert check(api) == []


def test_a_tracker_in_report_to_needs_its_secret_with_the_key_its_pods_read(caplog):
    """report_to names mlflow or wandb: the pods' MLflow/W&B callbacks read the address or key from tracking_secret
    (optional references, so a missing Secret would only show as a failure inside the pods, hours later)."""
    with FakeKubeAPI() as api:
        ready_cluster(api)
        assert check(api) == []  # tensorboard only: no Secret needed
        (problem,) = check(api, report_to=["tensorboard", "wandb"])
        assert problem.startswith("tracking_secret='llm-tracking': Secret not found in team-llm; report_to names wandb")
        assert "kubectl create secret generic llm-tracking --from-literal=WANDB_API_KEY=..." in problem
        api.add_secret(NS, "llm-tracking", {"MLFLOW_TRACKING_URI": "http://mlflow.team:5000"})
        assert check(api, report_to=["mlflow"]) == []
        assert check(api, report_to=["mlflow", "wandb"]) == [
            "tracking_secret='llm-tracking' has no key WANDB_API_KEY (it has: MLFLOW_TRACKING_URI); report_to names "
            "wandb, whose callback reads it"
        ]


def test_image_pull_secrets_must_exist_and_hold_registry_credentials():
    with FakeKubeAPI() as api:
        ready_cluster(api)
        api.add_secret(NS, "registry-mirror", {".dockerconfigjson": "{}"}, type="kubernetes.io/dockerconfigjson")
        api.add_secret(NS, "plain", {"password": "x"})
        assert check(api, image_pull_secrets=["registry-mirror"]) == []
        (missing,) = check(api, image_pull_secrets=["registry-mirror", "absent"])
        assert missing.startswith(f"image_pull_secrets: Secret 'absent' not found in {NS}; create it")
        assert "kubectl create secret docker-registry absent" in missing
        (wrong,) = check(api, train_backend="trainjob", image_pull_secrets=["plain"])
        assert wrong.startswith(
            "image_pull_secrets: Secret 'plain' is of type Opaque, not kubernetes.io/dockerconfigjson"
        )
        # The serving pods pull with them too.
        assert len(check(api, train_backend="local", image_pull_secrets=["absent"])) == 1


def test_an_unreadable_image_pull_secret_only_warns(caplog):
    with FakeKubeAPI() as api:
        ready_cluster(api).forbid("/secrets/mirror")
        with caplog.at_level(logging.WARNING):
            assert check(api, image_pull_secrets=["mirror"]) == []
        assert "image_pull_secrets: may not read Secret 'mirror'" in caplog.text
