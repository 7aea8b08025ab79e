"""Every KFP step's process skips CPython's final garbage collection at exit: each component body starts with
``start_step`` (components/observe/process.py) or, for the bookkeeping steps that log nothing, with
``freeze_heap_at_exit`` itself. The package no longer does it on import: a library user's process keeps its exit."""

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
STARTS = {"start_step", "freeze_heap_at_exit"}
# Written by `python -m pipelines.compile` from the settings model (pipelines/derive.py), which it would overwrite.
GENERATED = {"components/validate/component.py"}


def _first_call(body: list[ast.stmt]) -> str:
    """The name of the first function the body calls, after its docstring and imports."""
    for node in body:
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant):
            continue  # the docstring
        if isinstance(node, ast.Import | ast.ImportFrom):
            continue
        call = node.value if isinstance(node, ast.Expr | ast.Assign) else None
        if isinstance(call, ast.Call) and isinstance(call.func, ast.Name):
            return call.func.id
        return ast.unparse(node).splitlines()[0]
    return ""


def test_every_component_body_starts_its_process_first():
    late = []
    for path in sorted((ROOT / "components").glob("*/component.py")):
        if str(path.relative_to(ROOT)) in GENERATED:
            continue
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.FunctionDef) and any("component" in ast.unparse(d) for d in node.decorator_list):
                if _first_call(node.body) not in STARTS:
                    late.append(f"{path.relative_to(ROOT)}::{node.name}: {_first_call(node.body)}")
    assert late == [], "call start_step (or freeze_heap_at_exit) before anything else"


def test_a_started_step_freezes_its_heap_at_exit_and_logs_with_time_and_name():
    count_at_exit = "import atexit, gc; atexit.register(lambda: print('frozen', gc.get_freeze_count(), flush=True))"
    start = "from components.observe.process import start_step; start_step('a_step').info('hello')"
    done = subprocess.run(
        [sys.executable, "-c", f"{count_at_exit}; {start}"], capture_output=True, text=True, cwd=ROOT, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert int(done.stdout.split("frozen ")[1].split()[0]) > 1000
    assert done.stderr.rstrip().endswith(" a_step: hello")
    imported = subprocess.run(
        [sys.executable, "-c", f"{count_at_exit}; import components.observe.process"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
    )
    assert int(imported.stdout.split("frozen ")[1].split()[0]) == 0  # importing changes nothing
