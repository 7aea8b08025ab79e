"""Running the trainer from a benchmark (benchmarks/moe_layer_bench.py): each run a process tree with its output in
a log, ended on time or as soon as its figures are in, killed whole (torchrun starts its ranks in process groups of
their own); the children's environment; what the GPU is and how much of its memory was used; the versions run."""

from __future__ import annotations

import importlib.metadata
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import IO

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from components.models.mfu import PEAK_BF16_FLOPS  # noqa: E402

RUNNING: set[int] = set()  # the child processes running now (stop() kills them)


class GpuMemory:
    """The most GPU memory in use (MiB, every process) while it runs, sampled by ``nvidia-smi`` every 200 ms."""

    def __init__(self) -> None:
        self.peak_mib: float | None = None
        self._proc: subprocess.Popen | None = None
        self._thread: threading.Thread | None = None

    def __enter__(self) -> GpuMemory:
        if shutil.which("nvidia-smi"):
            cmd = ["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits", "-lms", "200"]
            self._proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
            self._thread = threading.Thread(target=self._read, args=(self._proc.stdout,), daemon=True)
            self._thread.start()
        return self

    def _read(self, stream: IO[str]) -> None:
        for line in stream:
            try:
                used = float(line.split(",")[0])
            except ValueError:
                continue
            self.peak_mib = used if self.peak_mib is None else max(self.peak_mib, used)

    def __exit__(self, *exc) -> None:
        if self._proc:
            self._proc.terminate()
            self._proc.wait()
        if self._thread:
            self._thread.join(timeout=5)


def kill_tree(pid: int) -> None:
    """SIGKILL ``pid`` and every process below it. Not SIGTERM: the trainer answers that by saving a checkpoint
    (fp32 master weights and Adam's moments), and torchrun starts its ranks in process groups of their own."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            parent = int(stat.read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        children.setdefault(parent, []).append(int(stat.parent.name))
    tree, todo = [], [pid]
    while todo:
        tree.append(todo.pop())
        todo += children.get(tree[-1], [])
    for p in tree:
        try:
            os.kill(p, signal.SIGKILL)
        except ProcessLookupError:
            pass


def run_logged(
    cmd: list[str], log: Path, timeout: float, env: dict[str, str], until: re.Pattern | None = None
) -> tuple[int | None, float]:
    """Run ``cmd`` with its output in ``log``; ``(exit status, or None when it ran out of time, seconds)``. Out of
    time, it is killed with every process it started (torchrun and its rank). With ``until``, it is also ended
    (exit status 0) as soon as its output matches: the figures are in by then, and what the trainer does after
    its last step (one evaluation pass, the export of the whole model) would take a lever's time for nothing."""
    started = time.monotonic()
    deadline = started + max(timeout, 1)
    with open(log, "w") as out:
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT)
        RUNNING.add(proc.pid)
        code: int | None = None
        try:
            while (code := proc.poll()) is None and time.monotonic() < deadline:
                if until is not None and until.search(log.read_text(errors="replace")):
                    kill_tree(proc.pid)
                    proc.wait()
                    code = 0
                    break
                time.sleep(0.5)
            if code is None:
                kill_tree(proc.pid)
                proc.wait()
        finally:
            RUNNING.discard(proc.pid)
    return code, time.monotonic() - started


def stop(signum, frame) -> None:
    """SIGTERM/SIGINT (a ``timeout`` around this script): no trainer left behind holding the GPU."""
    for pid in list(RUNNING):
        kill_tree(pid)
    sys.exit(128 + signum)


def child_env(workdir: Path, gpu: bool) -> dict[str, str]:
    """The trainer's environment: this checkout importable, no network, no metrics port, caches in ``workdir``."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)
    env.update(
        HF_HOME=str(workdir / "hf-home"),
        HF_HUB_OFFLINE="1",
        TOKENIZERS_PARALLELISM="false",
        PYTHONUNBUFFERED="1",
        OMP_NUM_THREADS=str(8 if gpu else max(1, os.cpu_count() or 1)),
    )
    env.pop("TRAINER_METRICS_PORT", None)
    return env


def error_of(text: str, code: int | None) -> str:
    """One line on why a run failed, from its output."""
    if code is None:
        return "stopped: out of time (--lever-timeout or --budget-seconds)"
    if "out of memory" in text.lower():
        return "CUDA out of memory"
    lines = [ln.strip() for ln in text.splitlines() if re.search(r"(Error|Exception)\b", ln) and "Traceback" not in ln]
    last = lines[-1] if lines else (text.strip().splitlines() or ["no output"])[-1]
    return f"exit {code}: {last[:300]}"


def gpu_device() -> dict | None:
    """The GPU's name, memory and driver from nvidia-smi, or None where there is none."""
    if not shutil.which("nvidia-smi"):
        return None
    query = ["nvidia-smi", "--query-gpu=name,memory.total,driver_version", "--format=csv,noheader,nounits"]
    try:
        first = subprocess.run(query, capture_output=True, text=True, timeout=30, check=True).stdout.splitlines()[0]
    except (subprocess.SubprocessError, IndexError):
        return None
    name, memory, driver = (x.strip() for x in first.split(","))
    peak = next((flops for key, flops in PEAK_BF16_FLOPS.items() if key in name), None)
    return {"name": name, "memory_gib": round(float(memory) / 1024, 1), "driver": driver, "peak_bf16_flops": peak}


def versions() -> dict[str, str]:
    """The versions of what the trainer runs on, read without importing them."""
    out = {"python": sys.version.split()[0]}
    for name in ("torch", "transformers", "deepspeed", "accelerate", "datasets", "liger-kernel", "flash-attn"):
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            out[name] = "none"
    return out
