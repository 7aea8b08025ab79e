"""A local run ends everything it starts and says what happened, however it ends: killed (SIGKILL to its process
group: no trainer rank, step or server outlives it), stopped (SIGTERM, SIGINT: its steps and servers stop, a
``cancelled`` summary, exit 143/130 as a shell reports them), out of disk space (a failed summary that says ENOSPC,
where, and the bytes free), or given a file for its workspace (one line, exit 2). The trainer's metrics port is
taken by the trainer itself: nothing can take it between a check and the trainer's bind.

Each slow test runs ``python -m pipelines.run`` for real up to the moment it signals, in a session of its own (the
run's process group is its own; the test's is not in it), and looks for what is left in /proc: every process of a
run names its workspace on its command line (the steps' executor input, torchrun's and the ranks' config, the
server's model).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from pipelines.local_runner import inductor_cache_default
from tests.helpers.repo import ROOT, in_ci, run_cli

# Every slow test trains 2 optimizer steps where it trains at all; the machine's other work sets how long that takes.
SHORT = ("-p", "max_steps=2")
NO_METRICS = ("-p", "metrics_port=0")  # a test about something else does not hold a port another test may want
STEP_TIMEOUT = 900  # seconds a test waits for a step to start or end (measured: 20-60 s each on 2 busy cores)
STOP_TIMEOUT = 120  # seconds a cancelled run has to end (its grace period is 30 s)
GONE_TIMEOUT = 20  # seconds the run's processes have to go after the run's own process has ended


def processes_naming(text: str) -> dict[int, str]:
    """The live (not zombie) processes whose command line contains ``text``: pid -> command line."""
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if text in cmdline and state != "Z" and int(entry.name) != os.getpid():
            found[int(entry.name)] = cmdline[:400]
    return found


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("", 0))
        return s.getsockname()[1]


class LocalRun:
    """``python -m pipelines.run --workspace <tmp>/ws --summary-json <tmp>/summary.json ARGS`` in a session of its
    own, its output collected as it comes. Leaving the block kills whatever of the run is left (a failing test
    leaves nothing training behind)."""

    def __init__(self, tmp_path: Path, *args: str, prefix: tuple[str, ...] = ()):
        self.workspace = tmp_path / "ws"
        self.summary_path = tmp_path / "summary.json"
        self.user_tmp = tmp_path / "tmp"  # the user's temporary folder (TMPDIR)
        self.user_tmp.mkdir()
        self.lines: list[str] = []
        self.proc = subprocess.Popen(
            [
                *prefix,
                sys.executable,
                "-m",
                "pipelines.run",
                "--workspace",
                str(self.workspace),
                "--summary-json",
                str(self.summary_path),
                *args,
            ],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
            env={**os.environ, "TMPDIR": str(self.user_tmp)},
        )
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line)

    @property
    def output(self) -> str:
        return "".join(self.lines)

    def processes(self) -> dict[int, str]:
        return processes_naming(str(self.workspace))

    def wait_for(self, ready, what: str, timeout: float = STEP_TIMEOUT) -> None:
        deadline = time.monotonic() + timeout
        while not ready():
            if self.proc.poll() is not None:
                self._reader.join(5)
                pytest.fail(f"the run ended (exit {self.proc.returncode}) before {what}:\n{self.output[-4000:]}")
            if time.monotonic() > deadline:
                pytest.fail(f"no {what} after {timeout}s:\n{self.output[-4000:]}")
            time.sleep(0.05)

    def finish(self, timeout: float = STOP_TIMEOUT) -> int:
        try:
            code = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            pytest.fail(f"the run did not end {timeout}s after it was signalled:\n{self.output[-4000:]}")
        self._reader.join(10)
        return code

    def left_behind(self, timeout: float = GONE_TIMEOUT) -> dict[int, str]:
        """What of the run is still alive ``timeout`` seconds from now (or as soon as nothing is)."""
        deadline = time.monotonic() + timeout
        while (left := self.processes()) and time.monotonic() < deadline:
            time.sleep(0.1)
        return left

    def summary(self) -> dict:
        return json.loads(self.summary_path.read_text())

    def temp_left(self) -> set[str]:
        """What the run left in the user's temporary folder, torch's compile cache (meant to stay) aside."""
        return {p.name for p in self.user_tmp.iterdir()} - {Path(inductor_cache_default()).name}

    def __enter__(self) -> LocalRun:
        return self

    def __exit__(self, *exc) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        for pid in self.processes():
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def trainer_ranks(run: LocalRun) -> dict[int, str]:
    """The trainer's rank processes (torchrun's workers), not torchrun itself."""
    return {
        pid: cmd
        for pid, cmd in run.processes().items()
        if "components.train.trainer" in cmd and "torch.distributed.run" not in cmd
    }


@pytest.mark.slow  # a real local run into training (20-60 s)
def test_killing_the_runs_process_group_during_training_leaves_no_process(tmp_path):
    # kill -KILL -- -PGID: the CLI and its steps can do nothing about it, and torchrun starts its ranks in sessions of
    # their own. Killed as soon as the ranks exist: still importing, before any request of their own to end with
    # torchrun, and before a first line of output could fail on a closed pipe and end them by chance.
    with LocalRun(tmp_path, *NO_METRICS) as run:
        run.wait_for(lambda: len(trainer_ranks(run)) == 2, "two trainer ranks")
        os.killpg(run.proc.pid, signal.SIGKILL)
        assert run.finish() == -signal.SIGKILL
        left = run.left_behind()
    assert left == {}, left


@pytest.mark.slow  # a real local run of 2 training steps, into evaluation (40-120 s)
def test_a_metrics_port_taken_while_training_costs_nothing_and_sigterm_during_evaluation_cancels_the_run(tmp_path):
    """Two faults of one run (two runs before; issue 38, CI's time). Another local run takes the metrics port after
    this run's train step started and before its trainer binds it (15-30 s on a laptop): the trainer serves its
    metrics on another port instead of failing the run. Then SIGTERM to the CLI during evaluation stops the step and
    writes a cancelled summary."""
    port = free_port()
    with LocalRun(tmp_path, "-p", f"metrics_port={port}", *SHORT) as run:
        run.wait_for(lambda: "torch.distributed.run" in run.output, "torchrun's command line")
        with socket.socket() as other:
            other.bind(("", port))
            other.listen()
            run.wait_for(
                lambda: re.search(r"train-model: (succeeded|FAILED)", run.output) is not None, "the train step's end"
            )
        assert "train-model: succeeded" in run.output, run.output[-4000:]
        served = re.findall(r"metrics at http://localhost:(\d+)/metrics", run.output)
        assert served and int(served[0]) != port, run.output[-4000:]
        assert f"metrics_port {port} is taken" in run.output
        run.wait_for(lambda: "evaluate-model: started" in run.output, "the evaluate step")
        time.sleep(1)  # into the step's work
        os.kill(run.proc.pid, signal.SIGTERM)  # the CLI's own process only, as `kill <pid>` sends it
        code = run.finish()
        left = run.left_behind()
    assert code == 128 + signal.SIGTERM, run.output[-4000:]
    assert left == {}, left
    s = run.summary()
    assert s["status"] == "cancelled" and s["signal"] == "SIGTERM", s
    assert "SIGTERM" in s["error"] and s["run_id"] and s["wall_seconds"] > 0
    assert json.loads(Path(s["run_dir"], "summary.json").read_text())["status"] == "cancelled"
    assert "evaluate-model: cancelled after " in run.output
    assert "status:      cancelled (SIGTERM) after " in run.output, run.output[-3000:]
    assert run.temp_left() == set()  # the steps' temporary files went with the run (pipelines/local_runner.py::RunTemp)


@pytest.mark.slow  # a real local run of 2 training steps, into deployment (45-140 s)
def test_sigterm_to_the_group_during_deployment_stops_the_local_server(tmp_path):
    # As `timeout 200 python -m pipelines.run` does: SIGTERM to the command's whole process group; the server runs in
    # a session of its own (a kept server outlives the step), so the group's signal never reaches it.
    with LocalRun(tmp_path, *NO_METRICS, *SHORT) as run:
        run.wait_for(lambda: "deploy-model: started" in run.output, "the deploy step")
        run.wait_for(lambda: any(" serve " in cmd for cmd in run.processes().values()), "the local server")
        os.killpg(run.proc.pid, signal.SIGTERM)
        code = run.finish()
        left = run.left_behind()
    assert left == {}, left
    assert code == 128 + signal.SIGTERM, run.output[-4000:]
    assert run.summary()["status"] == "cancelled"
    assert run.temp_left() == set()


@pytest.mark.slow  # a real local run into its data step (5-20 s)
def test_sigint_during_data_preparation_is_a_cancelled_run_with_exit_130(tmp_path):
    # Ctrl-C in a terminal reaches the whole foreground group; SIGINT to the CLI alone must do as much.
    with LocalRun(tmp_path, *NO_METRICS) as run:
        run.wait_for(lambda: "prepare-dataset: started" in run.output, "the data step")
        time.sleep(1)
        os.kill(run.proc.pid, signal.SIGINT)
        code = run.finish()
        left = run.left_behind()
    assert code == 128 + signal.SIGINT, run.output[-4000:]
    assert left == {}, left
    s = run.summary()
    assert s["status"] == "cancelled" and s["signal"] == "SIGINT", s
    assert "Traceback" not in run.output, run.output[-4000:]
    assert run.temp_left() == set()


def _tmpfs_unavailable() -> str | None:
    if os.geteuid() != 0:
        return "a full disk is a tmpfs mounted in a private mount namespace: that needs root"
    if shutil.which("unshare") is None:
        return "a full disk is a tmpfs mounted in a private mount namespace: that needs util-linux `unshare`"
    probe = subprocess.run(
        ["unshare", "--mount", "--propagation", "private", "mount", "-t", "tmpfs", "tmpfs", "/mnt"],
        capture_output=True,
        text=True,
    )
    if probe.returncode != 0:
        return f"`unshare` cannot mount a tmpfs in a mount namespace here: {probe.stderr.strip()}"
    return None


# The workspace's size: the data step's cache and dataset fit (5.2 MB, the tiny model among them), the trainer's
# first checkpoint (13 MB with its optimizer state) does not.
FULL_DISK = "12m"


@pytest.mark.slow  # a real local run on a 12 MB workspace, until its trainer fills it (30-90 s)
def test_a_full_disk_fails_the_run_with_a_summary_that_says_enospc_where_and_how_much_is_free(tmp_path):
    if why := _tmpfs_unavailable():
        if in_ci():
            pytest.fail(why)
        pytest.skip(why)
    (tmp_path / "ws").mkdir()
    # The workspace is a tmpfs of its own, in a mount namespace that ends with the run; the summary file is outside.
    mount = ["unshare", "--mount", "--propagation", "private", "sh", "-c"]
    script = f'mount -t tmpfs -o size={FULL_DISK} tmpfs "$0" && exec "$@"'
    with LocalRun(tmp_path, *NO_METRICS, *SHORT, prefix=(*mount, script, str(tmp_path / "ws"))) as run:
        code = run.finish(STEP_TIMEOUT)
    out = run.output
    assert code == 1, out[-4000:]
    assert "=== llm-finetune (local) ===" in out and "Traceback (most recent call last)" not in out.split("===")[-1]
    assert "train-model: FAILED after " in out, out[-4000:]  # the trainer's checkpoint is what does not fit
    s = run.summary()
    assert s["status"] == "failed", s
    # What the CLI could not write itself: each file, ENOSPC, and the bytes free (0 by then).
    assert any("ENOSPC" in e and str(tmp_path / "ws") in e and "bytes free" in e for e in s["write_errors"]), s
    assert "not written: could not write " in out
    disk = s.get("disk", "")
    assert "No space left on device" in disk and "bytes free" in disk and str(tmp_path / "ws") in disk, s
    assert f"disk:        {disk}" in out
    # The trainer's own words for it (torch: 'basic_ios::clear: iostream error') come with the cause.
    assert "ENOSPC" in out, out[-4000:]


def test_a_workspace_that_is_a_file_is_one_line_naming_the_setting_and_exit_2(tmp_path):
    taken = tmp_path / "workspace"
    taken.write_text("not a folder")
    result = run_cli("pipelines.run", "--workspace", str(taken))
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: --workspace {taken}"), result.stderr
    assert "is a file" in lines[0] and "--workspace DIR" in lines[0], lines[0]
