"""The local training backend's choices before it starts torchrun (components/train/launcher/local_torchrun.py);
torchrun training itself: tests/train/trainer/."""

import importlib.metadata
import subprocess
import sys
from pathlib import Path

import pytest

from components import quick_exit
from components.train.launcher import local_torchrun

ROOT = Path(__file__).resolve().parents[3]


def test_a_cpu_only_torch_build_trains_on_cpu_without_the_train_step_importing_torch():
    if not importlib.metadata.version("torch").endswith("+cpu"):
        pytest.skip("this environment's torch is not a CPU-only build")
    code = (
        "import sys; from components.train.launcher.local_torchrun import cuda_available; "
        "print(cuda_available(), 'torch' in sys.modules)"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert done.stdout.split() == ["False", "False"], done.stderr


def test_any_other_torch_build_is_asked(monkeypatch):
    import torch

    monkeypatch.setattr(local_torchrun.importlib.metadata, "version", lambda name: "2.13.0")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert local_torchrun.cuda_available()
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert not local_torchrun.cuda_available()


def test_torchrun_runs_in_a_process_that_skips_the_final_collection(monkeypatch, tmp_path):
    started = []

    class Done:
        def __init__(self, cmd, **kwargs):
            started.append((cmd, kwargs))
            self.stdout = iter(["trained\n"])

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

        def wait(self):
            return 0

    monkeypatch.setattr(local_torchrun.subprocess, "Popen", Done)
    local_torchrun.run_torchrun(str(tmp_path / "train_config.json"), nproc_per_node=2, env={})
    ((cmd, kwargs),) = started
    config = str(tmp_path / "train_config.json")
    assert cmd == quick_exit.command(
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node",
        "2",
        "-m",
        "components.train.trainer",
        "--config",
        config,
    )
    assert kwargs["env"]["OMP_NUM_THREADS"]


def test_a_local_runs_trainer_takes_a_free_metrics_port_itself_when_the_setting_is_taken(monkeypatch, tmp_path):
    # Two local runs on one machine (or a run's variants side by side) must not fail on the trainer's metrics port,
    # which only one process can hold. A check here, 15-30 s before the trainer binds the port, would leave that
    # long for another run to take it: the trainer, which binds it, takes another when it is taken
    # (tests/observe/test_trainer_metrics.py; end to end: tests/pipelines/test_local_run_lifetime.py). On a cluster
    # each pod has its own network and a clash is a setting to fix.
    assert local_torchrun.metrics_port_here(9410) == 9410 and local_torchrun.metrics_port_here(0) == 0
    envs = []

    class Done:
        def __init__(self, cmd, **kwargs):
            envs.append(kwargs["env"])
            self.stdout = iter([])

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

        def wait(self):
            return 0

    monkeypatch.setattr(local_torchrun.subprocess, "Popen", Done)
    local_torchrun.run_torchrun(
        str(tmp_path / "train_config.json"), nproc_per_node=2, env={"TRAINER_METRICS_PORT": "9410"}
    )
    assert envs[0]["TRAINER_METRICS_ANY_PORT"] == "1" and envs[0]["TRAINER_METRICS_PORT"] == "9410"
