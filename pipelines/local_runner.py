"""Run the pipeline on this machine with kfp.local: same components, workspace folders for volumes.

What the terminal shows: a line when each step starts and when it ends (with its duration), what the steps
log (the trainer's progress lines among it), and the summary ``pipelines.run`` prints. kfp.local's own
bookkeeping, all of it known to be harmless here, is silenced where it comes from; ``verbose`` keeps it:

- its two warnings per step: display names do nothing locally, and the components image is not a Python
  image (with ``use_venv=False`` the steps import this package from this environment, which is the point);
- its log records (pipeline and task banners, each task's outputs): replaced by the step lines;
- the KFP executor's lines in each step's output (which module it loads, the whole ``executor_input`` JSON,
  where it wrote its output), kfp.local's separator lines and blank lines: dropped, exactly those;
- progress bars (tqdm, datasets, the Hub's): off, by their libraries' own environment switches.

Everything a run makes is found under ``<workspace>/runs/<run id>/``, where the run id is the one the steps
name their folders on the volumes with (``data/runs/<id>``, ``models/runs/<id>``)::

    reports/prepare_dataset.md   the data step's report (counts, lengths, examples)
    reports/evaluation.md        the evaluation report (numbers, training curve, answers side by side)
    reports/training_loss.png    the training curve from that report
    model      -> ../../models/runs/<id>/<last stage>/final   the tuned model (the last stage's)
    train      -> ../../models/runs/<id>/<last stage>         checkpoints, tensorboard/, metrics.json, serve.log
    cpt, dpo   -> ../../models/runs/<id>/cpt, .../dpo         the other stages' folders, when they ran
                                                              (the last stage's folder is train/ for sft)
    dataset    -> ../../data/runs/<id>/dataset            the prepared dataset
    kfp        -> ../../kfp/llm-finetune-<time>           kfp.local's own outputs for the run
    summary.json                                          what ``--summary-json`` writes
"""

from __future__ import annotations

import base64
import contextlib
import errno
import getpass
import io
import json
import logging
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import warnings
from pathlib import Path
from typing import Any

from kfp import local

from components.observe.process import PARENT_PID_ENV, STOP_GRACE_SECONDS
from components.settings import split_arguments
from components.version import COMPONENTS_IMAGE
from pipelines import PIPELINE_NAME
from pipelines.errors import write_failure
from pipelines.llm_finetune import build_pipeline

# Libraries' own switches for their progress bars: in a log of interleaved processes each redraw is a line.
QUIET_ENV = {"TQDM_DISABLE": "1", "HF_DATASETS_DISABLE_PROGRESS_BARS": "1", "HF_HUB_DISABLE_PROGRESS_BARS": "1"}
# kfp.local's warnings that say nothing about this run (messages as kfp 2.17 words them).
HARMLESS_WARNINGS = [
    (UserWarning, r"Task '[\w-]+': settings \['display_name'\] have no effect in the current local runner"),
    (
        RuntimeWarning,
        r"You may be attemping to run a task that uses custom or non-Python base image "
        + re.escape(f'"{COMPONENTS_IMAGE}"'),
    ),
]
# Below this, and below a twentieth of its size, a failed run's summary names the workspace's free bytes as the likely
# cause.
LOW_DISK_BYTES = 64 * 2**20
_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_EXECUTOR_LINE = re.compile(
    r"^\s*\[KFP Executor [^\]]*\]: (Looking for component|Loading KFP component|"
    r"Got executor_input:|Wrote executor output file to )"
)


def run_locally(params: dict, workspace: Path, verbose: bool = False) -> dict:
    """Run every step in subprocesses of this Python (kfp.local SubprocessRunner); return the summary.

    The summary has ``status``, ``run_id``, ``run_dir``, ``model_uri``, ``metrics``, ``passed``, ``reason``,
    ``endpoint``, ``smoke_reply``, ``latency`` (the pre-deploy check's figures), ``reports`` (name -> file),
    ``tensorboard``, ``server_log``, ``kfp_dir``, ``training`` (the trainer's metrics.json), ``keep_serving``,
    ``base_model``, ``wall_seconds`` and, where a server was kept, ``temp_dir`` (``RunTemp``); a failed step gives
    ``status: failed``, ``error`` and what exists of the rest, and SIGTERM or SIGINT while the steps run
    ``status: cancelled`` with ``signal`` (``Cancellation``).
    ``write_errors`` lists what could not be written (a full disk: ENOSPC, the file, the bytes free), and a failed run
    on a (nearly) full disk has ``disk``, which says so. ``verbose`` keeps every line kfp.local and the steps print.
    """
    started = time.time()
    steps = StepLines()
    summary: dict[str, Any]
    # RunTemp outside Cancellation: its folder goes once the steps are stopped.
    with RunTemp() as temp, Cancellation(steps) as cancel:
        try:
            workspace.mkdir(parents=True, exist_ok=True)
            # use_venv=False: the steps import this package from the current environment instead of pip-installing
            # it. kfp.local's own workspace (removed by kfp after a run that succeeds) in the run's temporary folder.
            local.init(
                runner=local.SubprocessRunner(use_venv=False),
                pipeline_root=str(workspace / "kfp"),
                workspace_root=temp.kfp_workspace(),
                raise_on_error=True,
            )
            # kfp.local runs a loop's iterations at once up to its parallelism: variants share this machine's cores.
            pipeline = build_pipeline("local", str(workspace), variants_parallel=params.get("variants_parallel", 1))
            with contextlib.ExitStack() as quiet:
                if not verbose:
                    quiet.enter_context(_quiet_kfp_local(steps))
                try:
                    outputs = pipeline(**split_arguments(params)).outputs
                except Exception:
                    steps.failed()
                    raise
        except Exception as e:  # a failed step (kfp.local's RuntimeError), a full disk under kfp.local's own files, ...
            summary = unfinished(e, cancel.signum, workspace)
        else:
            summary = {
                "status": "succeeded",
                "model_uri": outputs["model_uri"],
                "metrics": dict(outputs["metrics"].metadata),
                "passed": outputs["passed"],
                "reason": outputs["reason"],
                "endpoint": outputs["endpoint"],
                "smoke_reply": outputs["smoke_reply"],
            }
        # The server the deploy step kept running may still use the run's temporary folder.
        temp.keep = params["keep_serving"] and summary["status"] == "succeeded"
    summary.update(collect_run(workspace, started, summary.get("model_uri")))
    summary["keep_serving"] = params["keep_serving"]
    if temp.keep:
        summary["temp_dir"] = temp.path
    summary["base_model"] = params["model_name_or_path"]
    summary["wall_seconds"] = round(time.time() - started, 1)
    if summary["run_dir"]:
        path = Path(summary["run_dir"], "summary.json")
        try:
            path.write_text(json.dumps(summary, indent=2, ensure_ascii=False))
        except OSError as e:
            summary["write_errors"].append(write_failure(e, path))
    return summary


def unfinished(exc: Exception, signum: int | None, workspace: Path) -> dict:
    """The summary's status and error for a run that did not finish: ``cancelled`` when ``signum`` stopped it, else
    ``failed`` with what failed and, when the workspace's disk is (nearly) full, that it is."""
    if signum is not None:
        name = signal.Signals(signum).name
        return {
            "status": "cancelled",
            "signal": name,
            "error": f"cancelled by {name}: the steps that were running were stopped, and the trainer processes and "
            "servers they had started",
        }
    if isinstance(exc, RuntimeError):
        error = _ANSI.sub("", str(exc))
    elif isinstance(exc, OSError) and exc.errno == errno.ENOSPC:
        error = write_failure(exc, exc.filename or workspace)
    else:
        error = f"{type(exc).__name__}: {exc}"
    summary = {"status": "failed", "error": error}
    try:
        total, _, free = shutil.disk_usage(workspace)
    except OSError:
        return summary
    if free < min(LOW_DISK_BYTES, total // 20):
        summary["disk"] = (
            f"the workspace {workspace} is on a filesystem with {free} bytes free: No space left on device (ENOSPC) "
            "is the likely cause; free space there or choose another --workspace"
        )
    return summary


def collect_run(workspace: Path, started: float, model_uri: str | None) -> dict:
    """Gather the run's outputs under ``<workspace>/runs/<run id>/`` (see the module docstring); return where
    everything is. The run id comes from the model's path, or, for a run that failed before training ended,
    from the newest run folder a step made on the data volume since ``started``."""
    kfp_dir = _newest(workspace / "kfp", f"{PIPELINE_NAME}-*", started)
    run_id: str | None
    if model_uri:
        run_id = Path(model_uri).parents[1].name  # <workspace>/models/runs/<id>/train/final
    else:
        newest = _newest(workspace / "data" / "runs", "*", started)
        run_id = newest.name if newest else None
    found: dict[str, Any] = {
        "run_id": run_id,
        "run_dir": None,
        "kfp_dir": str(kfp_dir) if kfp_dir else None,
        "reports": {},
        "tensorboard": None,
        "mlflow": None,
        "server_log": None,
        "training": {},
        "latency": None,
        "write_errors": [],
    }
    if run_id is None:
        return found
    run_dir = workspace / "runs" / run_id
    reports = run_dir / "reports"
    if not _written(found, reports, reports.mkdir, parents=True, exist_ok=True):
        return found
    found["run_dir"] = str(run_dir)
    train = workspace / "models" / "runs" / run_id / "train"
    # The last stage's folder: its final model is the run's; the other stages' folders get links of their own.
    if model_uri:
        train = Path(model_uri).parent
    models = workspace / "models" / "runs" / run_id
    links = {
        "model": train / "final",
        "train": train,
        "dataset": workspace / "data" / "runs" / run_id / "dataset",
        "kfp": kfp_dir,
        **{stage: models / stage for stage in ("cpt", "dpo")},
    }
    for name, target in links.items():
        if target is not None and target.exists():
            link = run_dir / name
            if link.is_symlink():
                link.unlink()
            _written(found, link, link.symlink_to, os.path.relpath(target, run_dir))
    if kfp_dir is not None:
        # The comparison's report is the evaluation's when the run has no variants.
        for step, name in (("prepare-dataset", "prepare_dataset.md"), ("compare-variants", "evaluation.md")):
            source = kfp_dir / step / "report"
            if source.is_file() and _written(found, reports / name, shutil.copyfile, source, reports / name):
                found["reports"][name[:-3]] = str(reports / name)
    if "evaluation" in found["reports"]:
        png = embedded_png(Path(found["reports"]["evaluation"]).read_text(encoding="utf-8"))
        curve = reports / "training_loss.png"
        if png is not None and _written(found, curve, curve.write_bytes, png):
            found["reports"]["training_loss"] = str(curve)
    if (train / "tensorboard").is_dir():
        found["tensorboard"] = str(train / "tensorboard")
    if (workspace / "mlruns").is_dir():  # report_to mlflow: the train step's file store (components/train/component.py)
        found["mlflow"] = str(workspace / "mlruns")
    if (train / "serve.log").is_file():
        found["server_log"] = str(train / "serve.log")
    if (train / "metrics.json").is_file():
        found["training"] = json.loads((train / "metrics.json").read_text())
    deployed = kfp_dir / "deploy-model" / "executor_output.json" if kfp_dir is not None else None
    if deployed is not None and deployed.is_file():
        # The pre-deploy check's latency on the served model (components/deploy: time to first token, output tokens/s).
        served = json.loads(deployed.read_text()).get("parameterValues", {}).get("served") or [{}]
        found["latency"] = served[0].get("latency")
    return found


def _written(found: dict, path: Path, write, *args, **kwargs) -> bool:
    """``write(*args, **kwargs)``, which writes ``path``; False, and what failed in ``found["write_errors"]``, if it
    raised OSError: a full disk must not cost the run its summary."""
    try:
        write(*args, **kwargs)
    except OSError as e:
        found["write_errors"].append(write_failure(e, path))
        return False
    return True


def embedded_png(markdown: str) -> bytes | None:
    """The first base64 PNG embedded in a Markdown report (the evaluation report's training curve)."""
    # A PNG data URI (RFC 2397), as components/evaluate/curves.py writes it; importing curves for its prefix would
    # load matplotlib into this process before the first step starts.
    match = re.search(r"!\[[^\]]*\]\(data:image/png;base64,([A-Za-z0-9+/=]+)\)", markdown)
    return base64.b64decode(match.group(1)) if match else None


def _newest(folder: Path, pattern: str, since: float) -> Path | None:
    candidates = [p for p in folder.glob(pattern) if p.is_dir() and p.stat().st_mtime >= since - 1]
    return max(candidates, key=lambda p: p.stat().st_mtime, default=None)


class StepLines(logging.Filter):
    """kfp.local's log records, turned into one line when a step starts and one when it ends.

    kfp.local logs through the root logger (its own handler, re-created for every message); a filter on
    the root logger sees each record first. Its task banners become the step lines; its other records
    (pipeline banners, the outputs of each task) are dropped; anything else (warnings, errors) passes.
    """

    _started = re.compile(r"^Executing task '([\w-]+)'")
    _finished = re.compile(r"^Task '([\w-]+)' finished with status (\w+)")
    _dropped = re.compile(
        r"^(Running pipeline:|Streamed logs:|Task '[\w-]+' (outputs:|has no outputs)|"
        r"Pipeline '[\w-]+' finished with status SUCCESS)"
    )

    def __init__(self) -> None:
        super().__init__()
        self.running: dict[str, float] = {}
        self.cancelled = False  # set when the run is cancelled: a step that ends now was stopped, it did not fail

    def filter(self, record: logging.LogRecord) -> bool:
        message = _ANSI.sub("", record.getMessage())
        if m := self._started.match(message):
            self.running[m.group(1)] = time.time()
            self._print(f"{m.group(1)}: started")
            return False
        if m := self._finished.match(message):
            seconds = time.time() - self.running.pop(m.group(1), time.time())
            outcome = "succeeded in" if m.group(2) == "SUCCESS" else self._ended()
            self._print(f"{m.group(1)}: {outcome} {seconds:.1f}s")
            return False
        return not self._dropped.match(message)

    def failed(self) -> None:
        """kfp.local raises instead of logging a failed step (raise_on_error): say which one it was."""
        for task, since in self.running.items():
            self._print(f"{task}: {self._ended()} {time.time() - since:.1f}s")
        self.running.clear()

    def _ended(self) -> str:
        return "cancelled after" if self.cancelled else "FAILED after"

    @staticmethod
    def _print(line: str) -> None:
        print(f"{time.strftime('%H:%M:%S')} {line}", flush=True)


class RunTemp:
    """The run's temporary folder: what its steps, their torchrun agents, trainer ranks and servers write to the
    temporary folder goes there (``TMPDIR`` in their environment), and the folder goes when the run ends.

    Without it every local run left its leftovers in the user's temporary folder: a folder per step (kfp's
    lightweight components run ``mktemp -d``), one per torchrun agent (torch elastic's ``torchelastic_*`` log
    folder), the job's DeepSpeed file (components/train/trainer/parallelism.py), vLLM's sockets, and kfp.local's
    workspace after a failed run. On a cluster each pod's temporary folder ends with the pod; here the run is the pod.

    The exception: a server kept running after the run (``keep_serving``) may still use it, so then it stays
    (``keep``, set by the run; the summary's ``temp_dir``). torch's compile cache, which is meant to outlast runs,
    stays where torch keeps it by default (``TORCHINDUCTOR_CACHE_DIR``, unless the user set it): a new run compiles
    nothing again.
    """

    def __init__(self) -> None:
        self.keep = False
        self.path = ""
        self._saved: dict[str, str | None] = {}

    def __enter__(self) -> RunTemp:
        # 0700: this user's alone. A short name: vLLM's sockets are files in it, and a socket's path holds 107 bytes.
        self.path = tempfile.mkdtemp(prefix=f"{PIPELINE_NAME}-")
        self._saved = {name: os.environ.get(name) for name in ("TMPDIR", INDUCTOR_CACHE_ENV)}
        os.environ.setdefault(INDUCTOR_CACHE_ENV, inductor_cache_default())
        os.environ["TMPDIR"] = self.path
        return self

    def kfp_workspace(self) -> str:
        """kfp.local's workspace folder for this run (kfp.local makes one in the temporary folder otherwise)."""
        path = os.path.join(self.path, "kfp-workspace")
        os.makedirs(path, exist_ok=True)
        return path

    def __exit__(self, *exc) -> None:
        for name, value in self._saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        if self.keep:
            return
        # A process the run stopped may still be ending (a rank after its agent): what it writes now is not kept.
        shutil.rmtree(self.path, ignore_errors=True)


# torch's setting for where Inductor caches what it compiled, and its default (torch/_inductor/runtime/
# cache_dir_utils.py::default_cache_dir: the temporary folder, then "torchinductor_" and the user's name with
# the characters a path cannot hold replaced).
INDUCTOR_CACHE_ENV = "TORCHINDUCTOR_CACHE_DIR"


def inductor_cache_default() -> str:
    """Where torch keeps its Inductor cache when ``TORCHINDUCTOR_CACHE_DIR`` is not set, as torch computes it."""
    try:
        user = getpass.getuser()
    except (KeyError, OSError):  # a container's user with no passwd entry
        user = f"uid_{os.getuid()}"
    user = re.sub(r'[\\/:*?"<>|]', "_", user)
    return os.path.join(tempfile.gettempdir(), f"torchinductor_{user}")


class Cancellation:
    """While a local run's steps run, SIGTERM and SIGINT stop them and the run ends ``cancelled`` (``signum``).

    The handler records the signal and starts a thread that signals the steps kfp.local started (``step_pids``):
    SIGTERM at once (each step unwinds and stops the torchrun or server it started:
    components/observe/process.py), SIGKILL to any still there ``STOP_GRACE_SECONDS`` later or at a second signal. A
    step started meanwhile is stopped the same way. kfp.local then sees a step fail and raises, and the run ends as a
    failed one does, summary and all. The handler raises nothing itself: an exception there would leave kfp.local in
    its ``subprocess.Popen`` block, whose exit waits for the step's process without a limit.

    It also names this process in the steps' environment (``PARENT_PID_ENV``): each step ends when this process
    ends, SIGKILL included (components/observe/process.py). Signal handlers need the main thread: from another, only
    the environment is set.
    """

    def __init__(self, steps: StepLines):
        self.steps = steps
        self.signum: int | None = None
        self._pid = os.getpid()
        self._force = False
        self._done = threading.Event()
        self._saved: dict[int, Any] = {}

    def __enter__(self) -> Cancellation:
        self._saved_env = os.environ.get(PARENT_PID_ENV)
        os.environ[PARENT_PID_ENV] = str(self._pid)
        if threading.current_thread() is threading.main_thread():
            for signum in (signal.SIGTERM, signal.SIGINT):
                self._saved[signum] = signal.signal(signum, self._handle)
        return self

    def __exit__(self, *exc) -> None:
        for signum, previous in self._saved.items():
            signal.signal(signum, signal.SIG_DFL if previous is None else previous)
        self._done.set()
        if self._saved_env is None:
            os.environ.pop(PARENT_PID_ENV, None)
        else:
            os.environ[PARENT_PID_ENV] = self._saved_env

    def _handle(self, signum, frame) -> None:
        if self.signum is not None:
            self._force = True  # a second signal: no more grace
            return
        self.signum = signum
        self.steps.cancelled = True
        print(
            f"{time.strftime('%H:%M:%S')} {signal.Signals(signum).name}: stopping the running steps "
            f"(a second signal kills them at once)",
            file=sys.stderr,
            flush=True,
        )
        threading.Thread(target=self._stop_steps, name="stop-steps", daemon=True).start()

    def _stop_steps(self) -> None:
        signalled: dict[int, float] = {}
        while True:
            now = time.monotonic()
            for pid in step_pids(self._pid):
                if pid not in signalled:
                    signalled[pid] = now
                    _send(pid, signal.SIGTERM)
                elif self._force or now - signalled[pid] >= STOP_GRACE_SECONDS:
                    _send(pid, signal.SIGKILL)
            if self._done.wait(0.2):
                return


def step_pids(pid: int) -> list[int]:
    """The steps' processes of the CLI ``pid``. kfp.local starts each step as ``sh -ec '...; python3 -m
    kfp.dsl.executor_main ...'``, the step's Python a child of that shell: a signal to the shell would end the shell
    alone and leave the step running. A shell that has not started its step yet is the step."""
    return [step for shell in child_pids(pid) for step in child_pids(shell) or [shell]]


def child_pids(pid: int) -> list[int]:
    """The live processes whose parent is ``pid``: from /proc (Linux), else from ``ps``."""
    proc = Path("/proc")
    if not (proc / "self" / "stat").exists():
        listed = subprocess.run(["ps", "-A", "-o", "pid=,ppid="], capture_output=True, text=True).stdout.split()
        return [int(c) for c, p in zip(listed[::2], listed[1::2], strict=True) if int(p) == pid]
    found = []
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            # pid (comm) state ppid ...: comm may hold spaces and parentheses, the last ")" ends it.
            state, ppid = (entry / "stat").read_text().rsplit(")", 1)[1].split()[:2]
        except (OSError, ValueError):
            continue
        if int(ppid) == pid and state != "Z":
            found.append(int(entry.name))
    return found


def _send(pid: int, signum: int) -> None:
    try:
        os.kill(pid, signum)
    except ProcessLookupError:
        pass


class ExecutorLineFilter(io.TextIOBase):
    """A stdout that drops, line by line, the KFP executor's bookkeeping in each step's streamed output
    (kfp.local prints it through ``print``, indented), kfp.local's separator lines and blank lines;
    every other line goes through unchanged."""

    def __init__(self, out):
        self.out = out
        self._partial = ""
        self._in_json = None  # the indentation of the executor_input JSON being skipped
        self._rule = "-" * shutil.get_terminal_size(fallback=(80, 24)).columns  # kfp.local's separator

    @property
    def encoding(self):
        return self.out.encoding

    def writable(self) -> bool:
        return True

    def write(self, text: str) -> int:
        self._partial += text
        *lines, self._partial = self._partial.split("\n")
        for line in lines:
            if self._keep(line):
                self.out.write(line + "\n")
        return len(text)

    def flush(self) -> None:
        self.out.flush()

    def close_partial(self) -> None:
        if self._partial and self._keep(self._partial):
            self.out.write(self._partial)
        self._partial = ""

    def _keep(self, line: str) -> bool:
        if self._in_json is not None:
            # json.dumps(indent=4) ends with the only "}" at the JSON's own indentation.
            if line == self._in_json + "}":
                self._in_json = None
            return False
        if match := _EXECUTOR_LINE.match(line):
            if match.group(1) == "Got executor_input:":
                self._in_json = line[: len(line) - len(line.lstrip())]
            return False
        return bool(line.strip()) and line != self._rule


@contextlib.contextmanager
def _quiet_kfp_local(steps: StepLines):
    """Silence kfp.local's harmless output for the duration of a run (see the module docstring)."""
    root = logging.getLogger()
    stdout = ExecutorLineFilter(sys.stdout)
    saved_env = {k: os.environ.get(k) for k in QUIET_ENV}
    os.environ.update(QUIET_ENV)
    root.addFilter(steps)
    try:
        with warnings.catch_warnings(), contextlib.redirect_stdout(stdout):
            for category, message in HARMLESS_WARNINGS:
                warnings.filterwarnings("ignore", message=message, category=category)
            try:
                yield
            finally:
                stdout.close_partial()
                stdout.flush()
    finally:
        root.removeFilter(steps)
        for key, value in saved_env.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
