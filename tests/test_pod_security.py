"""The pods the package creates pass the Pod Security Standards' ``restricted`` profile (issue 19, defect 10): the
training job's pods (PyTorchJob; TrainJob on Trainer v2.2 and later), the serving pods (the InferenceService on each
runtime), the pipeline's steps (as KFP's backend 2.16 and later builds their pods), and the images they run as.

Each pod is built the way its controller builds it from what we render (the operator copies the template; the
Trainer merges its patch into the runtime's pod; KServe merges the model container into the runtime's; KFP's compiler
and driver add their security defaults), then checked with tests/helpers/pod_security.py, the standard's rules as
Kubernetes defines them. What still needs ``baseline`` is tested as such: a TrainJob on Trainer v2.1.
"""

from __future__ import annotations

import copy
import re

import pytest
import yaml

from components.deploy.manifest import InferenceServiceSpec, build_inference_service
from components.deploy.serving_runtime import serving_runtime_manifest
from components.security import RUN_AS_GROUP, RUN_AS_USER
from components.train.launcher.pytorchjob import pytorchjob_for_run
from components.train.launcher.trainjob import TRAINER_V2_1, TRAINER_V2_2, trainjob_for_run
from pipelines.compile import COMPILED
from tests.helpers.pod_security import violations
from tests.helpers.repo import REFERENCE, ROOT

RUN_ARGS = {
    "run_id": "8b0e3f2a-1c2d-4e5f-9a8b-7c6d5e4f3a2b",
    "namespace": "team-llm",
    "config_path": "/mnt/models/runs/r1/train/c.json",
    "trainer_image": "registry.example/trainer:0.1.0",
    "num_nodes": 2,
    "gpus_per_node": 8,
    "data_pvc": "llm-data",
    "model_pvc": "llm-models",
    "hf_token_secret": "hf-token",
    "node_selector": {"gpu": "h100"},
    "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
    "tracking_secret": "trackers",
}


def merge_by_name(base: list, patch: list) -> list:
    out = [copy.deepcopy(item) for item in base]
    for item in patch:
        mine = next((o for o in out if o.get("name") == item.get("name")), None)
        if mine is None:
            out.append(copy.deepcopy(item))
        else:
            mine.update(copy.deepcopy(item))
    return out


def merge_pod(template: dict, patch: dict) -> dict:
    """A pod template with a patch merged in as the Trainer does it (maps merged, containers and volumes by name)."""
    out = copy.deepcopy(template)
    for key in ("labels", "annotations"):
        if (patch.get("metadata") or {}).get(key):
            out.setdefault("metadata", {}).setdefault(key, {}).update(patch["metadata"][key])
    for key, value in (patch.get("spec") or {}).items():
        spec = out.setdefault("spec", {})
        named = key in ("containers", "volumes")
        spec[key] = merge_by_name(spec.get(key, []), value) if named else copy.deepcopy(value)
    return out


def runtime_pod(filename: str) -> dict:
    """The ``node`` replicated job's pod template of a torch-distributed ClusterTrainingRuntime (Helm lines dropped)."""
    text = (REFERENCE / "runtimes" / filename).read_text()
    runtime = yaml.safe_load("\n".join(line for line in text.splitlines() if "{{" not in line))
    (rjob,) = runtime["spec"]["template"]["spec"]["replicatedJobs"]
    return rjob["template"]["spec"]["template"]


def trainjob_pod(version: str) -> dict:
    """A TrainJob's node pod as the Trainer of ``version`` builds it: the runtime's pod, the trainer fields in the
    ``node`` container, then our pod patch merged in."""
    job = trainjob_for_run(**RUN_ARGS, trainer_version=version)
    pod = runtime_pod("runtime_torch_distributed.yaml" if version == TRAINER_V2_2 else "v2.1.0_torch_distributed.yaml")
    trainer = job["spec"]["trainer"]
    node = pod["spec"]["containers"][0]
    node.update(
        image=trainer["image"],
        command=trainer["command"],
        args=trainer["args"],
        env=trainer["env"],
        resources=trainer["resourcesPerNode"],
    )
    if version == TRAINER_V2_2:
        (patch,) = job["spec"]["runtimePatches"]
        (rjob,) = patch["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"]
        return merge_pod(pod, rjob["template"]["spec"]["template"])
    (override,) = job["spec"]["podTemplateOverrides"]
    return merge_pod(pod, override)


# -- the checker can fail ---------------------------------------------------------------------------------


def test_a_pod_with_kubernetes_defaults_is_baseline_but_not_restricted():
    pod = {"spec": {"containers": [{"name": "c", "image": "x"}], "volumes": [{"name": "v", "emptyDir": {}}]}}
    assert violations(pod, "baseline") == []
    found = " | ".join(violations(pod))
    for control in ("Privilege Escalation", "Running as Non-root", "Seccomp", "Capabilities"):
        assert control in found, control


@pytest.mark.parametrize(
    "spec,control",
    [
        ({"hostNetwork": True}, "Host Namespaces"),
        ({"volumes": [{"name": "h", "hostPath": {"path": "/"}}]}, "HostPath Volumes"),
        ({"containers": [{"name": "c", "securityContext": {"privileged": True}}]}, "Privileged Containers"),
        ({"containers": [{"name": "c", "securityContext": {"capabilities": {"add": ["SYS_ADMIN"]}}}]}, "Capabilities"),
        ({"containers": [{"name": "c", "ports": [{"containerPort": 80, "hostPort": 80}]}]}, "Host Ports"),
        ({"securityContext": {"seccompProfile": {"type": "Unconfined"}}}, "Seccomp"),
        ({"securityContext": {"sysctls": [{"name": "kernel.msgmax", "value": "1"}]}}, "Sysctls"),
        ({"securityContext": {"seLinuxOptions": {"type": "spc_t"}}}, "SELinux"),
    ],
)
def test_each_baseline_control_fails_its_pod(spec, control):
    pod = {"spec": {"containers": [{"name": "c"}], **spec}}
    assert any(v.startswith(control) for v in violations(pod, "baseline")), violations(pod, "baseline")


@pytest.mark.parametrize(
    "change,control",
    [
        (lambda p: p["spec"]["volumes"].append({"name": "n", "nfs": {"server": "s", "path": "/"}}), "Volume Types"),
        (lambda p: p["spec"]["containers"][0]["securityContext"].update(runAsNonRoot=False), "Running as Non-root"),
        (lambda p: p["spec"]["securityContext"].update(runAsUser=0), "Running as Non-root user"),
        (
            lambda p: p["spec"]["containers"][0]["securityContext"].pop("allowPrivilegeEscalation"),
            "Privilege Escalation",
        ),
        (
            lambda p: p["spec"]["containers"][0]["securityContext"]["capabilities"].update(add=["NET_RAW"]),
            "Capabilities",
        ),
        (lambda p: p["spec"]["securityContext"].pop("seccompProfile"), "Seccomp"),
    ],
)
def test_each_restricted_control_fails_an_otherwise_restricted_pod(change, control):
    pod = {
        "spec": {
            "securityContext": {"runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}},
            "containers": [
                {"name": "c", "securityContext": {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}}
            ],
            "volumes": [{"name": "d", "persistentVolumeClaim": {"claimName": "x"}}, {"name": "e", "emptyDir": {}}],
        }
    }
    assert violations(pod) == []
    change(pod)
    assert any(v.startswith(control) for v in violations(pod)), violations(pod)


# -- the training job's pods ------------------------------------------------------------------------------


@pytest.mark.parametrize("options", [{}, {"min_nodes": 1}], ids=["static", "elastic"])
def test_pytorchjob_pods_are_restricted_with_no_token(options):
    job = pytorchjob_for_run(**RUN_ARGS, **options)
    for replica in job["spec"]["pytorchReplicaSpecs"].values():
        pod = replica["template"]
        assert violations(pod) == []
        assert pod["spec"]["automountServiceAccountToken"] is False  # the trainer never calls the API
        assert pod["spec"]["securityContext"]["runAsUser"] == RUN_AS_USER
        assert pod["spec"]["securityContext"]["fsGroup"] == RUN_AS_GROUP  # the claims' files, where the volume allows


def test_trainjob_pods_on_trainer_v2_2_are_restricted():
    pod = trainjob_pod(TRAINER_V2_2)
    assert violations(pod) == []
    assert pod["spec"]["terminationGracePeriodSeconds"] >= 600


def test_trainjob_pods_on_trainer_v2_1_need_baseline():
    """v2.1's podTemplateOverrides has no securityContext: the pods get the runtime's, which sets none."""
    pod = trainjob_pod(TRAINER_V2_1)
    assert violations(pod, "baseline") == []
    assert violations(pod) != []


# -- the serving pods -------------------------------------------------------------------------------------

# What Knative admits in a container's securityContext (knative/serving pkg/apis/serving/fieldmask.go).
KNATIVE_CONTAINER_SECURITY_FIELDS = {
    "capabilities",
    "readOnlyRootFilesystem",
    "runAsUser",
    "runAsGroup",
    "runAsNonRoot",
    "allowPrivilegeEscalation",
    "seccompProfile",
    "privileged",
}


def kserve_runtime(backend: str) -> dict:
    if backend == "manifests/serving":
        return serving_runtime_manifest("team-llm")
    name = {
        "kserve-vllm": "runtime_kserve-vllmserver.yaml",
        "kserve-huggingface": "runtime_kserve-huggingfaceserver.yaml",
    }
    return yaml.safe_load((REFERENCE / "runtimes" / name[backend]).read_text())


def predictor_pod(isvc: dict, runtime: dict) -> dict:
    """The predictor pod as KServe builds it: the predictor's pod fields, the runtime's container with the model
    container merged over it (securityContext key by key, env by name), the runtime's volumes and the model claim."""
    predictor = isvc["spec"]["predictor"]
    model = predictor["model"]
    (runtime_container,) = copy.deepcopy(runtime["spec"]["containers"])
    merged_context = {**runtime_container.get("securityContext", {}), **model.get("securityContext", {})}
    container = {
        **runtime_container,
        "securityContext": merged_context,
        "env": merge_by_name(runtime_container.get("env", []), model.get("env", [])),
        "args": runtime_container.get("args", []) + model.get("args", []),
        "resources": model["resources"],
    }
    claim = model["storageUri"].removeprefix("pvc://").split("/")[0]
    spec = {
        k: predictor[k]
        for k in ("securityContext", "automountServiceAccountToken", "nodeSelector", "tolerations")
        if k in predictor
    }
    spec.update(
        containers=[container],
        volumes=[
            *runtime["spec"].get("volumes", []),
            {"name": "kserve-pvc-source", "persistentVolumeClaim": {"claimName": claim, "readOnly": True}},
        ],
    )
    return {"metadata": {"annotations": predictor.get("annotations", {})}, "spec": spec}


@pytest.mark.parametrize(
    "backend,runtime",
    [
        ("kserve-vllm", "manifests/serving"),
        ("kserve-vllm", "kserve-vllm"),
        ("kserve-huggingface", "kserve-huggingface"),
    ],
)
@pytest.mark.parametrize("mode", ["Standard", "Knative"])
def test_serving_pods_are_restricted_with_no_token_and_a_writable_home(backend, runtime, mode):
    isvc = build_inference_service(
        InferenceServiceSpec(
            name="llm-serving",
            namespace="team-llm",
            storage_uri="pvc://llm-models/runs/r/sft/final",
            runtime=backend,
            gpus=2,
            max_model_len=4096,
            served_model_name="llm",
            node_selector={"gpu": "h100"},
            tolerations=[],
            deployment_mode=mode,
        )
    )
    pod = predictor_pod(isvc, kserve_runtime(runtime))
    assert violations(pod) == []
    assert pod["spec"]["automountServiceAccountToken"] is False
    (container,) = pod["spec"]["containers"]
    assert container["securityContext"]["runAsUser"] == RUN_AS_USER  # vLLM's image would run as root
    assert {"name": "HOME", "value": "/tmp"} in container["env"]  # its home belongs to root


def test_the_inference_service_sets_no_pod_level_security_context():
    """Knative admits a pod-level securityContext only with its kubernetes.podspec-securitycontext feature on (off by
    default; knative/serving pkg/apis/serving/fieldmask.go PodSpecMask, PodSecurityContextMask): everything is on the
    container, whose securityContext Knative admits field by field (SecurityContextMask)."""
    for mode in ("Standard", "Knative"):
        isvc = build_inference_service(
            InferenceServiceSpec(
                name="llm-serving",
                namespace="team-llm",
                storage_uri="pvc://llm-models/final",
                runtime="kserve-vllm",
                gpus=1,
                max_model_len=4096,
                served_model_name="llm",
                node_selector={},
                tolerations=[],
                deployment_mode=mode,
            )
        )
        predictor = isvc["spec"]["predictor"]
        assert "securityContext" not in predictor
        assert set(predictor["model"]["securityContext"]) <= KNATIVE_CONTAINER_SECURITY_FIELDS


def test_our_serving_runtime_alone_is_restricted():
    """Also for an InferenceService that is not ours: the runtime's container carries the whole context."""
    runtime = serving_runtime_manifest("team-llm")
    pod = {"spec": {"containers": runtime["spec"]["containers"], "volumes": runtime["spec"]["volumes"]}}
    assert violations(pod) == []


# -- the pipeline's steps ---------------------------------------------------------------------------------

# KFP's backend 2.16 and later (kubeflow/pipelines backend/src/v2/compiler/argocompiler/security_context.go and
# container.go; backend/src/v2/driver/k8s.go): every executor pod gets a RuntimeDefault seccomp profile; its main
# container allowPrivilegeEscalation=false, capabilities drop ALL, RuntimeDefault seccomp, then the SDK's
# runAsUser/runAsGroup/runAsNonRoot (kfp.kubernetes.set_security_context); its init container (the KFP launcher)
# all of those with runAsNonRoot=true; its scratch folders are emptyDirs. Argo's own init and wait containers take
# the workflow controller's executor settings, which KFP's manifests set to the same (manifests/kustomize/
# third-party/argo/base/workflow-controller-configmap-patch.yaml).
KFP_HARDENED = {
    "allowPrivilegeEscalation": False,
    "capabilities": {"drop": ["ALL"]},
    "seccompProfile": {"type": "RuntimeDefault"},
}
KFP_SCRATCH = [
    "kfp-launcher",
    "gcs-scratch",
    "s3-scratch",
    "minio-scratch",
    "dot-local-scratch",
    "dot-cache-scratch",
    "dot-config-scratch",
]
ARGO_EXECUTOR = {"runAsNonRoot": True, "runAsUser": 65532, **KFP_HARDENED}


def kfp_step_pod(executor: dict) -> dict:
    """A step's pod as KFP's backend builds it from the step's kubernetes platform config ``executor``."""
    sdk = {
        k: int(v) if k in ("runAsUser", "runAsGroup") else v for k, v in (executor.get("securityContext") or {}).items()
    }
    volumes = [{"name": n, "emptyDir": {}} for n in KFP_SCRATCH]
    volumes += [
        {"name": f"pvc-{i}", "persistentVolumeClaim": {"claimName": "from-a-parameter"}}
        for i, _ in enumerate(executor.get("pvcMount") or [])
    ]
    volumes += [
        {"name": m["volumeName"], "emptyDir": {"medium": m.get("medium", "")}}
        for m in executor.get("emptyDirMounts") or []
    ]
    return {
        "spec": {
            "securityContext": {"seccompProfile": {"type": "RuntimeDefault"}},
            "initContainers": [
                {"name": "kfp-launcher", "securityContext": {**KFP_HARDENED, "runAsNonRoot": True}},
                {"name": "init", "securityContext": ARGO_EXECUTOR},
            ],
            "containers": [
                {"name": "main", "securityContext": {**KFP_HARDENED, **sdk}},
                {"name": "wait", "securityContext": ARGO_EXECUTOR},
            ],
            "volumes": volumes,
        }
    }


@pytest.fixture(scope="module")
def executors() -> dict:
    # The YAML users upload (tests/pipelines/test_compile.py holds it equal to a fresh compile).
    pipeline, platform = yaml.safe_load_all(COMPILED.read_text())
    configs = platform["platforms"]["kubernetes"]["deploymentSpec"]["executors"]
    return {name: configs.get(name, {}) for name in pipeline["deploymentSpec"]["executors"]}


def test_every_step_runs_as_the_images_non_root_user(executors):
    for name, executor in executors.items():
        assert executor.get("securityContext") == {
            "runAsUser": str(RUN_AS_USER),
            "runAsGroup": str(RUN_AS_GROUP),
            "runAsNonRoot": True,
        }, name


def test_every_steps_pod_is_restricted_on_kfp_2_16_and_later(executors):
    for name, executor in executors.items():
        assert violations(kfp_step_pod(executor)) == [], name
        # Without our setting the image's user would go unchecked: runAsNonRoot is what restricted asks for.
        bare = kfp_step_pod({k: v for k, v in executor.items() if k != "securityContext"})
        assert any(v.startswith("Running as Non-root") for v in violations(bare)), name


# -- the images -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("image", ["components", "trainer"])
def test_images_run_as_the_pods_numeric_non_root_user_with_a_home(image):
    text = (ROOT / "images" / image / "Dockerfile").read_text()
    users = re.findall(r"^USER\s+(\S+)\s*$", text, re.M)
    assert users and users[-1] == f"{RUN_AS_USER}:{RUN_AS_GROUP}"  # numeric: the kubelet can verify runAsNonRoot
    assert f"useradd --uid {RUN_AS_USER} --gid {RUN_AS_GROUP} --create-home --home-dir /home/llm" in text
    assert re.search(r"^ENV HOME=/home/llm$", text, re.M)
    # Nothing runs as root after the switch.
    assert not re.search(r"^RUN ", text.split(f"USER {users[-1]}")[-1], re.M)
