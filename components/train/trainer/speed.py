"""The trainer's kernels, chosen from what this machine has: the attention implementation (with the collator it
needs), the MoE experts' implementation and Liger kernels.

One code path serves a GPU image (flash-attn built for sm_90, liger-kernel when installed) and a CPU laptop (SDPA,
plain PyTorch). What each is worth on a GPU is measured one at a time by benchmarks/train_throughput.py
(``--attn``, ``--liger``); that each keeps the loss is tested in tests/test_gpu_speed.py.
"""

from __future__ import annotations

import logging
import os

import torch

from components.distributed import global_rank
from components.models.batches import pad_collator
from components.train.trainer import varlen
from components.train.trainer.varlen import VARLEN_ATTN

log = logging.getLogger("sft.speed")
_said: set[str] = set()


def _once(key: str, message: str, *args, warning: bool = False) -> None:
    """Log ``message`` the first time ``key`` comes up in this process, from rank 0 only."""
    if key in _said:
        return
    _said.add(key)
    if global_rank() == 0:
        (log.warning if warning else log.info)(message, *args)


def attn_implementation(requested: str = "auto", model_type: str | None = None) -> str:
    """The attention implementation to load a ``model_type`` model with, for the ``attn_implementation`` setting.

    ``auto``: ``flash_attention_2`` when CUDA is present and flash-attn imports; else ``varlen_attn`` (PyTorch's own
    variable-length flash kernel, varlen.py) for the model types in ``varlen.MEASURED_MODEL_TYPES`` where this torch
    has it and CUDA is present; else ``sdpa``. varlen_attn joined auto after a GPU showed it keeps SDPA's loss and
    gradients (tests/train/trainer/test_gpu_speed.py) and is faster (an H200, 2026-11-29: Qwen3-30B-A3B's whole model
    projected 6,212 -> 7,849 tokens/s per GPU, benchmarks/results/moe-layer-bench.md); other model types (sliding
    windows, soft-capping) keep SDPA until one is measured. Packed rows carry ``position_ids`` and no attention mask:
    flash-attention and ``varlen_attn`` then run each row's documents alone (no masked-out work); SDPA gets the
    block-causal mask transformers builds from where the positions restart and computes the whole row's square; all
    three score a packed row as its documents one by one. A flash-attn that is installed but does not import (built
    against another torch or CUDA) is passed over with a warning, where naming it to transformers would fail the run
    at model load. A named implementation is taken as it is, with one error where this machine cannot run it.
    """
    chosen = _choose(requested, model_type)
    _once(f"attn:{chosen}", "attention: %s (attn_implementation %s)", chosen, requested)
    return chosen


def _choose(requested: str, model_type: str | None) -> str:
    if requested == VARLEN_ATTN:
        if not varlen.available():
            raise ValueError(
                f"attn_implementation {VARLEN_ATTN}: needs CUDA and PyTorch 2.10+ (torch.nn.attention.varlen); "
                f"this machine has torch {torch.__version__}, CUDA {torch.cuda.is_available()}: use auto"
            )
        return varlen.register()
    if requested == "flash_attention_2" and _flash_attn() is None:
        raise ValueError("attn_implementation flash_attention_2: flash-attn does not import here; use auto")
    if requested != "auto":
        return requested
    if flash := _flash_attn():
        return flash
    if model_type in varlen.MEASURED_MODEL_TYPES and varlen.available():
        return varlen.register()
    return "sdpa"


def _flash_attn() -> str | None:
    """``flash_attention_2`` when CUDA is present and flash-attn imports, else None (a broken install warned once)."""
    if not torch.cuda.is_available():
        return None
    try:
        # Lazy and optional: flash-attn exists only in the GPU image (built against its CUDA), never on a laptop.
        import flash_attn  # noqa: F401
    except ImportError as exc:
        if not (isinstance(exc, ModuleNotFoundError) and exc.name == "flash_attn"):
            _once("flash_attn", "flash-attn is installed but does not import (%s); it is not used", exc, warning=True)
        return None
    return "flash_attention_2"


def packed_collator(pad_token_id: int, attn_implementation: str):
    """``batches.pad_collator``, plus what flash-attention needs to keep a micro-batch's documents apart.

    transformers finds the documents of packed rows from ``position_ids`` for flash-attention only in a batch of
    one row (``_is_packed_sequence``: batch_size == 1, re-checked with a device sync in every layer); a batch of
    several packed rows would be attended causally over each whole row, one document into the next, and train
    on a wrong loss without an error. Under ``flash_attention_2`` and ``varlen_attn`` the micro-batch's packed rows
    are therefore laid end to end as one row (``position_ids`` restart at every document, so the documents stay the
    same) and the varlen boundaries are passed along (``cu_seq_lens_q/k``, ``max_length_q/k``), as transformers'
    ``DataCollatorWithFlattening`` does. SDPA builds a block mask per row and gets the batch as it is (one row of
    b x s tokens would cost it a b x s square mask). Unpacked rows, with their attention mask, are never changed.
    """
    collate = pad_collator(pad_token_id)
    if attn_implementation not in ("flash_attention_2", VARLEN_ATTN):
        return collate

    def flatten(rows):
        batch = collate(rows)
        if "position_ids" not in batch:
            return batch
        flat = {k: v.reshape(1, -1) for k, v in batch.items()}
        starts = torch.nonzero(flat["position_ids"][0] == 0).flatten()
        bounds = torch.cat([starts, torch.tensor([flat["position_ids"].shape[1]])]).to(torch.int32)
        longest = int((bounds[1:] - bounds[:-1]).max())
        return {
            **flat,
            "cu_seq_lens_q": bounds,
            "cu_seq_lens_k": bounds,
            "max_length_q": longest,
            "max_length_k": longest,
        }

    return flatten


def apply_liger_kernels(model_type: str, fused_loss: bool = True, *, layers: bool = True, moe_experts: bool = False):
    """Patch transformers' Qwen3 or Qwen3-MoE modelling with Liger's Triton kernels; return whether it did.

    ``layers`` (the ``liger_kernels`` setting): RoPE, RMSNorm, SwiGLU of dense Qwen3 and the causal-LM loss, which
    becomes Liger's fused linear cross-entropy: it computes the loss chunk by chunk from the hidden states and never
    holds the (tokens x vocabulary) fp32 logits, the tensor that ran out of memory at 4 rows of 4096 tokens with
    Qwen3's 151,936-token vocabulary on an H100 (../shared/gpu-checks). ``moe_experts`` (``moe_experts_implementation
    liger``): Qwen3-MoE's experts become Liger's fused MoE (``LigerExperts``); ``liger_kernels`` alone leaves a MoE
    model's experts to ``moe_experts_implementation``, one setting for one module. Liger's fused MoE autotunes about
    200 configurations on its first call unless ``LIGER_FUSED_MOE_AUTOTUNE=0`` (Liger-Kernel PR #1248): the trainer
    sets that default: with Liger's MoE a step never finished in 120 s on an H100 (issue 37), most likely that
    autotuning (not yet measured without it). Call it before the model is built or loaded: it replaces classes and
    ``forward`` in transformers' modules, for every model of that type this process builds afterwards.

    A no-op returning False (logged once) without CUDA, without the ``liger_kernel`` package, or for another
    ``model_type``. ``fused_loss=False`` keeps the model's own loss: under DeepSpeed ZeRO-3 the fused loss reads
    ``lm_head.weight`` outside the module's forward, where ZeRO-3 has not gathered it (Liger-Kernel issue #1048);
    there the trainer's ``chunked_cross_entropy`` (chunked_loss.py) keeps the logits small instead.
    """
    if model_type not in ("qwen3", "qwen3_moe"):
        _once(
            f"liger:{model_type}", "Liger kernels not applied: model type %r is neither qwen3 nor qwen3_moe", model_type
        )
        return False
    if not torch.cuda.is_available():
        _once("liger:cuda", "Liger kernels not applied: no CUDA device (they are Triton GPU kernels)")
        return False
    moe_experts = moe_experts and model_type == "qwen3_moe"
    if moe_experts:
        os.environ.setdefault("LIGER_FUSED_MOE_AUTOTUNE", "0")  # read when liger's fused MoE module is imported
    try:
        # Lazy and optional: liger-kernel is installed only where it was asked for, and runs only on CUDA.
        from liger_kernel.transformers import apply_liger_kernel_to_qwen3, apply_liger_kernel_to_qwen3_moe
    except ImportError as exc:
        _once("liger:import", "Liger kernels not applied: liger_kernel does not import (%s)", exc)
        return False
    fused_loss = fused_loss and layers
    if model_type == "qwen3":
        apply_liger_kernel_to_qwen3(
            rope=layers, rms_norm=layers, swiglu=layers, cross_entropy=False, fused_linear_cross_entropy=fused_loss
        )
        kernels = ["RoPE", "RMSNorm", "SwiGLU"] if layers else []
    else:
        apply_liger_kernel_to_qwen3_moe(
            rope=layers, rms_norm=layers, swiglu=moe_experts, cross_entropy=False, fused_linear_cross_entropy=fused_loss
        )
        kernels = (["RoPE", "RMSNorm"] if layers else []) + (["fused MoE experts"] if moe_experts else [])
    kernels += ["fused linear cross-entropy"] if fused_loss else []
    _once(f"liger:applied:{model_type}", "Liger kernels applied to %s: %s", model_type, ", ".join(kernels))
    return True


# transformers' experts implementations (transformers/integrations/moe.py, ExpertsInterface) plus the one the trainer
# registers: its grouped_mm function compiled regionally.
COMPILED_EXPERTS = "grouped_mm_compiled"
LIGER_EXPERTS = "liger"  # not transformers': Liger replaces the experts' module (apply_liger_kernels)


def experts_implementation(name: str) -> str:
    """The ``experts_implementation`` to load a MoE model with, for the ``moe_experts_implementation`` setting.

    ``grouped_mm_compiled`` registers transformers' own ``grouped_mm_experts_forward`` under ``torch.compile`` in
    its ExpertsInterface first. Measured on one H100 (benchmarks/results/moe-layer-bench.md): transformers' MoE
    block routes, permutes, applies SwiGLU, weights and scatters with many small unfused kernels (elementwise work
    was ~31% of a raw layer's CUDA time against ~19% for the three grouped GEMMs); Inductor fuses them. The region
    is the experts' function alone, not the module call: DeepSpeed ZeRO-3 gathers the MoE block's parameters in
    hooks around the block (a leaf module), which stay outside the compiled code, as torchtitan compiles the
    inner blocks under FSDP. Token counts are fixed per micro-batch (packed rows), so it compiles once; the
    closing evaluation's other row count compiles once more. Inductor compiles ``grouped_mm`` only in bf16, so an
    fp32 run (a CPU) takes transformers' fallback kernel in the same compiled code.
    """
    if name == LIGER_EXPERTS:
        return "grouped_mm"  # what any Qwen3-MoE experts module left unpatched runs (none, after Liger's patch)
    if name != COMPILED_EXPERTS:
        return name
    from transformers.integrations.moe import ExpertsInterface, grouped_mm_experts_forward

    if COMPILED_EXPERTS not in ExpertsInterface._global_mapping:
        ExpertsInterface.register(COMPILED_EXPERTS, torch.compile(grouped_mm_experts_forward, dynamic=False))
        _once("experts:compiled", "MoE experts: transformers' grouped_mm function under torch.compile")
    return COMPILED_EXPERTS
