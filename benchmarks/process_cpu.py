"""Where a test run's CPU goes, by process: each Python process of a virtualenv logs its own CPU time when it exits.

    python benchmarks/process_cpu.py install .venv /tmp/procs.jsonl   # a .pth hook in the venv's site-packages
    CI=true bash .ci/run                                               # or any run of that venv's python
    python benchmarks/process_cpu.py report /tmp/procs.jsonl [--tests 30]
    python benchmarks/process_cpu.py uninstall .venv

The hook (``hook.py`` below, imported by a ``.pth`` file at every interpreter start) appends one JSON line per process
at exit: its pid and parent's, wall seconds since it started, its own user + system CPU seconds, those of the
children it waited for, the test that was running (``PYTEST_CURRENT_TEST``, which pytest-xdist's workers set and
subprocesses inherit) and its first arguments. ``report`` sums them by kind of process (trainer ranks, kfp.local
steps, torchrun agents, ...) and by test. docs/development.md ("Test tiers") has what it measured in CI.

What it cannot see: a process killed by a signal or ended with ``os._exit`` runs no atexit handler (a killed rank,
a stopped server), one started with ``-S`` or ``-I`` skips ``.pth`` files, and another venv's interpreters (the
serving image's vLLM) have no hook. For those, process accounting (``accton``, ``sa``) counts every process by name.
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict
from pathlib import Path

HOOK_MODULE = "_process_cpu_hook"
PTH_FILE = "zz_process_cpu.pth"  # a late name: the other .pth files (setuptools' editable finder) have run before it
HOOK = '''"""benchmarks/process_cpu.py's hook: this process's CPU time, appended to {log!r} when it exits."""
import atexit, json, os, sys, time

_started = time.time()


def _log():
    t = os.times()
    record = {{
        "pid": os.getpid(),
        "ppid": os.getppid(),
        "wall": round(time.time() - _started, 2),
        "cpu": round(t.user + t.system, 2),
        "children_cpu": round(t.children_user + t.children_system, 2),
        "test": os.environ.get("PYTEST_CURRENT_TEST", ""),
        "argv": sys.argv[:6],
    }}
    with open({log!r}, "a") as f:
        f.write(json.dumps(record) + "\\n")


atexit.register(_log)
'''

# Kinds of process, by what their arguments contain, first match wins.
KINDS = (
    ("trainer rank", "components/train/trainer/__main__.py"),
    ("torchrun agent", "torch.distributed.run"),
    ("kfp.local step", "kfp/dsl/executor_main.py"),
    ("pipelines.run", "pipelines/run.py"),
)


def site_packages(venv: Path) -> Path:
    """The venv's site-packages folder."""
    found = sorted(venv.glob("lib/python3*/site-packages"))
    if not found:
        raise SystemExit(f"error: {venv} has no lib/python3*/site-packages: name a virtualenv's folder")
    return found[0]


def install(venv: Path, log: Path) -> None:
    """Write the hook and the ``.pth`` that imports it into ``venv``."""
    site = site_packages(venv)
    (site / f"{HOOK_MODULE}.py").write_text(HOOK.format(log=str(log.resolve())))
    (site / PTH_FILE).write_text(f"import {HOOK_MODULE}\n")


def uninstall(venv: Path) -> None:
    """Remove what ``install`` wrote, and the hook's bytecode the venv's processes wrote (``__pycache__`` too where
    nothing else is left in it)."""
    site = site_packages(venv)
    for name in (f"{HOOK_MODULE}.py", PTH_FILE):
        (site / name).unlink(missing_ok=True)
    cache = site / "__pycache__"
    for compiled in cache.glob(f"{HOOK_MODULE}.*.pyc"):
        compiled.unlink()
    if cache.is_dir() and not any(cache.iterdir()):
        cache.rmdir()


def kind(argv: list[str]) -> str:
    """A process's kind (``KINDS``), else its program's file name and first argument."""
    joined = " ".join(argv)
    for name, marker in KINDS:
        if marker in joined:
            return name
    return " ".join([Path(argv[0]).name if argv else "?", *argv[1:2]])


def read(log: Path) -> list[dict]:
    """The log's records."""
    return [json.loads(line) for line in log.read_text().splitlines() if line.strip()]


def summary(records: list[dict]) -> dict:
    """CPU seconds and processes by kind and by test (its node id without the phase or the xdist group)."""
    by_kind: dict[str, list] = defaultdict(lambda: [0, 0.0])
    by_test: dict[str, list] = defaultdict(lambda: [0, 0.0, 0, 0.0])
    for r in records:
        k = kind(r["argv"])
        by_kind[k][0] += 1
        by_kind[k][1] += r["cpu"]
        test = r["test"].split(" (")[0].split("@")[0]
        row = by_test[test]
        row[0] += 1
        row[1] += r["cpu"]
        if k == "trainer rank":
            row[2] += 1
            row[3] += r["cpu"]
    return {"processes": len(records), "cpu": sum(r["cpu"] for r in records), "kinds": by_kind, "tests": by_test}


def report(log: Path, tests: int) -> str:
    """The summary as text: the kinds, then the ``tests`` costliest tests."""
    s = summary(read(log))
    lines = [f"{s['processes']} processes, {s['cpu']:.0f} CPU-s", "", "CPU-s  processes  per process  kind"]
    for name, (n, cpu) in sorted(s["kinds"].items(), key=lambda kv: -kv[1][1]):
        lines.append(f"{cpu:6.0f} {n:10d} {cpu / n:12.1f}  {name}")
    lines += ["", "CPU-s  processes  (ranks  rank CPU-s)  test"]
    for test, (n, cpu, ranks, rank_cpu) in sorted(s["tests"].items(), key=lambda kv: -kv[1][1])[:tests]:
        lines.append(f"{cpu:6.0f} {n:10d}  ({ranks:5d} {rank_cpu:10.0f})  {test or '(outside a test)'}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="command", required=True)
    i = sub.add_parser("install", help="add the hook to a venv")
    i.add_argument("venv", type=Path)
    i.add_argument("log", type=Path, help="the JSON-lines file every process appends to")
    u = sub.add_parser("uninstall", help="remove the hook from a venv")
    u.add_argument("venv", type=Path)
    r = sub.add_parser("report", help="sum a log by kind of process and by test")
    r.add_argument("log", type=Path)
    r.add_argument("--tests", type=int, default=30, help="how many of the costliest tests to list")
    args = p.parse_args(argv)
    if args.command == "install":
        install(args.venv, args.log)
    elif args.command == "uninstall":
        uninstall(args.venv)
    else:
        print(report(args.log, args.tests))


if __name__ == "__main__":
    main()
