"""Test modules import shared code from tests/helpers/ and tests/fakes/, never from another test module or a
conftest: a helper defined in a test module drags that module's tests and fixtures along, and hides where the
helper lives."""

import ast
from pathlib import Path

TESTS = Path(__file__).resolve().parent


def _is_test_module_or_conftest(dotted: str) -> bool:
    last = dotted.rsplit(".", 1)[-1]
    return last.startswith("test_") or last == "conftest"


def imports_of_test_modules(root: Path) -> list[str]:
    """``file:line: module`` for every import, under ``root``, of a ``tests...test_*`` module or a conftest."""
    found = []
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            if isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").startswith("tests"):
                names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names if a.name.startswith("tests")]
            else:
                continue
            found += [f"{path.relative_to(root)}:{node.lineno}: {n}" for n in names if _is_test_module_or_conftest(n)]
    return found


def test_no_test_module_imports_another_or_a_conftest():
    assert imports_of_test_modules(TESTS) == [], "move the shared code to tests/helpers/ or tests/fakes/"


def test_the_check_finds_each_way_of_importing_a_test_module(tmp_path):
    (tmp_path / "test_a.py").write_text(
        "from tests.validate.test_preflight import PARAMS\n"
        "from tests.data import test_data_prepare as base\n"
        "import tests.observe.test_alerts\n"
        "from tests.conftest import run_cli\n"
        "from tests.helpers.repo import run_cli\n"
    )
    assert imports_of_test_modules(tmp_path) == [
        "test_a.py:1: tests.validate.test_preflight",
        "test_a.py:2: tests.data.test_data_prepare",
        "test_a.py:3: tests.observe.test_alerts",
        "test_a.py:4: tests.conftest",
    ]
