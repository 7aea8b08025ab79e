"""manifests/ipc-lock/: the least-privilege path for ipc_lock=true. The namespace must enforce the privileged Pod
Security level (IPC_LOCK is in no lower one), and this ValidatingAdmissionPolicy denies there what the baseline level
denies, IPC_LOCK aside. Each CEL expression is evaluated here with cel-python on the trainer pods the launcher renders
(``python -m components.train.launcher -p ... --dry-run``) and on pods that break one baseline control each."""

from __future__ import annotations

import copy

import celpy
import kubernetes
import pytest
import yaml

from components.train.launcher.__main__ import main as launcher
from tests.helpers.repo import ROOT

POLICY_DIR = ROOT / "manifests" / "ipc-lock"


def _documents() -> dict:
    return {d["kind"]: d for d in yaml.safe_load_all((POLICY_DIR / "policy.yaml").read_text())}


def _admit(pod: dict) -> list[str]:
    """The messages of the policy's validations that deny ``pod``, evaluated as the API server does: its variables
    first (``variables.<name>``), then each validation over ``object``."""
    spec = _documents()["ValidatingAdmissionPolicy"]["spec"]
    env = celpy.Environment()
    activation: dict = {"object": celpy.json_to_cel(pod)}
    variables: dict = {}
    for variable in spec["variables"]:
        activation["variables"] = celpy.celtypes.MapType(variables)
        value = env.program(env.compile(variable["expression"])).evaluate(activation)
        variables[celpy.celtypes.StringType(variable["name"])] = value
    activation["variables"] = celpy.celtypes.MapType(variables)
    denied = []
    for validation in spec["validations"]:
        result = env.program(env.compile(validation["expression"])).evaluate(activation)
        assert isinstance(result, celpy.celtypes.BoolType), (validation["expression"], result)
        if not result:
            denied.append(validation["message"])
    return denied


@pytest.fixture(scope="module")
def trainer_pods(tmp_path_factory) -> list[dict]:
    """The master and worker pods of an RDMA job with ipc_lock=true, as the train step would create them."""
    import contextlib
    import io

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        launcher(
            ["--run-id", "r1", "--namespace", "team-llm", "--dry-run"]
            + ["-p", "rdma_resource=rdma/ib", "-p", "rdma_per_pod=8", "-p", "ipc_lock=true"]
        )
    job = yaml.safe_load(out.getvalue())
    pods = [{"apiVersion": "v1", "kind": "Pod", **r["template"]} for r in job["spec"]["pytorchReplicaSpecs"].values()]
    assert pods and all(
        c["securityContext"]["capabilities"]["add"] == ["IPC_LOCK"] for p in pods for c in p["spec"]["containers"]
    )
    return pods


def test_the_manifests_are_the_real_api_types():
    """Field names as the API server reads them: the kubernetes client's models reject unknown fields."""
    client = kubernetes.client.ApiClient()
    types = {
        "ValidatingAdmissionPolicy": "V1ValidatingAdmissionPolicy",
        "ValidatingAdmissionPolicyBinding": "V1ValidatingAdmissionPolicyBinding",
    }
    for kind, document in _documents().items():
        model = client._ApiClient__deserialize(document, types[kind])
        assert client.sanitize_for_serialization(model) == document
    binding = _documents()["ValidatingAdmissionPolicyBinding"]["spec"]
    assert binding["validationActions"] == ["Deny"]
    assert binding["matchResources"]["namespaceSelector"] == {"matchLabels": {"llm-post-training-ipc-lock": "true"}}


def test_the_trainer_pods_with_ipc_lock_are_admitted(trainer_pods):
    for pod in trainer_pods:
        assert _admit(pod) == []


@pytest.mark.parametrize(
    ("break_it", "message"),
    [
        (lambda s: s["containers"][0]["securityContext"]["capabilities"]["add"].append("SYS_ADMIN"), "capabilities"),
        (lambda s: s.setdefault("initContainers", []).append(
            {"name": "i", "image": "x", "securityContext": {"capabilities": {"add": ["NET_ADMIN"]}}}), "capabilities"),
        (lambda s: s.setdefault("ephemeralContainers", []).append(
            {"name": "e", "image": "x", "securityContext": {"capabilities": {"add": ["SYS_PTRACE"]}}}), "capabilities"),
        (lambda s: s["containers"][0]["securityContext"].update(privileged=True), "privileged"),
        (lambda s: s.update(hostNetwork=True), "host namespaces"),
        (lambda s: s.update(hostPID=True), "host namespaces"),
        (lambda s: s["volumes"].append({"name": "root", "hostPath": {"path": "/"}}), "hostPath"),
        (lambda s: s["containers"][0].setdefault("ports", []).append({"containerPort": 80, "hostPort": 80}),
         "host ports"),
        (lambda s: s["securityContext"].update(seccompProfile={"type": "Unconfined"}), "seccomp"),
        (lambda s: s["containers"][0]["securityContext"].update(procMount="Unmasked"), "/proc"),
    ],
)  # fmt: skip
def test_a_pod_breaking_a_baseline_control_is_denied(trainer_pods, break_it, message):
    pod = copy.deepcopy(trainer_pods[0])
    break_it(pod["spec"])
    denied = _admit(pod)
    assert len(denied) == 1 and message in denied[0], denied
