"""The grpo stage's weight sync on GPUs (grpo_generation_backend=vllm-server, issue 30): the trainer's CUDA tensors
broadcast over ProcessGroupNCCL to a real vLLM server (its CUDA build) on another GPU, as the cluster's trainer pod and
server pod do; the CPU path (gloo, vLLM's CPU build) is test_grpo_vllm_server.py.

    KFP_VLLM_PYTHON=/path/to/venv-with-vllm-0.32-cuda/bin/python \\
        pytest -m "gpu and slow" tests/train/trainer/test_grpo_vllm_server_gpu.py

Needs two CUDA GPUs (NCCL does not put two ranks of one group on one GPU) and an interpreter with vLLM's CUDA build
(``KFP_VLLM_PYTHON``; the trainer's environment has no vllm). The server runs on the second GPU, the trainer's end on
the first. benchmarks/results/grpo-vllm-server.md has the command and what it measured.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time

import pytest
import torch

from components.models.logprobs import server_logprobs
from components.train.trainer.vllm_client import VLLMServer, WeightSync, engine_dir, server_args, server_env

pytestmark = [pytest.mark.gpu, pytest.mark.slow]

SERVED = "tiny-grpo"


def _unavailable() -> str | None:
    if torch.cuda.device_count() < 2:
        return "the NCCL weight sync needs two CUDA GPUs (one for the trainer's end, one for the vLLM server)"
    if not os.environ.get("KFP_VLLM_PYTHON"):
        return "KFP_VLLM_PYTHON names no interpreter with vLLM's CUDA build"
    return None


@contextlib.contextmanager
def _gpu_server(model: str, log_path):
    """vLLM's CUDA build serving ``model`` on the second GPU, float32, with the weight-sync engine."""
    with socket_port() as port:
        pass
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env.update(server_env(engine_dir()), CUDA_VISIBLE_DEVICES="1", HF_HUB_OFFLINE="1")
    cmd = [
        os.environ["KFP_VLLM_PYTHON"],
        "-m",
        "vllm.entrypoints.openai.api_server",
        *server_args(model, SERVED, port, host="127.0.0.1"),
        "--dtype",
        "float32",
        "--max-model-len",
        "512",
        "--gpu-memory-utilization",
        "0.2",
        "--enforce-eager",
    ]
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    client = VLLMServer(f"http://127.0.0.1:{port}")
    try:
        deadline = time.monotonic() + 600
        while True:
            try:
                client.get("/health")
                break
            except Exception:
                if proc.poll() is not None or time.monotonic() > deadline:
                    pytest.fail(f"vLLM server did not start:\n{log_path.read_text(errors='replace')[-4000:]}")
                time.sleep(2)
        yield client
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    if reason := _unavailable():
        pytest.skip(reason)
    from components.models.tiny import materialize

    return materialize(str(tmp_path_factory.mktemp("grpo-vllm-gpu") / "cache"))


class socket_port:
    """A free TCP port on loopback (closed again on exit)."""

    def __enter__(self) -> int:
        import socket

        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        return self.sock.getsockname()[1]

    def __exit__(self, *exc) -> None:
        self.sock.close()


def _reference_logprobs(model, ids: list[int]) -> list[float]:
    with torch.no_grad():
        logits = model(torch.tensor([ids], device=model.device)).logits[0].float()
    logps = torch.log_softmax(logits[:-1], dim=-1)
    return logps.gather(1, torch.tensor(ids[1:], device=model.device)[:, None])[:, 0].tolist()


def _round_trip(client, model, tokenizer, modify) -> dict:
    """Push ``model`` after ``modify`` over NCCL; the server's log-probabilities must follow transformers' on the
    modified weights (TF32 and other GPU kernels: a looser tolerance than on CPU, far below the change)."""
    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": "Say apple."}], add_generation_prompt=True, tokenize=True, return_dict=False
    )
    probe = prompt + [5, 6, 7, 8, 9]
    before = server_logprobs(client.url + "/v1", SERVED, probe)[1:]
    assert max(abs(a - b) for a, b in zip(before, _reference_logprobs(model, probe), strict=True)) < 2e-2
    with torch.no_grad():
        modify(model)
    sync = WeightSync(client, "127.0.0.1", device="cuda:0", bucket_bytes=1 << 20)
    try:
        assert sync.group_backend == "nccl"
        pushed = sync.push_model(model)
        after = server_logprobs(client.url + "/v1", SERVED, probe)[1:]
    finally:
        sync.close()
    expected = _reference_logprobs(model, probe)
    assert max(abs(a - b) for a, b in zip(after, expected, strict=True)) < 2e-2
    assert max(abs(a - b) for a, b in zip(after, before, strict=True)) > 0.05
    return pushed


def test_cuda_weights_reach_the_server_over_nccl(base, tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    def modify(m):
        m.model.layers[1].mlp.down_proj.weight.zero_()
        m.model.embed_tokens.weight.mul_(1.5)
        m.model.norm.weight.add_(0.5)

    with _gpu_server(base, tmp_path / "server.log") as client:
        model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32).to("cuda:0").eval()
        pushed = _round_trip(client, model, AutoTokenizer.from_pretrained(base), modify)
    print(f"nccl weight sync, dense: {pushed}")


def test_a_moe_models_experts_reach_the_server_over_nccl(base, tmp_path):
    from transformers import AutoTokenizer, Qwen3MoeConfig, Qwen3MoeForCausalLM

    tokenizer = AutoTokenizer.from_pretrained(base)
    torch.manual_seed(0)
    config = Qwen3MoeConfig(
        vocab_size=len(tokenizer),
        hidden_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        intermediate_size=192,
        num_experts=4,
        num_experts_per_tok=2,
        moe_intermediate_size=64,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=None,
        tie_word_embeddings=False,
        max_position_embeddings=1024,
    )
    Qwen3MoeForCausalLM(config).save_pretrained(tmp_path / "moe")
    tokenizer.save_pretrained(tmp_path / "moe")

    def modify(m):
        for layer in m.model.layers:
            layer.mlp.experts.gate_up_proj.mul_(3.0)
            layer.mlp.experts.down_proj[1].zero_()

    with _gpu_server(str(tmp_path / "moe"), tmp_path / "server.log") as client:
        model = Qwen3MoeForCausalLM.from_pretrained(tmp_path / "moe", dtype=torch.float32).to("cuda:0").eval()
        pushed = _round_trip(client, model, tokenizer, modify)
    print(f"nccl weight sync, moe: {pushed}")
