"""Checkpoint completeness, pruning, and the trainer config's errors (no training here)."""

import json
import logging
import os
import signal
from types import SimpleNamespace

from transformers import TrainerControl, TrainerState

from components.train.config import build_trainer_config, check_combination, write_trainer_config
from components.train.trainer.checkpoints import (
    MARKER,
    SaveOnSigtermCallback,
    latest_complete_checkpoint,
    prune_checkpoints,
)
from tests.helpers.repo import run_module
from tests.helpers.trainer import CPU_TEST_SETTINGS, trainer_settings


def _ckpt(root, step, complete=True):
    path = root / f"checkpoint-{step}"
    path.mkdir()
    (path / "trainer_state.json").write_text("{}")
    if complete:
        (path / MARKER).write_text("")
    return path


def test_a_partial_checkpoint_is_skipped_with_a_warning(tmp_path, caplog):
    _ckpt(tmp_path, 5)
    _ckpt(tmp_path, 10)
    _ckpt(tmp_path, 15, complete=False)
    with caplog.at_level(logging.WARNING):
        assert latest_complete_checkpoint(str(tmp_path)) == str(tmp_path / "checkpoint-10")
    assert "skipping" in caplog.text and "checkpoint-15" in caplog.text and MARKER in caplog.text


def test_no_checkpoint_means_a_fresh_start(tmp_path):
    assert latest_complete_checkpoint(str(tmp_path)) is None
    assert latest_complete_checkpoint(str(tmp_path / "missing")) is None
    _ckpt(tmp_path, 3, complete=False)
    assert latest_complete_checkpoint(str(tmp_path)) is None


def test_prune_keeps_the_last_k_complete_and_the_newest_partial(tmp_path):
    for step in (2, 4, 6, 8):
        _ckpt(tmp_path, step)
    _ckpt(tmp_path, 5, complete=False)  # left behind by an earlier crash
    _ckpt(tmp_path, 10, complete=False)  # may be being written right now
    prune_checkpoints(str(tmp_path), keep=2)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint-10", "checkpoint-6", "checkpoint-8"]


def test_sigterm_asks_for_a_checkpoint_and_a_stop_at_the_next_step_end():
    previous = signal.getsignal(signal.SIGTERM)
    try:
        callback = SaveOnSigtermCallback()
        args, state = SimpleNamespace(device="cpu", world_size=1), TrainerState(global_step=7)
        callback.on_train_begin(args, state, TrainerControl())
        control = callback.on_step_end(args, state, TrainerControl())
        assert not control.should_save and not control.should_training_stop and callback.stopped_at is None
        os.kill(os.getpid(), signal.SIGTERM)  # handled: this process goes on to the step end
        control = callback.on_step_end(args, state, TrainerControl())
        assert control.should_save and control.should_training_stop and callback.stopped_at == 7
    finally:
        signal.signal(signal.SIGTERM, previous)


def _config(tmp_path, **over):
    cfg = build_trainer_config(
        trainer_settings(
            model_name_or_path="builtin:tiny-qwen3",
            method="full",
            max_seq_length=128,
            per_device_train_batch_size=2,
            gradient_accumulation_steps=1,
            learning_rate=1e-3,
            num_train_epochs=1,
            max_steps=-1,
            warmup_ratio=0.0,
            seed=0,
            deepspeed_config="none",
            **CPU_TEST_SETTINGS,
        ),
        dataset_path=str(tmp_path / "nothing"),
        output_dir=str(tmp_path / "out"),
        use_cpu=True,
        model_cache_dir=str(tmp_path / "cache"),
    )
    cfg.update(over)
    return cfg


def test_qlora_on_cpu_and_with_zero3_offload_are_refused_naming_the_field(tmp_path):
    errors = check_combination(_config(tmp_path, method="qlora"))
    assert errors == ["method 'qlora' needs CUDA GPUs (bitsandbytes 4-bit); use method 'lora' or 'full' on CPU"]
    gpu = _config(tmp_path, method="qlora", use_cpu=False, deepspeed="zero3_offload")
    assert "set deepspeed_config to 'none' or 'zero2'" in check_combination(gpu)[0]
    assert check_combination(_config(tmp_path, method="lora", deepspeed="zero3")) == []


def test_the_entry_point_rejects_an_impossible_combination_before_training(tmp_path):
    path = write_trainer_config(_config(tmp_path, method="qlora"), str(tmp_path / "cfg.json"))
    result = run_module("components.train.trainer", "--config", path)
    assert result.returncode == 2 and "method 'qlora' needs CUDA GPUs" in result.stderr


def test_a_dataset_without_labels_is_named(tmp_path):
    from datasets import Dataset, DatasetDict

    rows = Dataset.from_list([{"input_ids": [1, 2, 3]}])
    DatasetDict(train=rows, eval=rows).save_to_disk(str(tmp_path / "data"))
    path = write_trainer_config(_config(tmp_path, dataset_path=str(tmp_path / "data")), str(tmp_path / "cfg.json"))
    result = run_module("components.train.trainer", "--config", path)
    assert result.returncode == 2 and "split 'train' lacks columns ['labels']" in result.stderr


def test_pipeline_config_checkpoints_and_reports_to_tensorboard(tmp_path):
    cfg = _config(tmp_path, save_steps=50)
    assert cfg["report_to"] == ["tensorboard"] and cfg["include_num_input_tokens_seen"] == "non_padding"
    assert json.loads(json.dumps(cfg))["save_steps"] == 50 and cfg["save_total_limit"] == 2
