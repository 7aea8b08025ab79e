"""Fixtures that start Debian's real Prometheus 2.42 (with promtool) and Alertmanager 0.25 on loopback
(`apt-get install -y prometheus prometheus-alertmanager`; .ci/run installs them). Where a binary is missing the test
skips, naming the package (in CI, CI=true, it fails instead)."""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from tests.helpers import repo

BINARIES = {"promtool": "prometheus", "prometheus": "prometheus", "prometheus-alertmanager": "prometheus-alertmanager"}


def _binary(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        why = f"{name} is not installed (apt-get install -y {BINARIES[name]})"
        if repo.in_ci():
            pytest.fail(why)
        pytest.skip(why)
    return path


@pytest.fixture
def promtool() -> str:
    return _binary("promtool")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_ready(url: str, proc: subprocess.Popen, log: Path, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"{proc.args[0]} exited with {proc.returncode}:\n{log.read_text()[-3000:]}")
        try:
            with urllib.request.urlopen(url, timeout=1):
                return
        except (urllib.error.URLError, OSError):
            time.sleep(0.2)
    raise AssertionError(f"{url} not ready in {timeout}s:\n{log.read_text()[-3000:]}")


class Server:
    """A started binary: ``url`` (http://127.0.0.1:PORT), ``api(path)`` for its JSON API."""

    def __init__(self, args: list[str], port: int, ready_path: str, workdir: Path):
        self.url = f"http://127.0.0.1:{port}"
        self.log = workdir / f"{Path(args[0]).name}.log"
        self.proc = subprocess.Popen(args, stdout=self.log.open("w"), stderr=subprocess.STDOUT, cwd=workdir)
        wait_ready(self.url + ready_path, self.proc, self.log)

    def api(self, path: str) -> dict:
        with urllib.request.urlopen(self.url + path, timeout=5) as r:
            return json.load(r)

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


@pytest.fixture
def start_prometheus(tmp_path):
    """``start(config: dict) -> Server``: Prometheus with that configuration (YAML-able dict) on a free port."""
    binary = _binary("prometheus")
    started = []

    def start(config: dict, files: dict | None = None) -> Server:
        import yaml

        work = tmp_path / f"prometheus-{len(started)}"
        work.mkdir()
        for name, text in (files or {}).items():
            (work / name).write_text(text)
        (work / "prometheus.yml").write_text(yaml.safe_dump(config))
        port = free_port()
        server = Server(
            [
                binary,
                f"--config.file={work / 'prometheus.yml'}",
                f"--storage.tsdb.path={work / 'data'}",
                f"--web.listen-address=127.0.0.1:{port}",
            ],
            port,
            "/-/ready",
            work,
        )
        started.append(server)
        return server

    yield start
    for server in started:
        server.stop()


@pytest.fixture
def start_alertmanager(tmp_path):
    """``start(config_text: str) -> Server``: Alertmanager 0.25 with that configuration, clustering off."""
    binary = _binary("prometheus-alertmanager")
    started = []

    def start(config: str) -> Server:
        work = tmp_path / f"alertmanager-{len(started)}"
        work.mkdir()
        (work / "alertmanager.yml").write_text(config)
        port = free_port()
        server = Server(
            [
                binary,
                f"--config.file={work / 'alertmanager.yml'}",
                f"--storage.path={work / 'data'}",
                f"--web.listen-address=127.0.0.1:{port}",
                "--cluster.listen-address=",
            ],
            port,
            "/-/ready",
            work,
        )
        started.append(server)
        return server

    yield start
    for server in started:
        server.stop()
