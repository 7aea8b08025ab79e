"""The TrainJob for each Kubeflow Trainer release (issue 19, defect 3): Trainer v2.1.0 patches the runtime's pods
through ``spec.podTemplateOverrides`` and has no ``activeDeadlineSeconds``; ``spec.runtimePatches`` arrived in
v2.2.0. The API server prunes the fields a structural schema does not declare, with only a warning, so a TrainJob
rendered for the wrong release starts its pods without the claims, ``/dev/shm`` or placement.

Checked against each release's real CRD (tests/reference/crds/ and crds/v2.1.0/) with the project's schema
checker, and against the API server's pruning; the installed release is read from the schema the (fake) API server
publishes, as the launcher and preflight read it.
"""

from __future__ import annotations

import copy
import functools
import json
import logging
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from components import kube
from components.paths import MODEL_MOUNT
from components.settings import Settings
from components.stages import job_groups
from components.train.launcher.job import training_job_for_run
from components.train.launcher.pytorchjob import pytorchjob_for_run
from components.train.launcher.trainjob import (
    OPENAPI_PATH,
    TRAINER_V2_1,
    TRAINER_V2_2,
    installed_trainer_version,
    trainjob_for_run,
)
from components.validate.preflight import preflight
from tests.fakes.k8s_api import FakeKubeAPI
from tests.helpers.cluster import NS, PARAMS, ready_cluster
from tests.helpers.crd_schema import crd_errors
from tests.helpers.repo import REFERENCE

ROOT = Path(__file__).resolve().parents[3]
CRDS = {TRAINER_V2_2: "trainer.kubeflow.org_trainjobs.yaml", TRAINER_V2_1: "v2.1.0/trainer.kubeflow.org_trainjobs.yaml"}
RUN_ID = "8b0e3f2a-1c2d-4e5f-9a8b-7c6d5e4f3a2b"
RUN_ARGS = {
    "run_id": RUN_ID,
    "namespace": NS,
    "config_path": f"{MODEL_MOUNT}/runs/{RUN_ID}/train/train_config.json",
    "trainer_image": "registry.example/trainer:0.1.0",
    "num_nodes": 2,
    "gpus_per_node": 8,
    "data_pvc": "llm-data",
    "model_pvc": "llm-models",
    "hf_token_secret": "hf-token",
    "node_selector": {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"},
    "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
}
OPTIONS = {
    "queue_name": "team-llm-h100",
    "affinity": {"podAffinity": {}},
    "nccl_env": {"NCCL_IB_HCA": "mlx5"},
    "shm_size": "32Gi",
    "tracking_secret": "trackers",
}


@pytest.fixture(autouse=True)
def short_api_outages(monkeypatch):
    monkeypatch.setattr(kube, "API_RETRY_WINDOW_SECONDS", 3.0)


def manifest(version: str, **overrides) -> dict:
    return trainjob_for_run(**{**RUN_ARGS, **overrides}, trainer_version=version)


@functools.cache
def _schema(version: str) -> dict:
    crd = yaml.load((REFERENCE / "crds" / CRDS[version]).read_text(), Loader=yaml.CSafeLoader)
    (served,) = crd["spec"]["versions"]
    return served["schema"]["openAPIV3Schema"]


def schema(version: str) -> dict:
    """The TrainJob's openAPIV3Schema in the release's CRD (a copy)."""
    return copy.deepcopy(_schema(version))


def prune(obj, schema: dict):
    """``obj`` as the API server stores it: fields a structural schema does not declare are dropped, silently
    (apiextensions-apiserver's pruning; ``x-kubernetes-preserve-unknown-fields`` keeps them)."""
    if isinstance(obj, dict):
        if schema.get("x-kubernetes-preserve-unknown-fields") and "properties" not in schema:
            return copy.deepcopy(obj)
        if "properties" in schema:
            return {k: prune(v, schema["properties"][k]) for k, v in obj.items() if k in schema["properties"]}
        if isinstance(schema.get("additionalProperties"), dict):
            return {k: prune(v, schema["additionalProperties"]) for k, v in obj.items()}
        return copy.deepcopy(obj)
    if isinstance(obj, list) and "items" in schema:
        return [prune(v, schema["items"]) for v in obj]
    return obj


def pod_patch(job: dict) -> dict:
    """The pod template patch, wherever the release keeps it."""
    spec = job["spec"]
    if "runtimePatches" in spec:
        (patch,) = spec["runtimePatches"]
        (node,) = patch["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"]
        return node["template"]["spec"]["template"]
    (override,) = spec["podTemplateOverrides"]
    assert override["targetJobs"] == [{"name": "node"}]
    return {k: v for k, v in override.items() if k != "targetJobs"}


def runtime_v2_1() -> dict:
    return yaml.safe_load((REFERENCE / "runtimes" / "v2.1.0_torch_distributed.yaml").read_text())


def merge_by_name(base: list, patch: list, key: str = "name") -> list:
    out = [copy.deepcopy(item) for item in base]
    for item in patch:
        mine = next((o for o in out if o.get(key) == item.get(key)), None)
        if mine is None:
            out.append(copy.deepcopy(item))
        else:
            for k, v in item.items():
                mine[k] = merge_by_name(mine.get(k, []), v, "mountPath") if k == "volumeMounts" else copy.deepcopy(v)
    return out


def apply_overrides_v2_1(template: dict, job: dict) -> dict:
    """The pod template Trainer v2.1 gives the ``node`` job (pkg/runtime/core/trainingruntime.go,
    mergePodTemplateOverrides): a strategic merge of each override's metadata labels/annotations and spec into
    the runtime's, containers and volumes merged by name, volume mounts by mount path."""
    out = copy.deepcopy(template)
    for override in job["spec"]["podTemplateOverrides"]:
        if {"name": "node"} not in override["targetJobs"]:
            continue
        for k in ("labels", "annotations"):
            out.setdefault("metadata", {})[k] = {
                **out.get("metadata", {}).get(k, {}),
                **override.get("metadata", {}).get(k, {}),
            }
        for k, v in override.get("spec", {}).items():
            spec = out.setdefault("spec", {})
            spec[k] = merge_by_name(spec.get(k, []), v) if k in ("containers", "volumes") else copy.deepcopy(v)
    return out


# -- rendering for each release ---------------------------------------------------------------------------


@pytest.mark.parametrize("version", [TRAINER_V2_1, TRAINER_V2_2])
@pytest.mark.parametrize("options", [{}, OPTIONS], ids=["plain", "options"])
def test_each_release_gets_a_trainjob_its_crd_accepts(version, options):
    assert crd_errors(manifest(version, **options), CRDS[version]) == []


def test_a_trainjob_for_v2_2_is_not_one_v2_1_accepts():
    errors = crd_errors(manifest(TRAINER_V2_2), CRDS[TRAINER_V2_1])
    assert any("runtimePatches" in e for e in errors), errors
    errors = crd_errors(manifest(TRAINER_V2_1), CRDS[TRAINER_V2_2])
    assert any("podTemplateOverrides" in e for e in errors), errors


def test_on_v2_1_the_api_server_prunes_a_v2_2_trainjobs_volumes_shm_and_placement():
    """The defect: stored by a v2.1 API server, the TrainJob for v2.2 keeps the trainer fields and loses the patch."""
    stored = prune(manifest(TRAINER_V2_2), schema(TRAINER_V2_1))
    assert stored["spec"]["trainer"] == manifest(TRAINER_V2_2)["spec"]["trainer"]
    assert "runtimePatches" not in stored["spec"] and "podTemplateOverrides" not in stored["spec"]
    text = json.dumps(stored)
    for lost in ("persistentVolumeClaim", "/dev/shm", "volumeMounts", "nodeSelector", "tolerations"):
        assert lost not in text, lost


@pytest.mark.parametrize("version", [TRAINER_V2_1, TRAINER_V2_2])
def test_the_trainjob_for_the_installed_release_survives_pruning_whole(version):
    job = manifest(version, **OPTIONS)
    assert prune(job, schema(version)) == job
    pod = pod_patch(job)
    assert {v["name"] for v in pod["spec"]["volumes"]} == {"data", "models", "dshm"}
    assert pod["spec"]["nodeSelector"] and pod["spec"]["tolerations"] and pod["spec"]["affinity"]


def test_v2_1_overrides_give_the_runtimes_node_pods_the_pytorchjobs_volumes_and_placement():
    runtime = runtime_v2_1()
    (rjob,) = runtime["spec"]["template"]["spec"]["replicatedJobs"]
    assert runtime["metadata"]["name"] == manifest(TRAINER_V2_1)["spec"]["runtimeRef"]["name"]
    assert rjob["name"] == "node"
    pod = apply_overrides_v2_1(rjob["template"]["spec"]["template"], manifest(TRAINER_V2_1))
    master = pytorchjob_for_run(**RUN_ARGS)["spec"]["pytorchReplicaSpecs"]["Master"]["template"]
    (node,) = pod["spec"]["containers"]
    assert node["name"] == "node" and node["volumeMounts"] == master["spec"]["containers"][0]["volumeMounts"]
    for key in ("volumes", "nodeSelector", "tolerations"):
        assert pod["spec"][key] == master["spec"][key], key
    assert master["metadata"]["labels"].items() <= pod["metadata"]["labels"].items()
    assert pod["metadata"]["annotations"] == master["metadata"]["annotations"]  # the Istio opt-out


def test_only_v2_2_carries_the_grace_period_and_security_context():
    """v2.1's podTemplateOverrides has no field for them: left out rather than pruned (preflight warns)."""
    v22, v21 = pod_patch(manifest(TRAINER_V2_2))["spec"], pod_patch(manifest(TRAINER_V2_1))["spec"]
    assert v22["terminationGracePeriodSeconds"] >= 600 and v22["securityContext"]["runAsNonRoot"] is True
    assert "securityContext" in v22["containers"][0]
    assert not {"terminationGracePeriodSeconds", "securityContext"} & set(v21)
    assert "securityContext" not in v21["containers"][0]


def test_a_deadline_is_refused_on_v2_1_naming_the_setting_and_the_release():
    assert manifest(TRAINER_V2_2, active_deadline_seconds=7200)["spec"]["activeDeadlineSeconds"] == 7200
    with pytest.raises(
        ValueError,
        match=r"active_deadline_seconds=7200: Trainer v2\.1's TrainJob has no "
        r"activeDeadlineSeconds .*v2\.2\.0",
    ):
        manifest(TRAINER_V2_1, active_deadline_seconds=7200)


def test_an_unknown_release_is_a_value_error():
    with pytest.raises(ValueError, match="trainer_version 'v3' must be one of"):
        manifest("v3")


def test_the_train_step_renders_for_the_version_it_read():
    groups = job_groups(Settings.from_flat({"train_backend": "trainjob"}), "sft")
    job = training_job_for_run(
        *groups,
        run_id=RUN_ID,
        namespace=NS,
        config_path="/mnt/models/runs/r1/train/c.json",
        trainer_version=TRAINER_V2_1,
    )
    assert crd_errors(job, CRDS[TRAINER_V2_1]) == []
    default = training_job_for_run(*groups, run_id=RUN_ID, namespace=NS, config_path="/mnt/models/runs/r1/train/c.json")
    assert crd_errors(default, CRDS[TRAINER_V2_2]) == []  # --render, with no cluster to ask


# -- reading the installed release ------------------------------------------------------------------------


def publish(api: FakeKubeAPI, version_schema: dict) -> FakeKubeAPI:
    api.install_crd("trainer.kubeflow.org", "v1alpha1", "trainjobs", "TrainJob")
    api.publish_schema("trainer.kubeflow.org", "v1alpha1", "TrainJob", version_schema)
    return api


def v2_0_schema() -> dict:
    """Trainer v2.0.0's TrainJob spec patched pods through podSpecOverrides (kubeflow/trainer tag v2.0.0)."""
    s = copy.deepcopy(schema(TRAINER_V2_1))
    spec = s["properties"]["spec"]["properties"]
    spec["podSpecOverrides"] = spec.pop("podTemplateOverrides")
    return s


@pytest.mark.parametrize("version", [TRAINER_V2_1, TRAINER_V2_2])
def test_the_installed_release_is_read_from_the_published_schema(version):
    with publish(FakeKubeAPI(), schema(version)) as api:
        assert installed_trainer_version(api.client) == version
        # One read, of what every authenticated account may read: no ClusterRole for the CRD needed.
        assert [r.path for r in api.requests] == [OPENAPI_PATH]


def test_trainer_v2_0_is_refused_naming_the_release():
    refused = (
        r"Trainer v2\.0 \(its TrainJob patches pods through spec\.podSpecOverrides\)"
        r".*install Kubeflow Trainer v2\.1"
    )
    with publish(FakeKubeAPI(), v2_0_schema()) as api, pytest.raises(RuntimeError, match=refused):
        installed_trainer_version(api.client)


def test_no_trainer_is_an_error_naming_the_fix():
    with FakeKubeAPI() as api, pytest.raises(RuntimeError, match="publishes no TrainJob schema .*install Kubeflow"):
        installed_trainer_version(api.client)


def test_dry_run_renders_for_the_release_named():
    cli = [
        "--run-id",
        RUN_ID,
        "--config-path",
        "/mnt/models/runs/r1/train/c.json",
        *["-p", "gpus_per_node=8", "-p", "num_nodes=2", "-p", "data_pvc=llm-data", "-p", "model_pvc=llm-models"],
        "--namespace",
        NS,
        *["-p", "train_backend=trainjob"],
        "--dry-run",
    ]

    def run(*args):
        return subprocess.run(
            [sys.executable, "-m", "components.train.launcher", *cli, *args],
            check=False,
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=120,
        )

    proc = run("--trainer-version", "v2.1")
    assert proc.returncode == 0, proc.stderr
    assert crd_errors(yaml.safe_load(proc.stdout), CRDS[TRAINER_V2_1]) == []
    proc = run("--trainer-version", "v2.1", "-p", "active_deadline_seconds=60")
    assert proc.returncode == 2 and proc.stderr.startswith("error: active_deadline_seconds=60: Trainer v2.1")


# -- preflight --------------------------------------------------------------------------------------------


def check(api: FakeKubeAPI, **overrides) -> list[str]:
    return preflight({**PARAMS, "train_backend": "trainjob", **overrides}, api_client=api.client, namespace=NS)


def v2_1_cluster(api: FakeKubeAPI) -> FakeKubeAPI:
    ready_cluster(api).publish_schema("trainer.kubeflow.org", "v1alpha1", "TrainJob", schema(TRAINER_V2_1))
    return api


def test_preflight_refuses_a_deadline_trainer_v2_1_cannot_honour():
    with v2_1_cluster(FakeKubeAPI()) as api:
        (problem,) = check(api, active_deadline_seconds=7200)
    assert problem.startswith("active_deadline_seconds=7200: Trainer v2.1's TrainJob has no activeDeadlineSeconds")


def test_preflight_passes_v2_1_without_a_deadline_and_warns_what_it_cannot_set(caplog):
    with v2_1_cluster(FakeKubeAPI()) as api:
        api.add_namespace(NS, {"pod-security.kubernetes.io/enforce": "restricted"})
        with caplog.at_level(logging.WARNING):
            assert check(api) == []
    warned = caplog.text
    assert "Trainer v2.1: the TrainJob cannot set its pods' grace period or security context" in warned
    assert "enforces the restricted Pod Security Standard" in warned


def test_preflight_passes_a_deadline_on_v2_2():
    with FakeKubeAPI() as api:
        assert check(ready_cluster(api), active_deadline_seconds=7200) == []


def test_preflight_refuses_trainer_v2_0():
    with ready_cluster(FakeKubeAPI()) as api:
        api.publish_schema("trainer.kubeflow.org", "v1alpha1", "TrainJob", v2_0_schema())
        (problem,) = check(api)
    assert problem.startswith("train_backend=trainjob: this cluster runs Trainer v2.0")


def test_preflight_does_not_read_the_schema_for_a_pytorchjob():
    with FakeKubeAPI() as api:
        assert check(ready_cluster(api), train_backend="pytorchjob") == []
        assert api.requests_for("GET", "/openapi/") == []
