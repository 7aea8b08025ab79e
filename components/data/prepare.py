"""Tokenize chat data for supervised fine-tuning; the data step outside KFP.

    python -m components.data.prepare --source builtin:sample --tokenizer PATH_OR_ID --out DIR

Reads OpenAI-style ``messages`` conversations (JSONL files or a Hugging Face Hub dataset), renders
each with the model's chat template, and labels only assistant tokens (everything else is -100, so
the loss and the evaluation cover what the model is asked to produce). Splits train/eval by a seeded
hash of each conversation, so the split is stable across runs and machines. Writes a ``datasets``
DatasetDict with ``save_to_disk`` plus ``stats.json``, into a temporary folder renamed into place
only when complete.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import os
import shutil
import sys
import tempfile
import time
import unicodedata
from pathlib import Path

log = logging.getLogger("prepare_dataset")

BUILTIN_SAMPLE = "builtin:sample"
SAMPLE_PATH = Path(__file__).with_name("sample") / "instructions.jsonl"
ROLES = {"system", "user", "assistant"}
IGNORE_INDEX = -100


class DataError(ValueError):
    """The data cannot be prepared; the message names the file/line/field and the fix."""


def load_conversations(source: str) -> list[list[dict]]:
    """Load ``messages`` conversations from the bundled sample, a JSONL file, or a Hub dataset id."""
    if source == BUILTIN_SAMPLE:
        return _read_jsonl(SAMPLE_PATH)
    if os.path.exists(source):
        return _read_jsonl(Path(source))
    if source.startswith(("/", ".", "pvc://")) or source.endswith((".jsonl", ".json")):
        raise DataError(f"dataset_source {source!r}: no such file; pass an existing JSONL path or a Hub dataset id")
    import datasets  # Hub datasets on the cluster path only: nothing is downloaded locally

    ds = datasets.load_dataset(source, split="train")
    if "messages" not in ds.column_names:
        raise DataError(
            f"dataset_source {source!r} has columns {ds.column_names}; expected a 'messages' column "
            "(list of {role, content})"
        )
    return [_check_messages(row["messages"], f"{source} row {i}") for i, row in enumerate(ds)]


def _read_jsonl(path: Path) -> list[list[dict]]:
    rows = []
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as e:
                raise DataError(f"{path}:{lineno}: not valid JSON ({e.msg}); fix or remove the line") from None
            if "messages" not in record:
                raise DataError(
                    f"{path}:{lineno}: no 'messages' field (found {sorted(record)}); "
                    "each line must be {\"messages\": [{\"role\": ..., \"content\": ...}]}"
                )
            rows.append(_check_messages(record["messages"], f"{path}:{lineno}"))
    if not rows:
        raise DataError(f"{path}: the dataset is empty; add at least one conversation")
    return rows


def _check_messages(messages, where: str) -> list[dict]:
    out = []
    for m in messages:
        role = m.get("role")
        if role not in ROLES:
            raise DataError(f"{where}: unknown role {role!r}; use one of {sorted(ROLES)}")
        # Hangul often arrives decomposed (NFD); normalise so equal text gives equal tokens.
        out.append({"role": role, "content": unicodedata.normalize("NFC", str(m.get("content", "")))})
    if not any(m["role"] == "assistant" for m in out):
        raise DataError(f"{where}: no assistant turn; there is nothing to learn from this conversation")
    return out


def tokenize_conversation(tokenizer, messages: list[dict]) -> tuple[list[int], list[int]]:
    """Token ids of the rendered conversation and labels that keep only assistant tokens.

    Each assistant turn's span is found by rendering the conversation up to the turn's generation
    prompt and up to the turn's end: the tokens in between are the assistant's (content and the
    end-of-turn token, which the model must learn to emit).
    """
    ids = tokenizer.apply_chat_template(messages, tokenize=True, return_dict=False)
    labels = [IGNORE_INDEX] * len(ids)
    for i, m in enumerate(messages):
        if m["role"] != "assistant":
            continue
        start = len(tokenizer.apply_chat_template(messages[:i], tokenize=True, add_generation_prompt=True, return_dict=False))
        end = len(tokenizer.apply_chat_template(messages[: i + 1], tokenize=True, return_dict=False))
        labels[start:end] = ids[start:end]
    return list(ids), labels


def _split_key(messages: list[dict], seed: int) -> float:
    digest = hashlib.sha256(f"{seed}\x00{json.dumps(messages, ensure_ascii=False)}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64


def prepare(
    source: str,
    tokenizer: str,
    out_dir: str,
    max_seq_length: int = 2048,
    eval_size: float = 0.05,
    seed: int = 42,
) -> dict:
    """Prepare ``source`` with ``tokenizer`` into ``out_dir``; return the stats written to stats.json.

    Args:
        source: ``builtin:sample``, a JSONL path, or a Hugging Face Hub dataset id.
        tokenizer: a tokenizer folder or Hub id; it must carry a chat template.
        out_dir: where the DatasetDict (train, eval) and stats.json go; replaced only when complete.
        max_seq_length: longer conversations are dropped (counted in stats).
        eval_size: a fraction (< 1) or a number of conversations (>= 1) held out for evaluation.
        seed: seeds the train/eval split.
    """
    import datasets
    from transformers import AutoTokenizer

    started = time.time()
    tok = AutoTokenizer.from_pretrained(tokenizer)
    if not tok.chat_template:
        raise DataError(f"tokenizer {tokenizer!r} has no chat template; use the model's instruct tokenizer")
    conversations = load_conversations(source)
    n_eval = int(round(eval_size * len(conversations))) if eval_size < 1 else int(eval_size)
    if not 0 < n_eval < len(conversations):
        raise DataError(
            f"eval_size {eval_size} gives {n_eval} eval conversations out of {len(conversations)}; "
            "it must leave at least one for each split"
        )
    keyed = sorted(conversations, key=lambda m: _split_key(m, seed))
    splits = {"eval": keyed[:n_eval], "train": keyed[n_eval:]}

    stats = {"source": source, "conversations": len(conversations), "max_seq_length": max_seq_length}
    columns = {}
    for split, convs in splits.items():
        rows = {"input_ids": [], "labels": []}
        dropped = 0
        for messages in convs:
            ids, labels = tokenize_conversation(tok, messages)
            if len(ids) > max_seq_length:
                dropped += 1
                continue
            rows["input_ids"].append(ids)
            rows["labels"].append(labels)
        if not rows["input_ids"]:
            raise DataError(
                f"every {split} conversation is longer than max_seq_length={max_seq_length} tokens; raise max_seq_length"
            )
        columns[split] = rows
        stats[split] = {
            "rows": len(rows["input_ids"]),
            "dropped_over_length": dropped,
            "tokens": sum(map(len, rows["input_ids"])),
            "label_tokens": sum(sum(1 for x in r if x != IGNORE_INDEX) for r in rows["labels"]),
        }
    ds = datasets.DatasetDict({k: datasets.Dataset.from_dict(v) for k, v in columns.items()})
    stats["seconds"] = round(time.time() - started, 2)

    out = Path(out_dir)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}-", dir=out.parent))
    try:
        ds.save_to_disk(str(tmp))
        (tmp / "stats.json").write_text(json.dumps(stats, indent=2))
        if out.exists():
            shutil.rmtree(out)
        os.rename(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    log.info(
        "prepared %d train / %d eval conversations (%d train tokens) in %.1fs -> %s",
        stats["train"]["rows"], stats["eval"]["rows"], stats["train"]["tokens"], stats["seconds"], out,
    )
    return stats


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point: the same code the KFP component runs."""
    p = argparse.ArgumentParser(prog="python -m components.data.prepare", description=__doc__.split("\n")[0])
    p.add_argument("--source", required=True, help="builtin:sample, a JSONL file, or a Hub dataset id")
    p.add_argument("--tokenizer", required=True, help="tokenizer folder or Hub id (builtin:tiny-qwen3 works)")
    p.add_argument("--out", required=True, help="output folder (replaced only when complete)")
    p.add_argument("--max-seq-length", type=int, default=2048)
    p.add_argument("--eval-size", type=float, default=0.05, help="fraction (<1) or count (>=1)")
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--cache-dir", default=os.path.expanduser("~/.cache/llm-post-training"),
                   help="where built-in models are built")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    from components.models.tiny import resolve_model

    try:
        stats = prepare(args.source, resolve_model(args.tokenizer, args.cache_dir), args.out,
                        args.max_seq_length, args.eval_size, args.seed)
    except DataError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(json.dumps(stats, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
