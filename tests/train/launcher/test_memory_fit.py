"""The memory-fit estimate: DeepSpeed's own estimators agree, the H100 measurement agrees, presets fit, bad setups
name the knob."""

import dataclasses
import json

import pytest
import torch
from deepspeed.runtime.zero.stage3 import estimate_zero3_model_states_mem_needs
from deepspeed.runtime.zero.stage_1_and_2 import estimate_zero2_model_states_mem_needs
from transformers import Qwen3Config, Qwen3ForCausalLM, Qwen3MoeConfig, Qwen3MoeForCausalLM

from components.estimate.memory import (
    GIB,
    NF4_BYTES_PER_PARAM,
    POD_MEMORY_GIB,
    base_weight_bytes,
    check_memory_fit,
    host_bytes_per_pod,
    model_states_bytes,
)
from components.models.shape import load_architecture, model_shape

QWEN3_30B = "Qwen/Qwen3-30B-A3B-Thinking-2507-FP8"
TINY = dict(
    vocab_size=211,
    hidden_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    intermediate_size=96,
)
# The model /work/shared/gpu-checks/qlora_moe_check.py loaded on one H100 (2026-11-23-qlora.log): Qwen3-30B-A3B's
# shape cut to 4 layers.
SLICE_4_LAYERS = dict(
    vocab_size=151936,
    hidden_size=2048,
    intermediate_size=6144,
    moe_intermediate_size=768,
    num_hidden_layers=4,
    num_attention_heads=32,
    num_key_value_heads=4,
    head_dim=128,
    num_experts=128,
    num_experts_per_tok=8,
    tie_word_embeddings=False,
)


def _tiny(moe: bool, **over):
    common = {**TINY, **over}
    config = (
        Qwen3MoeConfig(**common, num_experts=8, num_experts_per_tok=2, moe_intermediate_size=32)
        if moe
        else Qwen3Config(**common)
    )
    return config, (Qwen3MoeForCausalLM if moe else Qwen3ForCausalLM)(config)


def test_the_shipped_30b_architecture_counts_30_5b_parameters_3b_active():
    shape = model_shape(load_architecture(QWEN3_30B))
    assert shape.total == 30_532_122_624  # Qwen's model card: 30.5B
    assert 2.9e9 < shape.active < 3.4e9  # "A3B": 3.3B activated, of which ~0.3B the embedding lookup
    assert shape.largest_block == 128 * 3 * 2048 * 768 + 128 * 2048  # a whole MoE block, gathered as a ZeRO-3 leaf
    assert shape.expert_params == 48 * 128 * 3 * 2048 * 768  # 29.0B in the fused expert tensors


def test_the_shipped_32b_architecture_counts_32_8b_parameters():
    shape = model_shape(load_architecture("Qwen/Qwen3-32B"))
    assert round(shape.total / 1e9, 1) == 32.8  # Qwen's model card: 32.8B, of which 31.2B not embeddings
    assert round((shape.total - 2 * 151936 * 5120) / 1e9, 1) == 31.2


@pytest.mark.parametrize("moe", [False, True])
def test_parameter_counts_match_a_real_model_built_from_the_config(moe):
    with torch.device("meta"):
        config, model = _tiny(moe)
    shape = model_shape(config.to_dict())
    assert shape.total == sum(p.numel() for p in model.parameters())
    # What bitsandbytes would quantise: nn.Linear modules except those transformers keeps out (the output head).
    from transformers.quantizers.base import get_keys_to_not_convert

    kept = set(get_keys_to_not_convert(model))
    linear = sum(m.weight.numel() for n, m in model.named_modules() if isinstance(m, torch.nn.Linear) and n not in kept)
    assert shape.linear == linear
    experts = sum(p.numel() for n, p in model.named_parameters() if ".experts." in n)
    assert shape.expert_params == experts


@pytest.mark.parametrize("moe", [False, True])
def test_qlora_counts_each_tensor_in_the_dtype_peft_leaves_it(moe):
    """After prepare_model_for_kbit_training, every tensor bitsandbytes did not quantise is fp32 (PEFT's own code).

    No bitsandbytes on CPU: the bf16 model stands in for the 4-bit one, and the tensors bitsandbytes would have
    replaced (decoder nn.Linear weights) are counted at NF4, the others at whatever dtype PEFT left them in.
    """
    from peft import prepare_model_for_kbit_training
    from transformers.quantizers.base import get_keys_to_not_convert

    config, model = _tiny(moe)
    model = model.to(torch.bfloat16)
    kept = set(get_keys_to_not_convert(model))
    quantised = {f"{n}.weight" for n, m in model.named_modules() if isinstance(m, torch.nn.Linear) and n not in kept}
    model = prepare_model_for_kbit_training(model, use_gradient_checkpointing=False)
    actual = sum(
        p.numel() * NF4_BYTES_PER_PARAM if n in quantised else p.numel() * p.element_size()
        for n, p in model.named_parameters()
    )
    assert {p.dtype for n, p in model.named_parameters() if n not in quantised} == {torch.float32}
    assert base_weight_bytes(model_shape(config.to_dict()), "qlora") == pytest.approx(actual, abs=1)


def test_the_4_layer_slice_matches_what_an_h100_measured():
    """2026-11-23-qlora.log: after load_model(method qlora) torch.cuda.memory_allocated() was 11.37 GiB; the same
    model's parameters in bf16 are 5.80 GiB (numel x 2, computed by the script). Like with like: the measured
    figure is the prepared base plus the fp32 adapters (attention, r=16, the targets the check used) before any
    gradient or optimizer state exists. Tolerance 1%: NF4 quantisation states and allocator rounding."""
    shape = model_shape(SLICE_4_LAYERS)
    adapters = shape.lora_params(16, ["q_proj", "k_proj", "v_proj", "o_proj"])
    assert adapters == 1_114_112  # the log's "trainable"
    assert (base_weight_bytes(shape, "qlora") + 4 * adapters) / GIB == pytest.approx(11.37, rel=0.01)
    assert base_weight_bytes(shape, "lora") / GIB == pytest.approx(5.80, abs=0.005)


@pytest.mark.parametrize("nodes,gpus", [(1, 8), (2, 8), (4, 8)])
@pytest.mark.parametrize("offload_opt,offload_param", [(False, False), (True, False), (True, True)])
def test_zero3_model_states_equal_deepspeeds_estimator(nodes, gpus, offload_opt, offload_param):
    shape = model_shape(load_architecture(QWEN3_30B))
    zero = {
        "stage": 3,
        "offload_optimizer": {"device": "cpu" if offload_opt else "none"},
        "offload_param": {"device": "cpu" if offload_param else "none"},
    }
    # DeepSpeed's largest_layer_params: what ZeRO-3 holds gathered, a whole decoder layer (its MoE block one leaf).
    cpu_mem, gpu_mem, _ = estimate_zero3_model_states_mem_needs(
        shape.total,
        max(shape.largest_block, shape.largest_layer),
        num_gpus_per_node=gpus,
        num_nodes=nodes,
        cpu_offload=offload_opt,
        cpu_offload_params=offload_param,
    )
    assert model_states_bytes(shape, "full", zero, nodes * gpus) == gpu_mem
    # DeepSpeed's cpu figure is per node, which is one pod here.
    assert host_bytes_per_pod(shape, "full", zero, nodes, gpus)["model"] == pytest.approx(cpu_mem, abs=1)


@pytest.mark.parametrize("offload", [False, True])
def test_zero2_model_states_equal_deepspeeds_estimator(offload):
    shape = model_shape(load_architecture(QWEN3_30B))
    zero = {"stage": 2, "offload_optimizer": {"device": "cpu" if offload else "none"}}
    _, gpu_mem = estimate_zero2_model_states_mem_needs(
        shape.total, num_gpus_per_node=8, num_nodes=2, cpu_offload=offload
    )
    assert model_states_bytes(shape, "full", zero, 16) == gpu_mem


def test_qlora_of_the_30b_moe_is_refused_and_points_to_the_lora_preset():
    # The old qwen3-30b-a3b-qlora preset: 2 x 8 H100, plain DDP.
    error = check_memory_fit("Qwen/Qwen3-30B-A3B", "qlora", "none", 2, 8, 4096, 2)
    assert error.startswith("qlora fine-tuning of Qwen/Qwen3-30B-A3B needs about 1")  # > 100 GiB per GPU
    assert "29.0B parameters of the fused expert tensors" in error and "fp32" in error
    assert "use method 'lora' with deepspeed_config 'zero3' (preset qwen3-30b-a3b-lora)" in error


def test_lora_with_expert_adapters_on_the_30b_moe_fits_two_nodes():
    assert check_memory_fit(QWEN3_30B, "lora", "zero3", 2, 8, 4096, 2) is None


def test_every_preset_fits():
    from pipelines.params import preset_names, resolve

    names = preset_names()
    assert {"qwen3-30b-a3b-full", "qwen3-30b-a3b-lora", "qwen3-32b-qlora"} <= set(names)
    for name in names:
        p = resolve(name)
        # As validate_inputs calls it (components/validate/checks.py).
        assert (
            check_memory_fit(
                p["model_name_or_path"],
                p["method"],
                p["deepspeed_config"],
                p["num_nodes"],
                p["gpus_per_node"],
                p["max_seq_length"],
                p["per_device_train_batch_size"],
                gpu_memory_gib=p["gpu_memory_gib"],
            )
            is None
        ), name


def test_full_fine_tuning_without_zero3_names_deepspeed_config():
    error = check_memory_fit(QWEN3_30B, "full", "zero2", 2, 8, 4096, 1)
    assert "needs about 9" in error and "but a GPU has 80 GiB" in error and "set deepspeed_config to 'zero3'" in error


def test_too_few_gpus_for_zero3_names_num_nodes():
    error = check_memory_fit(QWEN3_30B, "full", "zero3", 1, 4, 4096, 1)
    assert "raise num_nodes (now 1)" in error


def test_a_long_sequence_names_the_micro_batch_and_sequence_length():
    error = check_memory_fit(QWEN3_30B, "full", "zero3", 2, 8, 32768, 4)
    assert "lower per_device_train_batch_size (now 4) or max_seq_length (now 32768)" in error


def test_offloaded_states_that_overflow_the_pod_name_num_nodes():
    # Fits the GPUs (states offloaded), but each pod would hold half of 30.5B x 18 bytes x 1.5.
    error = check_memory_fit(QWEN3_30B, "full", "zero3_offload", 2, 8, 4096, 1)
    assert "needs about 412 GiB of host memory per pod" in error and f"a pod has {POD_MEMORY_GIB:g} GiB" in error
    assert "raise num_nodes (now 2" in error and "GPU" not in error.split(":")[0]
    assert check_memory_fit(QWEN3_30B, "full", "zero3_offload", 8, 8, 4096, 1) is None


def test_moe_lora_without_zero3_names_deepspeed_config_for_host_memory():
    # Every rank fuses its own copy of the experts (58 GB in bf16) on the CPU before the Trainer moves it.
    error = check_memory_fit(QWEN3_30B, "lora", "zero2", 2, 8, 4096, 1)
    assert "of host memory per pod" in error and "set deepspeed_config to 'zero3'" in error


def test_pod_memory_is_the_trainer_pods_limit():
    # Both builders take the one spec: its memory default is the PyTorchJob's and the TrainJob's.
    from components.train.launcher.spec import TrainingJobSpec

    defaults = {f.name: f.default for f in dataclasses.fields(TrainingJobSpec)}
    assert defaults["memory"] == f"{POD_MEMORY_GIB:g}Gi"


def test_an_unknown_hub_model_is_not_checked_and_a_local_folder_is(tmp_path):
    assert check_memory_fit("someone/unknown-model", "full", "none", 1, 1, 4096, 1) is None
    config = load_architecture(QWEN3_30B)
    (tmp_path / "config.json").write_text(json.dumps(config))
    assert "set deepspeed_config" in check_memory_fit(str(tmp_path), "full", "none", 1, 8, 4096, 1)


def test_lora_targets_the_model_lacks_are_refused_with_the_valid_ones():
    with pytest.raises(ValueError, match=r"\['gate_proj'\] are not in this model; use some of \['experts.down_proj'"):
        check_memory_fit(QWEN3_30B, "lora", "zero3", 2, 8, 4096, 1, lora_target_modules="q_proj,gate_proj")
    with pytest.raises(ValueError, match=r"\['experts.gate_up_proj'\] are not in this model"):
        check_memory_fit("Qwen/Qwen3-32B", "lora", "zero3", 1, 8, 4096, 1, lora_target_modules="experts.gate_up_proj")


def test_the_hpz_secondary_partition_is_the_jobs_node_as_the_trainer_sets_it():
    # The shipped zero3_hpz says 8; the trainer rewrites it to the job's GPUs per node (1 on one node:
    # components/train/config.py::hpz_partition). On 2 x 4 GPUs each keeps 2P/4 of secondary weights, not 2P/8:
    # 91.5 GiB per GPU, past 85, which the shipped file's 8 would have called a fit (84.4).
    from components.estimate.training_plan import plan
    from components.settings import defaults
    from components.train.config import job_zero_config

    assert job_zero_config("zero3_hpz", 2, 4)["zero_hpz_partition_size"] == 4
    assert job_zero_config("zero3_hpz", 1, 8)["zero_hpz_partition_size"] == 1
    assert "zero_hpz_partition_size" not in job_zero_config("zero3", 2, 8)
    problem = check_memory_fit(
        "Qwen/Qwen3-30B-A3B",
        "full",
        "zero3_hpz",
        num_nodes=2,
        gpus_per_node=4,
        max_seq_length=4096,
        per_device_train_batch_size=1,
        gpu_memory_gib=85,
    )
    assert problem is not None and "91.5 GiB per GPU" in problem
    # The plan prints the same memory figure.
    values = {
        **defaults(),
        "model_name_or_path": "Qwen/Qwen3-30B-A3B",
        "deepspeed_config": "zero3_hpz",
        "num_nodes": 2,
        "gpus_per_node": 4,
        "per_device_train_batch_size": 1,
        "chunked_cross_entropy": False,  # as check_memory_fit above: the whole logits
        "max_seq_length": 4096,
    }
    assert plan(values, load_architecture("Qwen/Qwen3-30B-A3B")).memory_gib["total"] == pytest.approx(91.537, abs=0.01)


def test_a_micro_batch_or_recompute_that_does_not_fit_is_one_error_naming_the_levers():
    """8 rows of 4096 without recomputation: one error before any GPU, naming first what costs memory only
    (recompute every layer, the chunked loss), then the batch; with both levers the same batch fits."""
    from components.settings import defaults
    from components.validate.rules import check

    eight = {**defaults(), "per_device_train_batch_size": 8, "gradient_accumulation_steps": 1}
    eight["chunked_cross_entropy"] = False  # on by default since issue 28
    (error,) = check({**eight, "activation_checkpointing": False})
    assert "needs about 207.3 GiB per GPU" in error
    assert (
        "set activation_checkpointing=true with recompute_every_n_layers=1, or set chunked_cross_entropy=true, or "
        "lower per_device_train_batch_size (now 8)"
    ) in error
    (error,) = check({**eight, "recompute_every_n_layers": 2})
    assert "recompute_every_n_layers=1" in error
    assert check({**eight, "chunked_cross_entropy": True}) == []
