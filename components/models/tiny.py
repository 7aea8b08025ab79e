"""The tiny Qwen3 model the local run trains: built offline from a config, never downloaded.

``builtin:tiny-qwen3`` is a Qwen3ForCausalLM (same architecture code path as the real Qwen3 models)
with 4 layers and hidden size 128, and a byte-level BPE tokenizer trained on the bundled sample data
with Qwen's special tokens and chat format. Weights are initialised from a fixed seed, so every build
is identical and evaluation can rebuild the same base model the trainer started from.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import GenerationConfig, PreTrainedTokenizerFast, Qwen3Config

TINY_QWEN3 = "builtin:tiny-qwen3"
# Bump when the recipe changes so cached builds are not reused.
RECIPE_VERSION = "1"
VOCAB_SIZE = 2048
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>", "</think>"]
CHAT_TEMPLATE = Path(__file__).with_name("qwen3_chat_template.jinja")
SAMPLE_DATA = Path(__file__).parents[1] / "data" / "sample" / "instructions.jsonl"


def _corpus(path: Path) -> list[str]:
    texts: list[str] = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            if line.strip():
                texts.extend(m["content"] for m in json.loads(line)["messages"])
    return texts


def build_tokenizer(corpus_path: Path = SAMPLE_DATA):
    """Train a byte-level BPE on the bundled data and wrap it as a Hugging Face fast tokenizer."""
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    bpe.train_from_iterator(_corpus(corpus_path), trainer=trainer)
    tok = PreTrainedTokenizerFast(
        tokenizer_object=bpe,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        additional_special_tokens=SPECIAL_TOKENS[1:2] + SPECIAL_TOKENS[3:],
        model_max_length=2048,
    )
    tok.chat_template = CHAT_TEMPLATE.read_text(encoding="utf-8")
    return tok


def tiny_config(tokenizer):
    """The tiny model's Qwen3Config: 4 layers, hidden size 128, the tokenizer's vocabulary and special ids."""
    return Qwen3Config(
        vocab_size=len(tokenizer),
        hidden_size=128,
        intermediate_size=384,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        max_position_embeddings=2048,
        tie_word_embeddings=True,
        bos_token_id=None,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )


def build_model(tokenizer, seed: int = 0):
    """A freshly initialised 4-layer Qwen3 sized for a CPU laptop run (about 1M parameters)."""
    # Lazy: resolve.py imports this module for every model it resolves, and the data step, which loads only the
    # tokenizer, would pay transformers' modelling import (seconds) for a model it never builds.
    from transformers import Qwen3ForCausalLM

    torch.manual_seed(seed)
    model = Qwen3ForCausalLM(tiny_config(tokenizer))
    model.generation_config = GenerationConfig(
        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id, max_new_tokens=64
    )
    return model


def _cache_key() -> str:
    h = hashlib.sha256(RECIPE_VERSION.encode())
    h.update(SAMPLE_DATA.read_bytes())
    h.update(CHAT_TEMPLATE.read_bytes())
    return h.hexdigest()[:12]


def materialize(cache_root: str) -> str:
    """Build the tiny model and tokenizer into ``<cache_root>/models/tiny-qwen3-<key>`` once; return the path.

    Concurrent callers (two steps, two runs) are safe: each builds in a temporary folder and the first
    rename wins; a folder is only ever seen complete.
    """
    target = Path(cache_root) / "models" / f"tiny-qwen3-{_cache_key()}"
    if (target / "config.json").exists():
        return str(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".tiny-qwen3-", dir=target.parent))
    # mkdtemp makes it 0700: the steps and the trainer pods may run as different users on the volume.
    tmp.chmod(0o755)
    try:
        tokenizer = build_tokenizer()
        model = build_model(tokenizer)
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        try:
            os.rename(tmp, target)
        except OSError:  # another process finished first: its build is identical
            shutil.rmtree(tmp, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return str(target)
