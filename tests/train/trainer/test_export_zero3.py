"""Issue 9, defects 6 and 11: what ZeRO-3 runs write, checked by loading it back.

- Checkpoints are DeepSpeed's sharded state only (no consolidated weights gathered on rank 0), and a run
  resumes from them.
- ``final/`` is gathered one layer at a time and written shard by shard; it holds exactly what the
  partitions held (DeepSpeed's own ``zero_to_fp32`` reconstruction) under the tensor names
  ``save_pretrained`` writes (per-expert for Qwen3-MoE, as vLLM loads it).
- LoRA under ZeRO-3 with ``merge_lora`` ends with a plain merged model that loads and generates, equal to
  PEFT's own merge of the base and the saved adapter.

The multi-process tests run the real entry point under 2-rank torchrun on CPU (gloo); the ``gpu`` test
does the same on every visible GPU with bf16 and NCCL.
"""

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors import safe_open

from components.train.config import deepspeed_config_path
from components.train.launcher.local_torchrun import run_torchrun
from components.train.trainer.export import export_gathered, merge_adapter
from tests.helpers.trainer import make_workdir, trainer_config

LORA_TARGETS = ("q_proj", "v_proj", "gate_proj")
DENSE_ADAPTED = tuple(f"{t}.weight" for t in LORA_TARGETS)
MOE_ADAPTED = ("q_proj.weight", "k_proj.weight", "v_proj.weight", "o_proj.weight", "mlp.experts.")


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    return make_workdir(tmp_path_factory.mktemp("export"))


def _tiny(arch: str, vocab_size: int, **ids):
    """A tiny randomly initialised Qwen3 (tied embeddings) or Qwen3-MoE (4 experts, untied)."""
    from transformers import Qwen3Config, Qwen3ForCausalLM, Qwen3MoeConfig, Qwen3MoeForCausalLM

    torch.manual_seed(0)
    shape = dict(
        vocab_size=vocab_size,
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        intermediate_size=96,
        **ids,
    )
    if arch == "qwen3":
        return Qwen3ForCausalLM(Qwen3Config(tie_word_embeddings=True, **shape))
    return Qwen3MoeForCausalLM(Qwen3MoeConfig(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32, **shape))


def _tensors(folder: Path) -> dict:
    """Every tensor in a folder's safetensors files, by its on-disk name."""
    found = {}
    for path in sorted(folder.glob("*.safetensors")):
        with safe_open(str(path), "pt") as f:
            for key in f.keys():
                assert key not in found, f"{key} is in two shards"
                found[key] = f.get_tensor(key)
    return found


def _base(root: Path, arch: str) -> Path:
    """The fixture's dense base, or a tiny Qwen3-MoE with the fixture's tokenizer (written by save_pretrained)."""
    if arch == "qwen3":
        return root / "base"
    path = root / "moe-base"
    if not path.exists():
        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(root / "base")
        model = _tiny(
            "qwen3_moe", len(tok), pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id, bos_token_id=None
        )
        model.save_pretrained(path)
        tok.save_pretrained(path)
    return path


@pytest.mark.parametrize("arch", ["qwen3", "qwen3_moe"])
def test_the_shard_by_shard_export_writes_what_save_pretrained_writes(tmp_path, arch):
    from transformers import AutoModelForCausalLM

    _tiny(arch, 128).save_pretrained(tmp_path / "reference")
    # Loaded as the trainer loads it: from_pretrained records the checkpoint's conversion (per-expert -> fused).
    model = AutoModelForCausalLM.from_pretrained(tmp_path / "reference")
    expected = _tensors(tmp_path / "reference")
    if arch == "qwen3_moe":  # the names vLLM loads: one tensor per expert, not transformers' fused 3-D ones
        assert "model.layers.0.mlp.experts.3.gate_proj.weight" in expected
        assert not any(k.endswith("experts.gate_up_proj") for k in expected)
    else:  # tied: the head is not written twice
        assert "lm_head.weight" not in expected

    # A small shard limit: several shards plus the index, as for a 30B model.
    export_gathered(model, str(tmp_path / "export"), max_shard_bytes=64 * 1024)
    written = _tensors(tmp_path / "export")
    assert written.keys() == expected.keys()
    assert all(torch.equal(written[k], expected[k]) for k in expected)
    index = json.loads((tmp_path / "export" / "model.safetensors.index.json").read_text())
    shards = sorted(p.name for p in (tmp_path / "export").glob("*.safetensors"))
    assert len(shards) > 2 and sorted(set(index["weight_map"].values())) == shards
    assert index["weight_map"].keys() == expected.keys()
    assert index["metadata"]["total_parameters"] == model.num_parameters()
    reloaded = AutoModelForCausalLM.from_pretrained(tmp_path / "export")
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in reloaded.state_dict().items())


def test_merge_adapter_reloads_the_base_outside_a_live_zero3_config(tmp_path):
    """The base is loaded whole on one process even while the trainer's ZeRO-3 config is alive (QLoRA's path)."""
    from peft import LoraConfig, PeftModel, get_peft_model
    from transformers import AutoModelForCausalLM
    from transformers.integrations import HfDeepSpeedConfig, is_deepspeed_zero3_enabled

    _tiny("qwen3", 128).save_pretrained(tmp_path / "base")
    peft = get_peft_model(
        AutoModelForCausalLM.from_pretrained(tmp_path / "base"),
        LoraConfig(r=4, target_modules=["q_proj"], init_lora_weights=False),
    )
    peft.save_pretrained(tmp_path / "adapter")
    reference = (
        PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(tmp_path / "base"), tmp_path / "adapter")
        .merge_and_unload()
        .state_dict()
    )

    # What the Trainer holds during a ZeRO-3 run: from_pretrained would build the model inside zero.Init.
    live = HfDeepSpeedConfig({"zero_optimization": {"stage": 3}, "train_micro_batch_size_per_gpu": 1})
    assert is_deepspeed_zero3_enabled()
    merge_adapter(str(tmp_path / "base"), str(tmp_path / "adapter"), str(tmp_path / "merged"))
    assert is_deepspeed_zero3_enabled()  # restored for the rest of the run
    del live
    merged = AutoModelForCausalLM.from_pretrained(tmp_path / "merged").state_dict()
    assert all(torch.equal(merged[k], reference[k]) for k in reference)


def _checkpoint_files(checkpoint: Path) -> set[str]:
    return {p.relative_to(checkpoint).as_posix() for p in checkpoint.rglob("*") if p.is_file()}


def _weight_files(files: set[str]) -> list[str]:
    """Consolidated weights (model or adapter, safetensors or torch): gathered whole on rank 0 to be written."""
    return [
        f for f in files if f.endswith(".safetensors") or Path(f).name.startswith(("pytorch_model", "adapter_model"))
    ]


def _assert_deepspeed_shards_only(checkpoint: Path, step: int) -> None:
    files = _checkpoint_files(checkpoint)
    assert not _weight_files(files), files
    for rank in (0, 1):
        assert f"global_step{step}/zero_pp_rank_{rank}_mp_rank_00_model_states.pt" in files, files
        assert any(f.endswith(f"zero_pp_rank_{rank}_mp_rank_00_optim_states.pt") for f in files), files
    assert "COMPLETE" in files and "trainer_state.json" in files


@pytest.mark.slow
@pytest.mark.parametrize("arch", ["qwen3", "qwen3_moe"])
def test_zero3_checkpoints_are_deepspeed_shards_resume_works_and_final_is_the_partitioned_model(root, arch, capfd):
    from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint
    from transformers import AutoModelForCausalLM

    base = _base(root, arch)
    name = f"z3-{arch}"
    config = trainer_config(
        root,
        name,
        model_name_or_path=str(base),
        deepspeed=deepspeed_config_path("zero3"),
        max_steps=6,
        save_steps=3,
        logging_steps=3,
    )
    run_torchrun(config, nproc_per_node=2)
    out = root / name
    trained = capfd.readouterr().out
    assert json.loads((out / "metrics.json").read_text())["world_size"] == 2
    if arch == "qwen3_moe":  # (was test_trainer_moe.py's own ZeRO-3 run of the same model: issue 38, CI's time)
        assert "ZeRO-3 leaf modules: 2 x Qwen3MoeSparseMoeBlock" in trained  # one per layer
    _assert_deepspeed_shards_only(out / "checkpoint-3", 3)
    _assert_deepspeed_shards_only(out / "checkpoint-6", 6)

    # final/ holds what the partitions hold: DeepSpeed's own reconstruction from the step-6 shards (fp32 on CPU).
    partitioned = get_fp32_state_dict_from_zero_checkpoint(str(out / "checkpoint-6"))
    final = AutoModelForCausalLM.from_pretrained(out / "final").state_dict()
    assert partitioned.keys() == final.keys()
    for key, value in partitioned.items():
        torch.testing.assert_close(final[key], value, msg=key)
    start = AutoModelForCausalLM.from_pretrained(base).state_dict()
    q_proj = "model.layers.0.self_attn.q_proj.weight"
    assert not torch.equal(final[q_proj], start[q_proj])
    # Under the names save_pretrained wrote for the base (per-expert tensors for the MoE), every parameter there.
    assert _tensors(out / "final").keys() == _tensors(base).keys()
    loaded = AutoModelForCausalLM.from_pretrained(out / "final")
    assert loaded.num_parameters() == AutoModelForCausalLM.from_pretrained(base).num_parameters()
    assert json.loads((out / "final" / "config.json").read_text())["use_cache"] is True

    # Resume from a sharded checkpoint: without the last one the run picks up at step 3 and ends the same.
    shutil.rmtree(out / "checkpoint-6")
    shutil.rmtree(out / "final")
    (out / "metrics.json").unlink()
    run_torchrun(config, nproc_per_node=2)
    assert "resuming from " + str(out / "checkpoint-3") in capfd.readouterr().out
    assert json.loads((out / "metrics.json").read_text())["global_step"] == 6
    again = AutoModelForCausalLM.from_pretrained(out / "final").state_dict()
    for key, value in final.items():
        torch.testing.assert_close(again[key], value, msg=key)


def _assert_merged_like_peft(base: Path, out: Path, adapted: tuple[str, ...], tolerance: float) -> None:
    """``final/`` of a LoRA run is a plain model: it loads, generates, and is PEFT's merge of base + adapter.

    ``adapted``: name fragments of the on-disk tensors LoRA changes; every other tensor must be the base's.
    """
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    merged, start = _tensors(out / "final"), _tensors(base)
    assert merged.keys() == start.keys()  # no lora_A/B, no base_layer: vLLM serves it without PEFT
    # The base as the run loaded it (bf16 on GPUs): untouched weights come back bit for bit.
    changed = {k for k in start if not torch.equal(merged[k], start[k].to(merged[k].dtype))}
    expected_changed = {k for k in start if any(t in k for t in adapted)}
    assert changed == expected_changed, changed ^ expected_changed

    # PEFT's own merge on one process, written by save_pretrained (per-expert names for the MoE).
    model = AutoModelForCausalLM.from_pretrained(out / "final")
    reference = PeftModel.from_pretrained(
        AutoModelForCausalLM.from_pretrained(base, dtype=model.dtype), out / "adapter"
    )
    reference.merge_and_unload().save_pretrained(out.parent / f"{out.name}-peft-merge")
    expected = _tensors(out.parent / f"{out.name}-peft-merge")
    for key in changed:
        update = (expected[key].float() - start[key].float()).norm()
        error = (merged[key].float() - expected[key].float()).norm()
        assert error <= tolerance * update, (key, error.item(), update.item())

    tok = AutoTokenizer.from_pretrained(out / "final")
    prompt = tok.apply_chat_template(
        [{"role": "user", "content": "Repeat apple twice."}],
        add_generation_prompt=True,
        return_tensors="pt",
        return_dict=True,
    )
    with torch.no_grad():
        generated = model.generate(**prompt, max_new_tokens=4, min_new_tokens=4, do_sample=False)
    new = generated[0, prompt["input_ids"].shape[1] :]
    assert len(new) == 4 and isinstance(tok.decode(new), str)


@pytest.mark.slow
def test_lora_under_zero3_exports_a_merged_model_that_loads_and_generates(root):
    run_torchrun(
        trainer_config(
            root,
            "z3-lora",
            method="lora",
            lora_target_modules=",".join(LORA_TARGETS),
            lora_r=8,
            deepspeed=deepspeed_config_path("zero3"),
            max_steps=6,
            save_steps=6,
            learning_rate=1e-2,
        ),
        nproc_per_node=2,
    )
    out = root / "z3-lora"
    _assert_deepspeed_shards_only(out / "checkpoint-6", 6)
    assert json.loads((out / "adapter" / "adapter_config.json").read_text())["r"] == 8
    card = json.loads((out / "final" / "model.json").read_text())
    assert card["method"] == "lora" and card["merged"] is True
    _assert_merged_like_peft(root / "base", out, DENSE_ADAPTED, tolerance=1e-4)


@pytest.mark.slow
def test_moe_lora_on_attention_and_expert_tensors_under_zero3_trains_its_adapters_and_exports_a_merged_model(
    root, capfd
):
    """The default MoE targets: attention projections and the fused expert tensors (PEFT ``target_parameters``), on
    2 ranks under ZeRO-3. One run checks the adapters and the merged export (test_lora_moe.py's own run of the same
    model before; issue 38, CI's time)."""
    from peft import PeftModel
    from peft.tuners.lora import ParamWrapper
    from transformers import Qwen3MoeForCausalLM

    from components.models.shape import model_shape
    from components.train.trainer.lora import LORA_TARGETS_MOE

    base = _base(root, "qwen3_moe")
    run_torchrun(
        trainer_config(
            root,
            "z3-moe-lora",
            model_name_or_path=str(base),
            method="lora",
            lora_target_modules="",
            lora_r=16,
            lora_dropout=0.0,
            deepspeed=deepspeed_config_path("zero3"),
            max_steps=8,
            save_steps=8,
            logging_steps=2,
            learning_rate=1e-2,
        ),
        nproc_per_node=2,
    )
    out = root / "z3-moe-lora"
    config = json.loads((base / "config.json").read_text())
    # The base was partitioned by zero.Init before PEFT wrapped it; the adapters still count as memory-fit says.
    trainable = model_shape(config).lora_params(16, LORA_TARGETS_MOE.split(","))
    assert f"LoRA r=16 on {LORA_TARGETS_MOE}: {trainable} trainable parameters" in capfd.readouterr().out
    assert json.loads((out / "metrics.json").read_text())["world_size"] == 2
    _assert_deepspeed_shards_only(out / "checkpoint-8", 8)
    state = json.loads((out / "checkpoint-8" / "trainer_state.json").read_text())
    losses = [e["loss"] for e in state["log_history"] if "loss" in e]
    assert len(losses) == 4 and losses[-1] < 0.95 * losses[0], losses

    # The adapter gathered from the ZeRO-3 shards: full shapes (not the empty partitions ZeRO-3 holds per rank), and
    # trained (B started at zero).
    start = Qwen3MoeForCausalLM.from_pretrained(base)
    ids = torch.arange(1, 17).unsqueeze(0)
    with torch.no_grad():
        base_logits = start(input_ids=ids).logits
    tuned = PeftModel.from_pretrained(start, out / "adapter")
    for layer in tuned.base_model.model.model.layers:
        wrappers = {m.parameter_name: m for m in layer.mlp.modules() if isinstance(m, ParamWrapper)}
        assert sorted(wrappers) == ["down_proj", "gate_up_proj"]
        assert all(w.lora_B["default"].weight.abs().sum() > 0 for w in wrappers.values())
        assert wrappers["gate_up_proj"].lora_A["default"].weight.shape == (
            16 * config["num_local_experts"],
            config["hidden_size"],
        )
        assert layer.self_attn.q_proj.lora_B["default"].weight.abs().sum() > 0
    with torch.no_grad():
        tuned_logits = tuned(input_ids=ids).logits
        merged_logits = tuned.merge_and_unload()(input_ids=ids).logits
    assert not torch.allclose(tuned_logits, base_logits, atol=1e-4)
    torch.testing.assert_close(merged_logits, tuned_logits, atol=1e-4, rtol=1e-4)

    # Every expert's gate/up/down projection changes on disk, the router does not.
    _assert_merged_like_peft(base, out, MOE_ADAPTED, tolerance=1e-4)


@pytest.mark.gpu
@pytest.mark.slow
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_lora_under_zero3_on_gpus_with_bf16_and_nccl(root):
    gpus = torch.cuda.device_count()
    run_torchrun(
        trainer_config(
            root,
            "z3-lora-gpu",
            method="lora",
            lora_target_modules=",".join(LORA_TARGETS),
            lora_r=8,
            deepspeed=deepspeed_config_path("zero3"),
            max_steps=6,
            save_steps=6,
            learning_rate=1e-2,
            use_cpu=False,
            bf16=True,
            ddp_backend="nccl",
        ),
        nproc_per_node=gpus,
    )
    out = root / "z3-lora-gpu"
    assert not _weight_files(_checkpoint_files(out / "checkpoint-6"))
    assert json.loads((out / "metrics.json").read_text())["world_size"] == gpus
    # bf16 weights and a bf16 merge on the GPU against PEFT's on the CPU: agree to bf16 rounding of the update.
    _assert_merged_like_peft(root / "base", out, DENSE_ADAPTED, tolerance=0.1)
