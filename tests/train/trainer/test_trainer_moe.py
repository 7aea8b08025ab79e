"""Qwen3-MoE in the trainer: router auxiliary loss as configured, ZeRO-3 with the sparse block as a leaf."""

import json

import pytest
import torch
from transformers import AutoTokenizer, Qwen3MoeConfig, Qwen3MoeForCausalLM

from components.models.batches import pad_collator
from components.train.config import deepspeed_config_path
from components.train.launcher.local_torchrun import run_torchrun
from components.train.trainer.arguments import SFTConfig
from components.train.trainer.common import load_model
from tests.helpers.trainer import make_workdir, trainer_config


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    """The trainer fixtures with the base replaced by a tiny Qwen3-MoE (4 experts, 2 per token)."""
    root = make_workdir(tmp_path_factory.mktemp("moe"))
    tok = AutoTokenizer.from_pretrained(root / "base")
    torch.manual_seed(0)
    config = Qwen3MoeConfig(
        vocab_size=len(tok),
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        intermediate_size=96,
        num_experts=4,
        num_experts_per_tok=2,
        moe_intermediate_size=32,
        pad_token_id=tok.pad_token_id,
        eos_token_id=tok.eos_token_id,
        bos_token_id=None,
    )
    Qwen3MoeForCausalLM(config).save_pretrained(root / "moe")
    tok.save_pretrained(root / "moe")
    return root


def _loss(root, coef, tmp_path):
    import datasets

    cfg = SFTConfig(output_dir=str(tmp_path), use_cpu=True, router_aux_loss_coef=coef, report_to=[])
    model = load_model(cfg, str(root / "moe"))
    rows = datasets.load_from_disk(str(root / "data"))["train"]
    batch = pad_collator(0)([rows[0], rows[1]])
    with torch.no_grad():
        out = model(**batch)
    return out.loss.item(), out.aux_loss


def test_router_aux_loss_is_added_with_the_configured_weight(root, tmp_path):
    plain, no_aux = _loss(root, 0.0, tmp_path)
    weighted, aux = _loss(root, 0.5, tmp_path)
    assert no_aux is None and aux is not None and aux.item() > 0
    assert weighted == pytest.approx(plain + 0.5 * aux.item(), rel=1e-5)


@pytest.mark.slow
def test_zero3_trains_the_moe_model_on_two_ranks(root, capfd):
    run_torchrun(
        trainer_config(
            root,
            "moe-z3",
            model_name_or_path=str(root / "moe"),
            deepspeed=deepspeed_config_path("zero3"),
            max_steps=6,
            save_steps=6,
            logging_steps=2,
        ),
        nproc_per_node=2,
    )
    metrics = json.loads((root / "moe-z3" / "metrics.json").read_text())
    assert metrics["global_step"] == 6 and metrics["world_size"] == 2
    final = Qwen3MoeForCausalLM.from_pretrained(root / "moe-z3" / "final")
    assert final.num_parameters() == Qwen3MoeForCausalLM.from_pretrained(root / "moe").num_parameters()
    assert "ZeRO-3 leaf modules: 2 x Qwen3MoeSparseMoeBlock" in capfd.readouterr().out  # one per layer
