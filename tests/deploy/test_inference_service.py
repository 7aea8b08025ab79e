"""The InferenceService manifest (against KServe's CRD and runtimes) and its rollout (against the fake API
server, with a tiny local OpenAI-compatible server standing in for the model server)."""

from __future__ import annotations

import threading

import pytest
import yaml

from components import kube
from components.deploy.manifest import RUNTIMES
from components.deploy.rollout import deploy_inference_service
from tests.fakes.k8s_api import FakeKubeAPI
from tests.fakes.kserve import becomes_ready
from tests.fakes.openai_server import OpenAIServer
from tests.helpers.crd_schema import crd_errors
from tests.helpers.inference_service import CRD, GVP, NAME, NS, STORAGE, isvc
from tests.helpers.repo import REFERENCE

FAST = {"poll_seconds": 0.01}


@pytest.fixture(autouse=True)
def short_api_outages(monkeypatch):
    """A scenario mistake must fail in seconds, not after five minutes of API retries."""
    monkeypatch.setattr(kube, "API_RETRY_WINDOW_SECONDS", 3.0)


# -- the manifest ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("runtime", sorted(RUNTIMES))
def test_manifest_matches_the_crd(runtime):
    assert crd_errors(isvc(runtime), CRD) == []


def test_vllm_predictor_names_the_runtime_format_and_engine_args():
    model = isvc("kserve-vllm", gpus=4, max_model_len=4096)["spec"]["predictor"]["model"]
    assert model["modelFormat"] == {"name": "vLLM"} and model["runtime"] == "kserve-vllmserver"
    assert model["storageUri"] == STORAGE
    assert model["args"] == ["--served-model-name=qwen3-sft", "--tensor-parallel-size=4", "--max-model-len=4096"]
    assert model["resources"]["limits"]["nvidia.com/gpu"] == "4" == model["resources"]["requests"]["nvidia.com/gpu"]


def test_huggingface_predictor_uses_the_vllm_backend():
    model = isvc("kserve-huggingface", gpus=1)["spec"]["predictor"]["model"]
    assert model["modelFormat"] == {"name": "huggingface"} and model["runtime"] == "kserve-huggingfaceserver"
    assert "--backend=vllm" in model["args"] and "--model_name=qwen3-sft" in model["args"]
    assert "--tensor-parallel-size=1" in model["args"] and "--max_model_len=8192" in model["args"]


def test_placement_and_labels():
    manifest = isvc()
    assert manifest["metadata"]["labels"] == {"pipelines.kubeflow.org/run-id": "8b0e3f2a"}
    assert manifest["spec"]["predictor"]["nodeSelector"] == {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}
    assert manifest["spec"]["predictor"]["tolerations"][0]["key"] == "nvidia.com/gpu"
    assert "nodeSelector" not in isvc(node_selector={}, tolerations=[])["spec"]["predictor"]


@pytest.mark.parametrize("runtime", sorted(RUNTIMES))
def test_runtimes_match_kserves_definitions(runtime):
    """Our format, runtime name and OpenAI route agree with KServe's shipped ClusterServingRuntime."""
    rt = RUNTIMES[runtime]
    definition = yaml.safe_load((REFERENCE / "runtimes" / f"runtime_{rt.runtime}.yaml").read_text())
    assert definition["metadata"]["name"] == rt.runtime
    assert rt.model_format in [f["name"] for f in definition["spec"]["supportedModelFormats"]]
    (container,) = definition["spec"]["containers"]
    # The runtime names the model after the service unless our (later) flag overrides it.
    assert any(a.startswith(rt.served_name_flag + "=") for a in container["args"])
    # vLLM's own server routes /v1; KServe's model server mounts OpenAI under /openai/v1.
    serves_vllm_directly = "vllm.entrypoints.openai.api_server" in container.get("command", [])
    assert rt.openai_route == ("/v1" if serves_vllm_directly else "/openai/v1")


@pytest.mark.parametrize(
    "field,value",
    [
        ("name", "Qwen3_SFT"),
        ("runtime", "triton"),
        ("gpus", 0),
        ("max_model_len", 0),
        ("storage_uri", "/mnt/models/x"),
        ("served_model_name", ""),
    ],
)
def test_bad_input_is_a_value_error_naming_the_field(field, value):
    with pytest.raises(ValueError, match=field):
        isvc(**{field: value})


# -- the rollout against the fake API server -------------------------------------------------------------


def existing_service(api, url, **overrides) -> dict:
    """A Ready service from an earlier run (older model, extra field our spec does not have)."""
    old = isvc(storage_uri="pvc://llm-models/runs/previous/train/final", max_model_len=4096, **overrides)
    old["spec"]["predictor"]["minReplicas"] = 1
    old["status"] = {"observedGeneration": 1, "url": url, "conditions": [{"type": "Ready", "status": "True"}]}
    return api.put_object(*GVP, old)


@pytest.mark.parametrize("runtime,route", [("kserve-vllm", "/v1"), ("kserve-huggingface", "/openai/v1")])
def test_create_then_ready_then_smoke_test(runtime, route):
    with FakeKubeAPI() as api, OpenAIServer() as model_server:
        api.on_get("inferenceservices", becomes_ready(api, model_server.url, after=2))
        result = deploy_inference_service(isvc(runtime), api_client=api.client, **FAST)
        assert len(api.requests_for("POST", "/inferenceservices")) == 1
    assert result == {
        "endpoint": model_server.url + route,
        "served_model_name": "qwen3-sft",
        "smoke_reply": "Hi! How can I help?",
    }
    ((path, body),) = model_server.requests
    assert path == route + "/chat/completions" and body["model"] == "qwen3-sft"


def test_smoke_test_uses_the_in_cluster_address_and_reports_the_public_url():
    with FakeKubeAPI() as api, OpenAIServer() as model_server:
        public = "http://qwen3-30b-a3b-sft-team-llm.example.invalid"
        api.on_get("inferenceservices", becomes_ready(api, public, address=model_server.url))
        result = deploy_inference_service(isvc(), api_client=api.client, **FAST)
    assert result["endpoint"] == public + "/v1" and len(model_server.requests) == 1


def test_existing_service_is_patched_in_place_and_stale_ready_is_not_trusted():
    """Standard mode over a live service: the spec is tested on a candidate beside it, then the live service is patched
    in place (same object), and the old generation's Ready is not taken for the new one's."""
    events = []
    with FakeKubeAPI() as api, OpenAIServer(events=events) as model_server:
        before = existing_service(api, model_server.url)
        # The old generation's Ready=True stays in place for three polls after the patch.
        api.on_get("inferenceservices", becomes_ready(api, model_server.url, after=3, events=events))
        deploy_inference_service(isvc(), api_client=api.client, **FAST)
        assert [r.path.rsplit("/", 1)[1] for r in api.requests_for("POST")] == ["inferenceservices"]
        assert api.requests_for("POST")[0].body["metadata"]["name"] == f"{NAME}-candidate"
        assert len(api.requests_for("DELETE", f"/inferenceservices/{NAME}-candidate")) == 1
        assert len(api.requests_for("PATCH", f"/inferenceservices/{NAME}")) == 1
        after = api.get_object(*GVP, NS, NAME)
        assert api.get_object(*GVP, NS, f"{NAME}-candidate") is None
    # the candidate ready and smoke-tested, then the live service ready for the new spec and smoke-tested
    assert events == ["ready for the new spec", "smoke", "ready for the new spec", "smoke"]
    assert after["metadata"]["uid"] == before["metadata"]["uid"]
    assert after["metadata"]["generation"] == 2
    assert after["spec"] == isvc()["spec"]  # minReplicas, which our spec lacks, was removed


def test_no_request_reaches_a_failing_candidate_through_the_live_route():
    """Gates before traffic (issue 40): the live service keeps its spec, and its route its model, until the new spec
    passed on a candidate of its own; a candidate that fails is deleted and the live service never patched."""
    with FakeKubeAPI() as api, OpenAIServer() as live, OpenAIServer(fail=True) as candidate:
        before = existing_service(api, live.url)
        api.on_get("inferenceservices", by_name(api, {NAME: live.url, f"{NAME}-candidate": candidate.url}))
        with pytest.raises(
            RuntimeError, match=r"candidate.* failed the smoke test.*deleted the candidate.*was not changed"
        ):
            deploy_inference_service(isvc(), api_client=api.client, **FAST)
        assert api.requests_for("PATCH", f"/inferenceservices/{NAME}") == []  # the live service: not touched
        assert api.get_object(*GVP, NS, f"{NAME}-candidate") is None
        after = api.get_object(*GVP, NS, NAME)
    assert after == before and live.requests == [] and len(candidate.requests) == 1


def test_knative_tests_the_new_revision_at_zero_percent_before_it_gets_its_share():
    """Knative over a live service: the new revision first at canaryTrafficPercent 0 (tag routing on), tested by its
    tag; only then the second patch gives it its share (here 10%); a failure there restores the previous spec."""
    for fails in (False, True):
        with FakeKubeAPI() as api, OpenAIServer(fail=fails) as latest, OpenAIServer() as stable:
            before = isvc(deployment_mode="Knative", storage_uri="pvc://llm-models/runs/previous/train/final")
            before["status"] = {
                "observedGeneration": 1,
                "url": stable.url,
                "deploymentMode": "Knative",
                "conditions": [{"type": "Ready", "status": "True"}],
            }
            api.put_object(*GVP, before)
            api.on_get("inferenceservices", knative_revisions(api, stable.url, latest.url))
            manifest = isvc(deployment_mode="Knative", canary_traffic_percent=10)
            if fails:
                with pytest.raises(RuntimeError, match="smoke test.*restored the previous spec"):
                    deploy_inference_service(manifest, api_client=api.client, **FAST)
            else:
                deploy_inference_service(manifest, api_client=api.client, **FAST)
            patches = [r.body["spec"]["predictor"].get("canaryTrafficPercent") for r in api.requests_for("PATCH")]
            after = api.get_object(*GVP, NS, NAME)
        assert patches[0] == 0 and stable.requests == [] and len(latest.requests) == 1
        if fails:  # the new revision never had a share of the traffic
            assert after["spec"] == before["spec"] and 10 not in patches
        else:
            assert patches == [0, 10] and after["spec"]["predictor"]["canaryTrafficPercent"] == 10


def by_name(api, urls: dict) -> object:
    """KServe's side for several services: each Ready at its own model server's URL."""
    controllers = {name: becomes_ready(api, url) for name, url in urls.items()}
    return lambda obj: controllers[obj["metadata"]["name"]](obj)


def knative_revisions(api, stable_url: str, latest_url: str):
    """KServe's side in Knative mode: Ready for each generation, the previous revision at ``stable_url`` and the
    latest at ``latest_url`` under their traffic tags, at the spec's canary share."""
    ready = becomes_ready(api, "http://qwen3-30b-a3b-sft.team-llm.example.invalid", address=stable_url, after=0)

    def controller(obj):
        ready(obj)
        share = obj["spec"]["predictor"].get("canaryTrafficPercent", 100)
        obj["status"]["components"] = {
            "predictor": {
                "traffic": [
                    {"tag": "prev", "percent": 100 - share, "url": stable_url, "revisionName": "p-00001"},
                    {"tag": "latest", "percent": share, "url": latest_url, "revisionName": "p-00002"},
                ]
            }
        }

    return controller


def test_never_ready_times_out_with_the_conditions_reason_and_deletes_the_new_service():
    message = 'Revision "qwen3-30b-a3b-sft-predictor-00001" failed with message: Container failed with: OOMKilled.'

    def failing(obj):
        api.set_condition(obj, "PredictorReady", "False", "RevisionFailed", message)
        api.set_condition(obj, "Ready", "False", "RevisionFailed", message)
        obj["status"]["modelStatus"] = {
            "transitionStatus": "BlockedByFailedLoad",
            "lastFailureInfo": {"reason": "ModelLoadFailed", "message": "OOMKilled"},
        }

    with FakeKubeAPI() as api:
        api.on_get("inferenceservices", failing)
        with pytest.raises(TimeoutError) as err:
            deploy_inference_service(isvc(), api_client=api.client, timeout_seconds=0.2, **FAST)
        assert api.get_object(*GVP, NS, NAME) is None
    text = str(err.value)
    assert "RevisionFailed" in text and "OOMKilled" in text and "ModelLoadFailed" in text
    assert "deleted the new InferenceService" in text


def test_the_wait_for_ready_says_how_long_the_predictor_pods_phase_and_its_last_log_lines(capsys):
    pod = f"{NAME}-predictor-7c9f"

    def loading(obj):  # the predictor loads its weights for a few polls, then KServe says Ready
        if (NS, pod) not in api.pods:
            api.add_pod(NS, pod, {"serving.kserve.io/inferenceservice": NAME}, container="kserve-container")
            api.log(NS, pod, "INFO Starting vLLM API server", "INFO Loading safetensors checkpoint shards: 0%")
        else:
            api.log(NS, pod, "INFO Loading safetensors checkpoint shards: 50%")

    with FakeKubeAPI() as api, OpenAIServer() as model_server:
        ready = becomes_ready(api, model_server.url, after=3)
        api.on_get("inferenceservices", lambda obj: (loading(obj), ready(obj)))
        deploy_inference_service(isvc(), api_client=api.client, progress_seconds=0, **FAST)
    lines = capsys.readouterr().out.splitlines()
    waiting = [i for i, line in enumerate(lines) if "is not Ready yet after" in line]
    assert waiting and all(
        lines[i].startswith(f"InferenceService {NS}/{NAME} is not Ready yet after ") for i in waiting
    )
    assert f"pod {pod} Running" in lines[waiting[-1]]
    tail = lines[waiting[-1] + 1 : waiting[-1] + 4]  # the model server's last 3 lines, as far as it had written
    assert all(line.startswith(f"  [{pod}] INFO ") for line in tail) and len(tail) == 3, lines
    assert tail[-1] == f"  [{pod}] INFO Loading safetensors checkpoint shards: 50%"


def test_the_wait_for_ready_is_quiet_between_progress_lines(capsys):
    with FakeKubeAPI() as api, OpenAIServer() as model_server:
        api.on_get("inferenceservices", becomes_ready(api, model_server.url, after=3))
        deploy_inference_service(isvc(), api_client=api.client, progress_seconds=3600, **FAST)
    assert "not Ready yet" not in capsys.readouterr().out


def test_predictor_pod_that_cannot_start_fails_fast():
    def crashing(obj):
        if ("team-llm", "p-0") not in api.pods:
            api.add_pod(
                NS,
                "p-0",
                {"serving.kserve.io/inferenceservice": NAME},
                container="kserve-container",
                state="waiting",
                reason="CrashLoopBackOff",
                message="back-off 40s restarting failed container",
            )

    with FakeKubeAPI() as api:
        api.on_get("inferenceservices", crashing)
        with pytest.raises(RuntimeError, match="CrashLoopBackOff"):
            deploy_inference_service(isvc(), api_client=api.client, **FAST)


def test_smoke_failure_deletes_a_new_service():
    with FakeKubeAPI() as api, OpenAIServer(fail=True) as model_server:
        api.on_get("inferenceservices", becomes_ready(api, model_server.url))
        with pytest.raises(RuntimeError, match="smoke test.*HTTP 500.*deleted the new InferenceService"):
            deploy_inference_service(isvc(), api_client=api.client, **FAST)
        assert len(api.requests_for("DELETE", f"/inferenceservices/{NAME}")) == 1
        assert api.get_object(*GVP, NS, NAME) is None


# -- deployment mode, canary, startup probe ----------------------------------------------------------------


@pytest.mark.parametrize("runtime", sorted(RUNTIMES))
def test_knative_canary_manifest_matches_the_crd(runtime):
    assert crd_errors(isvc(runtime, deployment_mode="Knative", canary_traffic_percent=10), CRD) == []


def test_deployment_mode_is_kserves_annotation():
    standard = isvc()
    assert standard["metadata"]["annotations"] == {"serving.kserve.io/deploymentMode": "Standard"}
    assert "canaryTrafficPercent" not in standard["spec"]["predictor"]
    assert "annotations" not in standard["spec"]["predictor"]
    knative = isvc(deployment_mode="Knative")
    assert knative["metadata"]["annotations"] == {"serving.kserve.io/deploymentMode": "Knative"}
    # Knative would fail a revision still loading after its default 10 minutes.
    assert knative["spec"]["predictor"]["annotations"] == {"serving.knative.dev/progress-deadline": "1830s"}


def test_canary_splits_traffic_and_tags_the_new_revision():
    manifest = isvc(deployment_mode="Knative", canary_traffic_percent=10)
    assert manifest["spec"]["predictor"]["canaryTrafficPercent"] == 10
    assert manifest["metadata"]["annotations"]["serving.kserve.io/enable-tag-routing"] == "true"


@pytest.mark.parametrize(
    "overrides,message",
    [
        ({"canary_traffic_percent": 10}, "canary_traffic_percent=10 needs deployment_mode='Knative'"),
        ({"deployment_mode": "Knative", "canary_traffic_percent": 100}, "canary_traffic_percent must be 0"),
        ({"deployment_mode": "RawDeployment"}, "deployment_mode 'RawDeployment' is not one of .*use 'Standard'"),
        ({"deployment_mode": "Serverless"}, "use 'Knative'"),
    ],
)
def test_bad_mode_or_canary_is_a_value_error_naming_the_field(overrides, message):
    with pytest.raises(ValueError, match=message):
        isvc(**overrides)


def test_startup_probe_only_where_the_runtime_has_none():
    """KServe's vLLM runtime already waits 30 minutes for the model; its Hugging Face runtime has no probe."""
    assert "startupProbe" not in isvc("kserve-vllm")["spec"]["predictor"]["model"]
    probe = isvc("kserve-huggingface")["spec"]["predictor"]["model"]["startupProbe"]
    assert probe["httpGet"] == {"path": "/openai/v1/models", "port": 8080}
    assert probe["initialDelaySeconds"] + probe["failureThreshold"] * probe["periodSeconds"] >= 1800
    runtimes = REFERENCE / "runtimes"
    vllm = yaml.safe_load((runtimes / "runtime_kserve-vllmserver.yaml").read_text())["spec"]["containers"][0]
    hf = yaml.safe_load((runtimes / "runtime_kserve-huggingfaceserver.yaml").read_text())["spec"]["containers"][0]
    assert "startupProbe" in vllm and "startupProbe" not in hf
    assert RUNTIMES["kserve-vllm"].has_startup_probe and not RUNTIMES["kserve-huggingface"].has_startup_probe


def test_inference_service_for_run_reads_the_deploy_job_network_and_storage_settings():
    from components.deploy.manifest import inference_service_for_run
    from components.settings import DeploySettings, Settings

    deploy = DeploySettings(deploy_backend="kserve-vllm", serving_name=NAME, serving_gpus=8, max_model_len=4096)
    s = Settings.from_flat({"node_selector": {"pool": "gpu"}, "tolerations": []})
    standard = inference_service_for_run(
        deploy, s.job, s.network, s.storage, run_id="r1", namespace=NS, storage_uri=STORAGE
    )
    assert standard["metadata"]["annotations"]["serving.kserve.io/deploymentMode"] == "Standard"
    assert standard["metadata"]["labels"] == {"pipelines.kubeflow.org/run-id": "r1"}
    assert standard["spec"]["predictor"]["nodeSelector"] == {"pool": "gpu"}
    deploy.deployment_mode, deploy.canary_traffic_percent = "Knative", 25
    canary = inference_service_for_run(
        deploy, s.job, s.network, s.storage, run_id="r1", namespace=NS, storage_uri=STORAGE
    )
    assert canary["spec"]["predictor"]["canaryTrafficPercent"] == 25
    assert crd_errors(canary, CRD) == []


def test_changing_the_mode_of_an_existing_service_is_refused_before_any_change():
    with FakeKubeAPI() as api, OpenAIServer() as model_server:
        existing = isvc(deployment_mode="Knative")
        existing["status"] = {
            "observedGeneration": 1,
            "url": model_server.url,
            "deploymentMode": "Serverless",
            "conditions": [{"type": "Ready", "status": "True"}],
        }
        api.put_object(*GVP, existing)
        with pytest.raises(ValueError, match="runs in deployment mode Knative.*pass deployment_mode='Knative'"):
            deploy_inference_service(isvc(), api_client=api.client, **FAST)
        assert api.requests_for("PATCH") == [] and api.requests_for("POST") == []


def test_canary_smoke_test_goes_to_the_new_revision():
    """With a canary, the shared address reaches the old revision 90% of the time: test the new one by its tag."""
    with FakeKubeAPI() as api, OpenAIServer() as canary, OpenAIServer(fail=True) as stable:
        before = isvc(deployment_mode="Knative", storage_uri="pvc://llm-models/runs/previous/train/final")
        before["status"] = {
            "observedGeneration": 1,
            "url": stable.url,
            "deploymentMode": "Knative",
            "conditions": [{"type": "Ready", "status": "True"}],
        }
        api.put_object(*GVP, before)

        ready = becomes_ready(api, "http://qwen3-30b-a3b-sft.team-llm.example.invalid", address=stable.url)

        def rolled_out(obj):
            ready(obj)
            obj["status"]["components"] = {
                "predictor": {
                    "traffic": [
                        {"tag": "prev", "percent": 90, "url": stable.url, "revisionName": "p-00001"},
                        {
                            "tag": "latest",
                            "percent": 10,
                            "url": canary.url,
                            "revisionName": "p-00002",
                            "latestRevision": True,
                        },
                    ]
                }
            }

        api.on_get("inferenceservices", rolled_out)
        manifest = isvc(deployment_mode="Knative", canary_traffic_percent=10)
        result = deploy_inference_service(manifest, api_client=api.client, **FAST)
        after = api.get_object(*GVP, NS, NAME)
    assert len(canary.requests) == 1 and stable.requests == []
    assert result["endpoint"] == "http://qwen3-30b-a3b-sft.team-llm.example.invalid/v1"
    assert after["spec"]["predictor"]["canaryTrafficPercent"] == 10
    assert after["metadata"]["annotations"]["serving.kserve.io/enable-tag-routing"] == "true"


def _sigterm_after(seconds: float) -> threading.Timer:
    import os
    import signal

    timer = threading.Timer(seconds, os.kill, args=(os.getpid(), signal.SIGTERM))
    timer.start()
    return timer


def test_sigterm_during_the_rollout_deletes_the_new_service(capsys):
    with FakeKubeAPI() as api:
        api.on_get("inferenceservices", lambda obj: None)  # never Ready
        timer = _sigterm_after(0.3)
        with pytest.raises(SystemExit) as exit_:
            deploy_inference_service(isvc(), api_client=api.client, timeout_seconds=30, **FAST)
        timer.join()
        assert api.get_object(*GVP, NS, NAME) is None
    assert exit_.value.code == 143
    assert "cancelled (SIGTERM)" in capsys.readouterr().out


def test_sigterm_during_the_rollout_restores_the_previous_spec():
    import signal

    with FakeKubeAPI() as api, OpenAIServer() as model_server:
        before = existing_service(api, model_server.url)
        api.on_get("inferenceservices", lambda obj: None)  # the new generation never becomes Ready
        timer = _sigterm_after(0.3)
        with pytest.raises(SystemExit):
            deploy_inference_service(isvc(), api_client=api.client, timeout_seconds=30, **FAST)
        timer.join()
        after = api.get_object(*GVP, NS, NAME)
    assert after["spec"] == before["spec"] and after["metadata"]["uid"] == before["metadata"]["uid"]
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL  # the handler is gone again


@pytest.mark.parametrize("mode", ["Standard", "Knative"])
def test_the_predictor_pulls_with_the_secrets_and_goes_out_through_the_proxy_and_mirror(mode):
    from components.deploy.manifest import inference_service_for_run
    from components.settings import DeploySettings, Settings

    deploy = DeploySettings(deploy_backend="kserve-vllm", serving_name=NAME, deployment_mode=mode)
    s = Settings.from_flat(
        {
            "image_pull_secrets": ["registry-mirror"],
            "http_proxy": "http://proxy.corp.example:3128",
            "no_proxy": ".svc,.cluster.local",
            "hf_endpoint": "https://hf-mirror.corp.example",
        }
    )
    manifest = inference_service_for_run(
        deploy, s.job, s.network, s.storage, run_id="r1", namespace=NS, storage_uri=STORAGE
    )
    assert crd_errors(manifest, CRD) == []
    predictor = manifest["spec"]["predictor"]
    assert predictor["imagePullSecrets"] == [{"name": "registry-mirror"}]
    assert predictor["model"]["env"] == [
        {"name": "HOME", "value": "/tmp"},
        {"name": "HTTP_PROXY", "value": "http://proxy.corp.example:3128"},
        {"name": "http_proxy", "value": "http://proxy.corp.example:3128"},
        {"name": "NO_PROXY", "value": ".svc,.cluster.local"},
        {"name": "no_proxy", "value": ".svc,.cluster.local"},
        {"name": "HF_ENDPOINT", "value": "https://hf-mirror.corp.example"},
    ]
    d = Settings()
    default = inference_service_for_run(
        deploy, d.job, d.network, d.storage, run_id="r1", namespace=NS, storage_uri=STORAGE
    )
    assert "imagePullSecrets" not in default["spec"]["predictor"]
    assert default["spec"]["predictor"]["model"]["env"] == [{"name": "HOME", "value": "/tmp"}]
