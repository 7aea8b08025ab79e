"""Two LoRA adapters of the tiny model served together, unmerged, by the real vLLM server (its CPU build, the pinned
release, from the serving virtualenv), as deploy_backend=local serves the LoRA variants of a run with
deploy_variants=all (issue 23):

    pytest -m slow tests/deploy/test_lora_serving_local.py

The adapters are real PEFT adapter folders as export writes them (adapter_config.json, adapter_model.safetensors,
the tokenizer, model.json naming the base folder), built directly from the tiny base with different random
initialisations of both LoRA matrices (PEFT's ``init_lora_weights=False``), so each changes the model's output.
The deploy step's own functions plan the server (one base, two LoRA modules) and run it; each adapter must answer
a chat completion under its own name and reproduce the log-probabilities and greedy tokens that transformers +
PEFT compute for it (the evaluate step's reference, components/models/logprobs.py), and the two adapters must
differ from each other and from the base. One engine start (~1-3 minutes on two busy cores).

The serving virtualenv is built first where it is absent (tests/fakes/serving_image.py, as the rehearsal does);
skipped where it cannot be, a failure with ``CI=true``.
"""

from __future__ import annotations

import os
import time

import pytest

from components.deploy.local_server import serve_adapters_locally
from components.deploy.serving_plan import plan_servers
from components.models.logprobs import server_logprobs
from components.models.tiny import materialize
from tests.helpers.serving import build_adapter, serving_vllm

pytestmark = pytest.mark.slow

SERVING = "tiny-sft"


@pytest.fixture(scope="module")
def vllm() -> str:
    return serving_vllm()


def test_two_lora_adapters_of_the_tiny_model_answer_under_their_own_names(vllm, tmp_path):
    base = materialize(str(tmp_path / "cache"))
    serve, references = [], {}
    for variant, seed, rank in (("a", 1, 8), ("b", 2, 16)):
        final = tmp_path / "runs" / f"run-{variant}" / "sft" / "final"
        final.mkdir(parents=True)
        references[f"{SERVING}-{variant}"] = build_adapter(base, final, seed, rank)
        serve.append(
            {"variant": variant, "model_path": str(final), "adapter": True, "served_model_name": f"{SERVING}-{variant}"}
        )
    (server,) = plan_servers(serve, SERVING)
    assert server.model_path == base and server.max_lora_rank() == 16

    started = time.monotonic()
    result = serve_adapters_locally(
        server, str(tmp_path / "serve.log"), keep_serving=True, max_model_len=2048, serving_references=references
    )
    try:
        assert set(result["replies"]) == {"tiny-sft-base", "tiny-sft-a", "tiny-sft-b"}
        assert all(isinstance(reply, str) for reply in result["replies"].values())
        for name, check in result["serving_checks"].items():
            # bf16 LoRA kernels against PEFT in float32: the same tolerance as the evaluate step's reference.
            assert check["mean_abs_logprob_diff"] <= check["logprob_tolerance"], (name, check)
        # The adapters are applied: the same tokens score differently under each name.
        ids = references["tiny-sft-a"]["examples"][0]["token_ids"]
        scored = {
            name: server_logprobs(result["endpoint"], name, ids)[1:]
            for name in ("tiny-sft-base", "tiny-sft-a", "tiny-sft-b")
        }
        differ = {
            (x, y): max(abs(p - q) for p, q in zip(scored[x], scored[y], strict=True))
            for x, y in (("tiny-sft-base", "tiny-sft-a"), ("tiny-sft-base", "tiny-sft-b"), ("tiny-sft-a", "tiny-sft-b"))
        }
        assert all(d > 0.05 for d in differ.values()), differ
        log = (tmp_path / "serve.log").read_text(errors="replace")
        assert "0.32.0" in log
    finally:
        os.killpg(result["pid"], 15)
    checks = result["serving_checks"]
    print(
        f"vLLM CPU server with 2 LoRA modules: healthy after {result['startup_seconds']:.0f}s, "
        f"{time.monotonic() - started:.0f}s with smoke tests and checks; server vs PEFT: "
        + "; ".join(
            f"{n}: mean |diff| {c['mean_abs_logprob_diff']:.4f} max {c['max_abs_logprob_diff']:.4f} over "
            f"{c['tokens']} tokens, {c['greedy_tokens_compared']} greedy tokens equal"
            for n, c in checks.items()
        )
        + f"; largest log-probability differences between names {differ}; replies {result['replies']}"
    )
