"""A non-editable install (what the images do) carries every data file the code reads at run time."""

import subprocess
import sys
import zipfile

import pytest

from tests.helpers.repo import ROOT


def test_wheel_contains_presets_sample_data_templates_and_deepspeed_configs(tmp_path):
    pytest.importorskip("setuptools", reason="building the wheel needs setuptools in this environment")
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "-q",
            "--no-deps",
            "--no-build-isolation",
            str(ROOT),
            "-w",
            str(tmp_path),
        ],
        check=True,
        capture_output=True,
        cwd=tmp_path,
    )
    (wheel,) = tmp_path.glob("*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    tracked = subprocess.run(
        ["git", "ls-files", "pipelines", "components"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.split()
    missing = [f for f in tracked if f not in names and not f.endswith(".pyc")]
    assert missing == [], f"not in the wheel: {missing}"
