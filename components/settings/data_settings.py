"""The data step's settings."""

from __future__ import annotations

from dataclasses import dataclass

from components.settings.declare import setting


@dataclass
class DataSettings:
    """The data step (prepare_dataset); it also reads the model's tokenizer, max_seq_length and seed."""

    dataset_source: str = setting(
        "builtin:sample",
        "Training data, comma-separated: builtin:sample, files/folders/globs (JSONL, JSON, Parquet, CSV, saved Arrow) "
        "on a mounted volume, pvc://claim/path, hf://... or Hub ids (org/name?config=C&split=S&revision=R).",
    )
    dataset_format: str = setting(
        "auto",
        "Row format: auto (detected from the columns), messages, sharegpt, alpaca, prompt_completion or text "
        "(preference, prompt/chosen/rejected pairs, is the dpo and rm stages' format: those go in "
        "dpo_dataset_source; prompts, a prompt and an optional answer, the grpo stage's: grpo_dataset_source).",
        # The data step's format vocabulary (components/data/formats.py; a test holds it to these).
        choices=("auto", "messages", "sharegpt", "alpaca", "prompt_completion", "text", "preference", "prompts"),
    )
    column_mapping: dict = setting({}, 'The format\'s column name -> your column name, e.g. {"messages": "dialog"}.')
    eval_source: str = setting(
        "", "Take the eval split from this source (same syntax) instead of holding out eval_size; empty: hold out."
    )
    over_length: str = setting(
        "drop",
        "What happens to examples longer than max_seq_length: drop or truncate (the cpt stage's documents are cut "
        "into max_seq_length chunks instead: cpt_chunk_overlap).",
        choices=("drop", "truncate"),
    )
    cpt_chunk_overlap: int = setting(
        0,
        "cpt stage: tokens each max_seq_length chunk of a long document repeats from the end of the chunk before it, "
        "as context only (labels -100: every token is learned once); below max_seq_length.",
        plain=False,
        min=0,
    )
    near_dedup_threshold: float = setting(
        0.0,
        "Drop rows whose estimated Jaccard similarity (MinHash LSH over word 5-grams) to an earlier row is at least "
        "this, in (0, 1], e.g. 0.8; 0: off (exact duplicates are always dropped).",
        plain=False,
        min=0,
        max=1,
    )
    packing: bool = setting(
        True,
        "Pack examples into rows of exactly max_seq_length (position_ids restart per "
        "example); false: one example per row, padded per batch.",
    )
    num_proc: int = setting(
        0, "Tokenizer worker processes in each data step's pod; 0: one per CPU the pod may use (data_cpu).", min=0
    )
    data_shards: int = setting(
        1,
        "Pods that tokenize the sft and cpt data at once (a ParallelFor, each a slice of the input files), before "
        "the data step joins their shards, drops duplicates across them and packs; 1: the data step alone. Shards "
        "are kept by fingerprint: a retry skips the complete ones.",
        min=1,
        max=256,
    )
    data_cpu: str = setting("8", "CPU request of each data step's pod (and each shard's): a Kubernetes quantity.")
    data_memory: str = setting("32Gi", "Memory request of each data step's pod (and each shard's).")
    filter_min_chars: int = setting(
        0, "Drop rows with fewer characters of text than this (counted in the data report); 0: off.", plain=False, min=0
    )
    filter_max_chars: int = setting(0, "Drop rows with more characters of text than this; 0: off.", plain=False, min=0)
    filter_max_duplicate_line_fraction: float = setting(
        0.0,
        "Drop rows whose lines repeat: the share of lines that are copies of an earlier line above this (Gopher's "
        "0.3); 0: off.",
        plain=False,
        min=0,
        max=1,
    )
    filter_max_top_ngram_fraction: float = setting(
        0.0,
        "Drop rows of 50 words or more where the most frequent word 2-gram covers more than this share of the "
        "words' characters (Gopher's 0.2); 0: off.",
        plain=False,
        min=0,
        max=1,
    )
    filter_min_script_fraction: float = setting(
        0.0,
        "Drop rows where the letters of filter_scripts are less than this share of all letters, e.g. 0.5; 0: off.",
        plain=False,
        min=0,
        max=1,
    )
    filter_scripts: list = setting(
        ["hangul", "latin"],
        "The scripts filter_min_script_fraction counts as the corpus's languages: hangul, latin, han, hiragana, "
        "katakana, cyrillic.",
        plain=False,
        choices=("hangul", "latin", "han", "hiragana", "katakana", "cyrillic"),
    )
    eval_size: float = setting(0.05, "Held-out fraction (< 1) or number of conversations (>= 1).")
    max_bad_rows: int = setting(
        0,
        "Broken rows (not JSON, not UTF-8, an unknown role, a malformed turn) each stage's data step skips, counted "
        "in its report, before it fails the run; 0: the first one fails it.",
        plain=False,
        min=0,
    )
    dataset_tokens_estimate: int = setting(
        100_000_000,
        "The plan's size of the training split in tokens, before prepare_dataset has counted it "
        "(python -m pipelines.run --plan STATS_JSON takes the prepared dataset's own count).",
        plain=False,
        min=1,
    )
