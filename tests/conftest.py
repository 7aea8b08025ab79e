"""Fixtures for every test. Shared helpers live in tests/helpers/ and fake servers in tests/fakes/: test
modules import from there, never from one another (nor from this file)."""

import os

import pytest
import yaml

from components import kube
from tests.fakes.k8s_api import FakeKubeAPI
from tests.helpers.cluster import GPU_TAINT, H100
from tests.helpers.repo import REFERENCE
from tests.helpers.s3_server import s3_server as start_s3_server
from tests.helpers.worker_groups import group_and_order

# Each tier's time limit, the hard limit behind it and xdist's scheduling after a crash (tests/helpers/time_limits.py).
pytest_plugins = ["tests.helpers.time_limits"]

# Every vLLM CPU engine a test starts (the local deploy step, the GRPO server, the judge) skips Inductor, as vLLM's
# own CPU CI does (VLLM_CPU_CI_ENV, vllm/platforms/cpu.py): each start compiled for 40-80 s on two busy cores, and no
# test measures the CPU engine's speed. `python -m pipelines.run` outside the tests keeps vLLM's default (the
# README's serving figures); the rehearsal's pods get it from tests/fakes/serving_image.py's CPU_ENV.
os.environ.setdefault("VLLM_CPU_CI_ENV", "1")
# And runs its worker inside the engine-core process (UniProcExecutor, as a GPU engine at tensor parallel size 1 does)
# rather than a process of its own, as the rehearsal's stand-in image does (tests/fakes/serving_image.py CPU_ENV): one
# interpreter fewer to start, about 10 of a start's 33 CPU-s. vLLM's CPU platform keeps the worker apart only to pin its
# OpenMP threads, which no test measures.
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
# Under `-n N` the workers share the machine's cores: each worker's processes (torch in the test itself, a local run's
# steps, an engine) get their share of OpenMP threads rather than one per core each. OpenMP's threads spin at a
# parallel region's barrier, so N workers x all cores threads on all cores burn the time a descheduled thread is
# waited for. torchrun's ranks already divide the cores (components/train/launcher/local_torchrun.py). Set before
# torch is imported: the OpenMP runtime reads it when it loads.
if "PYTEST_XDIST_WORKER_COUNT" in os.environ:
    _share = (os.cpu_count() or 1) // int(os.environ["PYTEST_XDIST_WORKER_COUNT"])
    os.environ.setdefault("OMP_NUM_THREADS", str(max(1, _share)))


def pytest_configure(config):
    """The reference specs are part of the repository (tests/reference/); a ``REFERENCE_DIR`` that names no such
    folder stops the run here rather than failing tests one by one with FileNotFoundError."""
    if not (REFERENCE / "crds").is_dir():
        raise pytest.UsageError(f"no reference specs at {REFERENCE} (REFERENCE_DIR: a folder like tests/reference)")


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook reads the groups off the marks
def pytest_collection_modifyitems(config, items):
    """Which tests share a worker under ``-n 2``, and in what order they start (tests/helpers/worker_groups.py)."""
    group_and_order(items)


@pytest.fixture(scope="session")
def s3_server():
    """A real S3 server on loopback (tests/helpers/s3_server.py), one per test process: moto's authentication
    switch is global to the process, so a second server's setup would be refused by the first one's."""
    with start_s3_server() as server:
        yield server


@pytest.fixture
def cluster(tmp_path, monkeypatch):
    """A fake cluster the kubernetes client reaches through ~/.kube/config, with the reference run's prerequisites
    (for validate_inputs run as the pipeline runs it)."""
    monkeypatch.setattr(kube, "API_RETRY_WINDOW_SECONDS", 3.0)
    with FakeKubeAPI() as api:
        host = api.client.configuration.host
        # The client reads $KUBECONFIG once at import; ~/.kube/config is expanded at each load.
        kubeconfig = tmp_path / ".kube" / "config"
        kubeconfig.parent.mkdir()
        kubeconfig.write_text(
            yaml.safe_dump(
                {
                    "apiVersion": "v1",
                    "kind": "Config",
                    "current-context": "fake",
                    "clusters": [{"name": "fake", "cluster": {"server": host}}],
                    "contexts": [
                        {"name": "fake", "context": {"cluster": "fake", "user": "runner", "namespace": "default"}}
                    ],
                    "users": [{"name": "runner", "user": {"token": "not-a-secret"}}],
                }
            )
        )
        monkeypatch.setenv("HOME", str(tmp_path))
        api.install_crd("kubeflow.org", "v1", "pytorchjobs", "PyTorchJob")
        api.install_crd("serving.kserve.io", "v1beta1", "inferenceservices", "InferenceService")
        api.add_pvc("default", "llm-data")
        api.add_pvc("default", "llm-models")
        api.add_secret("default", "hf-token", {"HF_TOKEN": "hf_abc"})
        for i in range(2):
            api.add_node(f"gpu-{i}", {**H100, "kubernetes.io/hostname": f"gpu-{i}"}, gpus=8, taints=[GPU_TAINT])
        yield api
