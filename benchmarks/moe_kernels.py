"""The kernels' ceiling of Qwen3-30B-A3B's decoder layers on one GPU, per experts implementation: forward and
backward of the model body alone (no head, no loss, no optimizer, no ZeRO, no recomputation), and the top CUDA
kernels of one step.

    python benchmarks/moe_kernels.py                 # one H100/H200: 4 layers, 4 packed rows of 4096, ~2 min
    python benchmarks/moe_kernels.py --out $OUT      # + moe-kernels.json
    python benchmarks/moe_kernels.py --tiny          # CPU smoke test (tiny MoE, fp32): the harness only

What runs, per variant in a process of its own (Liger patches transformers' classes process-wide):
``Qwen3MoeModel`` (the reference config from components/models/architectures/, ``--layers`` decoder layers, random
bf16 weights) fed ``inputs_embeds`` of 4 packed rows whose documents have the lengths of benchmarks/moe_layer_bench.py
(log-normal, median 512), with ``position_ids`` restarting at each document: transformers then builds the same
block-causal SDPA mask the trainer's packed rows get under SDPA (``varlen_attn`` finds the same documents from the
positions). The experts and the attention are chosen as the trainer chooses them (components/train/trainer/speed.py:
``experts_implementation``, ``apply_liger_kernels``, ``attn_implementation``), so a variant is the settings
``moe_experts_implementation`` and ``attn_implementation`` and nothing else.

Variants (in this order):

    grouped_mm            transformers' grouped GEMMs (the default)
    grouped_mm_compiled   the same function under torch.compile (moe_experts_implementation grouped_mm_compiled)
    liger                 Liger's fused MoE, LIGER_FUSED_MOE_AUTOTUNE=0 (moe_experts_implementation liger)
    ep8-share             grouped_mm on 16 of the 128 experts, top-8 unchanged: one GPU's share under expert
                          parallelism 8 (every token-expert row it receives lands on its 16 experts)
    ep8-share-compiled    the same, compiled
    varlen, compiled-varlen, ep8-share-compiled-varlen
                          grouped_mm, grouped_mm_compiled and the EP-8 share compiled with attention by
                          ``varlen_attn`` (PyTorch's variable-length flash kernel, components/train/trainer/varlen.py:
                          each document alone) instead of SDPA under the block-causal mask (every other variant)

Counted as the plan counts (components/models/mfu.py): model FLOPs per token per layer = 6 x the layer's active
parameters (attention, router, top-8 experts) + 12 d T with T the mean causal keys per token of the packed documents;
no recomputation. ``tokens/s, 48 layers`` is the layers' ceiling for the whole model (48 x this layer, no head).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from moe_layer_bench import TINY_CONFIG  # noqa: E402  (this folder: sys.path[0] when run as a script)

from components.models.mfu import causal_attention_length, model_flops_per_token  # noqa: E402
from components.models.shape import load_architecture, model_shape  # noqa: E402

VARIANTS = {  # name: (moe_experts_implementation, experts kept of 128, attn_implementation)
    "grouped_mm": ("grouped_mm", None, "sdpa"),
    "grouped_mm_compiled": ("grouped_mm_compiled", None, "sdpa"),
    "liger": ("liger", None, "sdpa"),
    "ep8-share": ("grouped_mm", 16, "sdpa"),
    "ep8-share-compiled": ("grouped_mm_compiled", 16, "sdpa"),
    "varlen": ("grouped_mm", None, "varlen_attn"),
    "compiled-varlen": ("grouped_mm_compiled", None, "varlen_attn"),
    "ep8-share-compiled-varlen": ("grouped_mm_compiled", 16, "varlen_attn"),
}
# --tiny: the CPU smoke model of benchmarks/moe_layer_bench.py, its layer count set by --layers.
TINY = {k: v for k, v in TINY_CONFIG.items() if k not in ("architectures", "model_type", "num_hidden_layers")}


def packed_positions(rows: int, seq: int, seed: int = 0) -> list[list[int]]:
    """Each row's document lengths (log-normal, median seq/8, 32..seq, the last one cut to fill the row)."""
    rng, out = random.Random(seed), []
    for _ in range(rows):
        lengths: list[int] = []
        while sum(lengths) < seq:
            lengths.append(int(min(seq, max(32, rng.lognormvariate(math.log(seq / 8), 0.8)))))
        lengths[-1] -= sum(lengths) - seq
        out.append([n for n in lengths if n > 0])
    return out


def layer_flops_per_token(config: dict, experts_kept: int | None, keys: float) -> float:
    """Model FLOPs per token of one decoder layer, exactly as the plan counts them (components/models/mfu.py's
    ``model_flops_per_token``: the difference one more layer makes, norms and router included)."""
    fields = {**config, **({"num_experts": experts_kept} if experts_kept else {})}
    one, two = (model_shape({**fields, "num_hidden_layers": n}) for n in (1, 2))
    return model_flops_per_token(two, keys) - model_flops_per_token(one, keys)


def run_one(name: str, args) -> dict:
    """One variant, in this process: its timing, memory and (on a GPU) the top CUDA kernels of one step."""
    import torch
    from transformers import Qwen3MoeConfig
    from transformers.models.qwen3_moe import modeling_qwen3_moe

    from components.train.trainer.speed import (
        LIGER_EXPERTS,
        apply_liger_kernels,
        attn_implementation,
        experts_implementation,
    )

    implementation, kept, attention = VARIANTS[name]
    gpu = torch.cuda.is_available() and not args.tiny
    device, dtype = ("cuda", torch.bfloat16) if gpu else ("cpu", torch.float32)
    if implementation == LIGER_EXPERTS and not apply_liger_kernels(
        "qwen3_moe", fused_loss=False, layers=False, moe_experts=True
    ):
        return {"variant": name, "status": "skipped", "reason": "Liger's fused MoE needs CUDA and liger_kernel"}
    architecture = dict(TINY) if args.tiny else load_architecture(args.model)
    if architecture is None:
        return {"variant": name, "status": "failed", "error": f"no packaged architecture for {args.model}"}
    base = {k: v for k, v in architecture.items() if not k.startswith("_")}
    base.pop("model_type", None)
    fields = {**base, "num_hidden_layers": args.layers, "use_cache": False}
    if kept:
        fields["num_experts"] = kept
    config = Qwen3MoeConfig(**fields)
    if attention != "sdpa" and not gpu:
        return {"variant": name, "status": "skipped", "reason": f"{attention} needs CUDA"}
    config._attn_implementation = attn_implementation(attention)
    config._experts_implementation = experts_implementation(implementation)
    torch.manual_seed(0)
    torch.set_default_dtype(
        dtype
    )  # the weights are built in the run's dtype (bf16 on a GPU), as the trainer loads them
    with torch.device(device):
        model = modeling_qwen3_moe.Qwen3MoeModel(config)
    model.train()
    docs = packed_positions(args.rows, args.seq)
    positions = torch.tensor([[p for n in row for p in range(n)] for row in docs], device=device)
    keys = causal_attention_length([n for row in docs for n in row])
    x = torch.randn(args.rows, args.seq, config.hidden_size, device=device, dtype=dtype, requires_grad=True)
    grad = torch.randn_like(x)

    def step():
        out = model(inputs_embeds=x, position_ids=positions).last_hidden_state
        out.backward(grad)

    started = time.perf_counter()
    step()  # the first step compiles (grouped_mm_compiled) or builds Liger's kernels
    sync = torch.cuda.synchronize if gpu else (lambda: None)
    sync()
    first_s = time.perf_counter() - started
    for _ in range(args.warmup - 1):
        step()
    sync()
    if gpu:
        torch.cuda.reset_peak_memory_stats()
    started = time.perf_counter()
    for _ in range(args.steps):
        step()
    sync()
    seconds = (time.perf_counter() - started) / args.steps
    tokens = args.rows * args.seq
    per_layer = layer_flops_per_token(fields, kept, keys)
    result = {
        "variant": name,
        "status": "ok",
        "experts_implementation": implementation,
        "attention": attention,
        "experts": fields["num_experts"],
        "layers": args.layers,
        "rows": args.rows,
        "seq": args.seq,
        "attention_length": round(keys, 1),
        "first_step_s": round(first_s, 1),
        "ms_per_step": round(seconds * 1e3, 2),
        "us_per_token_per_layer": round(seconds / tokens / args.layers * 1e6, 4),
        "tokens_per_s": round(tokens / seconds),
        "tokens_per_s_48_layers": round(tokens / seconds * args.layers / 48),
        "model_tflops": round(tokens * args.layers * per_layer / seconds / 1e12, 1),
        "peak_gib": round(torch.cuda.max_memory_allocated() / 2**30, 2) if gpu else None,
    }
    if gpu:
        result["top_kernels"] = top_kernels(step)
    return result


def top_kernels(step, count: int = 12) -> list[list]:
    """torch.profiler over one step: the ``count`` kernels with the most self CUDA time [name, ms, % of the step]."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        step()
        torch.cuda.synchronize()
    events = sorted(prof.key_averages(), key=lambda e: -e.self_device_time_total)
    total = sum(e.self_device_time_total for e in events) or 1
    return [
        [e.key[:90], round(e.self_device_time_total / 1e3, 2), round(100 * e.self_device_time_total / total, 1)]
        for e in events[:count]
    ]


def table(results: list[dict]) -> str:
    lines = [
        "| variant | experts | us/token/layer | tokens/s | model TFLOP/s | tokens/s, 48 layers | first step s "
        "| peak GiB | status |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for r in results:
        if r["status"] != "ok":
            lines.append(f"| {r['variant']} | | | | | | | | {r['status']}: {r.get('reason') or r.get('error')} |")
            continue
        lines.append(
            f"| {r['variant']} | {r['experts']} | {r['us_per_token_per_layer']:.3f} | {r['tokens_per_s']:,} | "
            f"{r['model_tflops']} | {r['tokens_per_s_48_layers']:,} | {r['first_step_s']} "
            f"| {r['peak_gib'] or ''} | ok |"
        )
    return "\n".join(lines)


def parse_args(argv):
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    p.add_argument(
        "--model", default="Qwen/Qwen3-30B-A3B", help="a packaged architecture (components/models/architectures)"
    )
    p.add_argument("--layers", type=int, help="decoder layers (default 4; --tiny 2)")
    p.add_argument("--rows", type=int, default=4, help="packed rows per step (the reference preset's micro-batch)")
    p.add_argument("--seq", type=int, help="row length (default 4096; --tiny 128)")
    p.add_argument("--steps", type=int, help="timed steps (default 10; --tiny 2)")
    p.add_argument("--warmup", type=int, help="steps before timing, the first included (default 3; --tiny 1)")
    p.add_argument("--variants", help=f"comma-separated, from {list(VARIANTS)} (default: all)")
    p.add_argument("--variant-timeout", type=float, default=150.0, help="seconds one variant may take")
    p.add_argument("--tiny", action="store_true", help="CPU smoke test: tiny MoE, fp32")
    p.add_argument("--out", help="folder for moe-kernels.json")
    p.add_argument("--one", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    args.layers = args.layers or (2 if args.tiny else 4)
    args.seq = args.seq or (128 if args.tiny else 4096)
    args.steps = args.steps or (2 if args.tiny else 10)
    args.warmup = args.warmup or (1 if args.tiny else 3)
    args.variants = [v.strip() for v in (args.variants or ",".join(VARIANTS)).split(",") if v.strip()]
    unknown = sorted(set(args.variants) - set(VARIANTS))
    if unknown:
        p.error(f"unknown variants {unknown}; choose from {list(VARIANTS)}")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.one:
        print("RESULT " + json.dumps(run_one(args.one, args)), flush=True)
        return 0
    passed = ["--model", args.model, "--layers", str(args.layers), "--rows", str(args.rows), "--seq", str(args.seq)]
    passed += ["--steps", str(args.steps), "--warmup", str(args.warmup)] + (["--tiny"] if args.tiny else [])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)}
    results = []
    for name in args.variants:
        cmd = [sys.executable, str(Path(__file__).resolve()), *passed, "--one", name]
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=args.variant_timeout, env=env)
            lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
            result = json.loads(lines[-1].removeprefix("RESULT ")) if lines else None
            if result is None:
                tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
                result = {"variant": name, "status": "failed", "error": f"exit {proc.returncode}: {tail[:300]}"}
                print(proc.stderr[-3000:], file=sys.stderr, flush=True)
        except subprocess.TimeoutExpired:
            result = {
                "variant": name,
                "status": "failed",
                "error": f"over --variant-timeout {args.variant_timeout:.0f}s",
            }
        results.append(result)
        print("RESULT " + json.dumps(result), flush=True)
    print(table(results), flush=True)
    for r in results:
        for kernel in r.get("top_kernels", []):
            print(f"# {r['variant']}: {kernel[2]:5.1f}% {kernel[1]:8.2f} ms  {kernel[0]}", flush=True)
    if args.out:
        Path(args.out).mkdir(parents=True, exist_ok=True)
        (Path(args.out) / "moe-kernels.json").write_text(json.dumps(results, indent=2))
    return 1 if any(r["status"] == "failed" for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
