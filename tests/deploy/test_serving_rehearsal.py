"""The serving rehearsal (issue 19, defect 9): the deploy step against the real vLLM engine serving our export.

    pytest -m slow tests/deploy/test_serving_rehearsal.py     # as root, with util-linux unshare and setpriv

For the exported final model of (a) a dense full fine-tune (no DeepSpeed: ``Trainer.save_model``), (b) a Qwen3-MoE
full fine-tune under ZeRO-3 (2 ranks: gathered layer by layer, ``export_gathered``) and (c) a LoRA fine-tune under
ZeRO-3 merged into its base (``merge_lora_zero3``), each trained for a few steps by the project's trainer
(``torchrun -m components.train.trainer``) from a tiny base whose config carries Qwen3's RoPE base (1,000,000):

1. the evaluate step's own function scores it and writes the serving reference (components/models/logprobs.py);
2. the deploy step's own function (``deploy_inference_service``, with the manifest ``inference_service_for_run``
   renders) creates the InferenceService on the fake API server; a fake KServe controller runs the predictor pod
   from it and manifests/serving's ServingRuntime exactly as rendered: the real vLLM (the CPU build of the pinned
   release) in its own namespaces, the model mounted read-only at /mnt/models (tests/fakes/serving_image.py);
3. the deploy step smoke-tests it and requires the server's per-token log-probabilities and greedy tokens to
   match the evaluation's; any failure fails the test with the step's own error (and the pod's log).

On a CPU the InferenceService is rendered with ``serving_gpus=1``: vLLM runs with ``--tensor-parallel-size=1``.
vLLM serves in bf16 here (its CPU default for a float32 checkpoint) against the evaluation's float32. One engine
start per model (~2 minutes each on two busy cores); the serving image is built once into ``.serving-venv/``
(minutes, 3.4 GB) and reused.

Skipped where it cannot run (not root, no ``unshare``/``setpriv``, namespaces refused); with ``CI=true`` those are
failures: CI must run it.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import replace
from pathlib import Path

import pytest

from components.deploy.manifest import inference_service_for_run
from components.deploy.rollout import deploy_inference_service
from components.deploy.serving_runtime import serving_runtime_manifest
from components.evaluate.base_vs_tuned import EvalOptions, evaluate
from components.models.logprobs import LOGPROB_TOLERANCE, read_reference, reference_path
from components.paths import pvc_uri
from components.settings import Settings
from components.train.config import deepspeed_config_path
from components.train.launcher.local_torchrun import run_torchrun
from tests.fakes import serving_image
from tests.fakes.k8s_api import FakeKubeAPI
from tests.helpers.serving import READY_TIMEOUT_SECONDS, rehearsal_unavailable
from tests.helpers.trainer import make_workdir, trainer_config

pytestmark = pytest.mark.slow

RUN_ID = "5e0c2b9a-7d41-4f3e-9a6b-1c8d2e4f6a70"
NAMESPACE, CLAIM = "team-llm", "llm-models"
QWEN3_ROPE_THETA = 1000000.0
ZERO3 = deepspeed_config_path("zero3")
# name -> (base folder, ranks, trainer settings)
VARIANTS = {
    "dense-full": ("base", 1, dict(max_steps=20, save_steps=20)),
    "moe-full-zero3": ("moe-base", 2, dict(deepspeed=ZERO3, max_steps=16, save_steps=16)),
    "lora-merged-zero3": (
        "base",
        2,
        dict(
            method="lora",
            lora_target_modules="q_proj,v_proj,gate_proj",
            lora_r=8,
            merge_lora=True,
            deepspeed=ZERO3,
            max_steps=16,
            save_steps=16,
            learning_rate=1e-2,
        ),
    ),
}


@pytest.fixture(scope="module")
def machine():
    why = rehearsal_unavailable()
    if why:
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI must run the serving rehearsal: {why}")
        pytest.skip(why)


@pytest.fixture(scope="module")
def venv(machine) -> Path:
    info = serving_image.ensure_venv()
    print(
        f"serving image: {serving_image.venv_path()} ({info['bytes'] / 2**30:.1f} GiB, {info['versions']}, "
        f"built in {info['build_seconds']:.0f}s)"
        if info["build_seconds"]
        else f"serving image: {serving_image.venv_path()} reused ({info['versions']})"
    )
    assert info["versions"]["vllm"] == serving_image.VLLM_VERSION
    return serving_image.venv_path()


@pytest.fixture(scope="module")
def claim(machine, tmp_path_factory) -> Path:
    """The model claim's folder: the tiny bases (Qwen3's RoPE base in their configs), the prepared data, the runs."""
    import torch
    from transformers import AutoTokenizer, Qwen3MoeConfig, Qwen3MoeForCausalLM

    root = make_workdir(tmp_path_factory.mktemp("serving-claim"))
    config_path = root / "base" / "config.json"
    config = json.loads(config_path.read_text())
    config["rope_parameters"]["rope_theta"] = QWEN3_ROPE_THETA
    config_path.write_text(json.dumps(config, indent=2))
    tok = AutoTokenizer.from_pretrained(root / "base")
    torch.manual_seed(0)
    # head_dim 32: vLLM's CPU attention has no kernel for 16 (Qwen3's is 128).
    moe = Qwen3MoeConfig(
        vocab_size=len(tok),
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        intermediate_size=96,
        num_experts=4,
        num_experts_per_tok=2,
        moe_intermediate_size=32,
        pad_token_id=tok.pad_token_id,
        eos_token_id=tok.eos_token_id,
        bos_token_id=None,
        max_position_embeddings=2048,
    )
    moe.rope_parameters = {"rope_type": "default", "rope_theta": QWEN3_ROPE_THETA}
    Qwen3MoeForCausalLM(moe).save_pretrained(root / "moe-base")
    tok.save_pretrained(root / "moe-base")
    # Prompts of the fine-tuning task: a few steps make the tiny models decisive there, so greedy tokens are compared
    # (on the bundled prompts nearly every step of a tiny model is a near tie, which the check leaves out).
    (root / "prompts.jsonl").write_text(
        "".join(
            json.dumps({"messages": [{"role": "user", "content": f"Repeat {word} twice. (#{i})"}]}) + "\n"
            for i, word in enumerate(("apple", "river"))
        )
    )
    return root


def _train(claim: Path, variant: str) -> tuple[Path, Path]:
    base, ranks, settings = VARIANTS[variant]
    config = trainer_config(claim, variant, model_name_or_path=str(claim / base), **settings)
    run_torchrun(config, nproc_per_node=ranks)
    return claim / base, claim / variant / "final"


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_the_deploy_step_serves_the_evaluated_export_on_the_real_engine(variant, venv, claim, tmp_path):
    started = time.monotonic()
    base, final = _train(claim, variant)
    config = json.loads((final / "config.json").read_text())
    assert config["rope_parameters"]["rope_theta"] == config["rope_theta"] == QWEN3_ROPE_THETA
    trained = time.monotonic()

    # The evaluate step's own function writes the reference where the deploy step reads it.
    evaluate(
        str(base),
        str(final),
        str(claim / "data"),
        EvalOptions(4, 0.0, eval_prompts=str(claim / "prompts.jsonl"), max_new_tokens=8),
        serving_reference=reference_path(str(final)),
    )
    reference = read_reference(reference_path(str(final)))
    evaluated = time.monotonic()

    # Rendered as the deploy step renders it; one GPU's worth on a CPU: tensor parallel size 1.
    s = Settings()
    deploy = replace(s.deploy, serving_name=f"rehearsal-{variant}", serving_gpus=1, max_model_len=2048)
    manifest = inference_service_for_run(
        deploy,
        s.job,
        s.network,
        s.storage,
        run_id=RUN_ID,
        namespace=NAMESPACE,
        storage_uri=pvc_uri(CLAIM, str(claim), str(final)),
    )
    runtime = serving_runtime_manifest(NAMESPACE)
    assert runtime["spec"]["containers"][0]["image"] == serving_image.IMAGE  # the release the venv is the CPU build of
    container = serving_image.predictor_container(runtime, manifest)
    assert "--tensor-parallel-size=1" in container["args"] and "--model=/mnt/models" in container["args"]

    with FakeKubeAPI() as api:
        kserve = serving_image.KServeController(api, runtime, {CLAIM: claim}, venv, tmp_path)
        api.on_get("inferenceservices", kserve)
        try:
            result = deploy_inference_service(
                manifest,
                api_client=api.client,
                poll_seconds=2,
                timeout_seconds=READY_TIMEOUT_SECONDS,
                pending_timeout_seconds=60,
                serving_reference=reference,
            )
        except BaseException:
            for pod in kserve.pods.values():
                print(f"--- {pod.log} ---\n{pod.tail(80)}")
            raise
        finally:
            kserve.stop()
    (pod,) = kserve.pods.values()
    assert pod.gone(), f"pod {pod.name} outlived its deletion"
    log = pod.log.read_text(errors="replace")
    # The engine ran what the pod was given: the mounted model, one worker, the pinned release's CPU build.
    assert "model='/mnt/models'" in log and "tensor_parallel_size=1" in log
    assert f"(v{serving_image.VLLM_VERSION})" in log
    check = result["serving_check"]
    assert check["mean_abs_logprob_diff"] <= LOGPROB_TOLERANCE and check["greedy_tokens_compared"] > 0
    assert isinstance(result["smoke_reply"], str)
    print(
        f"{variant}: trained in {trained - started:.0f}s, evaluated in {evaluated - trained:.0f}s, engine Ready "
        f"{pod.ready_after:.0f}s after the pod started; server vs evaluation over {check['tokens']} tokens: mean "
        f"|difference| {check['mean_abs_logprob_diff']:.4f}, max {check['max_abs_logprob_diff']:.4f} nats, loss "
        f"{check['server_loss']:.4f} vs {check['eval_loss']:.4f}; {check['greedy_tokens_compared']} greedy tokens "
        f"equal; smoke reply {result['smoke_reply']!r}; {time.monotonic() - started:.0f}s in all"
    )
