"""Model FLOPs per token, counted once for the plan, the trainer's MFU and the benchmarks (components/models/mfu.py)."""

import pytest

from components.models.mfu import model_flops_per_token, recompute_flops_per_token
from components.models.shape import load_architecture, model_shape


def test_qwen3_30b_a3b_counts_as_the_field_publishes():
    """NVIDIA NeMo AutoModel's performance summary: 277 model TFLOP/s at 12,040 tokens/s per H100 for Qwen3 MoE 30B
    at 4096 tokens, i.e. 23.0 GFLOP per token (their flops formulas: causal attention halved, lm_head counted, no
    embedding FLOPs). Ours counts attention per document, (s + 1) / 2 keys for one document filling the row."""
    shape = model_shape(load_architecture("Qwen/Qwen3-30B-A3B"))
    flops = model_flops_per_token(shape, (4096 + 1) / 2)
    assert flops / 1e9 == pytest.approx(23.0, rel=0.01)
    # What differs from the over-count of ../shared/gpu-checks/moe_bench.py: the embedding table is no matmul.
    embedding_as_matmul = flops + 6 * shape.vocab * shape.hidden
    assert embedding_as_matmul / flops > 1.08


def test_recomputation_is_hardware_work_apart_from_the_model_flops():
    shape = model_shape(load_architecture("Qwen/Qwen3-30B-A3B"))
    t = 2048.5
    model, again = model_flops_per_token(shape, t), recompute_flops_per_token(shape, t)
    head = 2 * (shape.vocab * shape.hidden + shape.hidden)
    # The forward is a third of the model FLOPs; recomputation repeats it without the output head.
    assert again == pytest.approx(model / 3 - head)
    assert recompute_flops_per_token(shape, t, fraction=0.5) == pytest.approx(again / 2)
    assert recompute_flops_per_token(shape, t, fraction=0.0) == 0
