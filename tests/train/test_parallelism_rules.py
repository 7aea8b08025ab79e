"""validate_inputs' rules for ``parallelism`` (components/validate/rules/train.py): transformers' FSDP2 layouts are
refused, with one error naming the setting, where they cannot run; accepted where they can."""

import json

import pytest

from components.validate.rules import check
from pipelines import params as P

FULL = "qwen3-30b-a3b-full"
# benchmarks/netns_bytes.py's tiny Qwen3-MoE: its fp32 copy fits any pod.
TINY_MOE = {
    "model_type": "qwen3_moe",
    "architectures": ["Qwen3MoeForCausalLM"],
    "vocab_size": 687,
    "hidden_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "intermediate_size": 96,
    "num_experts": 4,
    "num_experts_per_tok": 2,
    "moe_intermediate_size": 32,
    "tie_word_embeddings": False,
}


def _errors(preset=FULL, **over) -> list[str]:
    values = P.resolve(preset)
    values.update(over)
    return [e for e in check(values) if "parallelism" in e]


@pytest.fixture
def tiny_moe(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(TINY_MOE))
    return str(tmp_path)


def test_hsdp_replaces_deepspeed_and_says_which_setting_to_change():
    assert _errors(parallelism="hsdp") == [
        "parallelism=hsdp shards the model with FSDP2 (transformers' DistributedConfig) in place of DeepSpeed: set "
        "deepspeed_config=none (it is zero3), or parallelism=deepspeed"
    ]


def test_hsdp_trains_full_fine_tuning_only():
    (error,) = _errors("qwen3-30b-a3b-lora", parallelism="hsdp", deepspeed_config="none")
    assert error.startswith("parallelism=hsdp trains method=full only (method is lora)")


def test_hsdp_runs_the_reference_job_now_that_its_export_gathers_one_layer_at_a_time():
    """Qwen3-30B-A3B: the export holds one layer in bf16 (1.2 GiB) and one 5 GiB shard on rank 0's host, beside its
    pod's 8 processes: far under the pod's 128 GiB (the fp32 gather of the whole model, 114 GiB, passed it)."""
    assert _errors(parallelism="hsdp", deepspeed_config="none") == []
    assert _errors(parallelism="hsdp_ep", deepspeed_config="none") == []


def test_hsdp_is_refused_where_one_layer_and_a_shard_pass_the_pods_memory():
    """A model whose one layer is larger than the pod (a made-up 64-expert MoE with 200 GiB per layer)."""
    from components.estimate.memory import POD_MEMORY_GIB
    from components.estimate.network import hsdp_export_host_gib
    from components.models.shape import ModelShape

    huge = ModelShape(
        total=10**12, active=10**11, linear=10**12, largest_block=10**11, layers=10, hidden=8192, q_dim=8192,
        kv_dim=1024, intermediate=8192, vocab=1000, experts=64, expert_params=9 * 10**11, largest_layer=10**11,
    )  # fmt: skip
    assert hsdp_export_host_gib(huge, 8) > POD_MEMORY_GIB


def test_expert_parallelism_needs_experts_that_divide_over_a_node(tiny_moe):
    (error,) = _errors("qwen3-32b-qlora", parallelism="hsdp_ep", deepspeed_config="none", method="full")
    assert "has 0 experts and gpus_per_node=8; use parallelism=hsdp" in error
    # The tiny MoE's 4 experts over 8 GPUs per node: refused; over 4 or 2: accepted.
    assert _errors(model_name_or_path=tiny_moe, parallelism="hsdp_ep", deepspeed_config="none")
    for gpus in (4, 2):
        assert (
            _errors(model_name_or_path=tiny_moe, parallelism="hsdp_ep", deepspeed_config="none", gpus_per_node=gpus)
            == []
        )


def test_a_model_that_fits_runs_under_hsdp(tiny_moe):
    values = P.resolve(FULL)
    values.update(model_name_or_path=tiny_moe, parallelism="hsdp", deepspeed_config="none")
    assert check(values) == []


def test_hsdp_checks_the_plans_memory_per_gpu(tiny_moe):
    """The same estimate as the plan's (network.py's hsdp_memory_gib): a GPU too small for the tiny MoE's 4 x 128-token
    rows of activations and logits is refused, naming the setting."""
    from components.estimate.network import hsdp_memory_gib
    from components.models.shape import model_shape

    est = hsdp_memory_gib(model_shape(TINY_MOE), False, 8, 4096, 1)
    values = P.resolve(FULL)
    values.update(
        model_name_or_path=tiny_moe,
        parallelism="hsdp",
        deepspeed_config="none",
        gpu_memory_gib=round(est["total"] - 0.5, 1),
    )
    (error,) = [e for e in check(values) if "parallelism" in e]
    assert error.startswith(
        f"parallelism=hsdp keeps a copy of the model states per node, sharded over its 8 GPUs: "
        f"it needs about {est['total']:.1f} GiB per GPU"
    )


def test_the_plan_counts_the_exports_shard_size_the_trainer_writes():
    from components.estimate.network import EXPORT_SHARD_BYTES
    from components.train.trainer.export import MAX_SHARD_BYTES

    assert EXPORT_SHARD_BYTES == MAX_SHARD_BYTES


def test_hsdp_refuses_a_model_that_ties_its_input_and_output_embeddings(tmp_path):
    """transformers 5.23's FSDP2 trains a tied-embedding model (Qwen3's small dense models) away from DDP from its
    second optimizer step (measured on the tiny Qwen3, 2 gloo ranks: step-3 loss 5.3105 under hsdp, 5.2648 under DDP),
    so hsdp and hsdp_ep are refused for it, naming the setting; the untied Qwen3-30B-A3B is unaffected."""
    tied = {**TINY_MOE, "model_type": "qwen3", "architectures": ["Qwen3ForCausalLM"], "tie_word_embeddings": True}
    for key in ("num_experts", "num_experts_per_tok", "moe_intermediate_size", "decoder_sparse_step"):
        tied.pop(key, None)
    (tmp_path / "config.json").write_text(json.dumps(tied))
    for layout in ("hsdp", "hsdp_ep"):
        errors = _errors(model_name_or_path=str(tmp_path), parallelism=layout, deepspeed_config="none")
        assert any(
            e.startswith(f"parallelism={layout}: {tmp_path} ties its input and output embeddings") for e in errors
        ), errors
    assert _errors(parallelism="hsdp", deepspeed_config="none") == []
