"""A process that imports the package skips CPython's final garbage collection at exit (components/__init__.py);
``python -m components.quick_exit MODULE`` gives the same to a program the package does not own (torchrun,
``transformers serve``)."""

import json
import os
import subprocess
import sys
from pathlib import Path

from components import quick_exit

ROOT = Path(__file__).resolve().parents[1]
# An atexit handler registered before the package is imported runs after the package's own (last in, first out):
# it sees what the package's handler left.
FREEZE_COUNT_AT_EXIT = "import atexit, gc; atexit.register(lambda: print('frozen', gc.get_freeze_count(), flush=True))"


def _python(*args: str, stdin: str = "") -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *args], input=stdin, capture_output=True, text=True, cwd=ROOT, timeout=120)


def _frozen_at_exit(out: str) -> int:
    return int(out.split("frozen ")[1].split()[0])


def test_the_entry_points_freeze_the_heap_at_exit_and_importing_the_package_does_not():
    """A library user's process keeps CPython's own exit; the package's programs skip the last collections."""
    imported = f"{FREEZE_COUNT_AT_EXIT}; import components.models.shape"
    assert _frozen_at_exit(_python("-c", imported).stdout) == 0  # what CPython does without it
    frozen = f"{FREEZE_COUNT_AT_EXIT}; from components.quick_exit import freeze_heap_at_exit; freeze_heap_at_exit()"
    assert _frozen_at_exit(_python("-c", frozen).stdout) > 1000


def test_quick_exit_runs_the_module_with_its_arguments_as_python_m_does():
    done = _python("-m", "components.quick_exit", "json.tool", "--sort-keys", stdin='{"b": 1, "a": 2}')
    assert done.returncode == 0, done.stderr
    assert done.stdout == json.dumps({"a": 2, "b": 1}, indent=4) + "\n"
    failed = _python("-m", "components.quick_exit", "json.tool", "--no-such-option")
    assert failed.returncode == 2 and "usage: python -m json.tool" in failed.stderr  # the module's own exit code


def test_quick_exit_loads_the_modules_packages_without_collecting_and_runs_it_collecting(tmp_path):
    """The packages run_module imports first (torch for torchrun) load with the collector paused; the module itself
    runs with it on again, those packages' objects frozen, and without runpy's warning about a module imported
    twice (its own code runs once, as __main__)."""
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("import gc\nLOADING_COLLECTS = gc.isenabled()\n")
    (tmp_path / "pkg" / "prog.py").write_text(
        "import gc, sys, pkg\n"
        "print(pkg.LOADING_COLLECTS, gc.isenabled(), gc.get_freeze_count() > 0, __name__, sys.argv[1:])\n"
    )
    done = subprocess.run(
        [sys.executable, "-W", "error::RuntimeWarning", "-m", "components.quick_exit", "pkg.prog", "x"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": f"{tmp_path}{os.pathsep}{ROOT}"},
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["False", "True", "True", "__main__", "['x']"]


def test_quick_exit_without_a_module_says_how_to_call_it():
    done = _python("-m", "components.quick_exit")
    assert done.returncode == 2 and "usage: python -m components.quick_exit MODULE [ARG ...]" in done.stderr
    assert quick_exit.command("torch.distributed.run", "--standalone") == [
        sys.executable,
        "-m",
        "components.quick_exit",
        "torch.distributed.run",
        "--standalone",
    ]
