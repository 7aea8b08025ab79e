"""The trainer entry point's and the evaluation's own checks. The trainer under real 2-process torchrun judged by the
evaluation: tests/pipelines/test_local_run.py's default run (this module's own run before; issue 38, CI's time)."""

import json

import pytest

from components.data.prepare import PrepareOptions, prepare
from components.evaluate.base_vs_tuned import gate, heldout_loss
from components.models.tiny import build_model, build_tokenizer
from components.train.config import build_trainer_config, deepspeed_config_path, write_trainer_config
from tests.helpers.repo import run_module
from tests.helpers.trainer import CPU_TEST_SETTINGS, trainer_settings


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    """A tiny base model and a prepared dataset where the answer is predictable from the question."""
    root = tmp_path_factory.mktemp("train")
    rows = [
        {
            "messages": [
                {"role": "user", "content": f"Repeat {w} twice."},
                {"role": "assistant", "content": f"{w} {w}. Done."},
            ]
        }
        for w in ["apple", "river", "cloud", "stone", "music", "green", "paper", "light"] * 12
    ]
    for i, r in enumerate(rows):  # make each conversation unique
        r["messages"][0]["content"] += f" (#{i})"
    corpus = root / "chat.jsonl"
    corpus.write_text("\n".join(json.dumps(r) for r in rows))
    tok = build_tokenizer(corpus)
    base = root / "base"
    build_model(tok).save_pretrained(base)
    tok.save_pretrained(base)
    prepare(str(corpus), str(base), str(root / "data"), PrepareOptions(max_seq_length=128, eval_size=16, seed=0))
    return root


def _config(workdir, **over):
    cfg = build_trainer_config(
        trainer_settings(
            model_name_or_path=str(workdir / "base"),
            method="full",
            max_seq_length=128,
            per_device_train_batch_size=8,
            gradient_accumulation_steps=1,
            learning_rate=3e-3,
            num_train_epochs=4,
            max_steps=-1,
            warmup_ratio=0.05,
            seed=0,
            deepspeed_config="none",
            **CPU_TEST_SETTINGS,
        ),
        dataset_path=str(workdir / "data"),
        output_dir=str(workdir / "out"),
        use_cpu=True,
        model_cache_dir=str(workdir / "cache"),
    )
    cfg.update(over)
    return write_trainer_config(cfg, str(workdir / "cfg" / f"{len(over)}.json"))


def test_base_scored_twice_gives_identical_numbers_on_identical_tokens(workdir):
    a = heldout_loss(str(workdir / "base"), str(workdir / "data"))
    b = heldout_loss(str(workdir / "base"), str(workdir / "data"), batch_size=3)
    assert a["tokens"] == b["tokens"] > 0
    assert a["eval_loss"] == pytest.approx(b["eval_loss"], rel=1e-5)


def test_gate_both_ways():
    base = {"eval_loss": 2.0}
    assert gate(base, {"eval_loss": 1.5}, 0.2)[0] is True
    passed, reason = gate(base, {"eval_loss": 1.9}, 0.2)
    assert not passed and "short of the required 20.0%" in reason and "lower min_loss_improvement" in reason
    assert gate(base, {"eval_loss": 2.1}, 0.0)[0] is False  # a worse model never passes


def test_unknown_config_key_lists_the_valid_ones(workdir):
    path = _config(workdir, learning_rat=1.0)
    result = run_module("components.train.trainer", "--config", path)
    assert result.returncode == 2
    assert "unknown keys ['learning_rat']; valid keys are" in result.stderr and "'learning_rate'" in result.stderr


def test_missing_dataset_is_named(workdir, tmp_path):
    path = _config(workdir, dataset_path=str(tmp_path / "nothing"))
    result = run_module("components.train.trainer", "--config", path)
    assert result.returncode == 2 and "is not a prepared dataset; run prepare_dataset first" in result.stderr


def test_deepspeed_configs_by_name():
    assert deepspeed_config_path("zero3").endswith("deepspeed/zero3.json")
    assert deepspeed_config_path("none") is None
    with pytest.raises(ValueError, match="use one of \\['zero2', 'zero3', 'zero3_hpz', 'zero3_offload', 'none'\\]"):
        deepspeed_config_path("zero4")
