"""Preflight of langfuse_secret (components/validate/preflight.py): a Secret without Langfuse's three keys fails the
run before any GPU is asked for; an absent one warns (its references are optional: the run is not traced)."""

from __future__ import annotations

import logging

import pytest

from components import kube
from components.validate.preflight import preflight
from tests.fakes.k8s_api import FakeKubeAPI
from tests.helpers.cluster import NS, PARAMS, ready_cluster

KEYS = {"LANGFUSE_PUBLIC_KEY": "pk-lf-1", "LANGFUSE_SECRET_KEY": "sk-lf-1", "LANGFUSE_HOST": "https://langfuse.example"}


@pytest.fixture(autouse=True)
def short_api_outages(monkeypatch):
    monkeypatch.setattr(kube, "API_RETRY_WINDOW_SECONDS", 3.0)


def check(api: FakeKubeAPI, **overrides) -> list[str]:
    return preflight({**PARAMS, **overrides}, api_client=api.client, namespace=NS)


def test_a_langfuse_secret_needs_all_three_keys_and_an_absent_one_warns(caplog):
    with FakeKubeAPI() as api:
        ready_cluster(api)
        with caplog.at_level(logging.WARNING):
            assert check(api, langfuse_secret="llm-langfuse") == []
        assert "langfuse_secret='llm-langfuse': Secret not found" in caplog.text
        assert "not traced" in caplog.text
        api.add_secret(NS, "half", {"LANGFUSE_PUBLIC_KEY": "pk-lf-1", "host": "https://langfuse.example"})
        api.add_secret(NS, "blank", {**KEYS, "LANGFUSE_SECRET_KEY": " "})
        api.add_secret(NS, "complete", KEYS)
        assert check(api, langfuse_secret="half") == [
            "langfuse_secret='half' has no key LANGFUSE_SECRET_KEY, LANGFUSE_HOST (it has: LANGFUSE_PUBLIC_KEY, "
            "host); the pods read Langfuse's keys and address from LANGFUSE_PUBLIC_KEY, LANGFUSE_SECRET_KEY, "
            "LANGFUSE_HOST"
        ]
        assert check(api, langfuse_secret="blank") == ["langfuse_secret='blank': key LANGFUSE_SECRET_KEY is empty"]
        assert check(api, langfuse_secret="complete") == []
