"""Serving several models of one run (issue 23): what is served (compare_variants' list, deploy_variants), how it is
grouped into servers (LoRA adapters of one base share one vLLM server, each full model its own), the
InferenceServices against KServe's real CRD schema, and the rollout of several services against the fake API
server: every served name smoke-tested, all rolled back when one fails. Bad input: one error naming the variant
and the setting, from validate_inputs' rules (before any GPU)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from components import kube
from components.deploy.manifest import ADAPTER_MOUNT, inference_services_for_servers, served_names
from components.deploy.rollout import deploy_inference_services
from components.deploy.serving_plan import LORA_RANKS, lora_rank_limit, plan_servers
from components.settings import DeploySettings, Settings, defaults
from components.validate.rules import check
from components.variants.compare import compare
from tests.fakes.k8s_api import FakeKubeAPI
from tests.fakes.kserve import becomes_ready
from tests.fakes.openai_server import OpenAIServer
from tests.helpers.crd_schema import crd_errors

CRD = "serving.kserve.io_inferenceservices.yaml"
GVP = ("serving.kserve.io", "v1beta1", "inferenceservices")
NS, CLAIM, SERVING = "team-llm", "llm-models", "qwen3-sft"
FAST = {"poll_seconds": 0.01}


@pytest.fixture(autouse=True)
def short_api_outages(monkeypatch):
    monkeypatch.setattr(kube, "API_RETRY_WINDOW_SECONDS", 3.0)


def adapter(
    mount: Path,
    variant: str,
    rank: int = 8,
    base: str = "cache/qwen3-8b",
    hub_id: str = "Qwen/Qwen3-8B",
    rank_pattern: dict | None = None,
) -> dict:
    """A LoRA variant's final folder as export writes it (adapter_config.json, model.json) and its serve entry."""
    final = mount / "runs" / f"run-{variant}" / "sft" / "final"
    final.mkdir(parents=True)
    (final / "adapter_config.json").write_text(
        json.dumps(
            {
                "peft_type": "LORA",
                "r": rank,
                "lora_alpha": 2 * rank,
                "base_model_name_or_path": str(mount / base),
                "target_modules": ["q_proj", "v_proj"],
                "rank_pattern": rank_pattern or {},
            }
        )
    )
    (final / "model.json").write_text(
        json.dumps({"base_model": hub_id, "base_model_path": str(mount / base), "method": "lora", "merged": False})
    )
    return {
        "variant": variant,
        "model_path": str(final),
        "model_uri": str(final),
        "adapter": True,
        "settings": {"method": "lora", "merge_lora": False},
        "served_model_name": f"{SERVING}-{variant}",
    }


def full(mount: Path, variant: str) -> dict:
    final = mount / "runs" / f"run-{variant}" / "sft" / "final"
    final.mkdir(parents=True)
    (final / "config.json").write_text("{}")
    return {
        "variant": variant,
        "model_path": str(final),
        "model_uri": str(final),
        "adapter": False,
        "settings": {"method": "full"},
        "served_model_name": f"{SERVING}-{variant}",
    }


def _groups(s: Settings) -> tuple:
    """The job, network and storage settings the InferenceServices read."""
    return s.job, s.network, s.storage


def manifests(servers, mount: Path, backend: str = "kserve-vllm") -> list[dict]:
    deploy = DeploySettings(deploy_backend=backend, serving_name=SERVING, serving_gpus=1, max_model_len=4096)
    s = Settings.from_flat({"model_pvc": CLAIM, "node_selector": {"pool": "gpu"}, "tolerations": []})
    return inference_services_for_servers(
        servers, deploy, s.job, s.network, s.storage, run_id="r1", namespace=NS, mount=str(mount)
    )


# -- what is served ----------------------------------------------------------------------------------------------


def evaluated(tmp_path: Path, variant: str, eval_loss: float, passed: bool, **settings) -> dict:
    model = tmp_path / f"run-{variant}" / "sft" / "final"
    model.mkdir(parents=True)
    (model.parent / "evaluation.json").write_text(
        json.dumps(
            {
                "base_model": "b",
                "passed": passed,
                "reason": "r",
                "report": "# r",
                "prompts": [],
                "answers": {"base": [], "tuned": []},
                "metrics": {
                    "eval_loss": eval_loss,
                    "base_eval_loss": 7.0,
                    "eval_loss_delta": eval_loss - 7,
                    "perplexity": 1.0,
                },
            }
        )
    )
    return {
        "variant": variant,
        "run_id": f"run-{variant}",
        "model_path": str(model),
        "model_uri": str(model),
        "settings": {"serving_name": SERVING, **settings},
        "overrides": {},
    }


def test_best_serves_one_and_all_serves_every_variant_that_passed(tmp_path):
    lora = {"method": "lora", "merge_lora": False}
    rows = [
        evaluated(tmp_path / "best", "a", 5.4, True, **lora),
        evaluated(tmp_path / "best", "b", 5.0, False),
        evaluated(tmp_path / "best", "c", 5.2, True, method="lora", merge_lora=True),
    ]
    (only,) = compare(rows)["serve"]
    assert (only["variant"], only["served_model_name"], only["adapter"]) == ("c", "qwen3-sft-c", False)

    rows = [
        evaluated(tmp_path / "all", "a", 5.4, True, deploy_variants="all", **lora),
        evaluated(tmp_path / "all", "b", 5.0, False, deploy_variants="all"),
        evaluated(tmp_path / "all", "c", 5.2, True, deploy_variants="all", method="full"),
    ]
    outcome = compare(rows)
    assert [(e["variant"], e["served_model_name"], e["adapter"]) for e in outcome["serve"]] == [
        ("a", "qwen3-sft-a", True),
        ("c", "qwen3-sft-c", False),
    ]
    assert outcome["reason"].startswith("serving the 2 of 3 variants that passed their gate (deploy_variants=all)")
    assert (
        compare([evaluated(tmp_path / "none", "a", 7.5, False), evaluated(tmp_path / "none", "b", 7.6, False)])["serve"]
        == []
    )


def test_a_run_without_variants_is_served_as_serving_name(tmp_path):
    (entry,) = compare([evaluated(tmp_path, "", 5.0, True, method="qlora", merge_lora=False)])["serve"]
    assert entry["served_model_name"] == SERVING and entry["adapter"] is True


# -- servers and their InferenceServices -------------------------------------------------------------------------


def test_two_adapters_of_one_base_share_one_vllm_service(tmp_path):
    serve = [adapter(tmp_path, "a", rank=8), adapter(tmp_path, "b", rank=16)]
    (server,) = plan_servers(serve, SERVING)
    assert server.name == SERVING and server.served_names() == ["qwen3-sft-base", "qwen3-sft-a", "qwen3-sft-b"]
    assert server.model_path == str(tmp_path / "cache/qwen3-8b") and server.max_lora_rank() == 16
    (manifest,) = manifests([server], tmp_path)
    assert crd_errors(manifest, CRD) == []
    model = manifest["spec"]["predictor"]["model"]
    assert model["storageUri"] == f"pvc://{CLAIM}/cache/qwen3-8b"  # the base, which KServe mounts at /mnt/models
    assert model["args"][model["args"].index("--enable-lora") :] == [
        "--enable-lora",
        "--max-loras=2",
        "--max-lora-rank=16",
        "--lora-modules",
        f"qwen3-sft-a={ADAPTER_MOUNT}/runs/run-a/sft/final",
        f"qwen3-sft-b={ADAPTER_MOUNT}/runs/run-b/sft/final",
    ]
    assert "--served-model-name=qwen3-sft-base" in model["args"]
    # The adapters come from the model claim, mounted read-only into the predictor's pod.
    assert manifest["spec"]["predictor"]["volumes"] == [
        {"name": "adapters", "persistentVolumeClaim": {"claimName": CLAIM, "readOnly": True}}
    ]
    assert model["volumeMounts"] == [{"name": "adapters", "mountPath": ADAPTER_MOUNT, "readOnly": True}]
    assert served_names(manifest) == server.served_names()


def test_two_full_variants_get_two_services(tmp_path):
    servers = plan_servers([full(tmp_path, "a"), full(tmp_path, "b")], SERVING)
    out = manifests(servers, tmp_path)
    assert [m["metadata"]["name"] for m in out] == ["qwen3-sft-a", "qwen3-sft-b"]
    for m, variant in zip(out, "ab", strict=True):
        assert crd_errors(m, CRD) == []
        model = m["spec"]["predictor"]["model"]
        assert model["storageUri"] == f"pvc://{CLAIM}/runs/run-{variant}/sft/final"
        assert f"--served-model-name=qwen3-sft-{variant}" in model["args"] and "--enable-lora" not in model["args"]
        assert "volumes" not in m["spec"]["predictor"]


def test_adapters_of_different_bases_get_a_server_each_and_a_hub_base_is_downloaded(tmp_path):
    serve = [
        adapter(tmp_path, "a"),
        full(tmp_path, "f"),
        adapter(tmp_path / "elsewhere", "b", base="qwen3-4b", hub_id="Qwen/Qwen3-4B"),
    ]
    servers = plan_servers(serve, SERVING)
    assert [(s.name, s.served_names()) for s in servers] == [
        ("qwen3-sft-f", ["qwen3-sft-f"]),
        ("qwen3-sft-1", ["qwen3-sft-1-base", "qwen3-sft-a"]),
        ("qwen3-sft-2", ["qwen3-sft-2-base", "qwen3-sft-b"]),
    ]
    out = manifests(servers[1:], tmp_path)
    assert [m["spec"]["predictor"]["model"]["storageUri"] for m in out] == [
        f"pvc://{CLAIM}/cache/qwen3-8b",
        f"pvc://{CLAIM}/elsewhere/qwen3-4b",
    ]
    claim_root = tmp_path / "claim"
    moved = plan_servers([adapter(claim_root, "c")], SERVING)
    moved[0].model_path = "/root/.cache/qwen3-8b"  # resolved off the claim: the Hub id it came from
    (m,) = inference_services_for_servers(
        moved,
        DeploySettings(serving_name=SERVING, serving_gpus=1),
        *_groups(Settings.from_flat({"model_pvc": CLAIM})),
        run_id="r",
        namespace=NS,
        mount=str(claim_root),
    )
    assert m["spec"]["predictor"]["model"]["storageUri"] == "hf://Qwen/Qwen3-8B" and crd_errors(m, CRD) == []


def test_adapter_ranks_map_to_vllms_max_lora_rank(tmp_path):
    assert [lora_rank_limit(r) for r in (1, 2, 8, 9, 64, 300, 512)] == [1, 8, 8, 16, 64, 320, 512]
    (server,) = plan_servers([adapter(tmp_path, "a", rank=8, rank_pattern={"q_proj": 40})], SERVING)
    assert server.max_lora_rank() == 64  # rank_pattern counts, as vLLM's PEFTHelper counts it
    with pytest.raises(ValueError, match="rank 600 cannot be served unmerged.*set lora_r <= 512 or merge_lora=true"):
        plan_servers([adapter(tmp_path, "big", rank=600)], SERVING)
    assert LORA_RANKS[-1] == 512


def test_lora_modules_need_vllms_own_server(tmp_path):
    servers = plan_servers([adapter(tmp_path, "a"), adapter(tmp_path, "b")], SERVING)
    with pytest.raises(ValueError, match="lora_modules need runtime 'kserve-vllm'"):
        manifests(servers, tmp_path, backend="kserve-huggingface")


def test_a_missing_adapter_config_names_the_folder(tmp_path):
    entry = full(tmp_path, "a")
    with pytest.raises(FileNotFoundError, match="adapter_config.json not found"):
        plan_servers([{**entry, "adapter": True}], SERVING)


# -- the rollout of several services -----------------------------------------------------------------------------


class Servers:
    """KServe's side for several services: each becomes Ready at its own model server's URL."""

    def __init__(self, api, urls: dict[str, str]):
        self.controllers = {name: becomes_ready(api, url) for name, url in urls.items()}

    def __call__(self, obj):
        self.controllers[obj["metadata"]["name"]](obj)


def test_every_served_name_of_every_service_is_smoke_tested(tmp_path):
    serve = [adapter(tmp_path, "a"), adapter(tmp_path, "b"), full(tmp_path, "f")]
    out = manifests(plan_servers(serve, SERVING), tmp_path)
    with FakeKubeAPI() as api, OpenAIServer() as lora_server, OpenAIServer() as full_server:
        api.on_get("inferenceservices", Servers(api, {"qwen3-sft": lora_server.url, "qwen3-sft-f": full_server.url}))
        results = deploy_inference_services(out, api_client=api.client, **FAST)
        assert api.get_object(*GVP, NS, "qwen3-sft") and api.get_object(*GVP, NS, "qwen3-sft-f")
    assert [body["model"] for _, body in full_server.requests] == ["qwen3-sft-f"]
    assert [body["model"] for _, body in lora_server.requests] == ["qwen3-sft-base", "qwen3-sft-a", "qwen3-sft-b"]
    assert results[1]["replies"] == {
        name: "Hi! How can I help?" for name in ("qwen3-sft-base", "qwen3-sft-a", "qwen3-sft-b")
    }
    assert results[0]["served_model_name"] == "qwen3-sft-f"


def test_one_failing_service_rolls_back_every_service_the_step_deployed(tmp_path):
    out = manifests(plan_servers([full(tmp_path, "a"), full(tmp_path, "b")], SERVING), tmp_path)
    with FakeKubeAPI() as api, OpenAIServer() as good, OpenAIServer(fail=True) as bad:
        previous = json.loads(json.dumps(out[0]))
        previous["spec"]["predictor"]["model"]["storageUri"] = f"pvc://{CLAIM}/runs/earlier/sft/final"
        previous["status"] = {
            "observedGeneration": 1,
            "url": good.url,
            "conditions": [{"type": "Ready", "status": "True"}],
        }
        before = api.put_object(*GVP, previous)
        # qwen3-sft-a is live: its spec is tested on a candidate beside it first (same model server here).
        urls = {"qwen3-sft-a": good.url, "qwen3-sft-a-candidate": good.url, "qwen3-sft-b": bad.url}
        api.on_get("inferenceservices", Servers(api, urls))
        with pytest.raises(RuntimeError) as err:
            deploy_inference_services(out, api_client=api.client, **FAST)
        after = api.get_object(*GVP, NS, "qwen3-sft-a")
        assert api.get_object(*GVP, NS, "qwen3-sft-b") is None  # new: deleted
    assert after["spec"] == before["spec"]  # the first one, smoke-tested fine, restored to what it was
    text = str(err.value)
    assert "qwen3-sft-b is Ready but failed the smoke test" in text and "deleted the new InferenceService" in text
    assert "rolled back too: InferenceService team-llm/qwen3-sft-a: restored the previous spec" in text
    # the candidate's smoke test, then the promoted service's
    assert [body["model"] for _, body in good.requests] == ["qwen3-sft-a", "qwen3-sft-a"]


def test_a_failing_adapter_name_fails_its_service_and_names_it(tmp_path):
    out = manifests(plan_servers([adapter(tmp_path, "a"), adapter(tmp_path, "b")], SERVING), tmp_path)

    with FakeKubeAPI() as api, OpenAIServer(fail=True) as server:
        api.on_get("inferenceservices", becomes_ready(api, server.url))
        with pytest.raises(RuntimeError, match="failed the smoke test for model 'qwen3-sft-base'.*deleted the new"):
            deploy_inference_services(out, api_client=api.client, **FAST)
        assert api.get_object(*GVP, NS, SERVING) is None


# -- bad input, before any GPU -----------------------------------------------------------------------------------


def errors(variants, **run) -> list[str]:
    return check({**defaults(), **run, "variants": variants})


LORA = {"method": "lora", "merge_lora": False}


def test_two_lora_variants_served_together_are_valid():
    assert (
        errors([{**LORA, "lora_r": 8, "name": "a"}, {**LORA, "lora_r": 16, "name": "b"}], deploy_variants="all") == []
    )


@pytest.mark.parametrize(
    "variants,run,needle",
    [
        (
            [{**LORA, "lora_r": 600}, {**LORA, "lora_r": 8}],
            {},
            "variants[0] ('v1'): lora_r=600 with merge_lora=false: vLLM loads adapters of rank <= 512",
        ),
        (
            [LORA, {**LORA, "lora_r": 8}],
            {"deploy_backend": "kserve-huggingface"},
            "variants[0] ('v1'): method=lora with merge_lora=false serves the adapter with vLLM's LoRA modules",
        ),
        (
            [{**LORA, "name": "base"}, {**LORA, "lora_r": 8}],
            {"deploy_variants": "all"},
            "variants[0] ('base'): with LoRA variants and deploy_variants=all the adapters' base is served as "
            "qwen3-30b-a3b-sft-base",
        ),
        (
            [{"learning_rate": 1e-5, "name": "a-very-long-name"}, {"learning_rate": 2e-5}],
            {"serving_name": "s" * 50},
            "variants[0] ('a-very-long-name') is served as",
        ),
        ([LORA, {**LORA, "lora_r": 8}], {"deploy_variants": "some"}, "deploy_variants"),
    ],
)
def test_bad_serving_input_is_one_error_naming_the_variant_and_the_setting(variants, run, needle):
    found = errors(variants, **run)
    assert any(needle in e for e in found), found


def test_several_local_adapters_without_vllms_cpu_build_say_which_setting(monkeypatch, tmp_path):
    monkeypatch.setenv("SERVING_VENV", str(tmp_path / "no-venv"))
    found = errors(
        [{**LORA, "name": "a"}, {**LORA, "lora_r": 8, "name": "b"}],
        deploy_variants="all",
        deploy_backend="local",
        train_backend="local",
    )
    (message,) = [e for e in found if "vLLM's CPU build" in e]
    assert message.startswith("variants ['a', 'b']: deploy_backend=local serves several LoRA adapters")
    assert "merge_lora=true or deploy_variants=best" in message


# -- the deploy step ---------------------------------------------------------------------------------------------


def test_the_deploy_step_serves_every_listed_variant_and_reports_each_name(tmp_path, monkeypatch):
    """deploy_model as the pipeline calls it with deploy_variants=all: two LoRA variants and a full one become two
    InferenceServices; each served name is smoke-tested and checked against its own evaluation's reference."""
    from components.deploy import manifest, rollout
    from components.deploy.component import deploy_model
    from components.models.logprobs import FORMAT_VERSION, REFERENCE_FILE
    from components.settings import Settings

    mount = tmp_path / "models"
    serve = [adapter(mount, "a"), adapter(mount, "b", rank=32), full(mount, "f")]
    for entry in serve:
        (Path(entry["model_path"]).parent / REFERENCE_FILE).write_text(
            json.dumps({"version": FORMAT_VERSION, "variant": entry["variant"], "examples": [], "greedy": []})
        )
    checked = []

    def check_server(base_url, name, reference, timeout=120.0):
        checked.append((name, reference["variant"]))
        return {"mean_abs_logprob_diff": 0.001, "tokens": 8, "logprob_tolerance": 0.05, "greedy_tokens_compared": 4}

    monkeypatch.setattr(rollout, "check_server", check_server)
    monkeypatch.setattr(manifest, "MODEL_MOUNT", str(mount))
    monkeypatch.setattr(kube, "current_namespace", lambda default="default": NS)
    settings = Settings().flat() | {
        "serving_name": SERVING,
        "serving_gpus": 1,
        "model_pvc": CLAIM,
        "deploy_variants": "all",
    }
    with FakeKubeAPI() as api, OpenAIServer() as lora_server, OpenAIServer() as full_server:
        monkeypatch.setattr(kube, "load_api_client", lambda: api.client)
        ready = {
            "qwen3-sft": becomes_ready(api, lora_server.url, after=0),
            "qwen3-sft-f": becomes_ready(api, full_server.url, after=0),
        }
        api.on_get("inferenceservices", lambda obj: ready[obj["metadata"]["name"]](obj))
        out = deploy_model.python_func(model_path=serve[1]["model_path"], settings=settings, run_id="r1", serve=serve)
        lora = api.get_object(*GVP, NS, "qwen3-sft")
    assert [(e["variant"], e["served_model_name"]) for e in out.served] == [
        ("f", "qwen3-sft-f"),
        ("", "qwen3-sft-base"),
        ("a", "qwen3-sft-a"),
        ("b", "qwen3-sft-b"),
    ]
    assert (out.served_model_name, out.endpoint) == ("qwen3-sft-b", lora_server.url + "/v1")  # the best: model_path
    assert sorted(checked) == [("qwen3-sft-a", "a"), ("qwen3-sft-b", "b"), ("qwen3-sft-f", "f")]
    assert "--max-lora-rank=32" in lora["spec"]["predictor"]["model"]["args"]
    assert crd_errors({k: v for k, v in lora.items() if k != "status"}, CRD) == []


def test_the_local_deploy_step_runs_vllm_for_a_bases_adapters_and_transformers_serve_for_a_full_model(
    tmp_path, monkeypatch
):
    """deploy_backend=local: the two adapters of one base go to one vLLM server (serve_adapters_locally, run for
    real by tests/deploy/test_local_lora_variants_run.py), the full variant to `transformers serve`, each with its own
    evaluation's reference."""
    from components.deploy import local_server
    from components.deploy.component import deploy_model
    from components.models.logprobs import FORMAT_VERSION, REFERENCE_FILE
    from components.settings import Settings

    serve = [adapter(tmp_path, "a"), full(tmp_path, "f"), adapter(tmp_path, "b")]
    for entry in serve:
        (Path(entry["model_path"]).parent / REFERENCE_FILE).write_text(
            json.dumps({"version": FORMAT_VERSION, "variant": entry["variant"], "examples": [], "greedy": []})
        )
    calls = []

    def adapters(server, log_path, keep_serving=False, max_model_len=0, serving_references=None, probe=None):
        calls.append(("vllm", server.served_names(), sorted((n, r["variant"]) for n, r in serving_references.items())))
        return {
            "endpoint": "http://127.0.0.1:1/v1",
            "served_model_name": server.served_model_name,
            "smoke_reply": "hi",
            "replies": {n: f"hi {n}" for n in server.served_names()},
            "serving_checks": {},
            "latency": {"error": "not measured by this fake"},
        }

    def single(model_path, log_path, keep_serving=False, serving_reference=None, probe=None):
        calls.append(("transformers serve", model_path, serving_reference["variant"]))
        return {
            "endpoint": "http://127.0.0.1:2/v1",
            "served_model_name": model_path,
            "smoke_reply": "hello",
            "latency": {"error": "not measured by this fake"},
        }

    monkeypatch.setattr(local_server, "serve_adapters_locally", adapters)
    monkeypatch.setattr(local_server, "serve_locally", single)
    settings = Settings().flat() | {
        "serving_name": SERVING,
        "deploy_backend": "local",
        "train_backend": "local",
        "deploy_variants": "all",
    }
    out = deploy_model.python_func(model_path=serve[1]["model_path"], settings=settings, run_id="r1", serve=serve)
    assert calls == [
        ("transformers serve", serve[1]["model_path"], "f"),
        ("vllm", ["qwen3-sft-base", "qwen3-sft-a", "qwen3-sft-b"], [("qwen3-sft-a", "a"), ("qwen3-sft-b", "b")]),
    ]
    assert [(e["variant"], e["served_model_name"]) for e in out.served] == [
        ("f", serve[1]["model_path"]),
        ("", "qwen3-sft-base"),
        ("a", "qwen3-sft-a"),
        ("b", "qwen3-sft-b"),
    ]
    assert (out.endpoint, out.smoke_reply) == ("http://127.0.0.1:2/v1", "hello")  # the best: model_path
