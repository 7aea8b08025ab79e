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


@pytest.mark.slow
def test_compiled_experts_train_under_zero3_and_fsdp2_as_grouped_mm_does_and_export_the_same_format(tmp_path):
    """Through the trainer's entry point on 2 CPU ranks (gloo): ZeRO-3 (the MoE block a leaf, its hooks outside the
    compiled function) and FSDP2 (parallelism hsdp) with grouped_mm_compiled end with grouped_mm's losses, eval_loss
    and exported weights, under the same names (the checkpoint and export formats do not change)."""
    import json
    import sys

    from safetensors.torch import load_file

    from components.train.config import deepspeed_config_path
    from components.train.launcher.local_torchrun import run_torchrun
    from tests.helpers.repo import ROOT
    from tests.helpers.trainer import trainer_config

    sys.path.insert(0, str(ROOT / "benchmarks"))
    import netns_bytes

    model = netns_bytes.make_moe(tmp_path)

    def run(name: str, **over) -> tuple[dict, dict]:
        cfg = trainer_config(
            tmp_path,
            name,
            model_name_or_path=str(model),
            max_steps=2,
            save_steps=2,
            logging_steps=1,
            per_device_train_batch_size=1,
            gradient_accumulation_steps=2,
            **over,
        )
        run_torchrun(cfg, nproc_per_node=2)
        (weights,) = (tmp_path / name / "final").glob("*.safetensors")
        return json.loads((tmp_path / name / "metrics.json").read_text()), load_file(weights)

    zero3 = {"deepspeed": deepspeed_config_path("zero3")}
    reference, reference_weights = run("z3-grouped", **zero3)
    for name, over in (
        ("z3-compiled", {**zero3, "moe_experts_implementation": "grouped_mm_compiled"}),
        ("hsdp-compiled", {"parallelism": "hsdp", "moe_experts_implementation": "grouped_mm_compiled"}),
    ):
        metrics, weights = run(name, **over)
        for key in ("final_train_loss", "eval_loss"):
            assert metrics[key] == pytest.approx(reference[key], rel=1e-5), (name, key, metrics, reference)
        assert sorted(weights) == sorted(reference_weights), name
        for key, value in reference_weights.items():
            torch.testing.assert_close(weights[key], value, rtol=1e-4, atol=1e-5, msg=f"{name}: {key}")
