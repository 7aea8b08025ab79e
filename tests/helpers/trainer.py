"""A tiny Qwen3 base model and a packed dataset in the prepared-dataset contract, for the trainer tests."""

import json
import random
from pathlib import Path
from typing import Any

from components.models.tiny import build_model, build_tokenizer
from components.settings import Settings, TrainerSettings, trainer_fields
from components.train.config import build_trainer_config, write_trainer_config

WORDS = ["apple", "river", "cloud", "stone", "music", "green", "paper", "light"]


def make_workdir(root: Path, rows: int = 96, max_seq_length: int = 128) -> Path:
    """``root/base`` (model + tokenizer) and ``root/data`` (packed train/eval splits); returns ``root``."""
    from datasets import Dataset, DatasetDict

    convs = [
        [{"role": "user", "content": f"Repeat {w} twice. (#{i})"}, {"role": "assistant", "content": f"{w} {w}. Done."}]
        for i, w in enumerate(WORDS * (rows // len(WORDS)))
    ]
    corpus = root / "chat.jsonl"
    corpus.write_text("\n".join(json.dumps({"messages": c}) for c in convs))
    tok = build_tokenizer(corpus)
    build_model(tok).save_pretrained(root / "base")
    tok.save_pretrained(root / "base")

    def example(conv):
        prompt = tok.apply_chat_template(conv[:1], tokenize=True, add_generation_prompt=True, return_dict=False)
        full = tok.apply_chat_template(conv, tokenize=True, return_dict=False)
        return full, [-100] * len(prompt) + full[len(prompt) :]

    def pack(examples):
        packed, row = [], {"input_ids": [], "labels": [], "position_ids": []}
        for ids, labels in examples:
            if len(row["input_ids"]) + len(ids) > max_seq_length:
                packed.append(row)
                row = {"input_ids": [], "labels": [], "position_ids": []}
            row["input_ids"] += ids
            row["labels"] += labels
            row["position_ids"] += list(range(len(ids)))
        packed.append(row)
        for r in packed:
            tail = max_seq_length - len(r["input_ids"])
            r["input_ids"] += [tok.pad_token_id] * tail
            r["labels"] += [-100] * tail
            r["position_ids"] += list(range(tail))
        return Dataset.from_list(packed)

    examples = [example(c) for c in convs]
    random.Random(0).shuffle(examples)
    DatasetDict(train=pack(examples[16:]), eval=pack(examples[:16])).save_to_disk(str(root / "data"))
    return root


# What the trainer configs of these tests set besides the run's sizes: the CPU run's own choices (the local-tiny
# preset's): a progress line every 5 steps, no activation recomputation (a tiny model's activations fit anywhere).
CPU_TEST_SETTINGS: dict[str, Any] = dict(logging_steps=5, activation_checkpointing=False)


def trainer_settings(**settings) -> TrainerSettings:
    """The trainer settings ``build_trainer_config`` takes, from settings by name (defaults else)."""
    return Settings().trainer().replace(**settings)


def setting_names() -> set[str]:
    """Every setting the trainer config is written from (the model, compute, train and preference groups)."""
    return set(trainer_fields())


def trainer_config(root: Path, name: str, **over) -> str:
    """Write a CPU trainer config for ``root``'s model and data (output in ``root/<name>``); return its path."""
    cfg = build_trainer_config(
        trainer_settings(
            model_name_or_path=str(root / "base"),
            method="full",
            max_seq_length=128,
            per_device_train_batch_size=2,
            gradient_accumulation_steps=1,
            learning_rate=3e-3,
            num_train_epochs=4,
            max_steps=-1,
            warmup_ratio=0.05,
            seed=0,
            deepspeed_config="none",
            **CPU_TEST_SETTINGS,
        ),
        dataset_path=str(root / "data"),
        output_dir=str(root / name),
        use_cpu=True,
        model_cache_dir=str(root / "cache"),
    )
    cfg.update(over)
    return write_trainer_config(cfg, str(root / "cfg" / f"{name}.json"))
