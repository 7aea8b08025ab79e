"""The grpo stage's own vLLM generation server on a cluster (grpo_generation_backend=vllm-server with no
grpo_vllm_server_url; issue 30): the train step creates its ConfigMap, Deployment and Service, waits until the
Deployment has a ready replica, runs the job with the server's URL in the trainer config, and deletes the three when
the stage ends, succeeded or failed; a killed step's are deleted by the exit handler; ``--render`` writes them. Driven
through the real kubernetes client against the fake API server (tests/fakes/k8s_api.py)."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml
from kfp.dsl import PipelineTaskFinalStatus
from kubernetes import client as k8s

from components import kube
from components.kube import RUN_ID_LABEL
from components.observe.component import notify_run
from components.observe.run_objects import GRPO_SERVER_RECORD, record_objects
from components.settings import Settings, defaults
from components.stages import job_groups
from components.train.launcher import generation_server
from components.train.launcher import job as launch
from components.train.launcher.generation_server import (
    run_server_manifests,
    server_name,
    service_url,
    weight_sync_secret_name,
)
from components.train.launcher.run import train_stage
from tests.fakes.k8s_api import FakeKubeAPI

RUN_ID = "7d2e9a41-0c5b-4f8e-9a63-1b4c2d8e7f90"
NS = "team-llm"
NAME = server_name(RUN_ID)
MODEL = f"/mnt/models/runs/{RUN_ID}/sft/final"
IMAGE = "registry.example/vllm/vllm-openai:v0.32.0"
KEYS = {
    "ConfigMap": ("", "v1", "configmaps", NS, f"{NAME}-engine"),
    "Deployment": ("apps", "v1", "deployments", NS, NAME),
    "Service": ("", "v1", "services", NS, NAME),
    "NetworkPolicy": ("networking.k8s.io", "v1", "networkpolicies", NS, NAME),
}
GRPO = {
    "stages": ["sft", "grpo"],
    "grpo_dataset_source": "builtin:arithmetic",
    "grpo_generation_backend": "vllm-server",
    "grpo_vllm_image": IMAGE,
    "grpo_vllm_server_gpus": 2,
    "image_pull_secrets": ["regcred"],
    "node_selector": {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"},
    "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
    "tensorboard": False,
    "prometheus_url": "",
    "model_pvc": "llm-models",
    "pending_timeout_seconds": 300,
}


def _round_trip(manifest: dict, model: str) -> dict:
    """``manifest`` through the kubernetes client's typed model and back: an unknown field is dropped."""
    api = k8s.ApiClient()
    return api.sanitize_for_serialization(api.deserialize(SimpleNamespace(data=json.dumps(manifest)), model))


def settings(**over) -> Settings:
    return Settings.from_flat({**defaults(), **GRPO, **over})


def server_groups(**over) -> tuple:
    """The job and storage settings the server's manifests are made from."""
    s = settings(**over)
    return s.job, s.storage


def server_args(**over) -> dict:
    """What the train step hands ``generation_server`` from the run's settings."""
    s = settings(**over)
    return {"job": s.job, "storage": s.storage, "pending_timeout_seconds": s.scheduling.pending_timeout_seconds}


def ready_after(gets: int):
    """The Deployment controller's side: the server's replica is ready after ``gets`` reads of the Deployment."""
    seen = {"n": 0}

    def advance(obj):
        seen["n"] += 1
        obj["status"] = {"replicas": 1, "readyReplicas": 1} if seen["n"] >= gets else {"replicas": 1}

    return advance


@pytest.fixture(autouse=True)
def fast_polls(monkeypatch):
    monkeypatch.setattr(generation_server, "POLL_SECONDS", 0.01)


def test_only_this_runs_pods_reach_the_server_and_it_requests_cpu_and_memory():
    """Issue 39: vLLM's RL routes (/pause, /update_weights, the weight-transfer group) answer anyone who reaches the
    port, and vLLM's --api-key guards only /v1. The run's NetworkPolicy admits to the server's pod, on its port only,
    the pods labelled with this run's id (the training job's pods are); every other pod of the cluster is refused
    where the CNI enforces NetworkPolicy. The pod requests CPU and memory (Burstable, not the first evicted)."""
    policy, _, deployment, service = run_server_manifests(
        *server_groups(grpo_vllm_server_gpus=2), run_id=RUN_ID, namespace=NS, model_path=MODEL
    )
    assert policy["kind"] == "NetworkPolicy" and policy["metadata"]["name"] == NAME
    assert _round_trip(policy, "V1NetworkPolicy") == policy
    server_pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
    selected = policy["spec"]["podSelector"]["matchLabels"]
    assert selected.items() <= server_pod_labels.items() and selected == service["spec"]["selector"]
    assert policy["spec"]["policyTypes"] == ["Ingress"]
    (rule,) = policy["spec"]["ingress"]
    assert rule["from"] == [{"podSelector": {"matchLabels": {RUN_ID_LABEL: RUN_ID}}}]  # this namespace, this run
    assert rule["ports"] == [{"protocol": "TCP", "port": generation_server.PORT}]
    # The training job's pods carry the label the policy admits.
    job = launch.training_job_for_run(
        *job_groups(settings(), "grpo"),
        stage="grpo",
        run_id=RUN_ID,
        namespace=NS,
        config_path="/mnt/models/runs/r1/train/c.json",
    )
    for replica in job["spec"]["pytorchReplicaSpecs"].values():
        assert replica["template"]["metadata"]["labels"][RUN_ID_LABEL] == RUN_ID
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    assert container["resources"]["requests"] == {"nvidia.com/gpu": "2", "cpu": "8", "memory": "32Gi"}
    assert "cpu" not in container["resources"]["limits"] and "memory" not in container["resources"]["limits"]


def test_the_server_is_named_labelled_and_placed_from_the_cluster_settings():
    _, config_map, deployment, service = run_server_manifests(
        *server_groups(), run_id=RUN_ID, namespace=NS, model_path=MODEL
    )
    assert NAME == kube.job_name_for(RUN_ID, "gen") and kube.DNS1035_LABEL.match(NAME)
    for obj in (config_map, deployment, service):
        assert obj["metadata"]["labels"][RUN_ID_LABEL] == RUN_ID and obj["metadata"]["namespace"] == NS
    assert _round_trip(deployment, "V1Deployment") == deployment
    pod = deployment["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert container["image"] == IMAGE and container["resources"]["limits"]["nvidia.com/gpu"] == "2"
    assert container["args"][container["args"].index("--tensor-parallel-size") + 1] == "2"
    assert pod["imagePullSecrets"] == [{"name": "regcred"}]
    assert pod["nodeSelector"] == GRPO["node_selector"] and pod["tolerations"] == GRPO["tolerations"]
    assert pod["volumes"][1]["persistentVolumeClaim"] == {"claimName": "llm-models", "readOnly": True}
    with pytest.raises(ValueError, match="grpo_vllm_server_url"):
        run_server_manifests(*server_groups(), run_id=RUN_ID, namespace=NS, model_path="Qwen/Qwen3-0.6B")


def test_it_runs_while_the_block_runs_and_is_deleted_after(tmp_path):
    manifests = run_server_manifests(*server_groups(), run_id=RUN_ID, namespace=NS, model_path=MODEL)
    record = tmp_path / "runs" / RUN_ID / GRPO_SERVER_RECORD
    with FakeKubeAPI() as api:
        api.on_get("deployments", ready_after(3))
        with generation_server.generation_server(
            **server_args(),
            run_id=RUN_ID,
            namespace=NS,
            model_path=MODEL,
            model_root=str(tmp_path),
            api_client=api.client,
        ) as url:
            assert url == service_url(NAME, NS) == f"http://{NAME}.{NS}.svc:8000"
            for manifest in manifests:
                stored = api.objects[KEYS[manifest["kind"]]]
                assert stored["metadata"]["labels"] == manifest["metadata"]["labels"]
                assert {k: v for k, v in stored.items() if k not in ("metadata", "status")} == {
                    k: v for k, v in manifest.items() if k != "metadata"
                }
            assert len(api.requests_for("GET", f"/deployments/{NAME}")) == 3  # until it had a ready replica
            assert json.loads(record.read_text()) == [
                {"kind": m["kind"], "namespace": NS, "name": m["metadata"]["name"]} for m in manifests
            ]
            # The run's token: a Secret created after the NetworkPolicy, owned by it, before the server's pod; the
            # server and vLLM's --api-key read it by reference.
            posts = [r.path.rsplit("/", 1)[-1] for r in api.requests_for("POST")]
            assert posts == ["networkpolicies", "secrets", "configmaps", "deployments", "services"], posts
            secret = api.core[("secrets", NS, weight_sync_secret_name(RUN_ID))]
            policy = api.objects[KEYS["NetworkPolicy"]]
            assert secret["metadata"]["ownerReferences"] == [
                {
                    "apiVersion": "networking.k8s.io/v1",
                    "kind": "NetworkPolicy",
                    "name": NAME,
                    "uid": policy["metadata"]["uid"],
                }
            ]
            assert secret["metadata"]["labels"] == {RUN_ID_LABEL: RUN_ID} and len(secret["data"]["token"]) >= 40
            env = api.objects[KEYS["Deployment"]]["spec"]["template"]["spec"]["containers"][0]["env"]
            assert [e for e in env if "valueFrom" in e] == [
                {"name": var, "valueFrom": {"secretKeyRef": {"name": weight_sync_secret_name(RUN_ID), "key": "token"}}}
                for var in ("VLLM_API_KEY", "KFP_WEIGHT_SYNC_TOKEN")
            ]
        assert not any(key in api.objects for key in KEYS.values())
        assert len(api.requests_for("DELETE")) == 4
        assert not record.exists()
        # Kubernetes' garbage collector deleted the token with its owner, the NetworkPolicy.
        assert ("secrets", NS, weight_sync_secret_name(RUN_ID)) not in api.core


def test_a_failed_stage_deletes_it_too(tmp_path):
    with FakeKubeAPI() as api:
        api.on_get("deployments", ready_after(1))
        with pytest.raises(RuntimeError, match="the job failed"):
            with generation_server.generation_server(
                **server_args(),
                run_id=RUN_ID,
                namespace=NS,
                model_path=MODEL,
                model_root=str(tmp_path),
                api_client=api.client,
            ):
                raise RuntimeError("the job failed")
        assert not any(key in api.objects for key in KEYS.values())
        assert not (tmp_path / "runs" / RUN_ID / GRPO_SERVER_RECORD).exists()


def test_a_server_that_cannot_start_fails_with_the_pods_reason_and_is_deleted(tmp_path):
    with FakeKubeAPI() as api:
        api.on_get("deployments", ready_after(10**6))
        labels = {"app.kubernetes.io/name": "grpo-vllm-server", "app.kubernetes.io/instance": NAME}
        api.add_pod(
            NS,
            f"{NAME}-5d8f-abcde",
            labels,
            container="vllm",
            state="waiting",
            reason="ImagePullBackOff",
            message=f'Back-off pulling image "{IMAGE}"',
        )
        with pytest.raises(RuntimeError, match=f"server {NS}/{NAME} cannot start: .*ImagePullBackOff"):
            with generation_server.generation_server(
                **server_args(),
                run_id=RUN_ID,
                namespace=NS,
                model_path=MODEL,
                model_root=str(tmp_path),
                api_client=api.client,
            ):
                pytest.fail("the block runs only once the server is ready")
        assert not any(key in api.objects for key in KEYS.values())
    with FakeKubeAPI() as api:  # never ready, never failing: the timeout
        api.on_get("deployments", ready_after(10**6))
        with pytest.raises(TimeoutError, match="not ready after"):
            with generation_server.generation_server(
                **server_args(),
                run_id=RUN_ID,
                namespace=NS,
                model_path=MODEL,
                model_root=str(tmp_path),
                api_client=api.client,
                ready_timeout_seconds=0.05,
            ):
                pass
        assert not any(key in api.objects for key in KEYS.values())


def test_the_exit_handler_deletes_what_a_killed_step_left(tmp_path, monkeypatch):
    manifests = run_server_manifests(*server_groups(), run_id=RUN_ID, namespace=NS, model_path=MODEL)
    with FakeKubeAPI() as api:
        monkeypatch.setattr("components.observe.run_objects.load_api_client", lambda: api.client)
        monkeypatch.setattr("components.observe.tensorboard.load_api_client", lambda: api.client)
        # The step recorded and created them, then was killed before its finally.
        record_objects(str(tmp_path), RUN_ID, GRPO_SERVER_RECORD, manifests)
        for m in manifests:
            group, version = m["apiVersion"].rpartition("/")[::2]
            api.put_object(group, version, KEYS[m["kind"]][2], m)
        status = PipelineTaskFinalStatus(
            state="FAILED",
            pipeline_job_resource_name="runs/r",
            pipeline_task_name="",
            error_code=None,
            error_message="",
        )
        kwargs = dict(status=status, run_id=RUN_ID, model_root=str(tmp_path), model_pvc="llm-models")
        notify_run.python_func(**kwargs, data_root=str(tmp_path))
        assert not any(key in api.objects for key in KEYS.values())
        assert not (tmp_path / "runs" / RUN_ID / GRPO_SERVER_RECORD).exists()
        notify_run.python_func(**kwargs, data_root=str(tmp_path))  # the record is gone: nothing more to delete
        assert len(api.requests_for("DELETE")) == 4


@pytest.mark.parametrize("job_fails", [False, True])
def test_the_train_step_runs_the_grpo_job_against_its_own_server(tmp_path, monkeypatch, job_fails):
    data, models = tmp_path / "data", tmp_path / "models"
    out = models / "runs" / RUN_ID / "grpo"
    seen: dict = {}
    with FakeKubeAPI() as api:
        api.on_get("deployments", ready_after(2))

        def run_training_job(manifest, **kwargs):
            # The server is up, ready, while the job runs; the job's config names it.
            seen["objects"] = [key for key in KEYS.values() if key in api.objects]
            seen["ready"] = api.objects[KEYS["Deployment"]]["status"].get("readyReplicas")
            seen["cfg"] = json.loads((out / "train_config.json").read_text())
            if job_fails:
                raise SystemExit(1)
            (out / "final").mkdir(parents=True, exist_ok=True)
            (out / "metrics.json").write_text(json.dumps({"global_step": 3}))

        monkeypatch.setattr(launch, "run_training_job", run_training_job)
        monkeypatch.setattr(kube, "current_namespace", lambda default="default": NS)
        monkeypatch.setattr(kube, "load_api_client", lambda: api.client)
        kwargs = dict(
            stage="grpo",
            base_model_path=str(models / "runs" / RUN_ID / "sft" / "final"),
            tuned={},
            dataset_path=str(data / "runs" / RUN_ID / "dataset-grpo"),
            packing=False,
            data_root=str(data),
            model_root=str(models),
            run_id=RUN_ID,
        )
        if job_fails:
            with pytest.raises(SystemExit):
                train_stage(settings(), **kwargs)
        else:
            train_stage(settings(), **kwargs)
        assert seen["objects"] == list(KEYS.values()) and seen["ready"] == 1
        assert seen["cfg"]["grpo_vllm_server_url"] == f"http://{NAME}.{NS}.svc:8000"
        assert seen["cfg"]["grpo_generation_backend"] == "vllm-server"
        deployment = api.requests_for("POST", f"/apis/apps/v1/namespaces/{NS}/deployments")[0].body
        assert deployment["spec"]["template"]["spec"]["containers"][0]["args"][1] == MODEL  # --model, the sft's
        assert not any(key in api.objects for key in KEYS.values())  # deleted, succeeded or failed
        assert not (models / "runs" / RUN_ID / GRPO_SERVER_RECORD).exists()


def test_a_given_url_or_another_stage_creates_nothing(tmp_path, monkeypatch):
    with FakeKubeAPI() as api:
        seen = []
        monkeypatch.setattr(launch, "run_training_job", lambda manifest, **kw: seen.append(manifest) or _ends(tmp_path))
        monkeypatch.setattr(kube, "current_namespace", lambda default="default": NS)
        monkeypatch.setattr(kube, "load_api_client", lambda: api.client)
        s = settings(grpo_vllm_server_url="http://my-vllm.team-llm.svc:8000")
        train_stage(
            s,
            stage="grpo",
            base_model_path=str(tmp_path / "models" / "runs" / RUN_ID / "sft" / "final"),
            tuned={},
            dataset_path=str(tmp_path / "data" / "d"),
            packing=False,
            data_root=str(tmp_path / "data"),
            model_root=str(tmp_path / "models"),
            run_id=RUN_ID,
        )
        cfg = json.loads((tmp_path / "models" / "runs" / RUN_ID / "grpo" / "train_config.json").read_text())
        assert cfg["grpo_vllm_server_url"] == "http://my-vllm.team-llm.svc:8000"
        # No server: the only objects are the job's own NetworkPolicy, created before it and deleted after.
        policies = f"/apis/networking.k8s.io/v1/namespaces/{NS}/networkpolicies"
        name = kube.job_name_for(RUN_ID, "grpo")
        assert len(seen) == 1 and [(r.method, r.path) for r in api.requests] == [
            ("POST", policies),
            ("DELETE", f"{policies}/{name}"),
        ]


def _ends(root: Path) -> None:
    out = root / "models" / "runs" / RUN_ID / "grpo"
    (out / "final").mkdir(parents=True, exist_ok=True)
    (out / "metrics.json").write_text("{}")


def test_render_writes_the_servers_manifests_and_the_config_names_its_url(tmp_path):
    from components.kube import job_name_for
    from pipelines.render import RENDER_RUN_ID, render

    params = {**defaults(), **GRPO, "model_name_or_path": "builtin:tiny-qwen3"}
    render(params, tmp_path, namespace="team-a")
    docs = list(yaml.safe_load_all((tmp_path / "grpo-vllm-server.yaml").read_text()))
    assert [d["kind"] for d in docs] == ["NetworkPolicy", "ConfigMap", "Deployment", "Service"]
    assert _round_trip(docs[0], "V1NetworkPolicy") == docs[0]
    assert _round_trip(docs[1], "V1ConfigMap") == docs[1]
    assert _round_trip(docs[2], "V1Deployment") == docs[2]
    assert _round_trip(docs[3], "V1Service") == docs[3]
    sft_final = f"/mnt/models/runs/{RENDER_RUN_ID}/train/final"
    assert docs == run_server_manifests(
        *server_groups(), run_id=RENDER_RUN_ID, namespace="team-a", model_path=sft_final
    )
    cfg = json.loads((tmp_path / "train_config-grpo.json").read_text())
    assert cfg["grpo_vllm_server_url"] == f"http://{job_name_for(RENDER_RUN_ID, 'gen')}.team-a.svc:8000"
    # With a URL given, or a transformers grpo stage: no server to write.
    render({**params, "grpo_vllm_server_url": "http://x:8000"}, tmp_path / "given", namespace="team-a")
    render({**params, "grpo_generation_backend": "transformers"}, tmp_path / "tf", namespace="team-a")
    assert not (tmp_path / "given" / "grpo-vllm-server.yaml").exists()
    assert not (tmp_path / "tf" / "grpo-vllm-server.yaml").exists()


def test_preflight_reviews_what_the_server_needs_only_when_the_step_runs_one():
    from components.validate.preflight import preflight
    from tests.helpers.cluster import NS as ns
    from tests.helpers.cluster import PARAMS, ready_cluster

    grpo = {"stages": ["sft", "grpo"], "grpo_generation_backend": "vllm-server"}
    with FakeKubeAPI() as api:
        ready_cluster(api).deny("create", "configmaps")
        assert preflight({**PARAMS, **grpo}, api_client=api.client, namespace=ns) == [
            f"this service account may not create configmaps in {ns}: apply manifests/rbac (kubectl apply -k "
            "manifests/) for the pipeline runner"
        ]
        given = {**grpo, "grpo_vllm_server_url": "http://my-vllm:8000"}
        assert preflight({**PARAMS, **given}, api_client=api.client, namespace=ns) == []


@pytest.mark.parametrize("backend", ["pytorchjob", "trainjob"])
def test_the_grpo_stages_pods_send_the_runs_token_and_other_stages_have_none(backend):
    """The grpo job's trainer reads the run's token from its server's Secret (optional: a server the user started has
    none, and then none is sent); no other stage's pods reference it."""
    s = settings(train_backend=backend)
    ref = {"name": weight_sync_secret_name(RUN_ID), "key": "token", "optional": True}
    for stage, expected in (
        ("grpo", [{"name": "KFP_WEIGHT_SYNC_TOKEN", "valueFrom": {"secretKeyRef": ref}}]),
        ("sft", []),
    ):
        job = launch.training_job_for_run(
            *job_groups(s, stage),
            run_id=RUN_ID,
            namespace=NS,
            config_path=f"/mnt/models/runs/{RUN_ID}/{stage}/c.json",
            stage=stage,
        )
        spec = job["spec"]
        envs = (
            [r["template"]["spec"]["containers"][0]["env"] for r in spec["pytorchReplicaSpecs"].values()]
            if backend == "pytorchjob"
            else [spec["trainer"]["env"]]
        )
        for env in envs:
            assert [e for e in env if e["name"] == "KFP_WEIGHT_SYNC_TOKEN"] == expected, stage
