"""The local training backend's choices before it starts torchrun (components/train/launcher/local.py); torchrun
training itself: tests/train/trainer/."""

import importlib.metadata
import subprocess
import sys
from pathlib import Path

import pytest

from components import quick_exit
from components.train.launcher import local

ROOT = Path(__file__).resolve().parents[3]


def test_a_cpu_only_torch_build_trains_on_cpu_without_the_train_step_importing_torch():
    if not importlib.metadata.version("torch").endswith("+cpu"):
        pytest.skip("this environment's torch is not a CPU-only build")
    code = (
        "import sys; from components.train.launcher.local import cuda_available; "
        "print(cuda_available(), 'torch' in sys.modules)"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert done.stdout.split() == ["False", "False"], done.stderr


def test_any_other_torch_build_is_asked(monkeypatch):
    import torch

    monkeypatch.setattr(local.importlib.metadata, "version", lambda name: "2.13.0")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert local.cuda_available()
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert not local.cuda_available()


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

    monkeypatch.setattr(local.subprocess, "Popen", Done)
    local.run_torchrun(str(tmp_path / "train_config.json"), nproc_per_node=2, env={})
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


def test_a_local_run_serves_its_metrics_on_a_free_port_when_the_setting_is_taken(caplog):
    # Two local runs on one machine (or a run's variants side by side) must not fail on the trainer's metrics port,
    # which only one process can hold; on a cluster each pod has its own network and a clash is a setting to fix.
    import logging
    import socket

    with socket.socket() as held:
        held.bind(("", 0))
        held.listen()
        taken = held.getsockname()[1]
        with caplog.at_level(logging.WARNING):
            port = local.metrics_port_here(taken)
        assert port not in (taken, 0)
        with socket.socket() as probe:
            probe.bind(("", port))  # free: the trainer can take it
    assert f"metrics_port {taken} is taken on this machine" in caplog.text and str(port) in caplog.text
    assert local.metrics_port_here(0) == 0  # off stays off
    with socket.socket() as free:
        free.bind(("", 0))
        own = free.getsockname()[1]
    assert local.metrics_port_here(own) == own
