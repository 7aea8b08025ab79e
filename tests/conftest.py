"""Fixtures for every test. Shared helpers live in tests/helpers/ and fake servers in tests/fakes/: test
modules import from there, never from one another (nor from this file)."""

import pytest
import yaml

from components import kube
from tests.fakes.k8s_api import FakeKubeAPI
from tests.helpers.cluster import GPU_TAINT, H100
from tests.helpers.repo import REFERENCE
from tests.helpers.s3_server import s3_server as start_s3_server


def pytest_configure(config):
    """The reference specs are part of the repository (tests/reference/); a ``REFERENCE_DIR`` that names no such
    folder stops the run here rather than failing tests one by one with FileNotFoundError."""
    if not (REFERENCE / "crds").is_dir():
        raise pytest.UsageError(f"no reference specs at {REFERENCE} (REFERENCE_DIR: a folder like tests/reference)")


# With pytest-xdist (`python -m pytest -n 2`; CI runs them one at a time), tests run on two workers at once. These
# modules hold the machine for themselves in ways a test beside them would disturb, so they share one xdist group
# (`--dist loadgroup` in pyproject.toml: one worker runs them, one after another): they make and count network
# namespaces and veth pairs (`ip netns list` before and after), run the real vLLM engine in a pod's namespace, and
# measure the bytes crossing a link.
ONE_AT_A_TIME = (
    "tests/train/launcher/test_rehearsal.py",
    "tests/deploy/test_serving_rehearsal.py",
    "tests/deploy/test_lora_serving_rehearsal.py",
    "tests/train/trainer/test_cross_pod_bytes.py",
)


def _uses_a_module_fixture(item) -> bool:
    """Whether the test reads a fixture built once per module (a trained model, a started server)."""
    return any(defs[-1].scope == "module" for defs in item._fixtureinfo.name2fixturedefs.values())


def pytest_collection_modifyitems(config, items):
    """ONE_AT_A_TIME's modules share the "machine" group; any other module whose tests read a module-scoped fixture is
    a group of its own, so one worker builds that fixture once (xdist's plain load split a module's tests between the
    workers and each built it: the GRPO engine server's module, 100 s of setup, twice)."""
    for item in items:
        module = item.nodeid.split("::")[0]
        if module in ONE_AT_A_TIME:
            item.add_marker(pytest.mark.xdist_group("machine"))
        elif _uses_a_module_fixture(item):
            item.add_marker(pytest.mark.xdist_group(module))
    items.sort(key=_start_order)  # stable: each module's tests stay in their order


# The whole local pipeline runs: the longest single tests (2-5 minutes each on 2 busy cores).
WHOLE_RUNS = ("tests/pipelines/test_local_", "tests/deploy/test_local_lora_variants_run.py")


def _start_order(item) -> int:
    """Longest first, so that the short tests fill the end of a run on both workers (xdist hands out work in this
    order): the "machine" group (one worker's queue, one test after another), the whole local runs, the rest of the
    slow tier, then the fast tier."""
    module = item.nodeid.split("::")[0]
    if module in ONE_AT_A_TIME:
        return 0
    if item.get_closest_marker("slow") is None:
        return 3
    return 1 if module.startswith(WHOLE_RUNS) else 2


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
