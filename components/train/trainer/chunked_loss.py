"""The causal-LM loss without the whole (tokens x vocabulary) logits: ``chunked_cross_entropy``.

A Qwen3 forward at 4 rows of 4096 tokens makes 16,384 x 151,936 logits: 5 GB in bf16, 10 GB once the loss upcasts
them to fp32, as much again for their gradient. That tensor, not the layers, is what ran out of memory at 4 rows
on an H100 (docs/memory.md). Here the output head runs on ``CHUNK_TOKENS`` (1,024) tokens at a time inside
``torch.utils.checkpoint``: each chunk's logits live only while its loss is computed, and the backward recomputes
them chunk by chunk. The head is called as a module, so DeepSpeed ZeRO-3 gathers its weight for every call (its
forward hooks) and FSDP2 has it unsharded within the root's forward: no engine-specific code. Plain PyTorch: it
runs, and is tested, on CPU too (Liger's fused kernel does the same in Triton, on CUDA only, and reads the head's
weight outside the module's forward, which ZeRO-3 has not gathered: Liger-Kernel issue #1048).

``enable(model)`` makes a loaded Qwen3 or Qwen3-MoE model compute its training loss this way; evaluation keeps the
model's own forward (its logits are scored row by row: components/models/batches.py::label_nll).
"""

from __future__ import annotations

import types

import torch
from torch.nn import functional as F
from torch.utils.checkpoint import checkpoint

from components.train.config import LOSS_CHUNK_TOKENS as CHUNK_TOKENS

IGNORE_INDEX = -100


def _chunk_loss(hidden: torch.Tensor, labels: torch.Tensor, head: torch.nn.Module) -> torch.Tensor:
    return F.cross_entropy(head(hidden).float(), labels, ignore_index=IGNORE_INDEX, reduction="sum")


def _chunks(tokens: int, chunk_tokens: int, device: torch.device) -> int:
    """How many chunks every rank runs: the most any rank needs. Under ZeRO-3 each call of the head gathers its
    weight, a collective: ranks with rows of different lengths (unpacked data) must call it as often."""
    chunks = -(-tokens // chunk_tokens)
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        most = torch.tensor([chunks], device=device)
        torch.distributed.all_reduce(most, op=torch.distributed.ReduceOp.MAX)
        chunks = int(most.item())
    return chunks


def chunked_cross_entropy(
    hidden_states: torch.Tensor,
    head: torch.nn.Module,
    labels: torch.Tensor,
    num_items_in_batch: torch.Tensor | int | None = None,
    chunk_tokens: int | None = None,
) -> torch.Tensor:
    """The causal-LM loss of ``head(hidden_states)`` against ``labels``, as transformers' ``ForCausalLMLoss``
    computes it (tokens < n predict n, label -100 not scored, fp32; summed over ``num_items_in_batch`` when the
    Trainer gives it, else the mean over scored tokens), ``chunk_tokens`` (default ``CHUNK_TOKENS``) tokens of
    logits at a time."""
    chunk_tokens = chunk_tokens or CHUNK_TOKENS
    shift = F.pad(labels, (0, 1), value=IGNORE_INDEX)[..., 1:].reshape(-1).to(hidden_states.device)
    flat = hidden_states.reshape(-1, hidden_states.shape[-1])
    total = flat.new_zeros((), dtype=torch.float32)
    for start in range(0, _chunks(flat.shape[0], chunk_tokens, flat.device) * chunk_tokens, chunk_tokens):
        # Past the end (another rank has more tokens) the slice is empty: the head still runs, on no tokens.
        y = shift[start : start + chunk_tokens]
        total = total + checkpoint(_chunk_loss, flat[start : start + chunk_tokens], y, head, use_reentrant=False)
    if num_items_in_batch is None:
        denominator = (shift != IGNORE_INDEX).sum()
    else:
        denominator = torch.as_tensor(num_items_in_batch, device=total.device)
    return total / denominator.to(total.dtype)


def _forward(self, input_ids=None, labels=None, output_router_logits=None, logits_to_keep=0, **kwargs):
    """``Qwen3ForCausalLM`` / ``Qwen3MoeForCausalLM.forward`` with the training loss chunked: the same outputs
    but no logits (the router's load-balancing loss added as the model adds it)."""
    if labels is None or not self.training:
        return type(self).forward(
            self,
            input_ids=input_ids,
            labels=labels,
            logits_to_keep=logits_to_keep,
            **({"output_router_logits": output_router_logits} if output_router_logits is not None else {}),
            **kwargs,
        )
    moe = hasattr(self, "router_aux_loss_coef")
    if moe:
        from transformers.modeling_outputs import MoeCausalLMOutputWithPast as Output
        from transformers.models.qwen3_moe.modeling_qwen3_moe import load_balancing_loss_func

        if output_router_logits is None:
            output_router_logits = self.config.output_router_logits
        kwargs["output_router_logits"] = output_router_logits
    else:
        from transformers.modeling_outputs import CausalLMOutputWithPast as Output
    num_items_in_batch = kwargs.get("num_items_in_batch")
    outputs = self.model(input_ids=input_ids, **kwargs)
    loss = chunked_cross_entropy(outputs.last_hidden_state, self.lm_head, labels, num_items_in_batch)
    extra = {}
    if moe and output_router_logits:
        aux = load_balancing_loss_func(
            outputs.router_logits, self.num_experts, self.num_experts_per_tok, kwargs.get("attention_mask")
        )
        loss = loss + self.router_aux_loss_coef * aux.to(loss.device)
        extra = {"aux_loss": aux, "router_logits": outputs.router_logits}
    return Output(loss=loss, logits=None, past_key_values=outputs.past_key_values, **extra)


def enable(model: torch.nn.Module) -> torch.nn.Module:
    """Make ``model`` (a Qwen3 or Qwen3-MoE causal LM, before PEFT or an engine wraps it) compute its training loss
    with ``chunked_cross_entropy``; ValueError for another model type."""
    model_type = getattr(model.config, "model_type", None)
    if model_type not in ("qwen3", "qwen3_moe"):
        raise ValueError(
            f"chunked_cross_entropy supports qwen3 and qwen3_moe models, not {model_type!r}; "
            "set chunked_cross_entropy false"
        )
    model.forward = types.MethodType(_forward, model)
    return model
