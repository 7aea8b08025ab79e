"""The reference job's compute levers on a few of Qwen3-30B-A3B's layers, on one GPU, through the trainer's own entry
point, and each lever's whole model projected from two layer counts.

    python benchmarks/moe_layer_bench.py                         # one H100/H200: 2 and 4 layers, rows of 4096
    python benchmarks/moe_layer_bench.py --out $OUT              # + moe-layer-bench.json and the trainers' log there
    python benchmarks/moe_layer_bench.py --levers preset,compiled-experts   # some levers only
    python benchmarks/moe_layer_bench.py --tiny                  # CPU smoke test: a tiny MoE over gloo, 1 and 2 layers

What runs. One model folder per layer count and architecture: Qwen3-30B-A3B's (components/models/architectures/) with
``--layers`` decoder layers (4 layers: 3.1B parameters, 16 bytes each as fp32 master weights, gradients and Adam's
moments, about 50 GB, the most that fits one H100 beside the activations), random bf16 weights, and the builtin tiny
tokenizer (the trainer and the data step need one; token ids then span 2,048 of the 151,936 embedding rows, which
changes no FLOP: the lookup costs none and the head scores every vocabulary entry anyway). One dataset: synthetic
documents with the lengths of benchmarks/train_throughput.py and of the 2026-11-23 measurement (log-normal, median
``seq``/8), written as text rows, then tokenized and packed into rows of ``seq`` by the data step itself
(``components.data.prepare.prepare``). Then, per lever and layer count, the trainer as a pod runs it: ``torchrun
--nproc_per_node 1 -m components.train.trainer --config FILE``, the config from ``build_trainer_config`` (the
launcher's own function) with ``max_steps`` = ``--steps``, a progress line every step, no checkpoint, no report_to.
The trainer is ended once its last step's progress line is out (``--through-export``: it evaluates and exports as a
job does).

Levers: the reference preset per GPU (qwen3-30b-a3b-full: ZeRO-3, activation checkpointing of every layer, 4 rows x 1,
chunked cross-entropy, grouped_mm experts) with one thing changed, each at ``--layers`` 2 and 4; every lever trains 4
rows of ``seq`` per optimizer step (LEVERS below, in the order they run):

    preset              as the preset
    compiled-experts    moe_experts_implementation grouped_mm_compiled (transformers' function under torch.compile)
    ep8-share           one GPU's share under expert parallelism 8: 16 of the 128 experts, top-8 unchanged
    ep8-share-compiled  both
    varlen              attn_implementation varlen_attn (PyTorch's variable-length flash kernel: each packed document
                        alone), named (auto chooses it where flash-attn is absent)
    sdpa                attn_implementation sdpa: SDPA over the whole row under the block-causal mask (auto's choice
                        before 2026-11-29)
    ep8-share-compiled-varlen   the EP-8 share, compiled experts and varlen_attn
    recompute-off       activation_checkpointing false
    liger-experts       moe_experts_implementation liger (Liger's fused MoE, LIGER_FUSED_MOE_AUTOTUNE=0)
    recompute-every-2   recompute_every_n_layers 2
    no-zero             deepspeed_config none: plain PyTorch on one GPU (fp32 weights, bf16 autocast)
    fsdp2               parallelism hsdp: FSDP2 on one rank (fp32 master weights, bf16 compute)
    liger               liger_kernels (RMSNorm, RoPE; under ZeRO-3 without Liger's fused loss: Liger-Kernel #1048)
    whole-logits-1x4    the preset before issue 28: 1 row x 4, the whole logits

The whole model (48 layers) is projected per lever from its two layer counts (``project``): the compute and DeepSpeed's
optimizer-step time (its ``wall_clock_breakdown`` timers) are each linear in the layers, and on one GPU of the reference
job the optimizer's share is divided by the GPUs that share it (16 under ZeRO-3, 2 for the EP-8 share).

A lever that cannot run here is reported as skipped, with the reason: a setting the trainer does not have
(``trainer_fields``), Liger without a GPU or without liger_kernel.

Read from the trainer: tokens/s = the mean of its progress lines' ``tokens/s/device`` over the steps after
``--warmup``; its logged MFU, and its own FLOPs/token ("MFU basis"), as cross-checks. Counted here as the plan and
the trainer count (components/models/mfu.py): model FLOP/s = tokens/s x ``model_flops_per_token`` (6 x active
parameters, lm_head included, embedding 0, causal attention per document over the prepared split's documents);
hardware FLOP/s adds the recomputation (``recompute_flops_per_token`` for the recomputed share of the layers, and
the head's forward again under chunked cross-entropy). Peak GPU memory: the most ``nvidia-smi`` showed in use while
the lever ran (CUDA context and allocator cache included: the trainer writes no peak of its own).

Prints one ``RESULT {json}`` line per lever and a table; ``--out DIR`` also writes moe-layer-bench.json and
moe-layer-bench-trainer.log (every trainer's output). ``--budget-seconds`` bounds the whole run, building included:
a lever that would start with too little time left is not run (its RESULT says so; ``--levers`` runs it later),
and one that runs past the budget is stopped and fails. Exit status 1 when a lever failed (the others still run),
2 for a usage error, else 0.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.metadata
import importlib.util
import json
import math
import os
import random
import re
import shutil
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import IO, Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

# No torch here: the parent stays light; the model is built and the trainer runs in processes of their own.
from bench_processes import (  # noqa: E402  (this folder: sys.path[0] when run as a script)
    GpuMemory,
    child_env,
    error_of,
    gpu_device,
    run_logged,
    stop,
    versions,
)

from components.models.mfu import model_flops_per_token, recompute_flops_per_token  # noqa: E402
from components.models.shape import ModelShape, load_architecture, model_shape  # noqa: E402
from components.settings import Settings, trainer_fields  # noqa: E402
from components.train.config import build_trainer_config, load_deepspeed_config, write_trainer_config  # noqa: E402

REFERENCE_MODEL = "Qwen/Qwen3-30B-A3B"
# --tiny: a Qwen3-MoE small enough for two shared CPU cores (the builtin tokenizer's 2,048-token vocabulary).
TINY_CONFIG: dict[str, Any] = {
    "architectures": ["Qwen3MoeForCausalLM"],
    "model_type": "qwen3_moe",
    "vocab_size": 2048,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "num_experts": 8,
    "num_experts_per_tok": 2,
    "moe_intermediate_size": 32,
    "decoder_sparse_step": 1,
    "mlp_only_layers": [],
    "norm_topk_prob": True,
    "tie_word_embeddings": False,
    "router_aux_loss_coef": 0.001,
}
# The baseline every lever changes: the reference preset as it is now (pipelines/presets/qwen3-30b-a3b-full.yaml,
# tests/benchmarks/test_moe_layer_bench.py holds the two together) on one GPU.
PRESET: dict[str, Any] = {
    "deepspeed_config": "zero3",
    "activation_checkpointing": True,
    "per_device_train_batch_size": 4,
    "gradient_accumulation_steps": 1,
    "chunked_cross_entropy": True,  # the chunked loss recomputes the head's chunks: hardware FLOPs of its own
    "moe_experts_implementation": "grouped_mm",
}
ROWS_PER_STEP = 4  # rows per optimizer step, the preset's 4 x 1: every lever trains the same tokens per step
# The reference job's GPUs (2 nodes x 8): ZeRO-3 spreads the optimizer's step over all of them, so the one-GPU
# benchmark's optimizer time is divided by this in the whole-model projection (and by the expert data-parallel
# degree, 16 / 8 = 2, for the expert-parallel share, whose 16 experts are held by 2 GPUs of the 16).
REFERENCE_GPUS = 16
EP_SHARE = {"num_experts": 16}  # one GPU's experts under expert parallelism 8: 16 of 128, top-8 unchanged


@dataclasses.dataclass(frozen=True)
class Lever:
    name: str
    what: str
    settings: dict[str, Any]  # trainer settings over PRESET
    model: dict[str, Any] = dataclasses.field(default_factory=dict)  # config.json fields over the reference model's
    optimizer_shards: int = REFERENCE_GPUS  # GPUs that share one optimizer step's work in the reference layout


COMPILED = {"moe_experts_implementation": "grouped_mm_compiled"}
# PyTorch's variable-length flash kernel (each packed document alone), named: the preset's auto chooses it where
# flash-attn is absent (the lent GPUs' image) since 2026-11-29; before, auto there was SDPA (the sdpa lever).
VARLEN = {"attn_implementation": "varlen_attn"}
# In the order they run: when --budget-seconds runs out, the last ones are left out.
LEVERS = [
    Lever("preset", "the reference preset: ZeRO-3, recompute every layer, 4 rows x 1, chunked loss", {}),
    Lever("compiled-experts", "moe_experts_implementation grouped_mm_compiled", COMPILED),
    Lever("ep8-share", "one GPU's share under expert parallelism 8: 16 of 128 experts", {}, EP_SHARE, 2),
    Lever("ep8-share-compiled", "the EP-8 share, compiled experts", COMPILED, EP_SHARE, 2),
    Lever("varlen", "attn_implementation varlen_attn: each packed document alone", VARLEN),
    Lever(
        "sdpa", "attn_implementation sdpa: the whole row under the block-causal mask", {"attn_implementation": "sdpa"}
    ),
    Lever(
        "ep8-share-compiled-varlen",
        "the EP-8 share, compiled experts, varlen_attn",
        {**COMPILED, **VARLEN},
        EP_SHARE,
        2,
    ),
    Lever("recompute-off", "no activation checkpointing", {"activation_checkpointing": False}),
    Lever("liger-experts", "moe_experts_implementation liger (autotune off)", {"moe_experts_implementation": "liger"}),
    Lever("recompute-every-2", "recompute every 2nd layer", {"recompute_every_n_layers": 2}),
    Lever("no-zero", "deepspeed none: plain PyTorch, fp32 weights", {"deepspeed_config": "none"}, optimizer_shards=1),
    # FSDP2 keeps fp32 master weights and computes in bf16 (its mixed-precision policy): the no-DeepSpeed path with
    # bf16 compute. No optimizer timer there: its projection keeps one GPU's whole optimizer step (pessimistic).
    Lever("fsdp2", "parallelism hsdp: FSDP2 on one rank", {"parallelism": "hsdp", "deepspeed_config": "none"}, {}, 1),
    Lever("liger", "liger_kernels: RMSNorm, RoPE (no fused loss under ZeRO-3)", {"liger_kernels": True}),
    Lever(
        "whole-logits-1x4",
        "the preset before issue 28: 1 row x 4, the whole logits",
        {"per_device_train_batch_size": 1, "gradient_accumulation_steps": 4, "chunked_cross_entropy": False},
    ),
]
STEP_LINE = re.compile(r"step (\d+)/(\d+) \| loss (\S+) \| lr \S+ \| (\d+) tokens/s/device \| MFU (\S+)")
BASIS_LINE = re.compile(r"MFU basis: ([\d.e+]+) GFLOPs/token")
ATTENTION_LINE = re.compile(r"attention: (\w+)")  # components/train/trainer/speed.py::attn_implementation's choice
# DeepSpeed's global timers, one line per optimizer step with wall_clock_breakdown (deepspeed/utils/timer.py)
TIMER_LINE = re.compile(r"time \(ms\) \| fwd: ([\d.]+) \| bwd: ([\d.]+) \|.*?\| step: ([\d.]+)")


def model_config(tiny: bool, layers: int) -> dict:
    """config.json of the benchmarked model: TINY_CONFIG, or Qwen3-30B-A3B's with ``layers`` decoder layers."""
    if tiny:
        return {**TINY_CONFIG, "num_hidden_layers": layers}
    config = load_architecture(REFERENCE_MODEL)
    assert config is not None, "the package ships Qwen3-30B-A3B's architecture"
    return {**{k: v for k, v in config.items() if not k.startswith("_")}, "num_hidden_layers": layers}


def document_lengths(seq: int, tokens: int, seed: int = 0) -> list[int]:
    """Synthetic document lengths (EOS included) totalling at least ``tokens``: log-normal, median ``seq``/8, sigma
    0.8, between 32 and ``seq`` (benchmarks/train_throughput.py's examples, the 2026-11-23 measurement's rows)."""
    rng, out = random.Random(seed), list[int]()
    while sum(out) < tokens:
        out.append(int(min(seq, max(32, rng.lognormvariate(math.log(seq / 8), 0.8)))))
    return out


def model_key(lever: Lever, layers: int) -> str:
    """The model folder a lever trains at ``layers``: one per distinct architecture and layer count."""
    return f"{layers}L" + "".join(f"-{k}{v}" for k, v in sorted(lever.model.items()))


def build_inputs(workdir: Path, configs: dict[str, dict], seq: int, rows: int, gpu: bool) -> dict:
    """The model folders (one per ``configs`` key) and the prepared dataset under ``workdir``; what the levers
    need (inputs.json).

    Runs in a process of its own (``--prepare-into``): it imports torch and, on a GPU, initialises the weights there.
    """
    import datasets
    import torch
    from transformers import AutoModelForCausalLM, Qwen3MoeConfig

    from components.data.prepare import PrepareOptions, prepare
    from components.models.mfu import attention_length
    from components.models.tiny import build_tokenizer

    started = time.time()
    tokenizer = build_tokenizer()
    models, model_bytes = {}, {}
    for key, config in configs.items():
        model_dir = workdir / f"model-{key}"
        fields = {k: v for k, v in config.items() if k != "model_type"}
        hf_config = Qwen3MoeConfig(
            **fields, pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id, bos_token_id=None
        )
        torch.manual_seed(0)
        with torch.device("cuda" if gpu else "cpu"):
            model = AutoModelForCausalLM.from_config(hf_config, dtype=torch.bfloat16)
        model.save_pretrained(model_dir)
        tokenizer.save_pretrained(model_dir)
        del model
        models[key] = str(model_dir)
        model_bytes[key] = sum(p.stat().st_size for p in model_dir.glob("*.safetensors"))
    built = time.time()

    # Text rows of words that are one token each (" word"), so a document of n tokens is n - 1 words + EOS.
    words = sorted(t[1:] for t in tokenizer.get_vocab() if t.startswith("Ġ") and t[1:].isascii() and t[1:].isalpha())
    rng = random.Random(1)
    source, data_dir = workdir / "synthetic.jsonl", workdir / "data"
    with open(source, "w") as f:
        for n in document_lengths(seq, int(rows * seq * 1.03) + seq):
            f.write(json.dumps({"text": "".join(" " + rng.choice(words) for _ in range(n - 1))}) + "\n")
    stats = prepare(
        str(source),
        next(iter(models.values())),  # the tokenizer: the same in every model folder
        str(data_dir),
        PrepareOptions(
            max_seq_length=seq,
            eval_size=1,  # one held-out document: the trainer's closing evaluation pass stays short
            seed=0,
            format="text",
            over_length="truncate",
            num_proc=1,
        ),
    )
    train = datasets.load_from_disk(str(data_dir))["train"]
    return {
        "models": models,
        "data_dir": str(data_dir),
        "attention_length": attention_length(train),  # what the trainer's progress callback measures
        "train_rows": len(train),
        "train_tokens": stats["train"].get("tokens"),
        "packing_efficiency": stats["train"].get("packing_efficiency"),
        "model_bytes": model_bytes,
        "build_seconds": round(built - started, 1),
        "prepare_seconds": round(time.time() - built, 1),
    }


def why_not(lever: Lever, gpu: bool) -> str | None:
    """Why ``lever`` cannot run here (skipped, not failed), or None."""
    missing = sorted(set(lever.settings) - set(trainer_fields()))
    if missing:
        return f"the trainer has no setting {', '.join(missing)}"
    if lever.settings.get("attn_implementation") == "varlen_attn" and not gpu:
        return "varlen_attn's kernels are CUDA kernels"
    if lever.settings.get("liger_kernels") or lever.settings.get("moe_experts_implementation") == "liger":
        if not gpu:
            return "Liger's kernels are Triton GPU kernels"
        if importlib.util.find_spec("liger_kernel") is None:
            return "liger_kernel is not installed"
    return None


def lever_config(lever: Lever, layers: int, inputs: dict, args, workdir: Path, gpu: bool) -> tuple[str, dict]:
    """The trainer config of ``lever`` at ``layers`` (``build_trainer_config``, as the launcher writes it); (path,
    dict). Its DeepSpeed config is the shipped one with ``wall_clock_breakdown`` on: DeepSpeed then prints each
    optimizer step's forward, backward and step times, which the whole-model projection splits on."""
    name = f"{lever.name}-{layers}L"
    trainer = (
        Settings()
        .trainer()
        .replace(
            model_name_or_path=inputs["models"][model_key(lever, layers)],
            method="full",
            max_seq_length=args.seq,
            learning_rate=1e-5,
            max_steps=args.steps,
            warmup_ratio=0.0,
            seed=0,
            save_steps=10**6,  # no checkpoint inside the run
            logging_steps=1,  # a progress line (tokens/s, MFU) per optimizer step
            report_to=[],
            **{**PRESET, **lever.settings},
        )
    )
    cfg = build_trainer_config(
        trainer,
        dataset_path=inputs["data_dir"],
        output_dir=str(workdir / "runs" / name),
        use_cpu=not gpu,
        model_cache_dir=str(workdir / "cache"),
    )
    if cfg.get("deepspeed"):
        timed = {**load_deepspeed_config(cfg["deepspeed"]), "wall_clock_breakdown": True}
        path = workdir / "configs" / f"ds-{Path(cfg['deepspeed']).stem}-timed.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(timed))
        cfg["deepspeed"] = str(path)
    return write_trainer_config(cfg, str(workdir / "configs" / f"{name}.json")), cfg


def measure(cfg: dict, text: str, shape: ModelShape, inputs: dict, args, peak: float | None) -> dict:
    """The lever's figures from its trainer's output: tokens/s after warm-up, FLOP/s counted, the trainer's MFU, and
    DeepSpeed's optimizer-step time per token (``None`` without DeepSpeed)."""
    steps = [m.groups() for m in STEP_LINE.finditer(text)]
    measured = [s for s in steps if int(s[0]) > args.warmup]
    if not measured:
        raise ValueError(f"no progress line after step {args.warmup} (got {len(steps)}); raise --steps")
    rates = [float(s[3]) for s in measured]
    tokens_per_s = statistics.fmean(rates)
    keys = inputs["attention_length"]
    flops = model_flops_per_token(shape, keys)
    every_n = int((cfg.get("activation_checkpointing_kwargs") or {}).get("every_n_layers", 1))
    # transformers checkpoints layer i when i % every_n_layers == 0 (components/estimate/memory.py::recomputed_layers)
    recomputed = -(-shape.layers // every_n) if cfg.get("activation_checkpointing") else 0
    hw = flops + recompute_flops_per_token(shape, keys, recomputed / shape.layers)
    if cfg.get("chunked_cross_entropy"):
        hw += 2 * shape.hidden * shape.vocab  # the head's forward again, chunk by chunk, in the backward
    mfus = [float(s[4].rstrip("%")) / 100 for s in measured if s[4].endswith("%")]
    basis = BASIS_LINE.search(text)
    attention = ATTENTION_LINE.search(text)
    # One line of DeepSpeed's global timers per optimizer step, printed inside the step, before its progress line.
    timers = [[float(x) for x in m.groups()] for m in TIMER_LINE.finditer(text)][-len(measured) :]
    optimizer = None
    if timers and len(timers) == len(measured):
        # Real tokens per optimizer step (what tokens/s counts): the rows' capacity times the data's packing efficiency.
        rows = cfg["per_device_train_batch_size"] * cfg["gradient_accumulation_steps"]
        tokens_per_step = rows * args.seq * (inputs.get("packing_efficiency") or 1.0)
        optimizer = statistics.fmean(t[2] for t in timers) / 1e3 / tokens_per_step
    return {
        "tokens_per_s": round(tokens_per_s, 1),
        "tokens_per_s_min_max": [min(rates), max(rates)],
        "measured_steps": len(measured),
        "final_loss": float(measured[-1][2]),
        "attention_length": keys,
        "model_gflops_per_token": flops / 1e9,
        "trainer_gflops_per_token": float(basis.group(1)) if basis else None,
        "attention": attention.group(1) if attention else None,
        "model_flops_per_s": tokens_per_s * flops,
        "model_tflops": float(f"{tokens_per_s * flops / 1e12:.4g}"),
        "recomputed_layers": recomputed,
        "hw_tflops": float(f"{tokens_per_s * hw / 1e12:.4g}"),
        "mfu": round(tokens_per_s * flops / peak, 4) if peak else None,
        "trainer_mfu": round(statistics.fmean(mfus), 4) if mfus else None,
        # DeepSpeed's fwd / bwd / step milliseconds per optimizer step, and the step's seconds per token
        "deepspeed_ms": [round(statistics.fmean(t[i] for t in timers), 1) for i in range(3)] if optimizer else None,
        "optimizer_s_per_token": optimizer,
    }


def project(points: list[dict], whole_layers: int, shards: int, flops_per_token: float) -> dict:
    """The whole model's tokens/s per GPU from one lever's runs at two layer counts (``points``: ``layers``,
    ``tokens_per_s``, ``optimizer_s_per_token``), before communication.

    Time per token is linear in the layers: t(L) = rest + L x layer, for the compute (forward, backward,
    recomputation, ZeRO's bookkeeping: the run's time less the optimizer step) and for the optimizer step apart. The
    whole model's time per token on one GPU of the reference layout is then the compute at ``whole_layers`` plus the
    optimizer's at ``whole_layers`` divided by the ``shards`` GPUs that share it (ZeRO-3 partitions the optimizer
    over every GPU of the job; one GPU of this benchmark steps its whole model). Without a measured optimizer time
    (plain PyTorch, or no DeepSpeed timers) the run's whole time is taken as compute: ``shards`` must then be 1.
    """
    ordered = sorted(points, key=lambda p: p["layers"])
    if len(ordered) < 2 or ordered[0]["layers"] == ordered[-1]["layers"]:
        raise ValueError("the projection needs runs at two layer counts (--layers 2,4)")
    a, b = ordered[0], ordered[-1]
    split = all(p.get("optimizer_s_per_token") for p in (a, b))
    if not split and shards != 1:
        raise ValueError("no optimizer-step time (DeepSpeed's wall_clock_breakdown) to divide among the GPUs")

    def parts(p):
        optimizer = p["optimizer_s_per_token"] if split else 0.0
        return 1 / p["tokens_per_s"] - optimizer, optimizer

    (ca, oa), (cb, ob) = parts(a), parts(b)
    span = b["layers"] - a["layers"]
    layer_c, layer_o = (cb - ca) / span, (ob - oa) / span
    rest_c, rest_o = ca - a["layers"] * layer_c, oa - a["layers"] * layer_o
    whole = rest_c + whole_layers * layer_c + (rest_o + whole_layers * layer_o) / shards
    return {
        "layers": f"{whole_layers}, projected from {a['layers']} and {b['layers']}",
        "us_per_token_per_layer": round(layer_c * 1e6, 3),
        "optimizer_us_per_token_per_layer_one_gpu": round(layer_o * 1e6, 3) if split else None,
        "rest_us_per_token": round((rest_c + rest_o / shards) * 1e6, 2),
        "rest_share": round((rest_c + rest_o / shards) / whole, 3),
        "optimizer_shards": shards,
        "tokens_per_s": round(1 / whole),
        "model_tflops": float(f"{flops_per_token / whole / 1e12:.4g}"),
    }


def run_lever(
    lever: Lever, layers: int, inputs: dict, shape: ModelShape, args, workdir: Path, gpu, deadline: float, log
) -> dict:
    """Train ``lever`` at ``layers`` with the trainer's entry point, to its last step; its RESULT dict."""
    path, cfg = lever_config(lever, layers, inputs, args, workdir, gpu is not None)
    name = f"{lever.name}-{layers}L"
    result: dict[str, Any] = {
        "lever": lever.name,
        "what": lever.what,
        "deepspeed": Path(cfg.get("deepspeed", "none")).stem.removesuffix("-timed").removeprefix("ds-"),
        "activation_checkpointing": cfg["activation_checkpointing"],
        "every_n_layers": (cfg.get("activation_checkpointing_kwargs") or {}).get("every_n_layers", 1),
        "rows_x_accumulation": f"{cfg['per_device_train_batch_size']} x {cfg['gradient_accumulation_steps']}",
        **{k: cfg[k] for k in ("chunked_cross_entropy", "liger_kernels", "moe_experts_implementation") if k in cfg},
        "model": lever.model,
        "layers": shape.layers,
        "seq": args.seq,
        "steps": args.steps,
        "warmup": args.warmup,
    }
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "1"]
    cmd += ["-m", "components.train.trainer", "--config", path]
    lever_log = workdir / "logs" / f"{name}.log"
    lever_log.parent.mkdir(parents=True, exist_ok=True)
    timeout = min(args.lever_timeout, deadline - time.monotonic())
    last = None if args.through_export else re.compile(rf"step {args.steps}/{args.steps} \|")
    with GpuMemory() as memory:
        code, seconds = run_logged(cmd, lever_log, timeout, child_env(workdir, gpu is not None), until=last)
    text = lever_log.read_text(errors="replace")
    log.write(f"===== {name}: {' '.join(cmd)}\n{json.dumps(cfg, sort_keys=True)}\n{text}\n")
    log.flush()
    shutil.rmtree(cfg["output_dir"], ignore_errors=True)
    result.update(seconds=round(seconds, 1), peak_gpu_gib=round(memory.peak_mib / 1024, 2) if memory.peak_mib else None)
    if code != 0:
        return {**result, "status": "failed", "error": error_of(text, code)}
    try:
        figures = measure(cfg, text, shape, inputs, args, gpu["peak_bf16_flops"] if gpu else None)
    except ValueError as exc:
        return {**result, "status": "failed", "error": str(exc)}
    return {**result, "status": "ok", **figures}


def table(results: list[dict]) -> str:
    """The results as a markdown table: one row per lever and layer count, then each lever's whole-model row."""

    def cell(r: dict, key: str, fmt: str = "{}") -> str:
        return "" if r.get(key) is None else fmt.format(r[key])

    head = (
        "| lever | layers | ZeRO | recompute | experts | attention | tokens/s | model TFLOP/s | hw TFLOP/s | MFU "
        "| optimizer step ms | peak GPU GiB | s | status |\n"
        "|---|---|---|---|---|---|---:|---:|---:|---:|---:|---:|---:|---|"
    )
    lines = [head]
    for r in results:
        recompute = "" if "activation_checkpointing" not in r else "off"
        if r.get("activation_checkpointing"):
            recompute = "every layer" if r["every_n_layers"] == 1 else f"every {r['every_n_layers']}"
        status = r["status"] if r["status"] == "ok" else f"{r['status']}: {r.get('error') or r.get('reason')}"
        experts = r.get("moe_experts_implementation", "")
        if r.get("model", {}).get("num_experts"):
            experts += f", {r['model']['num_experts']} experts"
        tokens = cell(r, "tokens_per_s", "{:,.0f}")
        if r.get("projected"):
            tokens += " tokens/s"
        lever = f"{r['lever']}: {r['what']}" if r.get("projected") else r["lever"]
        lines.append(
            f"| {lever} | {r.get('layers', '')} | {r.get('deepspeed', '')} | {recompute} | {experts} "
            f"| {r.get('attention') or ''} | {tokens} | {cell(r, 'model_tflops', '{:.4g}')} "
            f"| {cell(r, 'hw_tflops', '{:.3g}')} | {cell(r, 'mfu', '{:.1%}')} "
            f"| {'' if not r.get('deepspeed_ms') else r['deepspeed_ms'][2]} | {cell(r, 'peak_gpu_gib', '{:.1f}')} "
            f"| {cell(r, 'seconds', '{:.0f}')} | {status} |"
        )
    return "\n".join(lines)


def default_workdir(gpu: bool) -> Path:
    """A fresh folder: on a GPU machine in /dev/shm when it has room (the model is read and written once per lever)."""
    shm = Path("/dev/shm")
    if gpu and shm.is_dir() and shutil.disk_usage(shm).free > 40 * 2**30:
        return Path(tempfile.mkdtemp(prefix="moe-layer-bench-", dir=shm))
    return Path(tempfile.mkdtemp(prefix="moe-layer-bench-"))


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    p.add_argument("--layers", help="decoder-layer counts, comma-separated (default 2,4; --tiny 1,2): two project")
    p.add_argument("--whole-layers", type=int, help="the whole model's layers for the projection (default: its own)")
    p.add_argument("--seq", type=int, help="row length (default 4096; --tiny 256)")
    p.add_argument("--steps", type=int, help="optimizer steps per lever (default 5; --tiny 3)")
    p.add_argument("--warmup", type=int, help="steps left out of tokens/s (default 2; --tiny 1)")
    p.add_argument("--levers", help="comma-separated names, run in the table's order (default: all)")
    p.add_argument("--budget-seconds", type=float, default=450.0, help="bound on the whole run, building included")
    p.add_argument("--lever-timeout", type=float, default=300.0, help="bound on one lever's trainer")
    p.add_argument("--tiny", action="store_true", help="CPU smoke test: tiny MoE, rows of 256, gloo")
    p.add_argument("--out", help="folder for moe-layer-bench.json and moe-layer-bench-trainer.log")
    p.add_argument("--workdir", help="where the model, data and runs go (default: a fresh temporary folder)")
    p.add_argument("--keep", action="store_true", help="keep the working folder")
    p.add_argument(
        "--through-export", action="store_true", help="let each trainer end as a job's does (evaluation, export)"
    )
    p.add_argument("--prepare-into", help=argparse.SUPPRESS)  # the child that builds the models and the data
    args = p.parse_args(argv)
    args.layers = sorted({int(n) for n in (args.layers or ("1,2" if args.tiny else "2,4")).split(",") if n.strip()})
    args.seq = args.seq or (256 if args.tiny else 4096)
    args.steps = args.steps or (3 if args.tiny else 5)
    args.warmup = args.warmup if args.warmup is not None else (1 if args.tiny else 2)
    if args.steps <= args.warmup:
        p.error(f"--steps {args.steps} must be more than --warmup {args.warmup}")
    names = [lv.name for lv in LEVERS]
    if args.levers:
        args.levers = [n.strip() for n in args.levers.split(",") if n.strip()]
        unknown = sorted(set(args.levers) - set(names))
        if unknown:
            p.error(f"unknown levers {unknown}; choose from {names}")
    else:
        args.levers = names
    return args


def model_configs(args) -> dict[str, dict]:
    """Every model folder the chosen levers train, by ``model_key``."""
    out = {}
    for lever in (lv for lv in LEVERS if lv.name in args.levers):
        for layers in args.layers:
            out[model_key(lever, layers)] = {
                **model_config(args.tiny, layers),
                **lever.model,
                "num_hidden_layers": layers,
            }
    return out


def prepare_inputs(args, workdir: Path, deadline: float, log: IO[str]) -> dict | None:
    """Build the models and the data in a child process (``--prepare-into``); its inputs.json, or None on failure."""
    cmd = [sys.executable, str(Path(__file__).resolve()), "--prepare-into", str(workdir), "--seq", str(args.seq)]
    cmd += ["--steps", str(args.steps), "--layers", ",".join(map(str, args.layers)), "--levers", ",".join(args.levers)]
    cmd += ["--tiny"] if args.tiny else []
    code, seconds = run_logged(cmd, workdir / "prepare.log", deadline - time.monotonic(), child_env(workdir, False))
    text = (workdir / "prepare.log").read_text(errors="replace")
    log.write(f"===== prepare: {' '.join(cmd)}\n{text}\n")
    if code != 0:
        print(f"error: building the models and data failed ({error_of(text, code)})\n{text[-3000:]}", file=sys.stderr)
        return None
    inputs = json.loads((workdir / "inputs.json").read_text())
    print(
        f"# built in {seconds:.0f}s: {len(inputs['models'])} models ({sum(inputs['model_bytes'].values()) / 2**30:.2f} "
        f"GiB of bf16 weights), {inputs['train_rows']} packed rows of {args.seq} (packing efficiency "
        f"{inputs['packing_efficiency']}), {inputs['attention_length']:.0f} keys/token per document",
        flush=True,
    )
    return inputs


def projection_row(lever: Lever, runs: list[dict], args, inputs: dict) -> dict | None:
    """The lever's "whole model (N layers), projected" row from its runs, or None with fewer than two layer counts."""
    ok = [r for r in runs if r["status"] == "ok"]
    if len({r["layers"] for r in ok}) < 2:
        return None
    whole = model_config(args.tiny, 1)
    whole_layers = args.whole_layers or (TINY_CONFIG["num_hidden_layers"] if args.tiny else 48)
    flops = model_flops_per_token(model_shape({**whole, "num_hidden_layers": whole_layers}), inputs["attention_length"])
    shards = lever.optimizer_shards if all(r.get("optimizer_s_per_token") for r in ok) else 1
    figures = project(ok, whole_layers, shards, flops)
    return {
        "lever": lever.name,
        "what": f"whole model ({whole_layers} layers), projected",
        "projected": True,
        "status": "ok",
        **{k: ok[0][k] for k in ("deepspeed", "activation_checkpointing", "every_n_layers", "model") if k in ok[0]},
        **{k: ok[0][k] for k in ("moe_experts_implementation", "attention") if k in ok[0]},
        **figures,
    }


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.prepare_into:
        workdir = Path(args.prepare_into)
        built = build_inputs(workdir, model_configs(args), args.seq, args.steps * ROWS_PER_STEP, gpu=not args.tiny)
        (workdir / "inputs.json").write_text(json.dumps(built))
        return 0
    started = time.monotonic()
    deadline = started + args.budget_seconds
    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    gpu = None if args.tiny else gpu_device()
    if not args.tiny and gpu is None:
        print("error: no NVIDIA GPU here (nvidia-smi); use --tiny for the CPU smoke test", file=sys.stderr)
        return 2
    workdir = Path(args.workdir) if args.workdir else default_workdir(gpu is not None)
    workdir.mkdir(parents=True, exist_ok=True)
    out = Path(args.out) if args.out else None
    if out:
        out.mkdir(parents=True, exist_ok=True)
    device = gpu or {"name": "CPU (--tiny: gloo, fp32)", "peak_bf16_flops": None}
    header = {
        "device": device,
        "versions": versions(),
        "model": f"{'tiny Qwen3-MoE' if args.tiny else REFERENCE_MODEL} x {args.layers} layers",
        "seq": args.seq,
        "rows_per_step": ROWS_PER_STEP,
        "budget_seconds": args.budget_seconds,
    }
    print(f"# {json.dumps(header)}", flush=True)
    results: list[dict] = []
    log = open(out / "moe-layer-bench-trainer.log" if out else os.devnull, "w")
    try:
        inputs = prepare_inputs(args, workdir, deadline, log)
        if inputs is None:
            return 1
        for lever in (lv for lv in LEVERS if lv.name in args.levers):
            runs = []
            for layers in args.layers:
                shape = model_shape({**model_config(args.tiny, layers), **lever.model})
                reason = why_not(lever, gpu is not None)
                # Start a run only with the time one takes left: the ones run so far, or a floor before the first.
                taken = [r["seconds"] for r in results if r.get("seconds")]
                needed = max(20 if args.tiny else 40, 1.15 * statistics.median(taken) if taken else 0)
                what = {"lever": lever.name, "what": lever.what, "layers": layers}
                if reason is None and deadline - time.monotonic() < needed:
                    result = {**what, "status": "not run", "reason": "--budget-seconds"}
                elif reason:
                    result = {**what, "status": "skipped", "reason": reason}
                else:
                    result = run_lever(lever, layers, inputs, shape, args, workdir, gpu, deadline, log)
                runs.append(result)
                results.append(result)
                print("RESULT " + json.dumps(result), flush=True)
                if result["status"] == "failed":
                    tail = (workdir / "logs" / f"{lever.name}-{layers}L.log").read_text(errors="replace")[-2000:]
                    print(f"# {lever.name} at {layers} layers failed; the end of its output:\n{tail}", flush=True)
            projected = projection_row(lever, runs, args, inputs)
            if projected:
                results.append(projected)
                print("RESULT " + json.dumps(projected), flush=True)
    finally:
        log.close()
        if out:
            summary = {**header, "levers": results, "seconds": round(time.monotonic() - started, 1)}
            (out / "moe-layer-bench.json").write_text(json.dumps(summary, indent=2))
        if not args.keep:
            shutil.rmtree(workdir, ignore_errors=True)
    print(table(results), flush=True)
    left = sorted({r["lever"] for r in results if r["status"] == "not run"}, key=args.levers.index)
    if left:
        print(f"# not run within --budget-seconds: {', '.join(left)} (--levers {','.join(left)} runs them)")
    print(f"# {time.monotonic() - started:.0f}s in all", flush=True)
    return 1 if any(r["status"] == "failed" for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
