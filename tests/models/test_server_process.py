"""The local server's process (components/models/server_process.py), the one the deploy step and the judge share: a
stand-in server (a few lines of Python answering ``/health``) started, waited for and stopped with its whole group;
the judge's ``served_base`` over it. The real `transformers serve`: tests/deploy/test_deploy_local.py and
tests/evaluate/test_judge.py."""

from __future__ import annotations

import os
import sys
import time

import pytest

from components.evaluate import judge
from components.models import server_process
from components.models.server_process import free_port, start_server

# Answers 200 on /health, after starting a child of its own (in its process group) that sleeps.
HEALTH_SERVER = """
import http.server, subprocess, sys
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
print("child", child.pid, flush=True)
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200 if self.path == "/health" else 404)
        self.end_headers()
    def log_message(self, *args):
        pass
http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), H).serve_forever()
"""


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/status") as f:
            return "State:\tZ" not in f.read()
    except FileNotFoundError:
        return False


def test_a_server_is_ready_when_it_answers_and_stops_with_its_whole_group(tmp_path):
    port = free_port()
    log = tmp_path / "serve.log"
    server = start_server([sys.executable, "-c", HEALTH_SERVER, str(port)], port=port, log_path=str(log))
    try:
        server.wait_ready(30, interval=0.05)
        assert server.endpoint == f"http://127.0.0.1:{port}/v1"
        assert os.getpgid(server.pid) == server.pid  # a session, and so a process group, of its own
        child = int(server.log_tail().split()[1])
        assert _alive(child)
    finally:
        server.stop()
    assert server.proc.poll() is not None
    for _ in range(100):  # the child is not ours to reap: wait for init to
        if not _alive(child):
            break
        time.sleep(0.05)
    assert not _alive(child)


def test_a_server_that_exits_before_it_answers_fails_at_once_with_its_log(tmp_path):
    port = free_port()
    log = tmp_path / "serve.log"
    server = start_server(
        [sys.executable, "-c", "import sys; print('no such model'); sys.exit(3)"], port=port, log_path=str(log)
    )
    with pytest.raises(RuntimeError, match="exited before"):
        server.wait_ready(30, interval=0.05)
    assert "no such model" in server.log_tail()
    server.stop()  # nothing to stop: no error


def test_the_judges_served_base_runs_on_the_shared_process(tmp_path, monkeypatch):
    seen = {}

    def command(model_path, port):
        seen["port"] = port
        return [sys.executable, "-c", HEALTH_SERVER, str(port)], dict(os.environ)

    monkeypatch.setattr(judge, "transformers_serve", command)
    started = []
    real_start = server_process.start_server
    monkeypatch.setattr(judge, "start_server", lambda *a, **kw: started.append(real_start(*a, **kw)) or started[-1])
    with judge.served_base("/models/base", str(tmp_path / "judge_serve.log")) as url:
        assert url == f"http://127.0.0.1:{seen['port']}/v1"
        assert started[0].alive()
    assert not started[0].alive()  # stopped on leaving

    monkeypatch.setattr(judge, "transformers_serve", lambda m, p: ([sys.executable, "-c", "print('bad')"], None))
    with pytest.raises(RuntimeError, match="(?s)judge_endpoint='served-base': the local server exited\n.*bad"):
        with judge.served_base("/models/base", str(tmp_path / "judge_serve.log")):
            pass
