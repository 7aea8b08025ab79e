"""moe_experts_implementation: every choice the trainer offers computes what transformers' grouped_mm experts do.

The GPU-only choice (liger) is checked in tests/train/trainer/test_gpu_speed.py; its speed, and grouped_mm_compiled's,
in benchmarks/moe_kernels.py (benchmarks/results/moe-layer-bench.md).
"""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM, Qwen3MoeConfig

from components.settings import choices
from components.train.trainer.speed import LIGER_EXPERTS, experts_implementation

TINY_MOE = {
    "vocab_size": 128,
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 8,
    "num_experts": 8,
    "num_experts_per_tok": 2,
    "moe_intermediate_size": 16,
    "norm_topk_prob": True,
}


def _loss_and_grads(implementation: str, dtype=torch.float32):
    torch.manual_seed(0)
    config = Qwen3MoeConfig(**TINY_MOE)
    model = AutoModelForCausalLM.from_config(
        config, dtype=dtype, experts_implementation=experts_implementation(implementation)
    )
    # Packed rows as the trainer feeds them: two documents per row, positions restarting.
    ids = torch.randint(0, 128, (2, 24), generator=torch.Generator().manual_seed(1))
    positions = torch.cat([torch.arange(10), torch.arange(14)]).repeat(2, 1)
    out = model(input_ids=ids, position_ids=positions, labels=ids)
    out.loss.backward()
    return out.loss.detach(), {n: p.grad.detach().clone() for n, p in model.named_parameters()}


@pytest.mark.parametrize(
    "implementation", [pytest.param("grouped_mm_compiled", marks=pytest.mark.slow), "eager", "batched_mm"]
)
def test_experts_implementation_trains_as_grouped_mm_does(implementation):
    """Same loss and the same gradient on every parameter as the default grouped_mm (packed rows, fp32 on CPU: the
    compiled function takes transformers' grouped_mm fallback there, through Inductor)."""
    loss, grads = _loss_and_grads("grouped_mm")
    other_loss, other_grads = _loss_and_grads(implementation)
    torch.testing.assert_close(other_loss, loss, rtol=1e-5, atol=1e-6)
    assert other_grads.keys() == grads.keys()
    for name, grad in grads.items():
        torch.testing.assert_close(other_grads[name], grad, rtol=1e-4, atol=1e-6, msg=f"gradient of {name}")


def test_every_choice_loads():
    """Each choice the settings offer is one the trainer can hand to transformers (liger: the model's own class is
    grouped_mm, Liger then replaces the experts' module on a GPU)."""
    for name in choices("moe_experts_implementation"):
        resolved = experts_implementation(name)
        assert resolved == ("grouped_mm" if name == LIGER_EXPERTS else name)
        model = AutoModelForCausalLM.from_config(Qwen3MoeConfig(**TINY_MOE), experts_implementation=resolved)
        assert model.config._experts_implementation == resolved
