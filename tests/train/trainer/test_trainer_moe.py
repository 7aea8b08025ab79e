"""Qwen3-MoE in the trainer: router auxiliary loss as configured."""

import pytest
import torch
from transformers import AutoTokenizer, Qwen3MoeConfig, Qwen3MoeForCausalLM

from components.models.batches import pad_collator
from components.train.trainer.arguments import SFTConfig
from components.train.trainer.common import load_model
from tests.helpers.trainer import make_workdir


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


# ZeRO-3 training of this model on two ranks (the sparse block a leaf, one per layer) is asserted by
# tests/train/trainer/test_export_zero3.py's qwen3_moe run, which trains the same model the same way.
