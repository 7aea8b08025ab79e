"""The serving rehearsal for LoRA variants (issue 23): the deploy step's own functions render and roll out the one
InferenceService that serves two adapters of one base, and a fake KServe controller runs its predictor pod as KServe
would, with the real vLLM (the CPU build of the pinned release; tests/fakes/serving_image.py): the base from
``storageUri`` at /mnt/models, the model claim mounted read-only at /mnt/adapters from the predictor's own
``persistentVolumeClaim`` volume, the adapters loaded from the paths the manifest names.

    pytest -m slow tests/deploy/test_lora_serving_rehearsal.py     # as root, with util-linux unshare and setpriv

The deploy step smoke-tests the base and both adapters by name and requires each adapter's log-probabilities and
greedy tokens to match PEFT's (its evaluation's reference). Skipped where the rehearsal cannot run (a failure with
``CI=true``), as tests/deploy/test_serving_rehearsal.py.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from components.deploy.manifest import inference_services_for_servers
from components.deploy.rollout import deploy_inference_services
from components.deploy.serving_plan import plan_servers
from components.deploy.serving_runtime import serving_runtime_manifest
from components.models.logprobs import LOGPROB_TOLERANCE
from components.models.tiny import materialize
from components.settings import DeploySettings, Settings
from tests.fakes import serving_image
from tests.fakes.k8s_api import FakeKubeAPI
from tests.helpers.serving import READY_TIMEOUT_SECONDS, build_adapter, rehearsal_unavailable

pytestmark = pytest.mark.slow

NAMESPACE, CLAIM, SERVING = "team-llm", "llm-models", "rehearsal-lora"


@pytest.fixture(scope="module")
def venv() -> Path:
    why = rehearsal_unavailable()
    if why:
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI must run the serving rehearsal: {why}")
        pytest.skip(why)
    serving_image.ensure_venv()
    return serving_image.venv_path()


def test_one_inference_service_serves_two_adapters_of_one_base_on_the_real_engine(venv, tmp_path):
    claim = tmp_path / "claim"
    base = materialize(str(claim / "cache"))
    serve, references = [], {}
    for variant, seed, rank in (("a", 1, 8), ("b", 2, 16)):
        final = claim / "runs" / f"run-{variant}" / "sft" / "final"
        final.mkdir(parents=True)
        references[f"{SERVING}-{variant}"] = build_adapter(base, final, seed, rank)
        serve.append(
            {"variant": variant, "model_path": str(final), "adapter": True, "served_model_name": f"{SERVING}-{variant}"}
        )
    for path in (claim, *claim.rglob("*")):  # the pod runs as the security context's user, as the claim's files are
        path.chmod(path.stat().st_mode | (0o555 if path.is_dir() else 0o444))
    servers = plan_servers(serve, SERVING)
    deploy = DeploySettings(deploy_backend="kserve-vllm", serving_name=SERVING, serving_gpus=1, max_model_len=2048)
    s = Settings.from_flat({"model_pvc": CLAIM})
    (manifest,) = inference_services_for_servers(
        servers, deploy, s.job, s.network, s.storage, run_id="r1", namespace=NAMESPACE, mount=str(claim)
    )
    runtime = serving_runtime_manifest(NAMESPACE)
    container = serving_image.predictor_container(runtime, manifest)
    assert {m["mountPath"] for m in container["volumeMounts"]} >= {"/dev/shm", "/mnt/adapters"}

    started = time.monotonic()
    with FakeKubeAPI() as api:
        kserve = serving_image.KServeController(api, runtime, {CLAIM: claim}, venv, tmp_path / "pods")
        api.on_get("inferenceservices", kserve)
        try:
            (result,) = deploy_inference_services(
                [manifest],
                api_client=api.client,
                poll_seconds=2,
                timeout_seconds=READY_TIMEOUT_SECONDS,
                pending_timeout_seconds=60,
                serving_references=references,
            )
        except BaseException:
            for pod in kserve.pods.values():
                print(f"--- {pod.log} ---\n{pod.tail(80)}")
            raise
        finally:
            kserve.stop()
    (pod,) = kserve.pods.values()
    log = pod.log.read_text(errors="replace")
    assert "model='/mnt/models'" in log and f"(v{serving_image.VLLM_VERSION})" in log
    assert set(result["replies"]) == {"rehearsal-lora-base", "rehearsal-lora-a", "rehearsal-lora-b"}
    checks = result["serving_checks"]
    assert set(checks) == {"rehearsal-lora-a", "rehearsal-lora-b"}
    assert all(c["mean_abs_logprob_diff"] <= LOGPROB_TOLERANCE for c in checks.values()), checks
    print(
        f"LoRA service: engine Ready {pod.ready_after:.0f}s after the pod started, "
        f"{time.monotonic() - started:.0f}s with the smoke tests and checks; "
        + "; ".join(
            f"{n}: mean |diff| {c['mean_abs_logprob_diff']:.4f} over {c['tokens']} tokens, "
            f"{c['greedy_tokens_compared']} greedy tokens equal"
            for n, c in checks.items()
        )
    )
