"""The grpo stage's generation: a vLLM server (grpo_generation_backend=vllm-server) against transformers' ``generate``
(the default), on the same prompts and the same weights, and the weight sync's round trip.

    python -m benchmarks.grpo_generation [--prompts 16] [--completions 8] [--max-tokens 64] [--url http://host:port]

Without ``--url`` it starts vLLM's CPU build from the serving virtualenv (components/deploy/local_server.py
``vllm_python``) on the tiny Qwen3, float32, with the weight-sync engine, and stops it at the end. Sampling at
temperature 1 with ``ignore_eos`` on the server and ``min_new_tokens`` in transformers, so both produce exactly
``--max-tokens`` tokens per completion. Prints one markdown table (benchmarks/results/grpo-vllm-server.md).
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import subprocess
import tempfile
import time
from typing import cast


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _start_server(model: str, log_path: str) -> tuple[subprocess.Popen, str]:
    from components.deploy.local_server import vllm_python
    from components.train.trainer.vllm_client import engine_dir, server_args, server_env

    port = _free_port()
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env.update(server_env(engine_dir()), VLLM_CPU_KVCACHE_SPACE="1", HF_HUB_OFFLINE="1")
    cmd = [
        vllm_python(),
        "-m",
        "vllm.entrypoints.openai.api_server",
        *server_args(model, "policy", port, host="127.0.0.1"),
        "--dtype",
        "float32",
        "--max-model-len",
        "1024",
    ]
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    return proc, f"http://127.0.0.1:{port}"


def main(argv: list[str] | None = None) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from components.models.tiny import materialize
    from components.train.trainer.vllm_client import VLLMServer, WeightSync

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--completions", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--url", default="", help="a running server (else one is started on the tiny model)")
    args = parser.parse_args(argv)

    root = tempfile.mkdtemp(prefix="grpo-generation-")
    model_path = materialize(os.path.join(root, "cache"))
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32).eval()
    prompts = [
        cast(
            list[int],
            tokenizer.apply_chat_template(
                [{"role": "user", "content": f"Question {i}: what is {i} + {i}?"}],
                add_generation_prompt=True,
                tokenize=True,
                return_dict=False,
            ),
        )
        for i in range(args.prompts)
    ]
    proc = None
    url = args.url
    if not url:
        proc, url = _start_server(model_path, os.path.join(root, "server.log"))
    try:
        server = VLLMServer(url)
        started = time.monotonic()
        server.wait_ready(900)
        startup = time.monotonic() - started
        server.generate(prompts[:1], max_tokens=4)  # warm-up
        body_extra = {"ignore_eos": True}
        started = time.monotonic()
        choices = server.post(
            "/v1/completions",
            {
                "model": server.model,
                "prompt": prompts,
                "n": args.completions,
                "max_tokens": args.max_tokens,
                "temperature": 1.0,
                "return_token_ids": True,
                **body_extra,
            },
        )["choices"]
        vllm_seconds = time.monotonic() - started
        vllm_tokens = sum(len(c["token_ids"]) for c in choices)

        repeated = [p for p in prompts for _ in range(args.completions)]
        width = max(map(len, repeated))
        pad = tokenizer.pad_token_id or 0
        ids = torch.tensor([[pad] * (width - len(p)) + p for p in repeated])
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in repeated])
        started = time.monotonic()
        with torch.no_grad():
            out = model.generate(
                input_ids=ids,
                attention_mask=mask,
                do_sample=True,
                temperature=1.0,
                max_new_tokens=args.max_tokens,
                min_new_tokens=args.max_tokens,
                pad_token_id=pad,
            )
        hf_seconds = time.monotonic() - started
        hf_tokens = int(out[:, width:].numel())

        sync = WeightSync(server, "127.0.0.1")
        try:
            first = sync.push_model(model)
            second = sync.push_model(model)
        finally:
            sync.close()
    finally:
        if proc is not None:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(60)

    batch = f"{args.prompts} prompts x {args.completions} completions x {args.max_tokens} tokens"
    print(f"| backend | {batch}: seconds | tokens/s |")
    print("|---|---|---|")
    print(f"| vLLM server (CPU build 0.32.0) | {vllm_seconds:.2f} | {vllm_tokens / vllm_seconds:.0f} |")
    print(f"| transformers generate | {hf_seconds:.2f} | {hf_tokens / hf_seconds:.0f} |")
    print(
        f"\nserver start {startup:.0f} s; weight sync ({first['parameters']} tensors, {first['bytes'] / 1e6:.1f} MB, "
        f"gloo): first {first['seconds']:.3f} s (forms the group), then {second['seconds']:.3f} s"
    )


if __name__ == "__main__":
    main()
