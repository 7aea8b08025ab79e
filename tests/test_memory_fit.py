"""The memory-fit estimate: DeepSpeed's own estimators agree on model states, presets fit, bad setups name the knob."""

import pytest
import torch
from deepspeed.runtime.zero.stage3 import estimate_zero3_model_states_mem_needs
from deepspeed.runtime.zero.stage_1_and_2 import estimate_zero2_model_states_mem_needs
from transformers import Qwen3Config, Qwen3ForCausalLM, Qwen3MoeConfig, Qwen3MoeForCausalLM

from components.train.memory import check_memory_fit, load_architecture, model_shape, model_states_bytes

QWEN3_30B = "Qwen/Qwen3-30B-A3B-Thinking-2507-FP8"


def test_the_shipped_30b_architecture_counts_30_5b_parameters_3b_active():
    shape = model_shape(load_architecture(QWEN3_30B))
    assert shape.total == 30_532_122_624  # Qwen's model card: 30.5B
    assert 2.9e9 < shape.active < 3.4e9  # "A3B": 3.3B activated, of which ~0.3B the embedding lookup
    assert shape.largest_block == 128 * 3 * 2048 * 768 + 128 * 2048  # a whole MoE block, gathered as a ZeRO-3 leaf


@pytest.mark.parametrize("moe", [False, True])
def test_parameter_counts_match_a_real_model_built_from_the_config(moe):
    common = dict(vocab_size=211, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                  head_dim=16, intermediate_size=96)
    config = Qwen3MoeConfig(**common, num_experts=8, num_experts_per_tok=2, moe_intermediate_size=32) if moe \
        else Qwen3Config(**common)
    with torch.device("meta"):
        model = (Qwen3MoeForCausalLM if moe else Qwen3ForCausalLM)(config)
    assert model_shape(config.to_dict()).total == sum(p.numel() for p in model.parameters())
    linear = sum(m.weight.numel() for m in model.modules() if isinstance(m, torch.nn.Linear))
    assert model_shape(config.to_dict()).linear == linear


@pytest.mark.parametrize("nodes,gpus", [(1, 8), (2, 8), (4, 8)])
@pytest.mark.parametrize("offload_opt,offload_param", [(False, False), (True, False), (True, True)])
def test_zero3_model_states_equal_deepspeeds_estimator(nodes, gpus, offload_opt, offload_param):
    shape = model_shape(load_architecture(QWEN3_30B))
    zero = {"stage": 3, "offload_optimizer": {"device": "cpu" if offload_opt else "none"},
            "offload_param": {"device": "cpu" if offload_param else "none"}}
    _, gpu_mem, _ = estimate_zero3_model_states_mem_needs(
        shape.total, shape.largest_block, num_gpus_per_node=gpus, num_nodes=nodes,
        cpu_offload=offload_opt, cpu_offload_params=offload_param)
    assert model_states_bytes(shape, "full", zero, nodes * gpus) == gpu_mem


@pytest.mark.parametrize("offload", [False, True])
def test_zero2_model_states_equal_deepspeeds_estimator(offload):
    shape = model_shape(load_architecture(QWEN3_30B))
    zero = {"stage": 2, "offload_optimizer": {"device": "cpu" if offload else "none"}}
    _, gpu_mem = estimate_zero2_model_states_mem_needs(shape.total, num_gpus_per_node=8, num_nodes=2, cpu_offload=offload)
    assert model_states_bytes(shape, "full", zero, 16) == gpu_mem


def test_the_30b_presets_fit_on_two_nodes_of_eight_h100():
    assert check_memory_fit(QWEN3_30B, "full", "zero3", 2, 8, 4096, 1) is None
    assert check_memory_fit("Qwen/Qwen3-30B-A3B", "qlora", "none", 2, 8, 4096, 2) is None


def test_full_fine_tuning_without_zero3_names_deepspeed_config():
    error = check_memory_fit(QWEN3_30B, "full", "zero2", 2, 8, 4096, 1)
    assert "needs about 9" in error and "but a GPU has 80 GiB" in error and "set deepspeed_config to 'zero3'" in error


def test_too_few_gpus_for_zero3_names_num_nodes():
    error = check_memory_fit(QWEN3_30B, "full", "zero3", 1, 4, 4096, 1)
    assert "raise num_nodes (now 1)" in error


def test_a_long_sequence_names_the_micro_batch_and_sequence_length():
    error = check_memory_fit(QWEN3_30B, "full", "zero3", 2, 8, 32768, 4)
    assert "lower per_device_train_batch_size (now 4) or max_seq_length (now 32768)" in error


def test_an_unknown_hub_model_is_not_checked_and_a_local_folder_is(tmp_path):
    assert check_memory_fit("someone/unknown-model", "full", "none", 1, 1, 4096, 1) is None
    config = load_architecture(QWEN3_30B)
    (tmp_path / "config.json").write_text(__import__("json").dumps(config))
    assert "set deepspeed_config" in check_memory_fit(str(tmp_path), "full", "none", 1, 8, 4096, 1)


def test_lora_on_moe_experts_is_refused_with_the_valid_targets():
    with pytest.raises(ValueError, match=r"\['gate_proj'\] are not nn.Linear modules of this model"):
        check_memory_fit(QWEN3_30B, "lora", "none", 1, 8, 4096, 1, lora_target_modules="q_proj,gate_proj")
