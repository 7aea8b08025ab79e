"""Issue 10 on CPU: MFU counted per document, the trainer's kernel choices, and the throughput benchmark's smoke run.

The GPU halves (flash-attention and Liger keep the loss; the benchmark on a GPU) are in tests/test_gpu_speed.py.
"""

import importlib.util
import logging
import os
import subprocess
import sys
import types

import datasets
import numpy as np
import pyarrow as pa
import pytest
import torch

from components.models.mfu import (
    attention_length,
    causal_attention_length,
    document_lengths,
    flops_per_token,
)
from components.models.packing import packed_batches
from components.models.shape import model_shape
from components.train.trainer import speed
from components.train.trainer.callbacks import ProgressCallback
from tests.helpers.repo import ROOT

sys.path.insert(0, str(ROOT / "benchmarks"))
import train_throughput as bench  # noqa: E402

PAD = 0


def _prepared(tmp_path, lengths, capacity=64):
    """A prepared dataset folder (save_to_disk) whose train split packs examples of ``lengths`` with the real packer."""
    rng = np.random.default_rng(0)
    ids = [rng.integers(1, 100, n).tolist() for n in lengths]
    # prepare_dataset keeps only examples with a label token: here the last third of each
    labels = [[-100] * (n - max(1, n // 3)) + e[n - max(1, n // 3) :] for n, e in zip(lengths, ids, strict=True)]
    tokenized = datasets.Dataset.from_dict({"input_ids": ids, "labels": labels})
    batches = packed_batches(tokenized, np.arange(len(lengths)), np.array(lengths), capacity, pad_token_id=PAD)
    train = datasets.Dataset(pa.Table.from_batches(list(batches)))
    datasets.DatasetDict(train=train, eval=train.select([0])).save_to_disk(str(tmp_path / "data"))
    return datasets.load_from_disk(str(tmp_path / "data"))["train"]


def _pairs_per_real_token(split) -> float:
    """Brute force: build each row's block-causal mask from position_ids, as transformers does, and count the
    (query, key) pairs of the real (non-pad) queries."""
    pairs = tokens = 0
    for row in split:
        pos, ids = np.array(row["position_ids"]), np.array(row["input_ids"])
        doc = np.cumsum(pos == 0)
        mask = (doc[:, None] == doc[None, :]) & np.tril(np.ones((len(pos), len(pos)), dtype=bool))
        real = ids != PAD
        pairs += int(mask[real].sum())
        tokens += int(real.sum())
    return pairs / tokens


def test_flops_per_token_is_palms_formula_with_t_the_keys_each_token_attends_to():
    assert flops_per_token(1000, 2, 64, 512) == 6 * 1000 + 12 * 2 * 64 * 512  # PaLM appendix B, T = 512
    # causal: position p attends to p + 1 keys, so one document of s tokens averages (s + 1) / 2
    assert causal_attention_length([4096]) == 2048.5
    assert causal_attention_length([3, 1]) == pytest.approx((1 + 2 + 3 + 1) / 4)
    with pytest.raises(ValueError, match="no documents"):
        causal_attention_length([])


def test_attention_length_of_a_prepared_dataset_counts_each_document_causally(tmp_path):
    lengths = [40, 7, 23, 64, 5, 31, 18, 50, 12, 3]
    split = _prepared(tmp_path, lengths)
    assert "position_ids" in split.column_names and len(split) < len(lengths)  # packed, with pad tails
    assert sorted(document_lengths(split).tolist()) == sorted(lengths)  # pad tails are not documents
    t = attention_length(split)
    assert t == pytest.approx(_pairs_per_real_token(split), rel=1e-12)
    assert t == pytest.approx(causal_attention_length(lengths), rel=1e-12)
    assert t < 64 / 2  # far below the whole row's 64 (and a single full causal row's 32.5)


def test_unpacked_rows_are_one_document_each_and_large_splits_are_sampled_evenly():
    rows = datasets.Dataset.from_dict(
        {"input_ids": [[1] * n for n in (5, 9, 2, 7, 4)], "labels": [[1] * n for n in (5, 9, 2, 7, 4)]}
    )
    assert document_lengths(rows).tolist() == [5, 9, 2, 7, 4]
    assert document_lengths(rows, max_rows=3).tolist() == [5, 2, 4]  # rows 0, 2, 4
    assert attention_length(rows) == pytest.approx(causal_attention_length([5, 9, 2, 7, 4]))


def test_per_document_mfu_reproduces_the_h100_measurement():
    """../shared/gpu-checks/2026-11-23-bench1.log: 14,687 tokens/s on one H100, Qwen3-1.7B shape, rows of 4096:
    19.5% MFU counting attention over the whole row, 15.9% counting it causally per document."""
    examples = bench.make_examples(1000, 4096, bench.MODELS["qwen3-1.7b"]["vocab_size"])
    shape = model_shape(bench.MODELS["qwen3-1.7b"])
    assert shape.active == 1720574976  # the log's active_params
    per_doc = attention_length(datasets.Dataset.from_list(examples))
    # the packed rows hold the same documents: the same T once their pad tails are left out
    assert attention_length(datasets.Dataset.from_list(bench.pack(examples, 4096))) == pytest.approx(per_doc)

    def mfu(t):
        return 14687 * flops_per_token(shape.active, shape.layers, shape.q_dim, t) / 989e12

    assert round(mfu(4096), 3) == 0.195
    assert round(mfu(per_doc), 3) == 0.159


class _State(types.SimpleNamespace):
    global_step = 0
    max_steps = 20
    num_input_tokens_seen = 0
    is_world_process_zero = True


def test_progress_callback_logs_mfu_from_the_per_document_count(tmp_path, monkeypatch, caplog):
    split = _prepared(tmp_path, [40, 7, 23, 64, 5, 31])
    config = {**bench.MODELS["tiny"]}
    cb = ProgressCallback.for_model(config, split, world_size=2)
    shape = model_shape(config)
    assert cb.flops_per_token == flops_per_token(shape.active, shape.layers, shape.q_dim, attention_length(split))
    assert cb.peak is None  # CPU: no MFU
    cb.peak = 1e12  # as on a GPU whose peak is 1 TFLOP/s
    clock = iter([100.0, 110.0])
    monkeypatch.setattr("components.train.trainer.callbacks.time", types.SimpleNamespace(time=lambda: next(clock)))
    state = _State()
    with caplog.at_level(logging.INFO, logger="sft.progress"):
        cb.on_train_begin(None, state, None)
        state.global_step, state.num_input_tokens_seen = 10, 20_000  # both ranks: 1,000 tokens/s per device
        logs = {"loss": 2.5, "learning_rate": 1e-4}
        cb.on_log(None, state, None, logs=logs)
    assert logs["tokens_per_second_per_device"] == 1000.0
    assert logs["mfu"] == round(1000 * cb.flops_per_token / 1e12, 4)
    lines = [r.getMessage() for r in caplog.records]
    assert lines[0].startswith("MFU basis: ") and "causal attention over" in lines[0] and "keys/token" in lines[0]
    assert "step 10/20 | loss 2.5000" in lines[1] and "1000 tokens/s/device" in lines[1]


@pytest.fixture
def fresh_speed_log(monkeypatch):
    """speed.py logs each fact once per process: start every test with nothing said."""
    monkeypatch.setattr(speed, "_said", set())


def test_attention_is_sdpa_without_cuda_and_flash_attention_or_varlen_attn_with_it(
    monkeypatch, tmp_path, fresh_speed_log
):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert speed.attn_implementation(model_type="qwen3_moe") == "sdpa"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setitem(sys.modules, "flash_attn", None)  # not installed: the lent GPUs' image
    # PyTorch's own varlen kernel, for the model types a GPU has shown it keeps the loss of (test_gpu_speed.py)
    assert speed.attn_implementation(model_type="qwen3_moe") == "varlen_attn"
    assert speed.attn_implementation(model_type="qwen3") == "varlen_attn"
    assert speed.attn_implementation(model_type="mistral") == "sdpa"  # sliding windows, not measured: SDPA
    assert speed.attn_implementation() == "sdpa"
    monkeypatch.setitem(sys.modules, "torch.nn.attention.varlen", None)  # a torch before 2.10
    assert speed.attn_implementation(model_type="qwen3") == "sdpa"
    monkeypatch.delitem(sys.modules, "flash_attn")
    fake = tmp_path / "ok"
    (fake / "flash_attn").mkdir(parents=True)
    (fake / "flash_attn" / "__init__.py").write_text("")
    monkeypatch.syspath_prepend(str(fake))
    assert speed.attn_implementation() == "flash_attention_2"
    assert speed.attn_implementation(model_type="qwen3_moe") == "flash_attention_2"  # flash-attn first where it imports


def test_a_flash_attn_that_does_not_import_is_passed_over_with_a_warning(
    monkeypatch, tmp_path, caplog, fresh_speed_log
):
    monkeypatch.delitem(sys.modules, "flash_attn", raising=False)
    broken = tmp_path / "broken"
    (broken / "flash_attn").mkdir(parents=True)
    (broken / "flash_attn" / "__init__.py").write_text(
        "raise ImportError('flash_attn_2_cuda.so: undefined symbol: _ZN3c104cuda9SetDeviceEi')"
    )
    monkeypatch.syspath_prepend(str(broken))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    with caplog.at_level(logging.INFO, logger="sft.speed"):
        assert speed.attn_implementation() == "sdpa"
        assert speed.attn_implementation() == "sdpa"
    assert [r.levelname for r in caplog.records] == ["WARNING", "INFO"]  # each once
    assert "undefined symbol" in caplog.records[0].getMessage()
    assert caplog.records[1].getMessage() == "attention: sdpa (attn_implementation auto)"


def test_the_chosen_attention_loads_in_transformers(monkeypatch):
    from transformers import Qwen3Config, Qwen3ForCausalLM

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    config = Qwen3Config(**bench.MODELS["tiny"], pad_token_id=PAD, use_cache=False)
    model = Qwen3ForCausalLM._from_config(config, attn_implementation=speed.attn_implementation())
    assert model.config._attn_implementation == "sdpa"


def _packed_row(lengths, width, seed):
    g = torch.Generator().manual_seed(seed)
    row = {"input_ids": [], "labels": [], "position_ids": []}
    for n in lengths:
        ids = torch.randint(1, 97, (n,), generator=g).tolist()
        row["input_ids"] += ids
        row["labels"] += [-100] * (n // 3) + ids[n // 3 :]
        row["position_ids"] += list(range(n))
    tail = width - len(row["input_ids"])
    row["input_ids"] += [PAD] * tail
    row["labels"] += [-100] * tail
    row["position_ids"] += list(range(tail))
    return row


def test_under_flash_attention_a_micro_batch_of_packed_rows_is_laid_end_to_end_with_its_document_bounds():
    from transformers import Qwen3Config, Qwen3ForCausalLM

    from components.models.batches import pad_collator

    rows = [_packed_row((20, 33, 11), 96, 1), _packed_row((50, 46), 96, 2)]
    per_row = pad_collator(PAD)(rows)
    assert speed.packed_collator(PAD, "sdpa")(rows).keys() == per_row.keys()  # SDPA: the batch as it is
    flat = speed.packed_collator(PAD, "flash_attention_2")(rows)
    assert flat["input_ids"].shape == flat["labels"].shape == flat["position_ids"].shape == (1, 192)
    # documents 20, 33, 11, the first row's pad tail of 32, then 50 and 46
    assert flat["cu_seq_lens_q"].tolist() == flat["cu_seq_lens_k"].tolist() == [0, 20, 53, 64, 96, 146, 192]
    assert flat["cu_seq_lens_q"].dtype == torch.int32 and flat["max_length_q"] == flat["max_length_k"] == 50
    torch.manual_seed(0)
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
    model = Qwen3ForCausalLM(config).eval()
    with torch.no_grad():
        # SDPA ignores the varlen bounds and masks from position_ids: the same documents, the same labels, the same loss
        assert model(**flat).loss.item() == pytest.approx(model(**per_row).loss.item(), rel=1e-6)
    unpacked = [{"input_ids": r["input_ids"][:20], "labels": r["labels"][:20]} for r in rows]
    assert set(speed.packed_collator(PAD, "flash_attention_2")(unpacked)) == {"input_ids", "labels", "attention_mask"}


def test_liger_is_a_no_op_without_cuda_logged_once(monkeypatch, caplog, fresh_speed_log):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with caplog.at_level(logging.INFO, logger="sft.speed"):
        assert speed.apply_liger_kernels("qwen3") is False
        assert speed.apply_liger_kernels("qwen3") is False
    assert [r.getMessage() for r in caplog.records] == [
        "Liger kernels not applied: no CUDA device (they are Triton GPU kernels)"
    ]


def test_liger_patches_qwen3_and_qwen3_moe_when_installed_on_a_gpu(monkeypatch, caplog, fresh_speed_log):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setitem(sys.modules, "liger_kernel", None)  # not installed
    with caplog.at_level(logging.INFO, logger="sft.speed"):
        assert speed.apply_liger_kernels("qwen3") is False
    assert "liger_kernel does not import" in caplog.text
    calls = []
    fake = types.ModuleType("liger_kernel.transformers")
    fake.apply_liger_kernel_to_qwen3 = lambda **kw: calls.append(("qwen3", kw))
    fake.apply_liger_kernel_to_qwen3_moe = lambda **kw: calls.append(("qwen3_moe", kw))
    monkeypatch.setitem(sys.modules, "liger_kernel", types.ModuleType("liger_kernel"))
    monkeypatch.setitem(sys.modules, "liger_kernel.transformers", fake)
    assert speed.apply_liger_kernels("qwen3") is True
    assert speed.apply_liger_kernels("qwen3_moe") is True
    assert speed.apply_liger_kernels("llama") is False
    kernels = dict(rope=True, rms_norm=True, swiglu=True, cross_entropy=False, fused_linear_cross_entropy=True)
    # liger_kernels leaves a MoE model's experts to moe_experts_implementation (Liger's fused MoE, autotuning ~200
    # configurations on its first call; a step with it never finished in 120 s on an H100: issue 37).
    assert calls == [("qwen3", kernels), ("qwen3_moe", {**kernels, "swiglu": False})]
    # Under ZeRO-3 (or beside the chunked loss) the model keeps its own loss.
    assert speed.apply_liger_kernels("qwen3_moe", fused_loss=False) is True
    assert calls[-1] == ("qwen3_moe", {**kernels, "swiglu": False, "fused_linear_cross_entropy": False})
    # moe_experts_implementation liger alone: only the experts, with Liger's autotuning off unless the user set it.
    monkeypatch.setenv("LIGER_FUSED_MOE_AUTOTUNE", "")  # recorded, so the test leaves the environment as it was
    monkeypatch.delenv("LIGER_FUSED_MOE_AUTOTUNE")
    assert speed.apply_liger_kernels("qwen3_moe", fused_loss=False, layers=False, moe_experts=True) is True
    assert calls[-1] == (
        "qwen3_moe",
        dict(rope=False, rms_norm=False, swiglu=True, cross_entropy=False, fused_linear_cross_entropy=False),
    )
    assert os.environ["LIGER_FUSED_MOE_AUTOTUNE"] == "0"


def test_the_baseline_gets_the_same_tokens_per_optimizer_step_from_accumulation():
    examples = bench.make_examples(200, 256, 2048)
    rows = bench.pack(examples, 256)
    args = types.SimpleNamespace(micro_batch=4, grad_accum=2, baseline_micro_batch=1)
    plan = bench.plan(args, examples, rows)
    assert plan["ours"] == (4, 2)
    micro, accum = plan["baseline"]
    assert micro == 1 and accum == round(8 * len(examples) / len(rows))


@pytest.mark.skipif(importlib.util.find_spec("liger_kernel") is not None, reason="liger_kernel is installed")
def test_liger_without_liger_kernel_is_refused_before_anything_runs(capsys):
    with pytest.raises(SystemExit) as exit:
        bench.main(["--smoke", "--liger"])
    assert exit.value.code == 2
    assert "--liger needs the liger_kernel package" in capsys.readouterr().err


@pytest.mark.slow
def test_the_documented_smoke_command_runs_on_cpu_and_records_nothing():
    results = ROOT / "benchmarks" / "results" / "train_throughput.md"
    before = results.read_text()
    # On CPU, as documented, also on a machine with a GPU
    out = subprocess.run(
        [sys.executable, "benchmarks/train_throughput.py", "--smoke"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "CUDA_VISIBLE_DEVICES": ""},
    )
    assert out.returncode == 0, out.stderr[-3000:]
    for kind in ("baseline", "ours"):
        line = next(line for line in out.stdout.splitlines() if line.startswith(f"{kind}: "))
        assert "tokens/s/device, MFU n/a, peak memory" in line and "GiB (peak RSS)" in line
    assert "micro-batch 1 x 5 accumulation" in out.stdout  # the baseline's: ~5 examples per packed row
    assert "speed-up: " in out.stdout
    assert results.read_text() == before


def test_the_liger_setting_reaches_the_models_load_and_is_a_logged_no_op_on_cpu(tmp_path, caplog, fresh_speed_log):
    """liger_kernels=true: load_model asks for Liger before it builds the model; without CUDA that is one log line
    and the model is transformers' own (tests/train/trainer/test_gpu_speed.py checks the kernels on a GPU)."""
    from components.models.tiny import build_model, build_tokenizer
    from components.train.trainer.arguments import SFTConfig
    from components.train.trainer.common import load_model

    tokenizer = build_tokenizer()
    build_model(tokenizer).save_pretrained(tmp_path / "base")
    cfg = SFTConfig(output_dir=str(tmp_path / "out"), use_cpu=True, report_to=[], liger_kernels=True)
    with caplog.at_level(logging.INFO, logger="sft.speed"):
        model = load_model(cfg, str(tmp_path / "base"))
    assert "Liger kernels not applied: no CUDA device (they are Triton GPU kernels)" in caplog.text
    assert type(model).forward.__module__.startswith("transformers.")
