"""The reference specs in tests/reference/ are what its README says: every file there is listed, every listed file
is there, unchanged since it was copied (its sha256), with its upstream repository, commit and licence; the tests
find them there in a fresh clone, and ``REFERENCE_DIR`` still names another folder."""

import hashlib
import os
import re
import subprocess
import sys

import pytest

from tests.helpers.repo import ROOT

FOLDER = ROOT / "tests" / "reference"
README = FOLDER / "README.md"
APACHE_2 = {
    "kubeflow/trainer",
    "kubeflow/katib",
    "kubeflow/pipelines",
    "kubeflow/notebooks",
    "kubeflow/hub",
    "kserve/kserve",
}
# | file | what | upstream repository @ commit | licence | sha256 |
ROW = re.compile(r"^\| (\S+) \| .+ \| (\S+/\S+) .*@ ([0-9a-f]{7,40})\b.* \| (\S+) \| ([0-9a-f]{64}) \|$", re.M)


def _rows() -> dict[str, tuple[str, str, str, str]]:
    rows = {}
    for name, repository, commit, licence, sha256 in ROW.findall(README.read_text()):
        assert name not in rows, f"{name} is listed twice"
        rows[name] = (repository, commit, licence, sha256)
    return rows


def test_every_file_is_listed_and_every_listed_file_is_there():
    present = {p.relative_to(FOLDER).as_posix() for p in FOLDER.rglob("*") if p.is_file()} - {"README.md"}
    listed = set(_rows())
    assert present - listed == set(), "files in tests/reference/ missing from its README"
    assert listed - present == set(), "files in tests/reference/README.md missing from the folder"
    # What the tests read: the CRDs of both Trainer releases, KServe's, Katib's sources, KFP's and Model Registry's
    # APIs, the runtimes.
    assert len(present) == 23


def test_every_file_is_unchanged_since_it_was_copied():
    changed = [
        name
        for name, (*_, sha256) in _rows().items()
        if hashlib.sha256((FOLDER / name).read_bytes()).hexdigest() != sha256
    ]
    assert changed == [], "edited (or re-copied without updating the README's sha256)"


def test_every_file_names_its_upstream_and_an_apache_2_licence():
    readme = README.read_text()
    for name, (repository, commit, licence, _) in _rows().items():
        assert repository in APACHE_2 and licence == "Apache-2.0", (name, repository, licence)
        assert len(commit) >= 7, name
    assert "Apache License, Version 2.0" in readme and all(r in readme.split("## Files")[0] for r in APACHE_2)
    assert "## Facts the schemas do not show" in readme


def _run(*args: str, **env) -> subprocess.CompletedProcess:
    environ = {k: v for k, v in os.environ.items() if k not in ("REFERENCE_DIR", "CI")}
    return subprocess.run(
        [sys.executable, *args], cwd=ROOT, capture_output=True, text=True, timeout=300, env={**environ, **env}
    )


def test_the_tests_read_the_repositorys_copy_unless_reference_dir_names_another(tmp_path):
    where = ("-c", "from tests.helpers.repo import REFERENCE; print(REFERENCE)")
    assert _run(*where).stdout.strip() == str(FOLDER)
    assert _run(*where, REFERENCE_DIR=str(tmp_path)).stdout.strip() == str(tmp_path)


def test_a_reference_dir_without_the_specs_stops_the_run_before_any_test(tmp_path):
    empty = tmp_path / "absent"
    run = _run("-m", "pytest", "-q", "-p", "no:cacheprovider", "--collect-only", __file__, REFERENCE_DIR=str(empty))
    assert run.returncode == pytest.ExitCode.USAGE_ERROR, run.stdout + run.stderr
    assert f"no reference specs at {empty}" in run.stderr
