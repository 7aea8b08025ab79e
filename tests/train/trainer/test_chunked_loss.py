"""The chunked causal-LM loss (components/train/trainer/chunked_loss.py) is the model's own loss, computed without
the whole logits: equal losses and gradients on CPU, for Qwen3 and Qwen3-MoE (its router loss included), and equal
training under ZeRO-3 through the real entry point."""

from __future__ import annotations

import json

import pytest
import torch
from transformers import Qwen3Config, Qwen3ForCausalLM, Qwen3MoeConfig, Qwen3MoeForCausalLM

from components.train.trainer import chunked_loss
from components.train.trainer.chunked_loss import chunked_cross_entropy

TINY = dict(
    vocab_size=97,
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=8,
    max_position_embeddings=128,
)


def _model(moe: bool, seed: int = 0):
    torch.manual_seed(seed)
    if moe:
        config = Qwen3MoeConfig(
            **TINY,
            num_experts=4,
            num_experts_per_tok=2,
            moe_intermediate_size=16,
            output_router_logits=True,
            router_aux_loss_coef=0.01,
        )
        return Qwen3MoeForCausalLM(config)
    return Qwen3ForCausalLM(Qwen3Config(**TINY))


def _batch():
    torch.manual_seed(1)
    ids = torch.randint(0, 97, (3, 40))
    labels = ids.clone()
    labels[0, :10] = -100  # a prompt that is not scored
    labels[2, 30:] = -100  # a pad tail
    return ids, labels


def _loss_and_grads(model, ids, labels, **kwargs):
    model.train()
    model.zero_grad()
    loss = model(input_ids=ids, labels=labels, **kwargs).loss
    loss.backward()
    return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("moe", [False, True])
@pytest.mark.parametrize("num_items", [None, 77])
def test_the_chunked_loss_and_its_gradients_are_the_models_own(moe, num_items, monkeypatch):
    ids, labels = _batch()
    kwargs = {"num_items_in_batch": torch.tensor(num_items)} if num_items else {}
    plain_loss, plain_grads = _loss_and_grads(_model(moe), ids, labels, **kwargs)
    # 7 tokens a chunk: 18 chunks, the last one short, some entirely unscored.
    monkeypatch.setattr(chunked_loss, "CHUNK_TOKENS", 7)
    model = chunked_loss.enable(_model(moe))
    calls = []
    model.lm_head.register_forward_hook(lambda module, args, out: calls.append(out.shape[0]))
    loss, grads = _loss_and_grads(model, ids, labels, **kwargs)
    assert loss.item() == pytest.approx(plain_loss.item(), rel=1e-6)
    assert grads.keys() == plain_grads.keys()
    for name, grad in grads.items():
        torch.testing.assert_close(grad, plain_grads[name], rtol=1e-5, atol=1e-7, msg=name)
    # The head never saw more than one chunk of tokens at once (forward, then the backward's recomputation).
    assert max(calls) <= 7 and len(calls) == 2 * -(-ids.numel() // 7)


def test_evaluation_keeps_the_models_logits():
    ids, labels = _batch()
    model = chunked_loss.enable(_model(False)).eval()
    with torch.no_grad():
        out = model(input_ids=ids, labels=labels)
    assert out.logits.shape == (3, 40, 97) and out.loss is not None
    model.train()
    assert model(input_ids=ids, labels=labels).logits is None  # training: the loss only


def test_the_function_matches_transformers_causal_lm_loss():
    from transformers.loss.loss_utils import ForCausalLMLoss

    torch.manual_seed(0)
    hidden, head = torch.randn(2, 9, 16), torch.nn.Linear(16, 50, bias=False)
    labels = torch.randint(0, 50, (2, 9))
    labels[1, :4] = -100
    expected = ForCausalLMLoss(head(hidden), labels, vocab_size=50)
    assert chunked_cross_entropy(hidden, head, labels, chunk_tokens=4).item() == pytest.approx(
        expected.item(), rel=1e-6
    )
    expected = ForCausalLMLoss(head(hidden), labels, vocab_size=50, num_items_in_batch=torch.tensor(20))
    got = chunked_cross_entropy(hidden, head, labels, num_items_in_batch=torch.tensor(20), chunk_tokens=5)
    assert got.item() == pytest.approx(expected.item(), rel=1e-6)


def test_another_model_type_is_refused_naming_the_setting():
    from transformers import LlamaConfig, LlamaForCausalLM

    llama = LlamaForCausalLM(
        LlamaConfig(
            vocab_size=32,
            hidden_size=16,
            intermediate_size=32,
            num_hidden_layers=1,
            num_attention_heads=2,
            num_key_value_heads=2,
        )
    )
    with pytest.raises(ValueError, match="set chunked_cross_entropy false"):
        chunked_loss.enable(llama)


@pytest.mark.slow
def test_zero3_trains_with_the_chunked_loss_to_the_plain_losses_on_two_ranks(tmp_path):
    """Through the entry point the job's pods run (torchrun -m components.train.trainer), ZeRO-3 on 2 gloo ranks:
    the head is gathered for every chunk and every recomputation, and the losses are the plain path's."""
    from components.train.config import deepspeed_config_path
    from components.train.launcher.local_torchrun import run_torchrun
    from tests.helpers.trainer import make_workdir, trainer_config

    root = make_workdir(tmp_path)
    steps = 6
    # 9 rows of 128 tokens: 1,152 tokens a micro-step, two chunks of the head (CHUNK_TOKENS 1,024), one short.
    over = dict(
        max_steps=steps,
        save_steps=steps,
        logging_steps=1,
        per_device_train_batch_size=9,
        deepspeed=deepspeed_config_path("zero3"),
    )
    for name, chunked in (("plain", False), ("chunked", True)):
        run_torchrun(trainer_config(root, name, chunked_cross_entropy=chunked, **over), nproc_per_node=2)
    losses = {}
    for name in ("plain", "chunked"):
        state = json.loads((root / name / f"checkpoint-{steps}" / "trainer_state.json").read_text())
        losses[name] = [e["loss"] for e in state["log_history"] if "loss" in e]
    assert len(losses["plain"]) == steps
    assert losses["chunked"] == pytest.approx(losses["plain"], rel=1e-4), losses
    assert losses["plain"][-1] < losses["plain"][0]


@pytest.mark.slow
def test_fsdp2_trains_with_the_chunked_loss_to_the_plain_losses(tmp_path):
    """parallelism hsdp (transformers' FSDP2) on 2 gloo ranks, the tiny Qwen3-MoE: the head, sharded with the root,
    is whole for every chunk and for the backward's recomputation; the losses and eval_loss are the plain path's."""
    import sys
    from pathlib import Path

    from components.train.launcher.local_torchrun import run_torchrun
    from tests.helpers.trainer import make_workdir, trainer_config

    sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "benchmarks"))
    import netns_bytes

    root = make_workdir(tmp_path)
    model = netns_bytes.make_moe(tmp_path)
    metrics = {}
    for name, chunked in (("plain", False), ("chunked", True)):
        cfg = trainer_config(
            root,
            name,
            model_name_or_path=str(model),
            parallelism="hsdp",
            max_steps=3,
            save_steps=1,
            logging_steps=1,
            per_device_train_batch_size=9,  # 1,152 tokens a micro-step: two chunks, one short
            chunked_cross_entropy=chunked,
        )
        run_torchrun(cfg, nproc_per_node=2)
        metrics[name] = json.loads((root / name / "metrics.json").read_text())
    for key in ("train_loss_logged_mean", "final_train_loss", "eval_loss"):
        assert metrics["chunked"][key] == pytest.approx(metrics["plain"][key], rel=1e-4), (key, metrics)
