"""How long the data step takes for a corpus, and how data_shards changes it: the ``data:`` line of ``--plan``.

The rates are measured, on the 2-core development machine with Qwen3's real tokenizer:

- reading, cleaning and tokenizing: 250,000 tokens/s per CPU (``benchmarks/results/data_prep.md``, 2026-11-22:
  500,553 tokens/s with ``num_proc=2`` on 2 idle cores, 75M tokens, the whole step; one shard process with one
  worker read and tokenized 55.9M tokens at 329,000 tokens/s: ``benchmarks/results/data_shards.md``); a shard pod
  runs one tokenizer worker per CPU it requests (``num_proc=0``: ``data_cpu``);
- the join (duplicates across shards, the split, packing, writing the dataset): 55.9M tokens in 12.7-15.7 s, its
  start (imports, the tokenizer) included (``benchmarks/results/data_shards.md``): ``JOIN_TOKENS_PER_S``, once, in
  the data step, whatever the shard count.

Bytes on the data claim: 12.3 bytes a token in the shards (``input_ids`` int32, ``labels`` int64, lengths) and 12.0
in the packed dataset (``benchmarks/results/data_shards.md``): ``BYTES_PER_TOKEN`` for each.
"""

from __future__ import annotations

from components.settings import Settings

TOKENIZE_TOKENS_PER_S_PER_CPU = 250_000
JOIN_TOKENS_PER_S = 3_500_000
BYTES_PER_TOKEN = 12.2


def cpus(quantity: str) -> float:
    """A Kubernetes CPU quantity (``"8"``, ``"500m"``, ``"1.5"``) in CPUs; a ValueError naming data_cpu otherwise."""
    try:
        return float(quantity[:-1]) / 1000 if quantity.endswith("m") else float(quantity)
    except ValueError:
        raise ValueError(f"data_cpu={quantity!r}: write a Kubernetes CPU quantity, e.g. 8 or 500m") from None


def data_prep_seconds(tokens: float, shards: int, cpu_per_pod: float, num_proc: int = 0) -> dict:
    """``{"tokenize", "join", "total"}`` seconds to prepare ``tokens`` in ``shards`` pods of ``cpu_per_pod`` CPUs
    (``num_proc`` workers each; 0: one per CPU). With one shard the data step tokenizes and packs alone."""
    workers = max(1.0, min(num_proc, cpu_per_pod) if num_proc else cpu_per_pod)
    tokenize = tokens / (TOKENIZE_TOKENS_PER_S_PER_CPU * workers * shards)
    join = tokens / JOIN_TOKENS_PER_S
    return {"tokenize": tokenize, "join": join, "total": tokenize + join}


def data_prep_text(s: Settings, stats: dict | None = None) -> str:
    """The ``data:`` line of ``--plan``: the data step's wall time for ``dataset_tokens_estimate`` at the run's
    data_shards and data_cpu, the claim space it needs, and what more shards would save when it is long."""
    if stats:
        return "  data:     prepared already (the statistics given): no preparation to plan"
    tokens = float(s.data.dataset_tokens_estimate)
    per_pod = cpus(s.data.data_cpu)
    own = data_prep_seconds(tokens, s.data.data_shards, per_pod, s.data.num_proc)
    line = (
        f"  data:     {tokens / 1e6:,.0f}M tokens (dataset_tokens_estimate) on {s.data.data_shards} pod(s) x "
        f"{per_pod:g} CPUs (data_shards, data_cpu): {_minutes(own['tokenize'])} tokenizing + "
        f"{_minutes(own['join'])} joining and packing = {_minutes(own['total'])} before training; "
        f"{tokens * BYTES_PER_TOKEN * 2 / 1e9:,.0f} GB on the data claim ({s.storage.data_pvc})"
    )
    if own["tokenize"] > 15 * 60:
        shards = min(256, max(2, round(own["tokenize"] / (5 * 60) * s.data.data_shards)))
        more = data_prep_seconds(tokens, shards, per_pod, s.data.num_proc)
        line += f"; -p data_shards={shards}: {_minutes(more['total'])}"
    return line


def _minutes(seconds: float) -> str:
    return f"{seconds / 3600:.1f} h" if seconds >= 3600 else f"{seconds / 60:.0f} min" if seconds >= 60 else "<1 min"
