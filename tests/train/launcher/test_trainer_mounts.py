"""Issue 39, mounts by need: a trainer pod, which runs user code (reward functions, a user's DeepSpeed JSON), writes its
own run's folder on the models claim and nothing else there; it still reads any model on it (a base model may be an
earlier run's ``final/``). On the data claim it reads the prepared datasets and writes only the shared cache.

The pod is the rendered PyTorchJob's, mounted as the rehearsal's kubelet and container runtime mount it
(tests/rehearsal/cluster.py ``pod_mounts``, tests/rehearsal/container.py: claims as bind mounts, ``subPath`` and
``readOnly`` honoured) in a private mount namespace, with its real mount paths; its command tries what user code could.
"""

import json
import os
import shutil
import socket
import subprocess
import sys

import pytest

from components.train.launcher.pytorchjob import build_pytorchjob
from components.train.launcher.spec import TrainingJobSpec
from tests.helpers.repo import ROOT
from tests.rehearsal.cluster import pod_mounts

RUN_ID = "run-b"
OTHER = "run-a"  # an earlier run of another team: its served model
CONFIG = f"/mnt/models/runs/{RUN_ID}/train/train_config.json"

# What the user code in the pod tries: each path, whether the write went through (or the error's name), and a read.
PROBE = """
import json, os
out = {}
for path in ("/mnt/models/runs/run-b/train/checkpoint-1/w", "/mnt/models/runs/run-a/train/final/model.safetensors",
             "/mnt/models/runs/run-c/x", "/mnt/models/x", "/mnt/data/cache/huggingface/x",
             "/mnt/data/runs/run-a/data/train/data-00000-of-00001.arrow", "/mnt/data/x"):
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as f:
            f.write("mine")
        out[path] = "written"
    except OSError as e:
        out[path] = os.strerror(e.errno)
out["read"] = open("/mnt/models/runs/run-a/train/final/model.safetensors").read()
out["read data"] = open("/mnt/data/runs/run-a/data/train/data-00000-of-00001.arrow").read()
print(json.dumps(out))
"""


def _unavailable() -> str | None:
    if os.geteuid() != 0:
        return "bind mounts in a private mount namespace need root"
    if shutil.which("unshare") is None:
        return "needs util-linux `unshare`"
    return None


@pytest.mark.skipif(_unavailable() is not None and os.environ.get("CI") != "true", reason=str(_unavailable()))
def test_a_trainer_pod_writes_its_own_run_folder_and_reads_but_cannot_change_other_runs_models(tmp_path):
    data, models = tmp_path / "data", tmp_path / "models"
    final = models / "runs" / OTHER / "train" / "final"
    final.mkdir(parents=True)
    (final / "model.safetensors").write_text("theirs")
    (models / "runs" / RUN_ID / "train").mkdir(parents=True)  # the train step wrote its config there first
    data.mkdir()
    # Another run's prepared dataset (the data step writes runs/<id>/ on the data claim), and the shared cache the
    # data step created (the train step makes sure of it before the job exists).
    (data / "runs" / OTHER / "data" / "train").mkdir(parents=True)
    (data / "runs" / OTHER / "data" / "train" / "data-00000-of-00001.arrow").write_text("their rows")
    (data / "cache").mkdir()
    spec = TrainingJobSpec(
        name="llm-ft-run-b",
        namespace="team-llm",
        image="trainer:1",
        config_path=CONFIG,
        num_nodes=1,
        gpus_per_node=1,
        data_pvc="llm-data",
        model_pvc="llm-models",
        hf_token_secret="hf-token",
        node_selector={},
        tolerations=[],
        labels={},
    )
    job = build_pytorchjob(spec)
    pod = job["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]
    claims = {"llm-data": str(data), "llm-models": str(models)}
    mounts = pod_mounts(claims, pod, pod["containers"][0], tmp_path / "pod")
    spec = {
        "hostname": "llm-ft-run-b-master-0",
        "rootfs_dirs": ["/mnt"],
        "mounts": mounts,
        "keep": [],
        "hide": [],
        "staging": str(tmp_path / "staging"),
        "working_dir": "/",
        "command": [sys.executable, "-I", "-S", "-c", PROBE],
        "args": [],
        "env": [["PATH", "/usr/bin:/bin"]],
    }
    (tmp_path / "spec.json").write_text(json.dumps(spec))
    hostname = socket.gethostname()
    result = subprocess.run(
        # As the rehearsal's kubelet starts a pod: its own mount, PID and UTS namespaces (container.py sets the pod's
        # hostname, which must not become this machine's).
        ["unshare", "--mount", "--uts", "--pid", "--fork", "--propagation", "private", sys.executable, "-I", "-S"]
        + [str(ROOT / "tests" / "rehearsal" / "container.py"), str(tmp_path / "spec.json")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert socket.gethostname() == hostname  # the pod's name stayed in its own UTS namespace
    seen = json.loads(result.stdout)
    assert seen == {
        "/mnt/models/runs/run-b/train/checkpoint-1/w": "written",
        "/mnt/models/runs/run-a/train/final/model.safetensors": "Read-only file system",
        "/mnt/models/runs/run-c/x": "Read-only file system",
        "/mnt/models/x": "Read-only file system",
        "/mnt/data/cache/huggingface/x": "written",  # the shared Hugging Face cache
        # Datasets are read-only to the trainer: another run's prepared rows cannot be changed under it.
        "/mnt/data/runs/run-a/data/train/data-00000-of-00001.arrow": "Read-only file system",
        "/mnt/data/x": "Read-only file system",
        "read": "theirs",
        "read data": "their rows",
    }
    assert (final / "model.safetensors").read_text() == "theirs"
    assert (models / "runs" / RUN_ID / "train" / "checkpoint-1" / "w").read_text() == "mine"
