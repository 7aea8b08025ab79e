"""Tests that check against the real specs in ../shared/reference skip where it is absent, but fail in CI.

The two ways a test needs the reference (the ``reference`` fixture, and ``crd_errors`` against a CRD) are
driven by a pytest run in a subprocess, with ``CI`` and ``REFERENCE_DIR`` set as a CI job would set them.
"""

import os
import subprocess
import sys

import pytest

from components.train.launcher.pytorchjob import build_pytorchjob
from tests.helpers.crd_schema import crd_errors
from tests.helpers.repo import ROOT

HERE = "tests/test_reference_in_ci.py"


def test_uses_the_reference_fixture(reference):
    assert (reference / "README.md").is_file()


def test_uses_a_crd():
    job = build_pytorchjob(
        name="sft-ci",
        namespace="ns",
        image="trainer:1",
        config_path="/mnt/models/c.json",
        num_nodes=1,
        gpus_per_node=1,
        data_pvc="d",
        model_pvc="m",
        hf_token_secret="hf",
        node_selector={},
        tolerations=[],
        labels={},
    )
    assert crd_errors(job, "kubeflow.org_pytorchjobs.yaml") == []


def _pytest(test: str, **env) -> subprocess.CompletedProcess:
    environ = {k: v for k, v in os.environ.items() if k not in ("CI", "REFERENCE_DIR")}
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-rsf", "-p", "no:cacheprovider", f"{HERE}::{test}"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env={**environ, **env},
    )


@pytest.mark.parametrize("test", ["test_uses_the_reference_fixture", "test_uses_a_crd"])
def test_a_missing_reference_fails_in_ci_and_skips_elsewhere(test, tmp_path):
    empty = str(tmp_path / "absent")
    in_ci = _pytest(test, CI="true", REFERENCE_DIR=empty)
    # A fixture that fails is reported as an error at setup; either way the run fails.
    assert in_ci.returncode == 1 and ("1 failed" in in_ci.stdout or "1 error" in in_ci.stdout), in_ci.stdout
    assert f"reference specs not found at {empty}" in in_ci.stdout and "CI runs every check" in in_ci.stdout
    elsewhere = _pytest(test, REFERENCE_DIR=empty)
    assert elsewhere.returncode == 0 and "1 skipped" in elsewhere.stdout, elsewhere.stdout + elsewhere.stderr
    assert f"reference specs not found at {empty}" in elsewhere.stdout


def test_reference_dir_names_where_the_specs_are(reference):
    # CI with the specs in place (here: the default folder, named explicitly) runs the checks.
    found = _pytest("test_uses_a_crd", CI="true", REFERENCE_DIR=str(reference))
    assert found.returncode == 0 and "1 passed" in found.stdout, found.stdout + found.stderr
