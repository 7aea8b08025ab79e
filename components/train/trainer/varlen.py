"""Attention over each document of packed rows with PyTorch's own variable-length flash kernel, for GPU images without
the flash-attn package.

transformers runs SDPA over packed rows with a block-causal mask: the kernel then computes every (query, key) pair of
the whole row, the masked-out ones included. Measured on one H100 (benchmarks/results/moe-layer-bench.md, 2026-11-28):
SDPA's cuDNN forward and backward were 31% of the CUDA time of four Qwen3-30B-A3B decoder layers over rows of 4,096
tokens whose documents average 412 causal keys per token, against the 2,048 a whole row has. ``torch.nn.attention.
varlen.varlen_attn`` (PyTorch 2.10+; flash-attention's varlen kernels built into PyTorch, forward and backward) runs
each document alone, as flash-attn's ``flash_attn_varlen_func`` does, with no package beyond torch.

Registered in transformers' AttentionInterface as ``varlen_attn`` (``register``); its mask function is flash
attention's (no mask, or the 2D padding mask), so transformers never builds the square mask. Where the documents come
from, in order: the collator's ``cu_seq_lens_q/k`` (speed.packed_collator flattens a packed micro-batch into one row
and passes them, as transformers' DataCollatorWithFlattening does), else a 2D padding mask (each row's real tokens are
one sequence, padding dropped, as flash-attention unpads), else ``position_ids`` (a document starts where they restart
at 0, and at every row's start), else each row is one sequence.
"""

from __future__ import annotations

import inspect
from typing import NamedTuple

import torch

VARLEN_ATTN = "varlen_attn"
# The model types a GPU has shown varlen_attn keeps SDPA's loss and gradients for (tests/train/trainer/
# test_gpu_speed.py, an H200 on 2026-11-29): attn_implementation auto chooses it for these where flash-attn is absent.
MEASURED_MODEL_TYPES = frozenset({"qwen3", "qwen3_moe"})


class Sequences(NamedTuple):
    """Where the sequences lie in the (batch x length) tokens flattened: ``cu`` the cumulative bounds (int32, one more
    than the sequences), ``longest`` the longest sequence's length, ``keep`` the flat indices of the real tokens
    (None: all of them, no padding)."""

    cu: torch.Tensor
    longest: int
    keep: torch.Tensor | None


def available() -> bool:
    """Whether this torch has ``varlen_attn`` and a CUDA device to run it (its kernels are CUDA only)."""
    try:
        from torch.nn.attention.varlen import varlen_attn  # noqa: F401  (PyTorch 2.10+)
    except ImportError:
        return False
    return torch.cuda.is_available()


def sequences(
    batch: int,
    length: int,
    device: torch.device,
    *,
    attention_mask: torch.Tensor | None = None,
    position_ids: torch.Tensor | None = None,
    cu_seq_lens: torch.Tensor | None = None,
    max_length: int | None = None,
) -> Sequences:
    """The sequences of a (batch x length) block of tokens, from the first of: the collator's bounds, a 2D padding
    mask, ``position_ids`` restarting at 0, the rows themselves (see the module's docstring)."""
    if cu_seq_lens is not None:
        cu = cu_seq_lens.to(device=device, dtype=torch.int32)
        longest = int(max_length) if max_length is not None else int((cu[1:] - cu[:-1]).max())
        return Sequences(cu, longest, None)
    if attention_mask is not None and attention_mask.dim() == 2 and not bool(attention_mask.all()):
        real = attention_mask.to(device=device, dtype=torch.bool)
        counts = real.sum(dim=1, dtype=torch.int32)
        cu = torch.nn.functional.pad(torch.cumsum(counts, 0, dtype=torch.int32), (1, 0))
        keep = torch.nonzero(real.flatten()).flatten()
        return Sequences(cu, int(counts.max()), keep)
    flat = torch.arange(batch * length, device=device)
    starts = flat % length == 0
    if position_ids is not None and position_ids.shape[-1] == length:
        starts |= position_ids.to(device).expand(batch, length).flatten() == 0
    bounds = torch.cat([torch.nonzero(starts).flatten(), flat.new_tensor([batch * length])]).to(torch.int32)
    return Sequences(bounds, int((bounds[1:] - bounds[:-1]).max()), None)


def _causal_kwargs() -> dict:
    """The keyword that makes ``varlen_attn`` causal: ``window_size=(-1, 0)`` where it has one (PyTorch 2.11+),
    ``is_causal=True`` in the first release's signature."""
    from torch.nn.attention.varlen import varlen_attn

    params = inspect.signature(varlen_attn).parameters
    return {"window_size": (-1, 0)} if "window_size" in params else {"is_causal": True}


def varlen_attention_forward(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    **kwargs,
) -> tuple[torch.Tensor, None]:
    """transformers' attention-function signature over ``varlen_attn``: (batch, heads, length, dim) in, (batch,
    length, heads, dim) out, causal within each sequence. Grouped-query heads are passed as they are where
    ``varlen_attn`` takes ``enable_gqa``, else the key and value heads are repeated."""
    from torch.nn.attention.varlen import varlen_attn

    if dropout or kwargs.get("sliding_window"):
        raise ValueError(
            f"{VARLEN_ATTN} runs full causal attention without dropout; this layer asks for dropout {dropout}, "
            f"sliding window {kwargs.get('sliding_window')}: set attn_implementation sdpa"
        )
    batch, heads, length, dim = query.shape
    seqs = sequences(
        batch,
        length,
        query.device,
        attention_mask=attention_mask,
        position_ids=kwargs.get("position_ids"),
        cu_seq_lens=kwargs.get("cu_seq_lens_q"),
        max_length=kwargs.get("max_length_q"),
    )

    def flat(t: torch.Tensor) -> torch.Tensor:  # (b, h, s, d) -> (b*s [real tokens only], h, d)
        t = t.transpose(1, 2).reshape(batch * length, t.shape[1], dim)
        return t if seqs.keep is None else t.index_select(0, seqs.keep)

    extra = _causal_kwargs()
    kv_heads = key.shape[1]
    if kv_heads != heads:
        if "enable_gqa" in inspect.signature(varlen_attn).parameters:
            extra["enable_gqa"] = True
        else:
            key = key.repeat_interleave(heads // kv_heads, dim=1)
            value = value.repeat_interleave(heads // kv_heads, dim=1)
    out = varlen_attn(
        flat(query), flat(key), flat(value), seqs.cu, seqs.cu, seqs.longest, seqs.longest, scale=scaling, **extra
    )
    assert isinstance(out, torch.Tensor)  # a tuple only with return_aux, which is not asked for
    if seqs.keep is not None:
        out = out.new_zeros(batch * length, heads, dim).index_copy(0, seqs.keep, out)
    return out.reshape(batch, length, heads, dim), None


def register() -> str:
    """Register ``varlen_attn`` with transformers' attention and mask interfaces (once per process); its name."""
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, flash_attention_mask

    if VARLEN_ATTN not in AttentionInterface._global_mapping:
        AttentionInterface.register(VARLEN_ATTN, varlen_attention_forward)
        ALL_MASK_ATTENTION_FUNCTIONS.register(VARLEN_ATTN, flash_attention_mask)
    return VARLEN_ATTN
