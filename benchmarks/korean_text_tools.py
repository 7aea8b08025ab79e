"""Korean sentence splitting (kss) against the data step's tokenizer, on the same Korean text, one core each: what
sentence-aware chunk boundaries for Korean CPT text would cost the data step (issue 40, seed 001's tools).

    pip install kss==6.0.6      # not a dependency of the package: this measures whether it should be
    python benchmarks/korean_text_tools.py [--chars 400000]

The text is the Korean of the bundled sample (components/data/sample/instructions.jsonl), its paragraphs repeated to
``--chars`` characters. Reported: characters/s of ``kss.split_sentences`` (its default backend, pecab, as installed)
and of the Qwen3 tokenizer the data step uses (its fast Rust tokenizer, one thread), and their ratio.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
os.environ.setdefault("RAYON_NUM_THREADS", "1")  # the tokenizer on one core, as kss runs
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

SAMPLE = Path(__file__).resolve().parents[1] / "components" / "data" / "sample" / "instructions.jsonl"
HANGUL = re.compile(r"[\uac00-\ud7a3]")


def korean_paragraphs() -> list[str]:
    """The sample's texts that are mostly Hangul (at least half of their letters)."""
    out = []
    for line in SAMPLE.read_text(encoding="utf-8").splitlines():
        for message in json.loads(line).get("messages", []):
            text = message.get("content", "")
            letters = [c for c in text if c.isalpha()]
            if letters and len(HANGUL.findall(text)) >= len(letters) / 2:
                out.append(text)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--chars", type=int, default=400_000, help="characters of Korean text to process (default 400k)")
    args = p.parse_args()
    paragraphs = korean_paragraphs()
    text, texts = 0, []
    while text < args.chars:
        for para in paragraphs:
            texts.append(para)
            text += len(para)
    from data_prep import build_qwen3_tokenizer
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(build_qwen3_tokenizer(Path(tempfile.mkdtemp()) / "qwen3"))
    started = time.perf_counter()
    tokens = sum(len(ids) for ids in tokenizer(texts, add_special_tokens=False)["input_ids"])
    tokenize_s = time.perf_counter() - started

    import kss  # installed by hand: see the docstring

    kss.split_sentences(texts[0])  # its backend loads on the first call: not timed
    started = time.perf_counter()
    sentences = sum(len(kss.split_sentences(t)) for t in texts)
    kss_s = time.perf_counter() - started
    result = {
        "korean_chars": text,
        "paragraphs": len(texts),
        "tokenizer_chars_per_s": round(text / tokenize_s),
        "tokenizer_tokens_per_s": round(tokens / tokenize_s),
        "kss_chars_per_s": round(text / kss_s),
        "kss_sentences": sentences,
        "kss_slower_than_tokenizing": round(kss_s / tokenize_s, 1),
    }
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
