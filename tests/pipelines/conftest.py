"""Fixtures of the tests that talk to KFP (the fake KFP API) as the command lines do."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture
def isolated_kfp_client(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Keep the developer's KFP settings out: they would change which requests kfp.Client makes."""
    import kfp.client.client

    for name in ("KF_PIPELINES_SA_TOKEN_PATH", "KF_PIPELINES_UI_ENDPOINT", "KF_PIPELINES_ENDPOINT", "KFP_HOST"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.delenv("KFP_TOKEN", raising=False)
    monkeypatch.setattr(kfp.client.client.Client, "_LOCAL_KFP_CONTEXT", str(tmp_path / "context.json"))


@pytest.fixture
def kfp_api():
    """The fake KFP API (token ``t0k3n``); after the test, every request it got is one the real API has, with query
    parameters it declares."""
    from tests.fakes.kfp_api import running_fake_kfp

    with running_fake_kfp(token="t0k3n") as api:
        yield api
    for request in api.requests:
        api.operation_of(request)


@pytest.fixture
def token(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KFP_TOKEN", "t0k3n")
