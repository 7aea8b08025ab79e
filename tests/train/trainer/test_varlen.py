"""attn_implementation varlen_attn without a GPU: where the documents of a batch lie (the part of trainer/varlen.py
that runs before PyTorch's CUDA kernel), and the setting's one clear error where the kernel cannot run. The kernel's
losses and gradients against SDPA are tests/train/trainer/test_gpu_speed.py's (gpu-marked)."""

import pytest
import torch

from components.train.trainer import speed
from components.train.trainer.varlen import sequences

CPU = torch.device("cpu")


def test_the_collators_bounds_are_taken_as_they_are():
    seqs = sequences(1, 10, CPU, cu_seq_lens=torch.tensor([0, 4, 10]), max_length=6)
    assert seqs.cu.tolist() == [0, 4, 10] and seqs.cu.dtype == torch.int32
    assert seqs.longest == 6 and seqs.keep is None


def test_packed_rows_split_where_positions_restart_and_at_every_row():
    # Row 0: documents of 3 and 2 tokens; row 1: one of 5 (its positions never restart: the row's start bounds it).
    positions = torch.tensor([[0, 1, 2, 0, 1], [0, 1, 2, 3, 4]])
    seqs = sequences(2, 5, CPU, position_ids=positions)
    assert seqs.cu.tolist() == [0, 3, 5, 10] and seqs.longest == 5 and seqs.keep is None
    # Rows whose positions do not restart at 0 at their start (a continuation) are still cut at the row.
    seqs = sequences(2, 3, CPU, position_ids=torch.tensor([[4, 5, 6], [7, 8, 9]]))
    assert seqs.cu.tolist() == [0, 3, 6]


def test_padding_is_dropped_left_or_right_and_each_row_is_one_sequence():
    mask = torch.tensor([[1, 1, 1, 0], [0, 0, 1, 1], [1, 1, 1, 1]])
    seqs = sequences(3, 4, CPU, attention_mask=mask, position_ids=torch.arange(4)[None])
    assert seqs.cu.tolist() == [0, 3, 5, 9] and seqs.longest == 4
    assert seqs.keep.tolist() == [0, 1, 2, 6, 7, 8, 9, 10, 11]


def test_a_mask_without_padding_is_no_padding():
    seqs = sequences(2, 3, CPU, attention_mask=torch.ones(2, 3, dtype=torch.long))
    assert seqs.cu.tolist() == [0, 3, 6] and seqs.keep is None


def test_varlen_attn_named_on_a_machine_without_its_kernel_is_one_error(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ValueError, match=r"attn_implementation varlen_attn: needs CUDA .* use auto"):
        speed.attn_implementation("varlen_attn")
    with pytest.raises(ValueError, match=r"attn_implementation flash_attention_2: flash-attn does not import"):
        speed.attn_implementation("flash_attention_2")
    assert speed.attn_implementation("auto") == "sdpa"
    assert speed.attn_implementation("eager") == "eager"
