"""The package's boundaries, as contracts (docs/development.md, "Layout": which room holds what, by where it runs).

- import-linter's contracts in pyproject.toml ([tool.importlinter]; ``lint-imports`` checks them all), each run
  here on its own: the trainer program imports no cluster client, settings is a leaf, the launcher and the trainer
  import nothing of each other.
- What import-linter cannot say (it counts imports inside functions like any other): the launcher pod's modules,
  the KFP component modules and ``pipelines`` load no ML library when imported, and ``--help`` loads no cluster
  client either.
- No import circles in ``components`` or ``pipelines``, imports inside functions included: a circle that only
  works because one side imports late is still a circle.
- No two modules of ``components``, ``pipelines`` or ``benchmarks`` share a file name, but for the conventional ones
  (``component.py``, ``run.py``, ``__init__.py``, ``__main__.py``).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import grimp
import pytest

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: import-linter brings tomli
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
CONTRACTS = {c["id"]: c for c in PYPROJECT["tool"]["importlinter"]["contracts"]}
# Contracts that wait for work in flight elsewhere: id -> what keeps it. Remove an entry once it passes.
PENDING: dict[str, str] = {}
# Circles that wait for work in flight elsewhere (the set of their modules); any other circle fails. Empty it once
# they are gone.
PENDING_CIRCLES: dict[frozenset, str] = {}
# Loaded by the light side only where a function needs them, never by importing a module.
ML_LIBRARIES = ("torch", "transformers", "datasets", "deepspeed", "trl", "peft")
CLUSTER_CLIENTS = ("kfp", "kfp_server_api", "kubernetes", "kubeflow")


def _module(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _light_modules() -> list[str]:
    """The modules whose import must load no ML library: the launcher pod's program, the KFP component modules
    (their functions import what the step needs when it runs) and ``pipelines`` (compile, submit, the CLI)."""
    paths = [
        *(ROOT / "components/train/launcher").glob("*.py"),
        *(ROOT / "components/jobs").glob("*.py"),
        *(ROOT / "components/estimate").glob("*.py"),
        *(ROOT / "components").glob("*/component.py"),
        *(ROOT / "pipelines").glob("*.py"),
    ]
    return sorted(_module(p) for p in paths)


# Run in a fresh interpreter: imports ``argv[2:]`` and reports, for each library of ``argv[1]`` that got loaded,
# the lines of this repository that led to it (the import stack at the library's first import).
_SPY = r"""
import importlib, json, sys, traceback
root, watched, seen = sys.argv[1], set(sys.argv[2].split(",")), {}

class Spy:
    def find_spec(self, name, path=None, target=None):
        top = name.partition(".")[0]
        if top in watched and top not in seen:
            seen[top] = [f"{f.filename[len(root) + 1:]}:{f.lineno} {f.line}" for f in traceback.extract_stack()
                         if f.filename.startswith(root) and "/.venv/" not in f.filename]
        return None  # only watching: the real finders load it

sys.meta_path.insert(0, Spy())
for module in sys.argv[3].split(","):
    if module == "--main":
        from pipelines.run import main
        try:
            main(["--help"])
        except SystemExit:
            pass
    else:
        importlib.import_module(module)
print(json.dumps(seen))
"""


def _loaded(modules: list[str], watched: tuple[str, ...]) -> dict[str, list[str]]:
    result = subprocess.run(
        [sys.executable, "-c", _SPY, str(ROOT), ",".join(watched), ",".join(modules)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize(
    "contract",
    [
        pytest.param(cid, marks=pytest.mark.xfail(reason=PENDING[cid], strict=False)) if cid in PENDING else cid
        for cid in CONTRACTS
    ],
)
def test_import_linter_contract_is_kept(contract):
    result = subprocess.run(
        [
            sys.executable,
            "-c",
            "from importlinter.cli import lint_imports_command as c; c()",
            "--no-cache",
            "--contract",
            contract,
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, f"{CONTRACTS[contract]['name']}:\n{result.stdout[-4000:]}{result.stderr[-2000:]}"


def test_the_launcher_the_components_and_pipelines_load_no_ml_library_when_imported():
    modules = _light_modules()
    assert "components.train.launcher.job" in modules and "components.train.component" in modules
    assert "pipelines.run" in modules and "pipelines.llm_finetune" in modules
    loaded = _loaded(modules, ML_LIBRARIES)
    assert not loaded, "\n".join(
        f"{lib} is loaded at import, through:\n  " + "\n  ".join(chain) for lib, chain in loaded.items()
    )


def test_pipelines_run_help_loads_neither_ml_libraries_nor_cluster_clients():
    # What keeps `python -m pipelines.run --help` (and a bad argument) at a fraction of a second.
    loaded = _loaded(["--main"], ML_LIBRARIES + CLUSTER_CLIENTS)
    assert not loaded, "\n".join(
        f"{lib} is loaded by --help, through:\n  " + "\n  ".join(chain) for lib, chain in loaded.items()
    )


def _circles(graph, packages: tuple[str, ...]) -> list[list[str]]:
    """The import circles among ``packages``' modules: each strongly connected set of two or more (Tarjan)."""
    modules = sorted(m for m in graph.modules if m.startswith(packages))
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    circles = []

    def visit(module: str) -> None:
        index[module] = low[module] = len(index)
        stack.append(module)
        on_stack.add(module)
        for imported in sorted(graph.find_modules_directly_imported_by(module)):
            if not imported.startswith(packages):
                continue
            if imported not in index:
                visit(imported)
                low[module] = min(low[module], low[imported])
            elif imported in on_stack:
                low[module] = min(low[module], index[imported])
        if low[module] == index[module]:
            members = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                members.append(member)
                if member == module:
                    break
            if len(members) > 1:
                circles.append(sorted(members))

    for module in modules:
        if module not in index:
            visit(module)
    return circles


def _describe(graph, circle: list[str]) -> str:
    lines = []
    for importer in circle:
        for imported in sorted(set(graph.find_modules_directly_imported_by(importer)) & set(circle)):
            lines_at = sorted(d["line_number"] for d in graph.get_import_details(importer=importer, imported=imported))
            lines.append(f"  {importer} -> {imported} (line {', '.join(map(str, lines_at))})")
    return "\n".join(lines)


def test_no_import_circles_imports_inside_functions_included():
    graph = grimp.build_graph("components", "pipelines", cache_dir=None)
    circles = [c for c in _circles(graph, ("components.", "pipelines.")) if frozenset(c) not in PENDING_CIRCLES]
    assert not circles, "import circles:\n" + "\n".join(_describe(graph, c) for c in circles)


def test_the_circle_finder_sees_a_circle_closed_inside_a_function(tmp_path, monkeypatch):
    # The check above would pass vacuously if the graph left out imports made inside functions.
    package = tmp_path / "latecircle"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "a.py").write_text("from latecircle import b\n")
    (package / "b.py").write_text("def f():\n    from latecircle import a\n")
    (package / "c.py").write_text("from latecircle import a\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    graph = grimp.build_graph("latecircle", cache_dir=None)
    assert _circles(graph, ("latecircle.",)) == [["latecircle.a", "latecircle.b"]]
    assert "latecircle.b -> latecircle.a (line 2)" in _describe(graph, ["latecircle.a", "latecircle.b"])


# Module names that say what a module is by the folder it is in: each step's component, its work as a plain function,
# a package's docstring and entry point.
REPEATABLE_NAMES = {"__init__.py", "__main__.py", "component.py", "run.py"}


def test_no_two_modules_share_a_name_beyond_the_conventional_ones():
    """A file's name says what it holds (docs/development.md, "Layout"): ``stages.py`` in three folders says nothing
    of which of them one means."""
    seen: dict[str, list[str]] = {}
    for package in ("components", "pipelines", "benchmarks"):
        for path in sorted((ROOT / package).rglob("*.py")):
            if path.name not in REPEATABLE_NAMES:
                seen.setdefault(path.name, []).append(str(path.relative_to(ROOT)))
    repeated = {name: paths for name, paths in seen.items() if len(paths) > 1}
    assert not repeated, repeated
