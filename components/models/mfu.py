"""Model FLOPs utilisation (MFU), with causal attention counted per document.

    MFU = real (non-pad) tokens/s per GPU x training FLOPs per token / the GPU's peak dense bf16 FLOP/s

Training FLOPs per token, after PaLM (Chowdhery et al. 2022, "PaLM: Scaling Language Modeling with Pathways",
appendix B), whose formula is 6N + 12 L H Q T:

    flops_per_token = 6 N + 12 L d T

- N: the parameters one token is multiplied by (``ModelShape.active``: the routed experts only for MoE, the
  output head included, the embedding lookup not); 6N = the matmuls' forward (2N) and backward (4N) FLOPs.
- 12 L d T: attention's two matmuls (scores Q K^T and the weighted sum A V), 2 d FLOPs each per (query, key)
  pair in each of the L layers (d = H Q = heads x head_dim), x 3 for forward + backward; T = the keys each
  query attends to.

PaLM's appendix takes T = the sequence length: every query against every key, the full T x T matrix. A causal
LM's query at position p of its document attends to p + 1 keys, and in a packed row (several documents, each
restarting ``position_ids`` at 0) attention is block-causal, so a query never sees another document. T is
therefore the mean, over real tokens, of the keys each one attends to:

    T = sum_i n_i (n_i + 1) / 2 / sum_i n_i        (n_i: the lengths of the real documents; pad tails excluded)

which is (s + 1) / 2 for one causal document filling a row of s tokens (half of PaLM's count) and far less for
rows packed with short documents. ``attention_length`` measures it on a prepared dataset. Counting T = s for
packed rows overstated MFU: on one H100 (Qwen3-1.7B shape, rows of 4096, ../shared/gpu-checks) 19.5% by the
whole-row count against 15.9% per document, for the same 14,687 tokens/s.

Only useful FLOPs count: work a kernel spends on masked-out blocks (SDPA with the dense block-causal mask) or
on pad tokens is not added, so a faster attention kernel raises MFU through the time alone. Recomputation
(activation checkpointing) is hardware work, not model work: ``recompute_flops_per_token`` counts it apart, for
the plan's compute time; MFU never includes it. ``model_flops_per_token`` is the one count the plan, the trainer's
logged MFU and the benchmarks use (Qwen3-30B-A3B at 4096 tokens: 23.08 GFLOP per token, NVIDIA NeMo AutoModel's
published 23.0 within 0.4%; tests/models/test_mfu.py).
"""

from __future__ import annotations

import numpy as np

# torch (peak_flops) and pyarrow (document_lengths) are imported inside the two functions that need them: the FLOPs
# arithmetic is shared with processes that have neither loaded nor need them (benchmarks' parent process, planning).

IGNORE_INDEX = -100
# Rows read to measure a dataset's documents: evenly spaced, so ~8M tokens at 4096 per row (the mean is then
# exact to well under 1%) and a few seconds on every rank, whatever the dataset's size.
SAMPLE_ROWS = 2048
# Dense bf16 peak FLOP/s per GPU, from the vendors' data sheets (no sparsity). Matched in this order against
# the device name: the H100 PCIe and NVL are named "NVIDIA H100 PCIe" / "NVIDIA H100 NVL", the SXM one
# "NVIDIA H100 80GB HBM3".
PEAK_BF16_FLOPS = {
    "H200": 989e12,
    "H100 PCIe": 756e12,
    "H100 NVL": 835e12,
    "H100": 989e12,
    "A100": 312e12,
    "L40S": 362e12,
    "A10G": 70e12,
}


def peak_flops() -> float | None:
    """Peak bf16 FLOP/s of this process's GPU, or None (CPU, unknown GPU): MFU is then not reported."""
    import torch

    if not torch.cuda.is_available():
        return None
    name = torch.cuda.get_device_name()
    return next((flops for key, flops in PEAK_BF16_FLOPS.items() if key in name), None)


def flops_per_token(active_params: int, layers: int, q_dim: int, attention_length: float) -> float:
    """Training FLOPs per token: 6 N + 12 L d T (module docstring; PaLM appendix B).

    ``attention_length`` is T, the mean keys a token attends to: ``attention_length(dataset)`` for causal
    attention per document; the row length gives PaLM's whole-row (non-causal) count.
    """
    return 6 * active_params + 12 * layers * q_dim * attention_length


def model_flops_per_token(shape, attention_length: float) -> float:
    """Model FLOPs per trained token of a decoder (``components.models.shape.ModelShape``): 6 N + 12 L d T with
    N = ``shape.active``, the embedding lookup 0 and the output head a matmul; no recomputation."""
    return flops_per_token(shape.active, shape.layers, shape.q_dim, attention_length)


def recompute_flops_per_token(shape, attention_length: float, fraction: float = 1.0) -> float:
    """Hardware FLOPs that activation recomputation adds per token: the forward of the recomputed decoder layers
    again (2 N_layers + 4 L d T), for ``fraction`` of the layers. The output head and the final norm run outside
    the checkpointed layers and are not recomputed."""
    head = shape.vocab * shape.hidden + shape.hidden  # the lm_head's matmul (or the tied embedding's) and final norm
    return fraction * (2 * (shape.active - head) + 4 * shape.layers * shape.q_dim * attention_length)


def causal_attention_length(document_lengths) -> float:
    """T for causal attention within documents of these lengths: sum n (n + 1) / 2 / sum n."""
    n = np.asarray(document_lengths, dtype=np.float64)
    if not n.size or n.sum() == 0:
        raise ValueError("no documents to measure")
    return float((n * (n + 1) / 2).sum() / n.sum())


def document_lengths(split, max_rows: int = SAMPLE_ROWS) -> np.ndarray:
    """The lengths of the real documents in a prepared split (``datasets.Dataset``), over up to ``max_rows`` rows.

    Packed rows (a ``position_ids`` column): a document starts wherever ``position_ids`` is 0. The pad tail of
    a row restarts at 0 too and is told apart by its labels, all -100: every example prepare_dataset keeps has
    at least one label token. Unpacked rows (no ``position_ids``): each row is one document.
    """
    import pyarrow.compute as pc

    if len(split) > max_rows:
        split = split.select(np.linspace(0, len(split) - 1, max_rows).round().astype(np.int64))
    packed = "position_ids" in split.column_names
    columns = ["position_ids", "labels"] if packed else ["input_ids"]
    out = []
    for batch in split.select_columns(columns).with_format("arrow").iter(batch_size=256):
        if not packed:
            out.append(pc.list_value_length(batch["input_ids"]).to_numpy())
            continue
        positions = pc.list_flatten(batch["position_ids"]).to_numpy()
        scored = pc.list_flatten(batch["labels"]).to_numpy() != IGNORE_INDEX
        starts = np.flatnonzero(positions == 0)  # every row starts a document, so rows never merge
        lengths = np.diff(np.append(starts, len(positions)))
        out.append(lengths[np.add.reduceat(scored, starts) > 0])
    return np.concatenate(out) if out else np.zeros(0, dtype=np.int64)


def attention_length(split, max_rows: int = SAMPLE_ROWS) -> float:
    """T of ``flops_per_token`` for a prepared split: the mean keys a real token attends to, causal per document."""
    return causal_attention_length(document_lengths(split, max_rows))
