"""validate_inputs' rules on the watching settings (components/validate/rules/cluster.py)."""

from __future__ import annotations

import pytest

from components.settings import Settings
from components.validate.rules.cluster import check_cluster_settings


def errors(**settings) -> list[str]:
    return [e for e in check_cluster_settings(Settings.from_flat(settings)) if e]


@pytest.mark.parametrize("port", [23456, 29400, 29500])
def test_a_metrics_port_the_rendezvous_uses_is_refused(port):
    (error,) = errors(metrics_port=port)
    assert error.startswith(f"metrics_port={port} is a port the training pods' rendezvous uses")
    assert "9410" in error and "0 for no metrics" in error


def test_the_defaults_and_0_pass():
    assert errors() == []
    assert errors(metrics_port=0) == []


@pytest.mark.parametrize("url", ["prometheus:9090", "ftp://prom:9090", "http://"])
def test_prometheus_url_must_be_an_http_url(url):
    (error,) = errors(prometheus_url=url)
    assert error.startswith(f"prometheus_url={url!r} is not an http(s) URL")


def test_a_langfuse_secret_is_a_secret_name():
    (error,) = errors(langfuse_secret="Not_A_Name")
    assert "langfuse_secret" in error
    (error,) = errors(langfuse_secret="")
    assert error.startswith("langfuse_secret is empty")
