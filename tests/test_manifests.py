"""manifests/: the runner's RBAC grants exactly what the code calls, the claims are ReadWriteMany, and
the kustomization builds with its parameters applied.

The Role is checked against the API calls the launcher and preflight really make (the fake API server's
request log of full runs) plus the deployer's calls (read from its source), so a new call without a
rule, or a rule nothing calls, fails here.
"""

from __future__ import annotations

import copy
import os
import shutil
import signal
import subprocess
import tempfile
import threading
from pathlib import Path

import pytest
import yaml

from components import kube
from components.deploy import manifest as isvc_manifest
from components.deploy.manifest import InferenceServiceSpec, build_inference_service
from components.deploy.rollout import deploy_inference_service
from components.hpo.follow import run_experiment
from components.kube import job_name_for
from components.observe import tensorboard
from components.train.launcher.job import run_training_job
from components.train.launcher.pytorchjob import pytorchjob_for_run
from components.train.launcher.trainjob import trainjob_for_run
from components.validate.preflight import preflight
from components.validate.preflight_access import (
    DEPLOYER_ACCESS,
    GRPO_SERVER_ACCESS,
    LAUNCHER_ACCESS,
    POD_ACCESS,
    SEARCH_ACCESS,
    TENSORBOARD_ACCESS,
    TENSORBOARD_SERVER_ACCESS,
)
from tests.fakes.k8s_api import FakeKubeAPI
from tests.fakes.kserve import becomes_ready
from tests.fakes.openai_server import OpenAIServer
from tests.helpers.cluster import PARAMS, ready_cluster

ROOT = Path(__file__).resolve().parents[1]
MANIFESTS = ROOT / "manifests"
NS = "team-llm"
RUN_ID = "run-1"
NAME = job_name_for(RUN_ID)


def documents(path: Path) -> list[dict]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def ours() -> list[Path]:
    """Our YAML files (manifests/serving/ belongs to the deploy step)."""
    return sorted(p for p in MANIFESTS.rglob("*.yaml") if "serving" not in p.relative_to(MANIFESTS).parts)


RUNNER = "llm-post-training-runner"  # the package's Role, its binding, and the account manifests/ creates


def resources(kind: str) -> list[dict]:
    return [d for p in ours() for d in documents(p) if d.get("kind") == kind]


def package_role() -> dict:
    """The package's Role (what its steps call); KFP's own needs are llm-post-training-kfp-runtime's."""
    (role,) = [d for d in resources("Role") if d["metadata"]["name"] == "llm-post-training-runner"]
    return role


def test_every_file_parses_and_names_its_objects():
    assert ours(), "manifests/ is empty"
    for path in ours():
        for doc in documents(path):
            assert doc.get("apiVersion") and doc.get("kind"), path
            if doc["kind"] not in ("Kustomization", "Component"):
                assert doc["metadata"]["name"], path


def test_claims_are_read_write_many_and_named_like_the_pipeline_defaults():
    claims = {c["metadata"]["name"]: c for c in resources("PersistentVolumeClaim")}
    assert set(claims) == {PARAMS["data_pvc"], PARAMS["model_pvc"]}
    for claim in claims.values():
        assert claim["spec"]["accessModes"] == ["ReadWriteMany"]
        assert claim["spec"]["resources"]["requests"]["storage"]


# -- RBAC: exactly what the code calls ----------------------------------------------------------------


def rule_for(method: str, path: str) -> tuple | None:
    """(namespaced, apiGroup, resource, verb) RBAC needs for one request; None when every account may."""
    parts = path.strip("/").split("/")
    if parts[0] == "apis" and len(parts) == 3 or parts[0] == "openapi":
        return None  # API discovery and the published OpenAPI schemas: system:discovery
    if parts[:3] == ["api", "v1", "namespaces"] and len(parts) == 4:
        # The API server authorizes a read of a namespace as a request in that namespace: a Role may grant it.
        return True, "", "namespaces", {"GET": "get"}[method]
    if parts[1:] == ["authorization.k8s.io", "v1", "selfsubjectaccessreviews"]:
        return None  # system:basic-user
    group, rest = ("", parts[2:]) if parts[0] == "api" else (parts[1], parts[3:])
    namespaced = rest[0] == "namespaces"
    if namespaced:
        rest = rest[2:]
    resource, name, sub = rest[0], rest[1] if len(rest) > 1 else None, rest[2] if len(rest) > 2 else None
    verb = {"POST": "create", "DELETE": "delete", "PATCH": "patch", "PUT": "update", "GET": "get" if name else "list"}[
        method
    ]
    return namespaced, group, f"{resource}/{sub}" if sub else resource, verb


def launcher_rules(manifest: dict, plural: str, pod_label: str, done: str) -> set[tuple]:
    """The RBAC rules behind a job that succeeds and is cleaned up, one re-attached that fails, one cancelled."""
    group, version = manifest["apiVersion"].split("/")
    pod, container = f"{NAME}-master-0", "pytorch" if plural == "pytorchjobs" else "node"
    needed = set()

    def running(api):
        def step(job):
            api.add_pod(NS, pod, {pod_label: NAME}, container=container)
            api.log(NS, pod, "step 1")

        return step

    def failed(api):
        def step(job):
            api.set_container_state(NS, pod, "terminated", exit_code=1)
            api.set_condition(job, "Failed", reason="Failed")

        return step

    with FakeKubeAPI() as api:
        api.on_get(plural, api.steps(running(api), lambda job: api.set_condition(job, done)))
        run_training_job(manifest, api_client=api.client, poll_seconds=0.01, cleanup="always")
        needed |= {rule_for(r.method, r.path) for r in api.requests}
    with FakeKubeAPI() as api:
        api.put_object(group, version, plural, manifest)
        api.on_get(plural, api.steps(running(api), failed(api)))
        with pytest.raises(RuntimeError):  # reads the failing pod's log tail
            run_training_job(manifest, api_client=api.client, poll_seconds=0.01)
        needed |= {rule_for(r.method, r.path) for r in api.requests}
    with FakeKubeAPI() as api:
        api.on_get(plural, running(api))
        timer = threading.Timer(0.2, os.kill, (os.getpid(), signal.SIGTERM))
        timer.start()
        try:
            with pytest.raises(SystemExit):
                run_training_job(manifest, api_client=api.client, poll_seconds=0.01)
        finally:
            timer.cancel()
        needed |= {rule_for(r.method, r.path) for r in api.requests}
    return needed


def scripted_runs() -> set[tuple]:
    """The RBAC rules behind every request of full launcher and preflight runs, both job kinds."""
    args = {
        "run_id": RUN_ID,
        "namespace": NS,
        "config_path": "/mnt/models/runs/r1/train/c.json",
        "trainer_image": "img:1",
        "num_nodes": 1,
        "gpus_per_node": 8,
        "data_pvc": "llm-data",
        "model_pvc": "llm-models",
        "hf_token_secret": "hf-token",
        "node_selector": {},
        "tolerations": [],
    }
    needed = launcher_rules(pytorchjob_for_run(**args), "pytorchjobs", "training.kubeflow.org/job-name", "Succeeded")
    needed |= launcher_rules(trainjob_for_run(**args), "trainjobs", "jobset.sigs.k8s.io/jobset-name", "Complete")
    from tests.fakes.katib import KatibAPI, experiment, katib_runs, succeeds, trial

    with KatibAPI() as api:  # the search step: an Experiment followed to the end, one given up (deleted)
        api.on_get("experiments", api.steps(*succeeds(api)))
        run_experiment(experiment(), api_client=api.client, poll_seconds=0.01)
        needed |= {rule_for(r.method, r.path) for r in api.requests}
    with KatibAPI() as api:
        api.on_get("experiments", katib_runs(api, trial("t-1", "3e-05", "Running")))
        with pytest.raises(TimeoutError):
            run_experiment(experiment(), api_client=api.client, poll_seconds=0.01, timeout_seconds=0.1)
        needed |= {rule_for(r.method, r.path) for r in api.requests}
    with FakeKubeAPI() as api:  # the train step's Tensorboard, created and then found existing
        api.install_crd(tensorboard.GROUP, tensorboard.VERSION, tensorboard.PLURAL, tensorboard.KIND)
        for _ in range(2):
            tensorboard.ensure_tensorboard(
                tensorboard.tensorboard_manifest("tb-1", NS, "llm-models", RUN_ID), api_client=api.client
            )
        needed |= {rule_for(r.method, r.path) for r in api.requests}
    with FakeKubeAPI() as api, tempfile.TemporaryDirectory() as root:  # no controller: a Deployment and a Service
        board = tensorboard.tensorboard_manifest("tb-1", NS, "llm-models", RUN_ID)
        tensorboard.ensure_tensorboard(board, api_client=api.client, model_root=root)
        tensorboard.remove_servers(root, RUN_ID, api_client=api.client)  # the exit handler
        needed |= {rule_for(r.method, r.path) for r in api.requests}
    needed |= grpo_server_rules()
    for train in ("pytorchjob", "trainjob"):
        with FakeKubeAPI() as api:
            assert (
                preflight({**PARAMS, "train_backend": train}, api_client=ready_cluster(api).client, namespace=NS) == []
            )
            needed |= {rule_for(r.method, r.path) for r in api.requests}
    with FakeKubeAPI() as api:  # with a search: Katib, and the namespace's injection label
        ready_cluster(api).install_crd("kubeflow.org", "v1beta1", "experiments", "Experiment")
        api.add_namespace(NS, {"katib.kubeflow.org/metrics-collector-injection": "enabled"})
        assert preflight({**PARAMS, "hpo_trials": 4}, api_client=api.client, namespace=NS) == []
        needed |= {rule_for(r.method, r.path) for r in api.requests}
    return needed - {None}


def grpo_server_rules() -> set[tuple]:
    """The grpo stage's own vLLM server (components/train/launcher/generation_server.py): created, waited on until ready
    (its pods listed), deleted when the stage ends; one a killed step left, deleted by the exit handler; and the
    preflight of a run that has one."""
    from components.observe.run_objects import GRPO_SERVER_RECORD, record_objects, remove_recorded
    from components.settings import Settings, defaults
    from components.train.launcher import generation_server

    grpo = {"stages": ["sft", "grpo"], "grpo_generation_backend": "vllm-server"}
    s = Settings.from_flat({**defaults(), **grpo})
    model = f"/mnt/models/runs/{RUN_ID}/train/final"
    needed = set()
    with FakeKubeAPI() as api, tempfile.TemporaryDirectory() as root:
        ready = {"n": 0}

        def becomes_ready(obj):
            ready["n"] += 1
            obj["status"] = {"readyReplicas": 1} if ready["n"] > 1 else {}

        api.on_get("deployments", becomes_ready)
        with generation_server.generation_server(
            s.job,
            s.storage,
            run_id=RUN_ID,
            namespace=NS,
            model_path=model,
            model_root=root,
            pending_timeout_seconds=s.scheduling.pending_timeout_seconds,
            api_client=api.client,
            poll_seconds=0.01,
        ):
            pass
        manifests = generation_server.run_server_manifests(
            s.job, s.storage, run_id=RUN_ID, namespace=NS, model_path=model
        )
        record_objects(root, RUN_ID, GRPO_SERVER_RECORD, manifests)
        remove_recorded(root, RUN_ID, GRPO_SERVER_RECORD, api_client=api.client)  # the exit handler
        needed |= {rule_for(r.method, r.path) for r in api.requests}
    with FakeKubeAPI() as api:
        assert preflight({**PARAMS, **grpo}, api_client=ready_cluster(api).client, namespace=NS) == []
        needed |= {rule_for(r.method, r.path) for r in api.requests}
    return needed


def deployer_rules() -> set[tuple]:
    """The deployer's API calls, made by running it against the fake API server: a new service that becomes Ready
    and passes its smoke test, an existing one patched in place, and the two rollbacks (delete, restore)."""
    needed = set()
    manifest = build_inference_service(
        InferenceServiceSpec(
            name="qwen3-sft",
            namespace=NS,
            storage_uri="pvc://llm-models/runs/r/train/final",
            runtime="kserve-vllm",
            gpus=1,
            max_model_len=4096,
            served_model_name="qwen3-sft",
            node_selector={},
            tolerations=[],
            labels={},
        )
    )
    group, version, plural = isvc_manifest.GROUP, isvc_manifest.VERSION, isvc_manifest.PLURAL
    for existing, fail in [(False, False), (True, False), (False, True), (True, True)]:
        with FakeKubeAPI() as api, OpenAIServer(fail=fail) as server:
            if existing:
                old = copy.deepcopy(manifest)
                old["status"] = {
                    "observedGeneration": 1,
                    "url": server.url,
                    "conditions": [{"type": "Ready", "status": "True"}],
                }
                api.put_object(group, version, plural, old)
            api.on_get(plural, becomes_ready(api, server.url))
            try:
                deploy_inference_service(copy.deepcopy(manifest), api_client=api.client, poll_seconds=0.01)
            except RuntimeError:
                assert fail
            needed |= {rule_for(r.method, r.path) for r in api.requests}
    return needed


def granted(role: dict, namespaced: bool) -> set[tuple]:
    return {
        (namespaced, g, r, v)
        for rule in role["rules"]
        for g in rule["apiGroups"]
        for r in rule["resources"]
        for v in rule["verbs"]
    }


@pytest.fixture(scope="module")
def needed_rules():
    previous = kube.API_RETRY_WINDOW_SECONDS
    kube.API_RETRY_WINDOW_SECONDS = 3.0
    try:
        return scripted_runs() | deployer_rules()
    finally:
        kube.API_RETRY_WINDOW_SECONDS = previous


def test_role_grants_exactly_what_the_code_calls(needed_rules):
    role = package_role()
    assert granted(role, True) == {r for r in needed_rules if r[0]}


def test_cluster_role_grants_only_listing_nodes_and_training_runtimes(needed_rules):
    (cluster_role,) = resources("ClusterRole")
    assert (
        granted(cluster_role, False)
        == {r for r in needed_rules if not r[0]}
        == {(False, "", "nodes", "list"), (False, "trainer.kubeflow.org", "clustertrainingruntimes", "list")}
    )


def test_secret_access_is_limited_to_the_token_alert_langfuse_tracking_and_model_store_secrets():
    role = package_role()
    # Two rules: create (the grpo server's new token, any name: create cannot name one), and get by name.
    create, rule = sorted((r for r in role["rules"] if "secrets" in r["resources"]), key=lambda r: "resourceNames" in r)
    assert create == {"apiGroups": [""], "resources": ["secrets"], "verbs": ["create"]}
    assert rule["resourceNames"] == [
        PARAMS["hf_token_secret"],
        PARAMS["alert_webhook_secret"],
        "llm-langfuse",
        "llm-tracking",
        "llm-model-store",  # model_store_secret: the train step's launcher reads the keys to upload (storage)
    ]
    assert rule["verbs"] == ["get"]


def test_preflight_reviews_what_the_role_grants_to_the_runner():
    role = package_role()
    reviewed = {
        (True, g, f"{r}/{s}" if s else r, v)
        for v, g, r, s in [
            *LAUNCHER_ACCESS["pytorchjob"],
            *LAUNCHER_ACCESS["trainjob"],
            *POD_ACCESS,
            *DEPLOYER_ACCESS,
            *TENSORBOARD_ACCESS,
            *TENSORBOARD_SERVER_ACCESS,
            *GRPO_SERVER_ACCESS,
            *SEARCH_ACCESS,
        ]
    }
    # The rest of the Role is preflight's own reads, which it checks by making them.
    assert granted(role, True) - reviewed == {
        (True, "", "persistentvolumeclaims", "get"),
        (True, "", "secrets", "get"),
        (True, "", "namespaces", "get"),
    }


# -- kustomize ------------------------------------------------------------------------------------------


def kustomize(path: Path) -> list[dict]:
    if shutil.which("kubectl") is None:
        pytest.skip("kubectl (with its built-in kustomize) is not installed")
    proc = subprocess.run(["kubectl", "kustomize", str(path)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    return [d for d in yaml.safe_load_all(proc.stdout) if d]


def test_kustomization_builds_the_namespaced_prerequisites():
    built = {(d["kind"], d["metadata"]["name"]): d for d in kustomize(MANIFESTS)}
    assert set(built) == {
        ("ServiceAccount", "llm-post-training-runner"),
        ("Role", "llm-post-training-runner"),
        ("Role", "llm-post-training-kfp-runtime"),
        ("RoleBinding", "llm-post-training-runner"),
        ("RoleBinding", "llm-post-training-kfp-runtime"),
        ("PersistentVolumeClaim", "llm-data"),
        ("PersistentVolumeClaim", "llm-models"),
    }
    namespaces = {d["metadata"]["namespace"] for d in built.values()}
    # The steps run as the package's own account, bound to the package's Role and KFP's own needs only (not
    # Kubeflow's default-editor, whose edit rights the package's Role would only add to).
    for binding in ("llm-post-training-runner", "llm-post-training-kfp-runtime"):
        (subject,) = built[("RoleBinding", binding)]["subjects"]
        assert len(namespaces) == 1 and subject["namespace"] in namespaces
        assert subject == {"kind": "ServiceAccount", "name": RUNNER, "namespace": subject["namespace"]}
        assert built[("RoleBinding", binding)]["roleRef"]["name"] == binding
    from pipelines.params import RUNNER_SERVICE_ACCOUNT

    assert RUNNER_SERVICE_ACCOUNT == "llm-post-training-runner"  # what `python -m pipelines.run --host` submits with
    # KFP's machinery reads one Secret by name, never lists or reads others
    secrets = [r for r in built[("Role", "llm-post-training-kfp-runtime")]["rules"] if "secrets" in r["resources"]]
    assert secrets == [
        {"apiGroups": [""], "resources": ["secrets"], "resourceNames": ["mlpipeline-minio-artifact"], "verbs": ["get"]}
    ]


def test_parameters_reach_every_resource(tmp_path):
    """One place for the namespace and the parameters (settings/), and both builds follow it: a changed
    namespace or runner account moves the ClusterRoleBinding's subject along with the RoleBinding's."""
    copy = tmp_path / "manifests"
    shutil.copytree(MANIFESTS, copy, ignore=shutil.ignore_patterns("serving"))
    params = copy / "settings" / "params.yaml"
    text = params.read_text()
    for old, new in [
        ("runnerServiceAccount: llm-post-training-runner", "runnerServiceAccount: pipeline-runner"),
        ("storageClassName: standard-rwx", "storageClassName: efs-sc"),
        ("hfTokenSecret: hf-token", "hfTokenSecret: team-hf"),
        ("alertWebhookSecret: llm-alerts", "alertWebhookSecret: team-alerts"),
        ("langfuseSecret: llm-langfuse", "langfuseSecret: team-langfuse"),
        ("trackingSecret: llm-tracking", "trackingSecret: team-tracking"),
        ("modelStoreSecret: llm-model-store", "modelStoreSecret: team-store"),
    ]:
        assert old in text
        text = text.replace(old, new)
    params.write_text(text)
    settings = copy / "settings" / "kustomization.yaml"
    assert "namespace: kubeflow-user-example-com" in settings.read_text()
    settings.write_text(settings.read_text().replace("namespace: kubeflow-user-example-com", "namespace: kubeflow"))
    built = {(d["kind"], d["metadata"]["name"]): d for d in kustomize(copy)}
    for binding in ("llm-post-training-runner", "llm-post-training-kfp-runtime"):
        assert built[("RoleBinding", binding)]["subjects"] == [
            {"kind": "ServiceAccount", "name": "pipeline-runner", "namespace": "kubeflow"}
        ]
    assert {d["spec"]["storageClassName"] for k, d in built.items() if k[0] == "PersistentVolumeClaim"} == {"efs-sc"}
    rules = built[("Role", "llm-post-training-runner")]["rules"]
    (secrets,) = [r for r in rules if "secrets" in r["resources"] and "resourceNames" in r]
    assert secrets["resourceNames"] == ["team-hf", "team-alerts", "team-langfuse", "team-tracking", "team-store"]
    assert {d["metadata"]["namespace"] for d in built.values()} == {"kubeflow"}
    cluster = {d["kind"]: d for d in kustomize(copy / "cluster")}
    assert cluster["ClusterRoleBinding"]["subjects"] == [
        {"kind": "ServiceAccount", "name": "pipeline-runner", "namespace": "kubeflow"}
    ]


def test_cluster_kustomization_builds_with_the_same_subject():
    built = {d["kind"]: d for d in kustomize(MANIFESTS / "cluster")}
    assert sorted(built) == ["ClusterRole", "ClusterRoleBinding"]
    (namespaced,) = [d for d in kustomize(MANIFESTS) if (d["kind"], d["metadata"]["name"]) == ("RoleBinding", RUNNER)]
    assert built["ClusterRoleBinding"]["subjects"] == namespaced["subjects"]
    assert "namespace" not in built["ClusterRole"]["metadata"]  # cluster-scoped


def test_bindings_name_no_subject_of_their_own():
    """The files hold placeholders: the subject comes from settings/ only, so no copy of it can go stale."""
    for path in (MANIFESTS / "rbac" / "rolebinding.yaml", MANIFESTS / "cluster" / "clusterrolebinding.yaml"):
        for binding in documents(path):
            assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "runner", "namespace": "runs"}], path


def test_serving_runtime_builds_into_the_runs_namespace():
    (runtime,) = kustomize(MANIFESTS / "serving")
    (role,) = [d for d in kustomize(MANIFESTS) if (d["kind"], d["metadata"]["name"]) == ("Role", RUNNER)]
    assert runtime["kind"] == "ServingRuntime" and runtime["metadata"]["namespace"] == role["metadata"]["namespace"]
