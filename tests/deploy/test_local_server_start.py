"""How the local deploy backend starts `transformers serve` (components/models/server_process.py, shared with the
judge; the server itself: tests/deploy/test_deploy_local.py)."""

from __future__ import annotations

import pytest

from components import quick_exit
from components.deploy import local_server
from components.models import server_process


class _ExitedAtOnce:
    """A server process that died before it listened: what Popen returns here, whatever it was asked to run."""

    pid = 0

    def __init__(self, cmd, **kwargs):
        self.cmd, self.kwargs = cmd, kwargs

    def poll(self):
        return 1


def test_the_server_starts_without_asking_pypi_for_updates_and_skips_the_final_collection(tmp_path, monkeypatch):
    started = []
    monkeypatch.setattr(
        server_process.subprocess, "Popen", lambda cmd, **kw: started.append(_ExitedAtOnce(cmd, **kw)) or started[-1]
    )
    monkeypatch.delenv("HF_HUB_DISABLE_UPDATE_CHECK", raising=False)
    with pytest.raises(RuntimeError, match="exited before"):
        local_server.serve_locally("/models/final", str(tmp_path / "serve.log"))
    (proc,) = started
    assert proc.cmd[:6] == quick_exit.command("transformers.cli.transformers", "serve", "/models/final")
    # `transformers serve` checks PyPI once a day for up to 2 s before serving, unless told not to.
    assert proc.kwargs["env"]["HF_HUB_DISABLE_UPDATE_CHECK"] == "1"
    monkeypatch.setenv("HF_HUB_DISABLE_UPDATE_CHECK", "0")  # a user who wants the hint keeps it
    started.clear()
    with pytest.raises(RuntimeError):
        local_server.serve_locally("/models/final", str(tmp_path / "serve.log"))
    assert started[0].kwargs["env"]["HF_HUB_DISABLE_UPDATE_CHECK"] == "0"
