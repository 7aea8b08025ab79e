"""LoRA on Qwen3-MoE: adapters on attention and on the fused expert tensors. Under ZeRO-3 on two ranks:
tests/train/trainer/test_export_zero3.py (one run checks the adapters and the merged export)."""

import pytest
import torch
from peft.tuners.lora import Linear as LoraLinear
from peft.tuners.lora import ParamWrapper
from transformers import Qwen3Config, Qwen3ForCausalLM, Qwen3MoeConfig, Qwen3MoeForCausalLM

from components.models.shape import model_shape
from components.train.trainer.arguments import SFTConfig
from components.train.trainer.lora import LORA_TARGETS_DENSE, LORA_TARGETS_MOE, apply_lora, lora_targets

TINY = dict(
    vocab_size=211,
    hidden_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    intermediate_size=96,
)
MOE = dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32)


def _cfg(tmp_path, **over):
    fields = {"method": "lora", "lora_r": 4, "lora_alpha": 8, "lora_dropout": 0.0, "lora_target_modules": "", **over}
    return SFTConfig(output_dir=str(tmp_path), use_cpu=True, report_to=[], **fields)


def _trainable(model) -> int:
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


def test_default_targets_follow_the_model_type():
    assert lora_targets("qwen3") == (LORA_TARGETS_DENSE.split(","), [])
    assert lora_targets("qwen3_moe") == (
        ["q_proj", "k_proj", "v_proj", "o_proj"],
        ["experts.gate_up_proj", "experts.down_proj"],
    )
    assert lora_targets("qwen3_moe", "q_proj,v_proj") == (["q_proj", "v_proj"], [])  # the user's list wins


def test_moe_lora_wraps_attention_and_both_expert_tensors_and_counts_as_memory_fit_does(tmp_path):
    torch.manual_seed(0)
    config = Qwen3MoeConfig(**TINY, **MOE)
    model = apply_lora(Qwen3MoeForCausalLM(config), _cfg(tmp_path))
    for layer in model.base_model.model.model.layers:
        assert all(
            isinstance(getattr(layer.self_attn, n), LoraLinear) for n in ("q_proj", "k_proj", "v_proj", "o_proj")
        )
        wrappers = [m for m in layer.mlp.modules() if isinstance(m, ParamWrapper)]
        assert sorted(w.parameter_name for w in wrappers) == ["down_proj", "gate_up_proj"]
        assert all(w.num_experts == MOE["num_experts"] for w in wrappers)  # a rank-r pair per expert
    expected = model_shape(config.to_dict()).lora_params(4, LORA_TARGETS_MOE.split(","))
    assert _trainable(model) == expected
    # Gradients reach the expert adapters: B starts at zero, so its gradient is what makes it learn.
    ids = torch.randint(0, TINY["vocab_size"], (2, 16))
    model(input_ids=ids, labels=ids).loss.backward()
    expert_b = [p for n, p in model.named_parameters() if ".experts." in n and "lora_B" in n]
    assert len(expert_b) == 2 * TINY["num_hidden_layers"] and all(p.grad.abs().sum() > 0 for p in expert_b)


def test_dense_lora_wraps_every_linear_projection_and_counts_as_memory_fit_does(tmp_path):
    config = Qwen3Config(**TINY)
    model = apply_lora(Qwen3ForCausalLM(config), _cfg(tmp_path, lora_dropout=0.05))
    wrapped = {n.rsplit(".", 1)[-1] for n, m in model.named_modules() if isinstance(m, LoraLinear)}
    assert wrapped == set(LORA_TARGETS_DENSE.split(","))
    assert _trainable(model) == model_shape(config.to_dict()).lora_params(4, LORA_TARGETS_DENSE.split(","))


def test_expert_adapters_with_dropout_are_refused_naming_the_field(tmp_path):
    with pytest.raises(ValueError, match=r"lora_dropout=0.05 with expert tensors .*set lora_dropout to 0"):
        apply_lora(Qwen3MoeForCausalLM(Qwen3MoeConfig(**TINY, **MOE)), _cfg(tmp_path, lora_dropout=0.05))


def test_expert_targets_on_a_dense_model_are_refused(tmp_path):
    with pytest.raises(ValueError, match=r"\['experts.gate_up_proj'\]: the model \(qwen3\) has no such parameter"):
        apply_lora(
            Qwen3ForCausalLM(Qwen3Config(**TINY)), _cfg(tmp_path, lora_target_modules="q_proj,experts.gate_up_proj")
        )


def test_expert_adapters_get_the_same_gradients_with_gradient_checkpointing(tmp_path):
    """GPU runs checkpoint every layer: PEFT's parametrised expert weights must be rebuilt alike in the recompute."""
    grads = []
    for checkpointing in (False, True):
        torch.manual_seed(0)
        model = apply_lora(Qwen3MoeForCausalLM(Qwen3MoeConfig(**TINY, **MOE)), _cfg(tmp_path))
        for name, p in model.named_parameters():
            if "lora_B" in name:
                torch.nn.init.normal_(p, std=0.1)  # non-zero B, so every adapter gradient is non-trivial
        model.train()
        if checkpointing:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
            model.enable_input_require_grads()
        ids = torch.randint(0, TINY["vocab_size"], (2, 16), generator=torch.Generator().manual_seed(1))
        model(input_ids=ids, labels=ids).loss.backward()
        grads.append({n: p.grad for n, p in model.named_parameters() if p.requires_grad})
    assert grads[0].keys() == grads[1].keys()
    for name in grads[0]:
        torch.testing.assert_close(grads[1][name], grads[0][name], atol=1e-6, rtol=1e-5)
