"""Prepared datasets kept under a fingerprint of their inputs, so an unchanged run reuses its result.

The fingerprint covers the sources (file paths with size and mtime, or a pinned Hub revision), the
tokenizer (vocabulary, special tokens, chat template) and every option that changes the output. A cached
result is a finished output folder; it is copied by hard links, so on the data volume reuse copies no data.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path

from components.data import sources

# Bump when the output for the same inputs changes, so cached results are not reused.
CACHE_VERSION = "2"


def fingerprint(resolved: list, tokenizer, options: dict) -> str | None:
    """A key for sources + tokenizer + template + options; ``None`` when a source cannot be pinned."""
    ids = [sources.identity(r) for r in resolved]
    if any(i is None for i in ids):
        return None
    h = hashlib.sha256()
    h.update(json.dumps([CACHE_VERSION, ids, options], sort_keys=True, default=str).encode())
    h.update(tokenizer_digest(tokenizer).encode())
    return h.hexdigest()


def tokenizer_digest(tokenizer) -> str:
    """The tokenizer's vocabulary, chat template and special tokens, hashed; kept on the tokenizer object, since a
    sharded preparation keys every shard with it (serializing a 150k-token vocabulary takes a quarter second)."""
    cached = getattr(tokenizer, "_prepared_digest", None)
    state = (tokenizer.chat_template, json.dumps(tokenizer.special_tokens_map, sort_keys=True, default=str))
    if cached is not None and cached[0] == state:
        return cached[1]
    h = hashlib.sha256()
    vocabulary = tokenizer.backend_tokenizer.to_str() if tokenizer.is_fast else repr(tokenizer.get_vocab())
    h.update(vocabulary.encode())
    h.update((tokenizer.chat_template or "").encode())
    h.update(state[1].encode())
    tokenizer._prepared_digest = (state, h.hexdigest())
    return h.hexdigest()


def reuse(cache_dir: str, key: str, dest: Path) -> dict | None:
    """Fill the empty folder ``dest`` with the result kept under ``key`` and return its stats; None if none is kept."""
    cached = Path(cache_dir) / key
    if not (cached / "stats.json").exists():
        return None
    shutil.rmtree(dest)  # copytree makes it
    _link_tree(cached, dest)
    return json.loads((dest / "stats.json").read_text())


def keep(cache_dir: str, key: str, src: Path) -> None:
    """Keep the finished folder ``src`` under ``key`` unless something is kept there already.

    Linked into a staging folder first and renamed into place, so a reader never sees half a result.
    """
    cached = Path(cache_dir) / key
    if cached.exists():
        return
    os.makedirs(cache_dir, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{key}-", dir=cache_dir))
    shutil.rmtree(staging)
    _link_tree(src, staging)
    os.rename(staging, cached)


def _link_tree(src: Path, dst: Path) -> None:
    """Copy a finished dataset folder by hard links where the filesystem allows (same volume: no data copied)."""

    def link(a, b):
        try:
            os.link(a, b)
        except OSError:
            shutil.copy2(a, b)

    shutil.copytree(src, dst, copy_function=link)
