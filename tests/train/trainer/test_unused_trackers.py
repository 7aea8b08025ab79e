"""components/train/trainer/unused_trackers.py: a run that does not report to MLflow never loads it (the real run's
import profile is checked in tests/train/test_tracking.py); one that does, or whose config says nothing readable, is
left as it was."""

import json
import subprocess
import sys

import pytest

from components.train.trainer.unused_trackers import config_path, report_to
from tests.helpers.repo import ROOT

PROBE = """
import importlib.util, sys
from components.train.trainer.unused_trackers import hide_unreported_trackers
hidden = hide_unreported_trackers(sys.argv[1:])
imported = "-"
if hidden:  # a real import of MLflow takes seconds: tried only where it should fail at once
    try:
        import mlflow
        imported = True
    except ImportError:
        imported = False
print(hidden, importlib.util.find_spec("mlflow") is not None, imported)
"""


def _probe(*argv: str) -> str:
    """What a fresh process (as the trainer's __main__ is) sees after the call: hidden, find_spec, and where hidden,
    whether ``import mlflow`` still works."""
    out = subprocess.run([sys.executable, "-c", PROBE, *argv], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


def test_the_config_path_is_read_from_either_form_of_the_flag():
    assert config_path(["--config", "/a.json"]) == "/a.json" == config_path(["--config=/a.json"])
    assert config_path([]) is None and config_path(["--config"]) is None


@pytest.mark.parametrize(
    "text, suffix, want",
    [
        ('{"report_to": ["tensorboard", "wandb"]}', ".json", ["tensorboard", "wandb"]),
        ("report_to: mlflow\n", ".yaml", ["mlflow"]),
        ('{"stage": "sft"}', ".json", None),  # absent: transformers' default is left to decide
        ("{not json", ".json", None),
        ("report_to: [mlflow\n", ".yaml", None),  # yaml's errors are not ValueErrors
    ],
)
def test_report_to_is_read_from_json_and_yaml_and_none_when_it_cannot_be(tmp_path, text, suffix, want):
    path = tmp_path / f"train_config{suffix}"
    path.write_text(text)
    assert report_to(str(path)) == want
    assert report_to(str(tmp_path / "missing.json")) is None


@pytest.mark.skipif(__import__("importlib").util.find_spec("mlflow") is None, reason="needs mlflow installed")
def test_mlflow_is_absent_to_a_process_whose_run_does_not_report_to_it(tmp_path):
    cfg = tmp_path / "train_config.json"
    for report, seen in (
        (["tensorboard"], "['mlflow'] False False"),
        (["tensorboard", "mlflow"], "[] True -"),
        (["all"], "[] True -"),
    ):
        cfg.write_text(json.dumps({"stage": "sft", "report_to": report}))
        assert _probe("--config", str(cfg)) == seen, report
    assert _probe("--config", str(tmp_path / "missing.json")) == "[] True -"
