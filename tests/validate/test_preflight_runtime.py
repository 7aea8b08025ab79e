"""Preflight of the TrainJob's ClusterTrainingRuntime (``trainjob_runtime``) and of gang scheduling on it, against the
fake API server through the real kubernetes client. The runtimes are the vendored v2.1.0 ``torch-distributed`` one
and copies of it, each checked against the real ClusterTrainingRuntime CRD."""

from __future__ import annotations

import copy
import logging

import pytest
import yaml

from components import kube
from components.validate.preflight import preflight
from tests.fakes.k8s_api import FakeKubeAPI, Request
from tests.helpers.cluster import NS, PARAMS, ready_cluster
from tests.helpers.crd_schema import crd_errors
from tests.helpers.repo import REFERENCE

GROUP, VERSION, PLURAL = "trainer.kubeflow.org", "v1alpha1", "clustertrainingruntimes"
RUNTIME_CRD = "v2.1.0/trainer.kubeflow.org_clustertrainingruntimes.yaml"  # the runtime's own release
TRAINJOB = {**PARAMS, "train_backend": "trainjob"}


class RuntimesAPI(FakeKubeAPI):
    """The fake API server plus the cluster-scoped ClusterTrainingRuntimes (list), as the API server serves them
    once Kubeflow Trainer is installed (``/apis/<group>/<version>/clustertrainingruntimes``)."""

    def __init__(self):
        super().__init__()
        self.runtimes: dict[str, dict] = {}

    def add_runtime(self, runtime: dict) -> None:
        assert crd_errors(runtime, RUNTIME_CRD) == []
        self.runtimes[runtime["metadata"]["name"]] = copy.deepcopy(runtime)

    def handle(self, method, path, query, body, content_type):
        parts = path.strip("/").split("/")
        forbidden = any(fragment in path for fragment in self.forbidden)
        if parts == ["apis", GROUP, VERSION, PLURAL] and method == "GET" and not forbidden:
            with self.lock:
                self.requests.append(Request(method, path, query, body, content_type))
                items = [copy.deepcopy(r) for _, r in sorted(self.runtimes.items())]
            return (
                200,
                {"apiVersion": f"{GROUP}/{VERSION}", "kind": "ClusterTrainingRuntimeList", "items": items},
                ("application/json"),
            )
        return super().handle(method, path, query, body, content_type)


def torch_distributed(name: str = "torch-distributed", pod_group_policy: dict | None = None) -> dict:
    runtime = yaml.safe_load((REFERENCE / "runtimes" / "v2.1.0_torch_distributed.yaml").read_text())
    runtime["metadata"]["name"] = name
    if pod_group_policy is not None:
        runtime["spec"]["podGroupPolicy"] = pod_group_policy
    return runtime


@pytest.fixture(autouse=True)
def short_api_outages(monkeypatch):
    monkeypatch.setattr(kube, "API_RETRY_WINDOW_SECONDS", 3.0)


@pytest.fixture
def api():
    with RuntimesAPI() as api:
        ready_cluster(api)
        api.install_crd(GROUP, VERSION, PLURAL, "ClusterTrainingRuntime", namespaced=False)
        api.add_runtime(torch_distributed())
        yield api


def check(api: FakeKubeAPI, **overrides) -> list[str]:
    return preflight({**TRAINJOB, **overrides}, api_client=api.client, namespace=NS)


def test_the_default_runtime_on_a_cluster_that_has_it_passes(api):
    assert check(api) == []
    assert api.requests_for("GET", f"/{PLURAL}")


def test_a_runtime_the_cluster_does_not_have_is_one_error_naming_the_setting_and_what_there_is(api):
    api.add_runtime(torch_distributed("torch-distributed-h100"))
    (problem,) = check(api, trainjob_runtime="deepspeed-distributed")
    assert problem.startswith("trainjob_runtime='deepspeed-distributed': this cluster has no ClusterTrainingRuntime")
    assert "(it has: torch-distributed, torch-distributed-h100)" in problem
    assert check(api, trainjob_runtime="torch-distributed-h100") == []


def test_gang_scheduling_needs_a_runtime_with_a_pod_group_policy(api, caplog):
    (problem,) = check(api, gang_scheduling=True)
    assert problem.startswith("gang_scheduling=true with train_backend=trainjob: the ClusterTrainingRuntime ")
    assert "torch-distributed has no spec.podGroupPolicy" in problem and "coscheduling or volcano" in problem
    for name, policy in (
        ("torch-gang", {"coscheduling": {"scheduleTimeoutSeconds": 120}}),
        ("torch-volcano", {"volcano": {}}),
    ):
        api.add_runtime(torch_distributed(name, policy))
        with caplog.at_level(logging.INFO, logger="components.validate.preflight"):
            assert check(api, gang_scheduling=True, trainjob_runtime=name) == []
        assert f"trainjob_runtime={name!r}: gang scheduling by {next(iter(policy))}" in caplog.text


def test_runtimes_the_account_may_not_list_are_a_warning(api, caplog):
    api.forbid(f"/{PLURAL}")
    with caplog.at_level(logging.WARNING):
        assert check(api, trainjob_runtime="not-checked", gang_scheduling=True) == []
    assert (
        "may not list the ClusterTrainingRuntimes" in caplog.text
        and "neither the runtime nor its gang scheduling is checked" in caplog.text
    )


def test_the_pytorchjob_backend_asks_nothing_about_runtimes(api):
    assert check(api, train_backend="pytorchjob", trainjob_runtime="absent") == []
    assert not api.requests_for("GET", f"/{PLURAL}")
