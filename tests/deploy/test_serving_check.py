"""Issue 19, defect 8: the deploy step proves the server runs the evaluated model (components/models/logprobs.py).

A served model that reads the exported config differently still answers a chat message; these tests put such a
server (tests/fakes/vllm_server.py, a real model behind vLLM's completions API) in front of the deploy step's
check. The real engine does the same in tests/deploy/test_serving_rehearsal.py.
"""

from __future__ import annotations

import json

import pytest
import torch

from components import kube
from components.deploy.manifest import InferenceServiceSpec, build_inference_service
from components.deploy.rollout import deploy_inference_service
from components.models.logprobs import (
    LOGPROB_TOLERANCE,
    TIE_MARGIN,
    ServingMismatch,
    check_greedy_text,
    check_server,
    read_reference,
    reference_path,
    transformers_reference,
    write_reference,
)
from components.train.trainer.export import add_transformers4_rope_keys
from tests.fakes.k8s_api import FakeKubeAPI
from tests.fakes.vllm_server import VLLMServer, as_transformers4_reads
from tests.helpers.trainer import make_workdir

QWEN3_ROPE_THETA = 1_000_000.0
PROMPTS = [[{"role": "user", "content": "Repeat apple twice."}], [{"role": "user", "content": "Repeat stone twice."}]]


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    """The fixture data and tokenizer, and a tiny Qwen3 with Qwen3's RoPE base whose attention matters (weights
    drawn wider than a fresh model's, as a trained model's are), written by transformers 5 as the export writes it."""
    from datasets import load_from_disk
    from transformers import AutoTokenizer, Qwen3Config, Qwen3ForCausalLM

    root = make_workdir(tmp_path_factory.mktemp("serving-check"))
    tok = AutoTokenizer.from_pretrained(root / "base")
    torch.manual_seed(0)
    config = Qwen3Config(
        vocab_size=len(tok),
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        intermediate_size=96,
        initializer_range=0.2,
        tie_word_embeddings=True,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
        bos_token_id=None,
    )
    config.rope_parameters = {"rope_type": "default", "rope_theta": QWEN3_ROPE_THETA}
    model = Qwen3ForCausalLM(config).eval()
    model.save_pretrained(root / "final")
    tok.save_pretrained(root / "final")
    rows = load_from_disk(str(root / "data"))["eval"]
    return {
        "root": root,
        "model": model,
        "tok": tok,
        "rows": rows,
        "reference": transformers_reference(model, tok, rows, PROMPTS),
    }


def test_the_reference_holds_the_evaluated_models_per_token_logprobs_and_greedy_answers(work):
    ref = work["reference"]
    assert ref["version"] == 1 and ref["engine"] == "transformers" and ref["dtype"] == "float32"
    assert len(ref["examples"]) == 4 and ref["tokens"] == sum(len(ex["positions"]) for ex in ref["examples"])
    ex = ref["examples"][0]
    # Each scored token is an assistant (label) token: the row's labels say so.
    ids = torch.tensor([ex["token_ids"]])
    expected = work["model"](input_ids=ids).logits[0].log_softmax(-1)
    for p, lp in zip(ex["positions"], ex["logprobs"], strict=True):
        assert lp == pytest.approx(expected[p - 1, ex["token_ids"][p]].item(), abs=1e-5)
    assert len(ref["greedy"]) == 2 and all(len(g["answer_ids"]) == len(g["margins"]) for g in ref["greedy"])
    assert ref["greedy"][0]["prompt_text"].endswith("<|im_start|>assistant\n")


def test_a_server_running_the_evaluated_model_passes(work):
    with VLLMServer(work["root"] / "final", "qwen3-sft") as server:
        summary = check_server(server.url + "/v1", "qwen3-sft", work["reference"])
    assert summary["mean_abs_logprob_diff"] < 1e-4 and summary["tokens"] == work["reference"]["tokens"]
    assert summary["server_loss"] == pytest.approx(summary["eval_loss"], abs=1e-4)
    assert summary["greedy_tokens_compared"] > 0
    path, body = server.requests[0]
    assert path == "/v1/completions" and body["echo"] is True
    assert body["prompt"] == work["reference"]["examples"][0]["token_ids"]


def test_a_transformers4_server_reading_the_transformers5_export_is_caught(work, tmp_path):
    """Defect 8 as it would meet a user: the runtime's transformers 4.x reads RoPE's base as 10,000, not 1,000,000.
    The model still answers; the per-token log-probabilities give it away (the smoke test could not)."""
    config = json.loads((work["root"] / "final" / "config.json").read_text())
    assert "rope_theta" not in config and config["rope_parameters"]["rope_theta"] == QWEN3_ROPE_THETA
    with VLLMServer(work["root"] / "final", "qwen3-sft", read_config=as_transformers4_reads) as server:
        assert server.model.config.rope_parameters["rope_theta"] == 10000.0
        with pytest.raises(ServingMismatch, match=r"log-probabilities differ .* mean \|difference\| \d") as err:
            check_server(server.url + "/v1", "qwen3-sft", work["reference"])
    diff = float(str(err.value).split("mean |difference| ")[1].split(" ")[0])
    assert diff > 5 * LOGPROB_TOLERANCE


def test_the_export_with_transformers4_keys_is_read_right_by_the_same_server(work, tmp_path):
    """With the export's fix (rope_theta and rope_scaling beside rope_parameters) the 4.x reader gets 1,000,000."""
    import shutil

    fixed = tmp_path / "final"
    shutil.copytree(work["root"] / "final", fixed)
    add_transformers4_rope_keys(fixed / "config.json")
    with VLLMServer(fixed, "qwen3-sft", read_config=as_transformers4_reads) as server:
        summary = check_server(server.url + "/v1", "qwen3-sft", work["reference"])
    assert summary["mean_abs_logprob_diff"] < 1e-4


def test_a_greedy_answer_that_departs_before_a_near_tie_fails_and_one_after_it_passes(work):
    ref = json.loads(json.dumps(work["reference"]))
    g = ref["greedy"][0]
    with VLLMServer(work["root"] / "final", "qwen3-sft") as server:
        # The evaluation "chose" another token at a decisive step: the server's greedy answer departs from it.
        g["answer_ids"][0] = (g["answer_ids"][0] + 1) % len(work["tok"])
        g["margins"][0] = 3.0
        with pytest.raises(ServingMismatch, match="greedy answer to evaluation prompt 1 differs"):
            check_server(server.url + "/v1", "qwen3-sft", ref)
        # Where the evaluation's own choice was a near tie, either token is faithful: nothing from there on counts.
        g["margins"][0] = TIE_MARGIN / 2
        check_server(server.url + "/v1", "qwen3-sft", ref)


def test_the_text_check_compares_greedy_answers_where_the_server_gives_no_logprobs(work):
    ref = json.loads(json.dumps(work["reference"]))
    with VLLMServer(work["root"] / "final", "m") as server:
        assert check_greedy_text(server.url + "/v1", "m", ref) >= 1
        ref["greedy"][0]["decisive_text"] = "something the model never says"
        with pytest.raises(ServingMismatch, match="evaluation prompt 1 differs"):
            check_greedy_text(server.url + "/v1", "m", ref)


def test_the_reference_file_round_trips_and_a_missing_one_names_its_writer(work, tmp_path):
    model_path = tmp_path / "train" / "final"
    model_path.mkdir(parents=True)
    assert reference_path(str(model_path)) == str(tmp_path / "train" / "serving_check.json")
    with pytest.raises(FileNotFoundError, match="evaluate_model writes"):
        read_reference(reference_path(str(model_path)))
    write_reference(reference_path(str(model_path) + "/"), work["reference"])
    assert read_reference(reference_path(str(model_path))) == work["reference"]
    (tmp_path / "train" / "serving_check.json").write_text(json.dumps({"version": 0}))
    with pytest.raises(ValueError, match="format version 0"):
        read_reference(reference_path(str(model_path)))


def _ready_at(api, url):
    def controller(obj):
        status = obj.setdefault("status", {})
        if status.get("observedGeneration") == obj["metadata"]["generation"]:
            return
        status.update(observedGeneration=obj["metadata"]["generation"], url=url)
        api.set_condition(obj, "Ready", "True")

    return controller


def test_deploy_rolls_back_a_service_that_is_not_the_evaluated_model(work, monkeypatch):
    monkeypatch.setattr(kube, "API_RETRY_WINDOW_SECONDS", 3.0)
    manifest = build_inference_service(
        InferenceServiceSpec(
            name="qwen3-sft",
            namespace="team-llm",
            storage_uri="pvc://models/runs/r/train/final",
            runtime="kserve-vllm",
            gpus=1,
            max_model_len=2048,
            served_model_name="qwen3-sft",
            node_selector={},
            tolerations=[],
        )
    )
    with (
        FakeKubeAPI() as api,
        VLLMServer(work["root"] / "final", "qwen3-sft", read_config=as_transformers4_reads) as server,
    ):
        api.on_get("inferenceservices", _ready_at(api, server.url))
        with pytest.raises(
            RuntimeError,
            match="does not serve the evaluated model: .*log-probabilities differ.*deleted the new InferenceService",
        ):
            deploy_inference_service(
                manifest, api_client=api.client, poll_seconds=0.01, serving_reference=work["reference"]
            )
        assert api.get_object("serving.kserve.io", "v1beta1", "inferenceservices", "team-llm", "qwen3-sft") is None
    # The smoke test passed first: a one-reply check alone would have kept this service.
    assert [path for path, _ in server.requests][0] == "/v1/chat/completions"


def test_deploy_keeps_a_service_that_serves_the_evaluated_model(work, monkeypatch):
    monkeypatch.setattr(kube, "API_RETRY_WINDOW_SECONDS", 3.0)
    manifest = build_inference_service(
        InferenceServiceSpec(
            name="qwen3-sft",
            namespace="team-llm",
            storage_uri="pvc://models/runs/r/train/final",
            runtime="kserve-vllm",
            gpus=1,
            max_model_len=2048,
            served_model_name="qwen3-sft",
            node_selector={},
            tolerations=[],
        )
    )
    with FakeKubeAPI() as api, VLLMServer(work["root"] / "final", "qwen3-sft") as server:
        api.on_get("inferenceservices", _ready_at(api, server.url))
        result = deploy_inference_service(
            manifest, api_client=api.client, poll_seconds=0.01, serving_reference=work["reference"]
        )
    assert result["serving_check"]["mean_abs_logprob_diff"] < 1e-4


def test_the_evaluate_step_writes_the_reference_the_deploy_step_checks(work, tmp_path):
    """evaluate() scores the tuned model and writes its reference; a server of that same folder passes the check."""
    from components.evaluate.base_vs_tuned import EvalOptions, evaluate

    tuned = work["root"] / "final"
    path = reference_path(str(tuned))
    result = evaluate(
        str(work["root"] / "base"),
        str(tuned),
        str(work["root"] / "data"),
        EvalOptions(4, 0.0, max_new_tokens=4),
        serving_reference=path,
    )
    reference = read_reference(path)
    assert reference["engine"] == "transformers" and reference["tokens"] > 0
    assert "serving_reference" not in json.dumps(result["metrics"])  # the file, not the run's metrics
    with VLLMServer(tuned, "qwen3-sft") as server:
        assert check_server(server.url + "/v1", "qwen3-sft", reference)["mean_abs_logprob_diff"] < 1e-4


@pytest.mark.slow
def test_transformers_serve_reproduces_the_evaluations_greedy_answers_and_a_mismatch_fails_the_local_deploy(
    work, tmp_path
):
    """The local backend against the real `transformers serve` (no log-probabilities there: answers only)."""
    from components.deploy.local_server import serve_locally
    from components.evaluate.base_vs_tuned import load_causal_lm
    from components.evaluate.prompts import BUILTIN_PROMPTS, load_prompts
    from components.models.tiny import materialize

    model_path = materialize(str(tmp_path / "cache"))
    reference = transformers_reference(
        load_causal_lm(model_path), work["tok"].from_pretrained(model_path), work["rows"], load_prompts(BUILTIN_PROMPTS)
    )
    assert serve_locally(model_path, str(tmp_path / "serve.log"), serving_reference=reference)["greedy_prompts_checked"]
    reference["greedy"][1]["decisive_text"] = "an answer the model never gives"
    with pytest.raises(RuntimeError, match="greedy answer to evaluation prompt 2 differs"):
        serve_locally(model_path, str(tmp_path / "serve2.log"), serving_reference=reference)


def test_the_pinned_runtime_reads_transformers5_configs_and_is_the_release_the_rehearsal_runs():
    """vLLM ships transformers 5 from 0.19.1 on (vllm-project/vllm#30566); earlier images read the export's RoPE base
    as 10,000. The serving rehearsal runs the CPU build of exactly the pinned release (tests/fakes/serving_image.py)."""
    from components.deploy.serving_runtime import serving_runtime_manifest
    from tests.fakes import serving_image

    (container,) = serving_runtime_manifest("ns")["spec"]["containers"]
    assert container["image"] == serving_image.IMAGE
    assert tuple(map(int, serving_image.VLLM_VERSION.split("."))) >= (0, 19, 1)
