"""Packed rows: one row of several examples scores exactly what the examples score one by one."""

import pytest
import torch
from transformers import Qwen3Config, Qwen3ForCausalLM

from components.models.batches import pad_collator

PAD = 0


def _model():
    torch.manual_seed(0)
    # use_cache=False as load_model sets it: with a KV cache transformers ignores position_ids restarts.
    config = Qwen3Config(
        vocab_size=97,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        pad_token_id=PAD,
        use_cache=False,
    )
    return Qwen3ForCausalLM(config).eval()


def _examples():
    g = torch.Generator().manual_seed(1)
    out = []
    for n, prompt in [(11, 4), (17, 6), (9, 3)]:
        ids = torch.randint(1, 97, (n,), generator=g).tolist()
        out.append({"input_ids": ids, "labels": [-100] * prompt + ids[prompt:]})
    return out


def _pack(examples, width):
    row = {"input_ids": [], "labels": [], "position_ids": []}
    for ex in examples:
        row["input_ids"] += ex["input_ids"]
        row["labels"] += ex["labels"]
        row["position_ids"] += list(range(len(ex["input_ids"])))
    tail = width - len(row["input_ids"])
    row["input_ids"] += [PAD] * tail
    row["labels"] += [-100] * tail
    row["position_ids"] += list(range(tail))
    return row


def _one_by_one(model, examples):
    total, tokens = 0.0, 0
    with torch.no_grad():
        for ex in examples:
            logits = model(input_ids=torch.tensor([ex["input_ids"]])).logits[0, :-1]
            targets = torch.tensor(ex["labels"][1:])
            total += torch.nn.functional.cross_entropy(logits, targets, ignore_index=-100, reduction="sum").item()
            tokens += int((targets != -100).sum())
    return total / tokens


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_packed_row_loss_equals_token_weighted_loss_of_its_examples(attn):
    model = _model()
    model.config._attn_implementation = attn
    examples = _examples()
    # Plain-text examples: the second and third start with scored tokens, which must not be predicted
    # from the end of the previous example.
    examples[1]["labels"] = list(examples[1]["input_ids"])
    batch = pad_collator(PAD)([_pack(examples, 48)])
    assert set(batch) == {"input_ids", "labels", "position_ids"}  # no attention_mask: block-causal from positions
    with torch.no_grad():
        packed = model(**batch).loss.item()
    # fp32 on CPU: the only differences are summation order in the matmuls and the mean.
    assert packed == pytest.approx(_one_by_one(model, examples), rel=1e-5, abs=1e-6)


def test_without_the_block_mask_the_examples_would_leak_into_each_other():
    """The same packed row scored as one long sequence gives a different loss: the test can fail."""
    model = _model()
    examples = _examples()
    batch = pad_collator(PAD)([_pack(examples, 48)])
    with torch.no_grad():
        leaky = model(input_ids=batch["input_ids"], labels=batch["labels"]).loss.item()
    assert abs(leaky - _one_by_one(model, examples)) > 1e-3


def test_two_packed_rows_in_one_batch_weigh_every_token_equally():
    model = _model()
    examples = _examples()
    batch = pad_collator(PAD)([_pack(examples[:2], 32), _pack(examples[2:], 32)])
    with torch.no_grad():
        loss = model(**batch).loss.item()
    assert loss == pytest.approx(_one_by_one(model, examples), rel=1e-5, abs=1e-6)


def test_unpacked_rows_are_padded_to_the_longest_with_a_mask():
    model = _model()
    examples = _examples()
    batch = pad_collator(PAD)(examples)
    assert set(batch) == {"input_ids", "labels", "attention_mask"}
    assert batch["input_ids"].shape == (3, 17) and batch["attention_mask"].sum() == 11 + 17 + 9
    with torch.no_grad():
        loss = model(**batch).loss.item()
    assert loss == pytest.approx(_one_by_one(model, examples), rel=1e-5, abs=1e-6)
