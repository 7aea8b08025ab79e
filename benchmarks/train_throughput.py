"""Training throughput: ours (packed rows) against a plain Hugging Face Trainer on padded batches, one mean at a time.

    python benchmarks/train_throughput.py --smoke                           # CPU, tiny Qwen3, ~30 s, prints only
    python benchmarks/train_throughput.py --model qwen3-1.7b                # one GPU, bf16: the trainer's default
    python benchmarks/train_throughput.py --model qwen3-1.7b --attn sdpa --skip-baseline        # without flash-attn
    python benchmarks/train_throughput.py --model qwen3-1.7b --liger --micro-batch 4 --skip-baseline

Same model (randomly initialised from the named Qwen3 architecture), same synthetic SFT examples (lengths drawn
log-normally between 32 and ``--max-seq-length``, the first 30% of each a masked prompt), same real tokens per
optimizer step, every example once, through ``transformers.Trainer`` (AdamW; bf16 autocast over fp32 weights on
a GPU, as the trainer's single-GPU full fine-tuning):

- ours: the examples packed into rows of ``--max-seq-length`` with ``position_ids`` (the prepared-dataset
  contract) and ``components.train.trainer.speed.packed_collator``; ``--micro-batch`` rows per micro-batch x
  ``--grad-accum``; attention from ``components.train.trainer.speed.attn_implementation`` (flash-attention varlen when
  flash-attn imports on a GPU, else SDPA with the block-causal mask) unless ``--attn`` names one; ``--liger``
  applies ``components.train.trainer.speed.apply_liger_kernels`` (GPU and liger_kernel only).
- baseline: one example per row, each micro-batch padded to its longest row with an attention mask, SDPA, no
  Liger. Its micro-batch is ``--baseline-micro-batch`` examples (default 1: at most ``--max-seq-length`` tokens,
  so it fits wherever ours fits one packed row without Liger) and its gradient accumulation gives the same real
  tokens per optimizer step as ours.

Each run trains in its own process: Liger patches transformers' classes for a whole process, and peak memory is
then the run's own. Reported per run: real (non-pad) tokens/s per device after ``--warmup`` optimizer steps; MFU
with causal attention counted per document (components/models/mfu.py; n/a on CPU and unknown GPUs); peak memory
(GPU: ``torch.cuda.max_memory_allocated``; CPU: the process's peak RSS). Results are appended to
benchmarks/results/train_throughput.md (``--results``; the smoke run only prints unless given one).
"""

from __future__ import annotations

import argparse
import math
import multiprocessing
import platform
import random
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
RESULTS = ROOT / "benchmarks" / "results" / "train_throughput.md"

# Architectures by name (config.json numbers of the Qwen3 releases; "tiny" is the laptop model's shape).
MODELS: dict[str, dict[str, Any]] = {
    "tiny": dict(
        vocab_size=2048,
        hidden_size=128,
        intermediate_size=384,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        tie_word_embeddings=True,
    ),
    "qwen3-0.6b": dict(
        vocab_size=151936,
        hidden_size=1024,
        intermediate_size=3072,
        num_hidden_layers=28,
        num_attention_heads=16,
        num_key_value_heads=8,
        head_dim=128,
        tie_word_embeddings=True,
    ),
    "qwen3-1.7b": dict(
        vocab_size=151936,
        hidden_size=2048,
        intermediate_size=6144,
        num_hidden_layers=28,
        num_attention_heads=16,
        num_key_value_heads=8,
        head_dim=128,
        tie_word_embeddings=True,
    ),
}
PAD = 0  # <|endoftext|>, the pad id of the tiny tokenizer the Trainer is given for counting real tokens


def make_examples(n: int, max_seq_length: int, vocab: int, seed: int = 0) -> list[dict]:
    """Synthetic SFT examples: log-normal lengths (median max_seq_length/8), prompt tokens labelled -100."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        length = int(min(max_seq_length, max(32, rng.lognormvariate(math.log(max_seq_length / 8), 0.8))))
        ids = [rng.randrange(1, vocab) for _ in range(length)]
        prompt = int(0.3 * length)
        out.append({"input_ids": ids, "labels": [-100] * prompt + ids[prompt:]})
    return out


def pack(examples: list[dict], max_seq_length: int) -> list[dict]:
    """First-fit packing into rows of exactly ``max_seq_length`` with restarting ``position_ids``."""
    rows: list[dict] = []
    for ex in sorted(examples, key=lambda e: -len(e["input_ids"])):
        n = len(ex["input_ids"])
        row = next((r for r in rows if len(r["input_ids"]) + n <= max_seq_length), None)
        if row is None:
            row = {"input_ids": [], "labels": [], "position_ids": []}
            rows.append(row)
        row["input_ids"] += ex["input_ids"]
        row["labels"] += ex["labels"]
        row["position_ids"] += list(range(n))
    for r in rows:
        tail = max_seq_length - len(r["input_ids"])
        r["input_ids"] += [PAD] * tail
        r["labels"] += [-100] * tail
        r["position_ids"] += list(range(tail))
    random.Random(1).shuffle(rows)
    return rows


def plan(args, examples: list[dict], rows: list[dict]) -> dict:
    """Micro-batch and gradient accumulation of each run: the baseline's give ours' real tokens per optimizer step."""
    examples_per_step = args.micro_batch * args.grad_accum * len(examples) / len(rows)
    return {
        "ours": (args.micro_batch, args.grad_accum),
        "baseline": (args.baseline_micro_batch, max(1, round(examples_per_step / args.baseline_micro_batch))),
    }


def run(kind: str, args, micro_batch: int, grad_accum: int, flops: float) -> dict:
    """Train one epoch as ``kind`` ("ours" or "baseline") in this process; return its figures."""
    import resource

    import datasets
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM, Trainer, TrainerCallback, TrainingArguments
    from transformers.trainer_callback import PrinterCallback

    from components.models.mfu import peak_flops
    from components.models.tiny import build_tokenizer
    from components.train.trainer.speed import apply_liger_kernels, attn_implementation, packed_collator

    gpu = torch.cuda.is_available()
    examples = make_examples(args.examples, args.max_seq_length, MODELS[args.model]["vocab_size"])
    if kind == "ours":
        rows = pack(examples, args.max_seq_length)
        attn = attn_implementation(model_type="qwen3") if args.attn == "auto" else args.attn
        if args.liger and not apply_liger_kernels("qwen3"):
            raise RuntimeError("--liger: Liger kernels were not applied (see the log)")
    else:
        rows, attn = examples, "sdpa"
    config = Qwen3Config(**MODELS[args.model], pad_token_id=PAD, use_cache=False)
    torch.manual_seed(0)
    model = Qwen3ForCausalLM(config)
    model.set_attn_implementation(attn)

    class Timer(TrainerCallback):
        start = None

        def on_step_end(self, a, state, control, **kw):
            if state.global_step == args.warmup:
                if gpu:
                    torch.cuda.synchronize()
                self.start = (time.perf_counter(), state.num_input_tokens_seen)

        def on_train_end(self, a, state, control, **kw):
            if gpu:
                torch.cuda.synchronize()
            self.end = (time.perf_counter(), state.num_input_tokens_seen, state.global_step)

    timer = Timer()
    with tempfile.TemporaryDirectory() as out:
        targs = TrainingArguments(
            output_dir=out,
            per_device_train_batch_size=micro_batch,
            gradient_accumulation_steps=grad_accum,
            num_train_epochs=1,
            learning_rate=1e-4,
            bf16=gpu,
            use_cpu=not gpu,
            report_to=[],
            save_strategy="no",
            logging_steps=10**6,
            remove_unused_columns=False,
            include_num_input_tokens_seen="non_padding",
            seed=0,
            activation_checkpointing=args.gradient_checkpointing,
            dataloader_num_workers=0,
            disable_tqdm=True,
        )
        trainer = Trainer(
            model=model,
            args=targs,
            train_dataset=datasets.Dataset.from_list(rows),
            data_collator=packed_collator(PAD, attn),
            callbacks=[timer],
            processing_class=build_tokenizer(),
        )  # only its pad id (= PAD), to count real tokens
        trainer.remove_callback(PrinterCallback)  # its metrics dict would repeat the line printed below
        trainer.train()
    steps = timer.end[2]
    if timer.start is None:
        raise RuntimeError(
            f"{kind}: {steps} optimizer steps, not more than --warmup {args.warmup}; add --examples or lower --warmup"
        )
    seconds = timer.end[0] - timer.start[0]
    tps = (timer.end[1] - timer.start[1]) / seconds
    peak = peak_flops()
    if gpu:
        memory, device = torch.cuda.max_memory_allocated() / 2**30, torch.cuda.get_device_name()
    else:
        # ru_maxrss is in KiB on Linux
        memory = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
        device = f"CPU ({platform.processor() or platform.machine()}, {torch.get_num_threads()} threads)"
    result = {
        "kind": kind,
        "attn": attn,
        "liger": kind == "ours" and args.liger,
        "rows": len(rows),
        "micro_batch": micro_batch,
        "grad_accum": grad_accum,
        "steps": steps,
        "tokens_per_step": timer.end[1] / steps,
        "tokens_per_second": tps,
        "mfu": tps * flops / peak if peak else None,
        "peak_memory_gib": memory,
        "memory_kind": "GPU max allocated" if gpu else "peak RSS",
        "device": device,
    }
    print(f"{kind}: {_describe(result)}", flush=True)
    return result


def _describe(r: dict) -> str:
    mfu = "n/a" if r["mfu"] is None else f"{r['mfu']:.1%}"
    return (
        f"{r['rows']} rows, micro-batch {r['micro_batch']} x {r['grad_accum']} accumulation, {r['steps']} steps, "
        f"{r['attn']}{' + Liger' if r['liger'] else ''}: {r['tokens_per_second']:,.0f} tokens/s/device, "
        f"MFU {mfu}, peak memory {r['peak_memory_gib']:.2f} GiB ({r['memory_kind']})"
    )


def in_own_process(*run_args) -> dict:
    """``run`` in a fresh spawned process (Liger's patches and the CUDA allocator's peak stay with it)."""
    with ProcessPoolExecutor(max_workers=1, mp_context=multiprocessing.get_context("spawn")) as pool:
        return pool.submit(run, *run_args).result()


def main(argv=None) -> None:
    """Parse arguments, run baseline and ours, print and record the figures."""
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", choices=sorted(MODELS), default="qwen3-1.7b")
    p.add_argument("--max-seq-length", type=int, default=4096)
    p.add_argument("--examples", type=int, default=2000)
    p.add_argument(
        "--warmup", type=int, default=3, help="optimizer steps excluded from the timing (CUDA init, allocator)"
    )
    p.add_argument(
        "--micro-batch", type=int, default=1, help="ours: packed rows per micro-batch (memory grows with it)"
    )
    p.add_argument("--grad-accum", type=int, default=1, help="ours: micro-batches per optimizer step")
    p.add_argument(
        "--baseline-micro-batch",
        type=int,
        default=1,
        help="baseline: examples per micro-batch (padded to the longest); accumulation matches ours' tokens/step",
    )
    p.add_argument(
        "--attn",
        choices=["auto", "sdpa", "flash_attention_2"],
        default="auto",
        help="ours: attention implementation (auto: the trainer's choice)",
    )
    p.add_argument("--liger", action="store_true", help="ours: Liger kernels (needs a GPU and liger_kernel)")
    p.add_argument("--gradient-checkpointing", action="store_true")
    p.add_argument("--skip-baseline", action="store_true", help="measure ours only (one mean at a time, less GPU time)")
    p.add_argument("--smoke", action="store_true", help="CPU smoke run: tiny model, seq 256, 120 examples")
    p.add_argument(
        "--results", help=f"markdown file to append to (default {RESULTS.relative_to(ROOT)}; none for --smoke)"
    )
    args = p.parse_args(argv)
    if args.smoke:
        args.model, args.max_seq_length, args.examples = "tiny", 256, 120
    results = args.results if args.results is not None else ("" if args.smoke else str(RESULTS))
    # No torch here: the runs import it in their own processes, and this one stays quick to start.
    import importlib.metadata
    import importlib.util

    from components.models.mfu import causal_attention_length, flops_per_token
    from components.models.shape import model_shape

    if args.liger and importlib.util.find_spec("liger_kernel") is None:
        p.error("--liger needs the liger_kernel package (and a CUDA GPU)")
    examples = make_examples(args.examples, args.max_seq_length, MODELS[args.model]["vocab_size"])
    rows = pack(examples, args.max_seq_length)
    keys = causal_attention_length([len(e["input_ids"]) for e in examples])  # each example one causal document
    shape = model_shape(MODELS[args.model])
    flops = flops_per_token(shape.active, shape.layers, shape.q_dim, keys)
    mean_len = sum(len(e["input_ids"]) for e in examples) / len(examples)
    print(
        f"{args.examples} examples (mean {mean_len:.0f} tokens) in {len(rows)} packed rows of {args.max_seq_length}; "
        f"{flops / 1e9:.3g} GFLOPs/token (6N + causal attention over {keys:.0f} keys/token)",
        flush=True,
    )
    settings = plan(args, examples, rows)
    runs = [] if args.skip_baseline else [in_own_process("baseline", args, *settings["baseline"], flops)]
    runs.append(in_own_process("ours", args, *settings["ours"], flops))
    speedup = runs[-1]["tokens_per_second"] / runs[0]["tokens_per_second"] if len(runs) == 2 else None
    if speedup:
        print(f"speed-up: {speedup:.2f}x", flush=True)
    if not results:
        return

    def version(name):
        try:
            return importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            return "none"

    def row(r):
        label = "baseline: HF Trainer, padded" if r["kind"] == "baseline" else "ours: packed rows"
        mfu = "n/a" if r["mfu"] is None else f"{r['mfu']:.1%}"
        return (
            f"| {label} | {r['attn']} | {'yes' if r['liger'] else 'no'} | {r['micro_batch']} x {r['grad_accum']} | "
            f"{r['tokens_per_step']:,.0f} | {r['tokens_per_second']:,.0f} | {mfu} | {r['peak_memory_gib']:.1f} |"
        )

    cmd = "python benchmarks/train_throughput.py " + " ".join(argv if argv is not None else sys.argv[1:])
    section = "\n".join(
        [
            f"## {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}: {args.model}, seq {args.max_seq_length}, "
            f"{runs[-1]['device']}",
            "",
            f"`{cmd}`",
            "",
            f"torch {version('torch')}, transformers {version('transformers')}, flash-attn {version('flash-attn')}, "
            f"liger-kernel {version('liger-kernel')}; {args.examples} examples, mean length {mean_len:.0f}, "
            f"{len(rows)} packed rows; {flops / 1e9:.3g} GFLOPs/token (causal attention over {keys:.0f} keys/token per "
            f"document){'; gradient checkpointing' if args.gradient_checkpointing else ''}.",
            "",
            f"| run | attention | Liger | micro-batch x accumulation | real tokens/step | tokens/s/device | MFU | "
            f"peak memory GiB ({runs[-1]['memory_kind']}) |",
            "|---|---|---|---|---:|---:|---:|---:|",
            *[row(r) for r in runs],
            "",
            f"Speed-up: **{speedup:.2f}x**." if speedup else "Baseline not run (`--skip-baseline`).",
            "",
            "",
        ]
    )
    path = Path(results)
    if not path.exists():
        path.write_text("# Training throughput\n\nAppended by `benchmarks/train_throughput.py`; newest last.\n\n")
    with open(path, "a") as f:
        f.write(section)


if __name__ == "__main__":
    main()
