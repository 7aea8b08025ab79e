"""A server process on this machine, started, waited for and stopped the one way every local server of a run is: the
deploy step's (components/deploy/local_server.py: `transformers serve`, or vLLM's CPU build for LoRA adapters) and
the evaluation's judge serving the base model (components/evaluate/judge.py, ``served_base``). Which command runs is
the caller's (components/models/serve_command.py for `transformers serve`); how it runs is this module's:

- on a free localhost port (``free_port``), chosen before the command is built with it;
- its stdout and stderr appended to a log file (``log_tail`` reads the end of it for an error message);
- in a session of its own, so that ``stop`` reaches the server and every process it started (its process group),
  and a server that is kept (the deploy step's ``keep_serving``) outlives the step that started it;
- unless kept, ended with this process however it ends: the kernel's parent-death signal, SIGTERM
  (components/parent_death.py; components/observe/process.py says how a local run's processes end with it);
- ready once ``/health`` answers 200 (``wait_ready``); a server that exits first fails at once;
- stopped with SIGTERM to its group, then SIGKILL after ``STOP_SECONDS``.

Standard library only: the evaluation step imports nothing of the deploy step's, and neither loads an ML library.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass

from components import parent_death

# Seconds a server has to stop after SIGTERM before its process group is SIGKILLed.
STOP_SECONDS = 15


def free_port() -> int:
    """A TCP port nothing listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_healthy(url: str, timeout: float, is_alive: Callable[[], bool] = lambda: True, interval: float = 0.5) -> None:
    """Poll ``url`` every ``interval`` seconds until it answers 200; raise TimeoutError after ``timeout`` seconds or
    RuntimeError when ``is_alive()`` turns false."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not is_alive():
            raise RuntimeError(f"the server exited before {url} became healthy")
        try:
            with urllib.request.urlopen(url, timeout=5) as resp:
                if resp.status == 200:
                    return
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            pass
        time.sleep(interval)
    raise TimeoutError(f"{url} did not become healthy within {timeout:.0f}s")


@dataclass
class LocalServer:
    """A started server: its process, the localhost port it serves on and its log file."""

    proc: subprocess.Popen
    port: int
    log_path: str

    @property
    def pid(self) -> int:
        return self.proc.pid

    @property
    def endpoint(self) -> str:
        """The OpenAI-compatible base URL."""
        return f"http://127.0.0.1:{self.port}/v1"

    @property
    def health_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/health"

    def alive(self) -> bool:
        return self.proc.poll() is None

    def wait_ready(self, timeout: float, interval: float = 0.5) -> None:
        """Until ``/health`` answers 200: TimeoutError after ``timeout`` seconds, RuntimeError when the server exits
        first (``wait_healthy``). A local port refuses at once until the server listens: a short ``interval`` costs
        nothing."""
        wait_healthy(self.health_url, timeout, is_alive=self.alive, interval=interval)

    def log_tail(self, chars: int = 2000) -> str:
        """The last ``chars`` characters of the server's log."""
        with open(self.log_path, "rb") as f:
            return f.read()[-chars:].decode(errors="replace")

    def stop(self) -> None:
        """SIGTERM to the server's process group, SIGKILL after ``STOP_SECONDS``; nothing when it has exited."""
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=STOP_SECONDS)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()


def start_server(
    cmd: list[str],
    *,
    port: int,
    log_path: str,
    env: dict[str, str] | None = None,
    cwd: str | None = None,
    keep: bool = False,
) -> LocalServer:
    """Start ``cmd`` (a server that listens on ``127.0.0.1:port``) with its output appended to ``log_path``, in a
    session of its own; unless ``keep``, it gets SIGTERM when this process ends, however it ends."""
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(
            cmd,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env=env,
            cwd=cwd,
            preexec_fn=None if keep else parent_death.preexec(signal.SIGTERM),
        )
    return LocalServer(proc, port, log_path)
