"""The plan before a run (components/estimate/training_plan.py, network.py, plan_text.py): the issue's worked example,
what each layout moves over which link, bandwidth settings, the prepared dataset's figures, and ``python -m
pipelines.run ... --plan``."""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from components.estimate.memory import GIB, estimate_gib
from components.estimate.network import GB, INTER, INTRA, collectives, zero_config
from components.estimate.plan_text import read_stats
from components.estimate.training_plan import (
    alternatives,
    architecture,
    faster_layout,
    format_plan,
    lighter_recompute,
    plan,
)
from components.models.shape import load_architecture, model_shape
from components.settings import Settings
from components.train.config import job_zero_config, zero3_sizes
from pipelines import params as P
from tests.helpers.pipeline_args import reference_arguments

ROOT = Path(__file__).resolve().parents[3]
FULL, LORA, QLORA = "qwen3-30b-a3b-full", "qwen3-30b-a3b-lora", "qwen3-32b-qlora"
# What the issue's arithmetic takes for the network: each GPU's whole ring traffic through 50 GB/s, i.e. a node's
# traffic through one 400 Gb/s link (50 GB/s / 8 GPUs per node).
ONE_400G_LINK_PER_NODE = 50.0 / 8


# The clusters these plans describe have their RDMA network requested (InfiniBand, as on a DGX H100); without it NCCL
# runs over TCP between nodes (tests/validate/test_network.py).
RDMA = {"rdma_resource": "rdma/ib", "rdma_per_pod": 8, "ipc_lock": True}


# The micro-batch the worked examples below were computed at (the reference preset's before issue 28: 1 row x 4
# micro-steps, the whole logits); the shipped 4 x 1 with the chunked loss has tests of its own.
ONE_ROW = {"per_device_train_batch_size": 1, "gradient_accumulation_steps": 4, "chunked_cross_entropy": False}


def _settings(preset: str, **over) -> dict:
    values = P.resolve(preset)
    values.update({**RDMA, **(ONE_ROW if preset == FULL else {}), **over})
    return values


def _plan(preset: str, stats=None, **over):
    values = _settings(preset, **over)
    return plan(values, architecture(values["model_name_or_path"]), stats)


def test_zero3_reference_job_reproduces_the_issues_worked_example():
    """The worked example: ~57 GB per collective per GPU, ~170 GB per micro-step; compute ~1.33 s (23.1 GFLOP per
    token x 4096 plus the recomputed layers' forward, at 93 TFLOP/s); ~3.4 s of communication and ~1,200 tokens/s
    per GPU when that traffic crosses 50 GB/s per GPU. The example's compute speed, 93, was the default until the
    whole-model measurements of 2026-11-27 (122) and 2026-11-28 (159, benchmarks/results/plan.md): the arithmetic is
    the example's."""
    p = _plan(FULL, achieved_tflops_per_gpu=93.0)
    assert (p.layout, p.num_nodes, p.gpus_per_node, p.micro_batch, p.accumulation) == ("ZeRO-3", 2, 8, 1, 4)
    assert [c.bytes_per_gpu / GB for c in p.collectives] == pytest.approx([57.2] * 3, abs=0.1)
    assert p.bytes_per_gpu(per="micro-step") / GB == pytest.approx(171.7, abs=0.1)
    # The config's matmuls see 3.04B active parameters (the embedding lookup counts 0, the lm_head is a matmul).
    assert p.flops_per_token_dense == pytest.approx(6 * 3.042e9, rel=1e-3)
    # Attention per document, one document filling the row (T = 2048.5): 23.1 GFLOP per token in all.
    assert p.attention_length == 2048.5
    assert (p.flops_per_token_dense + p.flops_per_token_attention) / 1e9 == pytest.approx(23.08, abs=0.01)
    assert p.compute_s == pytest.approx(1.328, abs=0.002)

    # Every byte of a GPU's ring through a node's single 400 Gb/s link: the issue's 3.4 s and ~1,200 tokens/s.
    slow = _plan(FULL, inter_node_gb_per_s=ONE_400G_LINK_PER_NODE, achieved_tflops_per_gpu=93.0)
    assert slow.comm_s[INTER] / 4 == pytest.approx(3.43, abs=0.01)
    assert slow.bottleneck == INTER and 1100 < slow.tokens_per_s_per_gpu < 1250

    # A DGX H100 has 8 such links per node, and a ring spanning nodes leaves each node once per channel (one per NIC):
    # 1/8 of a GPU's ring traffic crosses its own NIC, so the reference job is compute-bound there.
    assert p.bytes_per_gpu(INTER, per="micro-step") / GB == pytest.approx(171.7 / 8, abs=0.05)
    assert p.comm_s[INTER] / 4 == pytest.approx(0.43, abs=0.01) and p.bottleneck == "compute"
    assert p.tokens_per_s_per_gpu == pytest.approx(4096 * 4 / p.step_s)
    assert 3000 < p.tokens_per_s_per_gpu < 3100


def test_memory_is_the_estimate_validate_inputs_checks():
    p = _plan(FULL)
    shape = model_shape(load_architecture(p.model))
    zero = job_zero_config("zero3", 2, 8, shape.largest_layer)  # ZeRO-3 sized for this model, as the trainer runs it
    assert p.memory_gib == estimate_gib(shape, "full", zero, 16, 4096, 1)
    assert p.memory_gib["total"] == pytest.approx(45.3, abs=0.1) and p.fits


def test_hpz_keeps_the_secondary_partition_in_the_memory_estimate():
    shape = model_shape(load_architecture("Qwen/Qwen3-30B-A3B"))
    z3 = estimate_gib(shape, "full", zero_config("zero3"), 16, 4096, 1)
    hpz = estimate_gib(shape, "full", zero_config("zero3_hpz"), 16, 4096, 1)
    assert hpz["model_states"] - z3["model_states"] == pytest.approx(2 * shape.total / 8 / GIB, abs=1e-6)
    sized = {**zero_config("zero3_hpz"), **zero3_sizes(shape.largest_layer)}
    assert _plan(FULL, deepspeed_config="zero3_hpz").memory_gib == estimate_gib(shape, "full", sized, 16, 4096, 1)


def test_hpz_gathers_within_the_node_after_each_steps_first_forward():
    z3, hpz = _plan(FULL), _plan(FULL, deepspeed_config="zero3_hpz")
    assert hpz.layout == "ZeRO++ hpZ (ZeRO-3, partition 8)"
    crossing = {c.name: c.times_per_step(4) for c in hpz.collectives if c.link == INTER}
    assert crossing == {"parameters, forward": 1, "gradients": 4}
    assert all(c.ranks == 8 and c.nodes == 1 for c in hpz.collectives if c.link == INTRA)
    # 12 collectives of 2P cross nodes per step under ZeRO-3, 5 under hpZ.
    assert z3.bytes_per_gpu(INTER) / hpz.bytes_per_gpu(INTER) == pytest.approx(12 / 5)
    # The same total traffic per GPU (8 ranks instead of 16 in the inner rings: (n-1)/n is a little smaller).
    assert hpz.bytes_per_gpu() < z3.bytes_per_gpu()


def test_lora_gathers_the_frozen_base_but_reduces_only_the_adapters():
    p = _plan(LORA)
    assert (p.method, p.layout, p.micro_batch, p.accumulation) == ("lora", "ZeRO-3", 2, 2)
    sizes = {c.name: c.size for c in p.collectives}
    assert sizes["parameters, forward"] == sizes["parameters, backward"] == 2 * p.total_params
    assert sizes["gradients"] == 2 * p.trainable_params and 0.6e9 < p.trainable_params < 0.7e9
    # Under hpZ the frozen base keeps its secondary partition all run long: only the adapters cross nodes.
    hpz = _plan(LORA, deepspeed_config="zero3_hpz")
    assert {c.size for c in hpz.collectives if c.link == INTER} == {2 * p.trainable_params}
    assert hpz.bytes_per_gpu(INTER) < p.bytes_per_gpu(INTER) / 40
    # LoRA skips the frozen nn.Linear weights' gradients; the fused experts' are computed (PEFT's W + BA).
    full = _plan(FULL, per_device_train_batch_size=2, gradient_accumulation_steps=2)
    assert p.compute_s < full.compute_s and p.compute_s > 0.85 * full.compute_s


def test_ddp_all_reduces_once_per_step_within_one_node():
    p = _plan(QLORA)
    assert p.layout == "DDP" and p.num_nodes == 1
    [c] = p.collectives
    assert (c.kind, c.link, c.times_per_step(p.accumulation)) == ("all-reduce", INTRA, 1)
    assert c.size == 4 * p.trainable_params and p.bytes_per_gpu(INTER) == 0


def test_zero2_reduce_scatters_every_micro_step_and_gathers_after_the_step():
    p = _plan(QLORA, method="lora", deepspeed_config="zero2", num_nodes=2)
    kinds = {(c.kind, c.when) for c in p.collectives}
    assert kinds == {("reduce-scatter", "every"), ("all-gather", "after")}


def test_a_slower_network_shows_what_it_costs():
    steps = [_plan(FULL, inter_node_gb_per_s=bw).step_s for bw in (50.0, 25.0, 6.25, 3.125, 1.5625)]
    assert steps == sorted(steps) and steps[-1] > 10 * steps[0]
    # Within the node nothing changes.
    assert _plan(QLORA, inter_node_gb_per_s=1.0).step_s == _plan(QLORA).step_s


def test_recomputation_is_the_layers_forward_again_counted_apart():
    on, off = _plan(FULL), _plan(FULL, activation_checkpointing=False)
    # The decoder layers' forward runs twice; the lm_head's forward (6.2% of the model FLOPs here) runs once.
    assert off.recompute_flops_per_micro_step == 0 and on.recompute_flops_per_micro_step > 0
    assert on.flops_per_micro_step == pytest.approx(off.flops_per_micro_step + on.recompute_flops_per_micro_step)
    assert 1.29 < on.compute_s / off.compute_s < 4 / 3
    # The default: the reference preset's whole model measured on one H100, recomputation included (PlanSettings).
    assert on.achieved_tflops == 159.0 and _plan(FULL, achieved_tflops_per_gpu=318.0).compute_s == pytest.approx(
        on.compute_s / 2
    )


def test_wall_time_and_gpu_hours_follow_the_tokens_and_epochs():
    p = _plan(FULL, dataset_tokens_estimate=1_000_000_000, num_train_epochs=1.0)
    assert p.dataset_source == "the setting dataset_tokens_estimate"
    assert p.steps == pytest.approx(1e9 / (4096 * 4 * 16), abs=1)
    assert p.wall_s == pytest.approx(p.steps * p.step_s) and p.gpu_hours == pytest.approx(p.wall_s * 16 / 3600)
    assert _plan(FULL, max_steps=10).steps == 10


def test_the_prepared_datasets_statistics_replace_the_estimate(tmp_path):
    stats = {
        "train": {"rows": 20000, "tokens": 73_728_000, "packing_efficiency": 0.9},
        "length_histogram": [{"from": 0, "to": 511, "count": 900}, {"from": 512, "to": 1023, "count": 100}],
    }
    p = _plan(FULL, stats=stats)
    assert p.dataset_source == "the prepared dataset's statistics"
    assert p.steps == 20000 * 2 // 64 and p.dataset_tokens == 73_728_000
    assert p.real_token_fraction == 0.9 and p.tokens_per_s_per_gpu == pytest.approx(0.9 * 4096 * 4 / p.step_s)
    mids = [(255.5, 900), (767.5, 100)]
    expected = sum(c * n * (n + 1) / 2 for n, c in mids) / sum(c * n for n, c in mids)
    assert p.attention_length == pytest.approx(expected) and p.compute_s < _plan(FULL).compute_s
    # The artifact's metadata works as well as stats.json.
    meta = tmp_path / "meta.json"
    meta.write_text(json.dumps({"train_rows": 20000, "train_tokens": 73_728_000, "packing_efficiency": 0.9}))
    assert read_stats(str(meta))["train"]["rows"] == 20000
    (tmp_path / "bad.json").write_text("{}")
    with pytest.raises(ValueError, match="no training split's row count"):
        read_stats(str(tmp_path / "bad.json"))


def test_alternatives_keep_the_global_batch_and_name_a_faster_fitting_layout():
    values = _settings(FULL, inter_node_gb_per_s=ONE_400G_LINK_PER_NODE)
    config = architecture(values["model_name_or_path"])
    options = alternatives(values, config)
    # The run's own + 4 layouts (zero3, zero3_hpz, hsdp, hsdp_ep) x (1, 2, 4 rows) - itself.
    assert options[0][0] == {} and len(options) == 12
    assert all(p.micro_batch * p.accumulation == 4 for _, p in options)
    assert {p.layout for _, p in options} == {
        "ZeRO-3",
        "ZeRO++ hpZ (ZeRO-3, partition 8)",
        "HSDP (FSDP2: sharded in a node, replicated over nodes)",
        "HSDP + EP (FSDP2, experts parallel in a node)",
    }
    assert options[1][0] == {"per_device_train_batch_size": 2, "gradient_accumulation_steps": 2}  # zero3 unchanged
    # Through one 400 Gb/s link per node, the forward's gather is what remains: ZeRO-3 and hpZ gather the same for the
    # first forward of a step, so with one micro-step they tie; the one needing less memory is named.
    over, best = faster_layout(values, config)
    assert over == {"per_device_train_batch_size": 4, "gradient_accumulation_steps": 1}
    # The layout moves the bound to compute: 2.6x the preset's ZeRO-3 on that network (at 93 TFLOP/s).
    assert best.fits and best.tokens_per_s_per_gpu > 2.5 * options[0][1].tokens_per_s_per_gpu
    # Through half that, hpZ's fewer crossings win.
    over, best = faster_layout(_settings(FULL, inter_node_gb_per_s=ONE_400G_LINK_PER_NODE / 2), config)
    assert over == {"deepspeed_config": "zero3_hpz", "per_device_train_batch_size": 4, "gradient_accumulation_steps": 1}
    # At a DGX H100's network every layout is compute-bound: nothing is 10% faster.
    assert faster_layout(_settings(FULL), config) is None


def test_the_plan_reads_settings_objects_as_well():
    values = _settings(FULL)
    config = architecture(values["model_name_or_path"])
    assert plan(Settings.from_flat(values), config).step_s == plan(values, config).step_s


def test_a_hub_id_with_no_config_here_says_so_naming_the_setting(tmp_path, monkeypatch):
    from huggingface_hub import constants

    # The cache as HF_HUB_CACHE names it; huggingface_hub reads the variable once, at its import.
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    with pytest.raises(ValueError, match=r"model_name_or_path='acme/unknown-7b'.*hf download acme/unknown-7b"):
        architecture("acme/unknown-7b")
    # A config in the Hugging Face cache is read from there, without a download.
    snap = tmp_path / "hub" / "models--acme--unknown-7b" / "snapshots" / ("a" * 40)
    snap.mkdir(parents=True)
    (snap / "config.json").write_text(json.dumps(load_architecture("Qwen/Qwen3-32B")))
    (tmp_path / "hub" / "models--acme--unknown-7b" / "refs").mkdir()
    (tmp_path / "hub" / "models--acme--unknown-7b" / "refs" / "main").write_text("a" * 40)
    assert architecture("acme/unknown-7b") == load_architecture("Qwen/Qwen3-32B")


def _cli(*args, env=None):
    start = time.monotonic()
    result = subprocess.run(
        [sys.executable, "-m", "pipelines.run", *args], cwd=ROOT, capture_output=True, text=True, timeout=120, env=env
    )
    return result, time.monotonic() - start


def test_plan_on_the_command_line_needs_no_cluster_gpu_or_download():
    result, seconds = _cli("--preset", FULL, "--plan", *[f"-p{k}={v}" for k, v in RDMA.items()])
    assert result.returncode == 0, result.stderr
    assert seconds < 10  # 0.3 s on a laptop; loose for a loaded CI machine
    out = result.stdout
    assert "ZeRO-3" in out and "5,216 tokens/s per GPU" in out and "bottleneck: compute" in out
    assert "171.7 GB, 21.5 GB of it over the network" in out and "44.2 GiB per GPU of 80" in out
    assert "from the setting dataset_tokens_estimate" in out and "GPU-hours" in out
    # Compute-bound there: recomputing every 2nd layer instead of every one fits (72.7 GiB of 80) and is faster.
    assert "recompute: only what memory needs, -p recompute_every_n_layers=2: 5,901 tokens/s per GPU (x1.13)" in out


def test_plan_on_a_slow_network_names_the_link_and_a_faster_layout(tmp_path):
    stats = tmp_path / "stats.json"
    stats.write_text(json.dumps({"train": {"rows": 1000, "tokens": 4_000_000, "packing_efficiency": 1.0}}))
    network = ["-p", f"inter_node_gb_per_s={ONE_400G_LINK_PER_NODE}", "-p", "rdma_resource=rdma/ib"]
    result, _ = _cli("--plan", str(stats), *network, *[f"-p{k}={v}" for k, v in ONE_ROW.items()])
    assert result.returncode == 0, result.stderr
    assert "bottleneck: inter-node link" in result.stdout and "the prepared dataset's statistics" in result.stdout
    assert "faster:   -p per_device_train_batch_size=4 -p gradient_accumulation_steps=1:" in result.stdout


def test_plan_of_an_unknown_hub_model_is_one_line_naming_the_setting(tmp_path):
    env = {**os.environ, "HF_HUB_CACHE": str(tmp_path), "HF_HUB_OFFLINE": "1"}
    result, _ = _cli("--plan", "-p", "model_name_or_path=acme/unknown-7b", env=env)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert result.stderr.startswith("error: model_name_or_path='acme/unknown-7b'")


def test_plan_of_the_local_run_says_it_is_for_gpu_jobs():
    result, _ = _cli("--preset", "local-tiny", "--plan")
    assert result.returncode == 0 and "the plan is for GPU jobs" in result.stdout


def test_validate_inputs_logs_the_plan(cluster, caplog):
    from components.validate.component import validate_inputs

    caplog.set_level("INFO", logger="validate_inputs")
    validate_inputs.python_func(**reference_arguments())
    logged = "\n".join(r.getMessage() for r in caplog.records if r.name == "validate_inputs")
    assert "plan: full fine-tuning of Qwen/Qwen3-30B-A3B-Thinking-2507-FP8, 2 x 8 GPUs, ZeRO-3" in logged
    # The default requests no RDMA device: NCCL runs over TCP between nodes, and the logged plan says so.
    assert "over TCP on the pod network (no rdma_resource requested" in logged
    assert "1,182 tokens/s per GPU, bottleneck: inter-node link" in logged


HSDP = {"parallelism": "hsdp", "deepspeed_config": "none"}
# benchmarks/netns_bytes.py's tiny Qwen3-MoE.
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
HSDP_EP = {"parallelism": "hsdp_ep", "deepspeed_config": "none"}


def test_hsdp_keeps_the_gathers_in_the_node_and_all_reduces_each_gpus_shard_across_nodes_once_per_step():
    """transformers' DistributedConfig(dp_replicate_size=2, fsdp_size=8): every micro-step all-gathers (forward and
    backward) and reduce-scatters within the node; across nodes one all-reduce of each GPU's fp32 gradient shard,
    deferred to the last micro-step (Trainer._defer_fsdp_gradient_reduction)."""
    p = _plan(FULL, **HSDP)
    shape = model_shape(architecture(p.model))
    assert p.layout.startswith("HSDP (FSDP2") and p.parallelism == "hsdp"
    inter = [c for c in p.collectives if c.link == INTER]
    assert len(inter) == 1
    (across,) = inter
    assert (across.kind, across.ranks, across.nodes, across.per_node, across.when) == ("all-reduce", 2, 2, 1, "last")
    assert across.size == 4 * shape.total / 8  # the fp32 shard of a GPU
    # One rank per node: its NIC carries all of it, 2 S (2 - 1) / 2 = S per GPU and optimizer step.
    assert p.bytes_per_gpu(INTER) == pytest.approx(4 * shape.total / 8)
    intra = [c for c in p.collectives if c.link == INTRA]
    assert [(c.kind, c.ranks, c.when) for c in intra] == [("all-gather", 8, "every")] * 2 + [
        ("reduce-scatter", 8, "every")
    ]
    # Against ZeRO-3: 85.9 GB per GPU and step over the network, 15.3 under HSDP.
    z3 = _plan(FULL)
    assert z3.bytes_per_gpu(INTER) / p.bytes_per_gpu(INTER) > 5
    # Model states over one node's 8 GPUs: 16 bytes per parameter / 8, and the gathered blocks.
    assert p.memory_gib["model_states"] == pytest.approx((2 * shape.total + 10 * shape.largest_block) / GIB)
    assert p.fits and p.bottleneck == "compute"


def test_hsdp_ep_trades_the_expert_gathers_for_token_all_to_alls_within_the_node():
    p, hsdp = _plan(FULL, **HSDP_EP), _plan(FULL, **HSDP)
    shape = model_shape(architecture(p.model))
    a2a = [c for c in p.collectives if c.kind == "all-to-all"]
    tokens, k = 4096, 8  # one 4096-token row per micro-step, Qwen3-30B-A3B's top-8
    per_pass = 2 * shape.sparse_layers * tokens * k * shape.hidden * 2  # to the experts and back, bf16
    assert [(c.size, c.phase, c.link) for c in a2a] == [
        (per_pass, "forward", INTRA),
        (2 * per_pass, "backward", INTRA),
    ]  # + recomputed forward
    gathers = [c for c in p.collectives if c.kind == "all-gather"]
    assert all(c.size == 2 * (shape.total - shape.expert_params) for c in gathers)
    assert p.bytes_per_gpu(INTRA) < hsdp.bytes_per_gpu(INTRA) / 3
    assert p.bytes_per_gpu(INTER) == hsdp.bytes_per_gpu(INTER)  # the same gradient shards cross nodes
    assert p.memory_gib["total"] < hsdp.memory_gib["total"]  # no expert block gathered


def test_hsdp_runs_the_reference_job_and_is_weighed_with_the_others_on_a_slow_network():
    """On one 200 Gb/s link per node HSDP moves less than any ZeRO-3 layout. Its export now holds one layer and one
    shard on rank 0's host (it gathered the fp32 model, 114 GiB, past the pod's 128 GiB), so it runs, and the plan
    weighs it: the fastest layout that fits wins (hpZ at 4 rows: HSDP at 4 rows does not fit an H100)."""
    values = _settings(FULL, inter_node_gb_per_s=3.125)
    config = architecture(values["model_name_or_path"])
    options = alternatives(values, config)
    z3 = options[0][1]
    hsdp = [p for over, p in options if over.get("parallelism") == "hsdp" and p.micro_batch == 1]
    assert hsdp and hsdp[0].tokens_per_s_per_gpu > 2.5 * z3.tokens_per_s_per_gpu  # 3.0x at 93 TFLOP/s, more at 122
    assert hsdp[0].runs and hsdp[0].blocked is None and "does not run" not in format_plan(hsdp[0])
    assert "every rank writes its own shards" in format_plan(hsdp[0])
    over, best = faster_layout(values, config)
    fitting = [p for _, p in options if p.runs]
    assert round(best.tokens_per_s_per_gpu) == max(round(p.tokens_per_s_per_gpu) for p in fitting)
    assert over == {"deepspeed_config": "zero3_hpz", "per_device_train_batch_size": 4, "gradient_accumulation_steps": 1}
    assert plan({**values, **HSDP}, TINY_MOE).blocked is None


def test_the_cpu_measurement_and_the_plan_count_the_same_hsdp_collectives():
    """benchmarks/netns_bytes.py predicts the tiny MoE's bytes across the pod boundary with ``collectives``: HSDP's
    all-reduce of each rank's fp32 shard (4P / 2) between the two pods is all that crosses."""
    shape = model_shape(TINY_MOE)
    items = collectives(shape, "full", {}, 2, 2, shape.total, "hsdp")
    crossing = [c for c in items if c.link == INTER]
    assert [(c.kind, c.size, c.dtype_bytes) for c in crossing] == [("all-reduce", 4 * shape.total / 2, 4)]


def test_recomputing_fewer_layers_trades_memory_for_compute_in_the_plan_and_the_fit():
    every, half, none = (
        _plan(FULL),
        _plan(FULL, recompute_every_n_layers=2),
        _plan(FULL, activation_checkpointing=False),
    )
    # Half the layers' forward again (24 of 48), and none without checkpointing.
    assert half.recompute_flops_per_micro_step == pytest.approx(every.recompute_flops_per_micro_step / 2)
    assert none.recompute_flops_per_micro_step == 0
    assert every.compute_s > half.compute_s > none.compute_s
    # The layers not checkpointed keep their activations: the fit counts them (it did not, before this setting).
    acts = [p.memory_gib["activations"] for p in (every, half, none)]
    assert acts[0] < acts[1] < acts[2] and acts[2] > 2.5 * acts[0]
    assert none.fits and none.tokens_per_s_per_gpu > every.tokens_per_s_per_gpu


def test_the_chunked_loss_keeps_only_a_chunk_of_logits_in_the_fit():
    """4 rows of 4096 tokens: 16,384 x 151,936 logits at 10 bytes each (bf16, fp32, gradient) in the plain loss;
    1,024 tokens' worth with chunked_cross_entropy (components/train/trainer/chunked_loss.py)."""
    four = dict(per_device_train_batch_size=4, gradient_accumulation_steps=1)
    plain, chunked = _plan(FULL, **four), _plan(FULL, chunked_cross_entropy=True, **four)
    saved = (plain.memory_gib["activations"] - chunked.memory_gib["activations"]) * GIB
    assert saved == pytest.approx(10 * (16384 - 1024) * 151936, rel=1e-9)
    assert chunked.memory_gib["total"] < 46 and chunked.fits


def test_the_reference_preset_runs_its_global_batch_as_one_micro_step_of_4_rows_with_the_chunked_loss():
    """Issue 28: the presets take the largest micro-batch that fits with the same global batch. 64 sequences over 16
    GPUs are 4 rows each: one micro-step of 4 x 4096 tokens, which fits an H100 with the chunked loss at 44.2 GiB
    (65.9 with the whole logits), and moves each layer's ZeRO-3 gathers once per 4 rows instead of once per row."""
    shipped = P.resolve(FULL)
    p = plan({**shipped, **RDMA}, architecture(shipped["model_name_or_path"]))
    assert (p.micro_batch, p.accumulation) == (4, 1) and p.micro_batch * p.accumulation * 16 == 64
    assert p.runs and p.memory_gib["total"] == pytest.approx(44.2, abs=0.05)
    whole = plan({**shipped, **RDMA, "chunked_cross_entropy": False}, architecture(shipped["model_name_or_path"]))
    assert whole.memory_gib["total"] == pytest.approx(65.9, abs=0.05)
    # Over TCP (no rdma_resource) the gathers are the step: a quarter of them per token, four times the tokens/s.
    config = architecture(shipped["model_name_or_path"])
    tcp, tcp_one_row = plan(shipped, config), plan({**shipped, **ONE_ROW}, config)
    assert tcp.tokens_per_s_per_gpu > 3.9 * tcp_one_row.tokens_per_s_per_gpu


def test_the_least_recomputation_that_fits_is_named_where_compute_bounds_the_job():
    """recompute_every_n_layers n recomputes layers i % n == 0: memory grows with n, compute falls. The plan names the
    largest n (or no checkpointing) whose memory fit passes, and only where it makes the step faster."""
    preset = dict(P.resolve(FULL))  # as shipped: 4 rows x 1, the chunked loss
    values = {**preset, **RDMA}
    config = architecture(values["model_name_or_path"])
    over, best = lighter_recompute(values, config)
    assert over == {"recompute_every_n_layers": 2} and best.runs
    assert best.memory_gib["total"] <= best.gpu_memory_gib
    assert not plan({**values, "recompute_every_n_layers": 3}, config).fits  # the next stride keeps too much
    assert best.tokens_per_s_per_gpu > 1.1 * plan(values, config).tokens_per_s_per_gpu
    # At 1 row per micro-batch the activations are a quarter: no recomputation at all fits.
    assert lighter_recompute(_settings(FULL), config)[0] == {"activation_checkpointing": False}
    # Waiting on the network (TCP: the preset as it ships), less recomputation buys nothing: nothing named.
    assert lighter_recompute(preset, config) is None
    # Nothing recomputed: nothing to lighten.
    assert lighter_recompute({**values, "activation_checkpointing": False}, config) is None
