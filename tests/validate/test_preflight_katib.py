"""Preflight and Katib's metrics collector (issue 19, defect 4): Katib's pod webhook injects the collector only into
pods of namespaces labelled ``katib.kubeflow.org/metrics-collector-injection: enabled``; without it a trial's job
succeeds, no metric is recorded and the trial controller requeues the trial forever. Standalone KFP namespaces do
not carry the label, so a search (``hpo_trials > 0``) checks it first, against the fake API server."""

from __future__ import annotations

import logging

import pytest

from components import kube
from components.validate.preflight import preflight
from tests.fakes.k8s_api import FakeKubeAPI
from tests.helpers.cluster import NS, PARAMS, ready_cluster

LABEL = "katib.kubeflow.org/metrics-collector-injection"
FIX = f"kubectl label namespace {NS} {LABEL}=enabled"


@pytest.fixture(autouse=True)
def short_api_outages(monkeypatch):
    monkeypatch.setattr(kube, "API_RETRY_WINDOW_SECONDS", 3.0)


def katib_cluster(api: FakeKubeAPI, **labels) -> FakeKubeAPI:
    """The reference cluster with Katib installed and the runs' namespace labelled ``labels``."""
    ready_cluster(api).install_crd("kubeflow.org", "v1beta1", "experiments", "Experiment")
    api.add_namespace(NS, labels)
    return api


def check(api: FakeKubeAPI, **overrides) -> list[str]:
    return preflight({**PARAMS, "hpo_trials": 4, **overrides}, api_client=api.client, namespace=NS)


@pytest.mark.parametrize("train", ["pytorchjob", "trainjob"])
def test_a_labelled_namespace_passes(train):
    with katib_cluster(FakeKubeAPI(), **{LABEL: "enabled"}) as api:
        assert check(api, train_backend=train) == []
        assert [r.path for r in api.requests].count(f"/api/v1/namespaces/{NS}") == 1  # read once


def test_a_namespace_without_the_label_is_one_error_naming_the_label_and_the_command():
    with katib_cluster(FakeKubeAPI()) as api:
        (problem,) = check(api)
    assert problem.startswith(f"hpo_trials > 0: namespace {NS} lacks the label {LABEL}=enabled")
    assert "requeue the trial forever" in problem and problem.endswith(f"add it: {FIX}")


def test_a_label_set_to_something_else_says_what_it_is():
    with katib_cluster(FakeKubeAPI(), **{LABEL: "disabled"}) as api:
        (problem,) = check(api)
    assert f"lacks the label {LABEL}=enabled (it is 'disabled')" in problem and FIX in problem


def test_without_a_search_the_namespace_is_not_read():
    with katib_cluster(FakeKubeAPI()) as api:
        assert check(api, hpo_trials=0) == []
        assert f"/api/v1/namespaces/{NS}" not in [r.path for r in api.requests]


def test_a_local_search_needs_no_label():
    with FakeKubeAPI() as api:
        assert check(api, train_backend="local", deploy_backend="local") == []
        assert api.requests == []


def test_a_namespace_the_runner_may_not_read_warns_with_the_command(caplog):
    with katib_cluster(FakeKubeAPI()) as api:
        # RBAC's 403 for the first GET under the namespace, which is the namespace itself (the claims come later).
        api.fail_next(1, status=403, method="GET", path_contains=f"/api/v1/namespaces/{NS}")
        with caplog.at_level(logging.WARNING):
            problems = check(api)
    assert [r.path for r in api.requests_for("GET", f"/api/v1/namespaces/{NS}")][0] == f"/api/v1/namespaces/{NS}"
    assert not any(LABEL in p for p in problems)
    assert f"could not check that namespace {NS} has the label {LABEL}=enabled" in caplog.text
    assert FIX in caplog.text
