"""Training throughput: ours (packed rows, padding-free attention) vs a plain Hugging Face Trainer on padded batches.

    python benchmarks/train_throughput.py --smoke                                      # CPU, tiny Qwen3, ~1 minute
    python benchmarks/train_throughput.py --model qwen3-1.7b --max-seq-length 4096     # one GPU, bf16

Same model (randomly initialised from the named Qwen3 architecture), same synthetic SFT examples (lengths
drawn log-normally between 32 and ``max_seq_length``, the first 30% of each a masked prompt), same sequence
length, one process, in one run:

- ours: the examples packed into rows of ``max_seq_length`` with ``position_ids`` (the prepared-dataset
  contract), ``components.train.batches.pad_collator``, flash-attention varlen when installed (else SDPA with
  the block-causal mask);
- baseline: the same examples, ``per_device_train_batch_size`` = max_seq_length / mean example length
  (about the same tokens per step), each batch padded to its longest row with an attention mask, SDPA.

Both go through ``transformers.Trainer`` (AdamW, bf16 on GPU) over every example once. Reported: real
(non-pad) tokens/s per device after ``--warmup`` steps, and MFU = tokens/s x FLOPs/token / the GPU's peak
bf16 FLOP/s (components/train/callbacks.py; n/a on CPU). Results are appended to
benchmarks/results/train_throughput.md.
"""

from __future__ import annotations

import argparse
import math
import platform
import random
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

# Architectures by name (config.json numbers of the Qwen3 releases; "tiny" is the laptop model's shape).
MODELS = {
    "tiny": dict(vocab_size=2048, hidden_size=128, intermediate_size=384, num_hidden_layers=4,
                 num_attention_heads=4, num_key_value_heads=2, head_dim=32, tie_word_embeddings=True),
    "qwen3-0.6b": dict(vocab_size=151936, hidden_size=1024, intermediate_size=3072, num_hidden_layers=28,
                       num_attention_heads=16, num_key_value_heads=8, head_dim=128, tie_word_embeddings=True),
    "qwen3-1.7b": dict(vocab_size=151936, hidden_size=2048, intermediate_size=6144, num_hidden_layers=28,
                       num_attention_heads=16, num_key_value_heads=8, head_dim=128, tie_word_embeddings=True),
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


def run(label: str, rows: list[dict], model_name: str, batch_size: int, attn: str, args) -> dict:
    """Train one epoch over ``rows`` and return real tokens/s per device after warm-up (and MFU on known GPUs)."""
    import datasets
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM, Trainer, TrainerCallback, TrainingArguments

    from components.models.tiny import build_tokenizer
    from components.train.callbacks import flops_per_token, peak_flops
    from components.train.memory import model_shape
    from components.train.batches import pad_collator

    gpu = torch.cuda.is_available()
    config = Qwen3Config(**MODELS[model_name], pad_token_id=PAD, use_cache=False)
    config._attn_implementation = attn
    torch.manual_seed(0)
    model = Qwen3ForCausalLM(config)

    class Timer(TrainerCallback):
        def on_step_end(self, a, state, control, **kw):
            if state.global_step == args.warmup:
                self.start = (time.perf_counter(), state.num_input_tokens_seen)

        def on_train_end(self, a, state, control, **kw):
            if gpu:
                torch.cuda.synchronize()
            self.end = (time.perf_counter(), state.num_input_tokens_seen)

    timer = Timer()
    with tempfile.TemporaryDirectory() as out:
        targs = TrainingArguments(
            output_dir=out, per_device_train_batch_size=batch_size, num_train_epochs=1, learning_rate=1e-4,
            bf16=gpu, use_cpu=not gpu, report_to=[], save_strategy="no", logging_steps=10**6,
            remove_unused_columns=False, include_num_input_tokens_seen="non_padding", seed=0,
            gradient_checkpointing=args.gradient_checkpointing, dataloader_num_workers=0,
        )
        trainer = Trainer(model=model, args=targs, train_dataset=datasets.Dataset.from_list(rows),
                          data_collator=pad_collator(PAD), callbacks=[timer],
                          processing_class=build_tokenizer())  # only its pad id (= PAD), to count real tokens
        trainer.train()
    seconds = timer.end[0] - timer.start[0]
    tokens = timer.end[1] - timer.start[1]
    tps = tokens / seconds
    shape = model_shape(config.to_dict())
    peak = peak_flops()
    mfu = tps * flops_per_token(shape.active, shape.layers, shape.q_dim, args.max_seq_length) / peak if peak else None
    steps = math.ceil(len(rows) / batch_size)
    print(f"{label}: {len(rows)} rows, batch {batch_size}, {steps} steps, {tokens} real tokens in {seconds:.1f} s "
          f"after {args.warmup} warm-up steps: {tps:,.0f} tokens/s, MFU {'n/a' if mfu is None else f'{mfu:.1%}'}", flush=True)
    return {"tokens_per_second": tps, "mfu": mfu, "rows": len(rows), "batch": batch_size, "steps": steps}


def main(argv=None) -> None:
    """Parse arguments, run baseline and ours, print and record the figures."""
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", choices=sorted(MODELS), default="qwen3-1.7b")
    p.add_argument("--max-seq-length", type=int, default=4096)
    p.add_argument("--examples", type=int, default=2000)
    p.add_argument("--warmup", type=int, default=3, help="steps excluded from the timing (CUDA init, allocator)")
    p.add_argument("--gradient-checkpointing", action="store_true")
    p.add_argument("--smoke", action="store_true", help="CPU smoke run: tiny model, seq 256, 200 examples")
    p.add_argument("--results", default=str(ROOT / "benchmarks" / "results" / "train_throughput.md"))
    args = p.parse_args(argv)
    if args.smoke:
        args.model, args.max_seq_length, args.examples = "tiny", 256, 200
    import importlib.util

    import torch

    examples = make_examples(args.examples, args.max_seq_length, MODELS[args.model]["vocab_size"])
    mean_len = sum(len(e["input_ids"]) for e in examples) / len(examples)
    flash = torch.cuda.is_available() and importlib.util.find_spec("flash_attn") is not None
    base_batch = max(1, round(args.max_seq_length / mean_len))
    baseline = run("baseline (padded batches)", examples, args.model, base_batch, "sdpa", args)
    ours = run("ours (packed rows)", pack(examples, args.max_seq_length), args.model, 1,
               "flash_attention_2" if flash else "sdpa", args)
    speedup = ours["tokens_per_second"] / baseline["tokens_per_second"]
    print(f"speed-up: {speedup:.2f}x")

    device = torch.cuda.get_device_name() if torch.cuda.is_available() else f"CPU ({platform.processor() or platform.machine()}, {torch.get_num_threads()} threads)"
    cmd = "python benchmarks/train_throughput.py " + " ".join(argv if argv is not None else sys.argv[1:])

    def mfu(r):
        return "n/a" if r["mfu"] is None else f"{r['mfu']:.1%}"

    section = "\n".join([
        f"## {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}: {args.model}, seq {args.max_seq_length}, {device}",
        "", f"`{cmd}` (torch {torch.__version__}, flash-attn {'yes' if flash else 'no'}, "
            f"{args.examples} examples, mean length {mean_len:.0f})", "",
        "| run | rows x batch | tokens/s/device | MFU |", "|---|---|---|---|",
        f"| baseline: HF Trainer, padded batches, SDPA | {baseline['rows']} x {baseline['batch']} | {baseline['tokens_per_second']:,.0f} | {mfu(baseline)} |",
        f"| ours: packed rows, {'flash-attn varlen' if flash else 'SDPA block-causal'} | {ours['rows']} x 1 | {ours['tokens_per_second']:,.0f} | {mfu(ours)} |",
        "", f"Speed-up: **{speedup:.2f}x**.", "", "",
    ])
    path = Path(args.results)
    if not path.exists():
        path.write_text("# Training throughput\n\nAppended by `benchmarks/train_throughput.py`; newest last.\n\n")
    with open(path, "a") as f:
        f.write(section)


if __name__ == "__main__":
    main()
