"""The trainer entry point under real 2-rank torchrun on CPU (gloo): DeepSpeed ZeRO-2/3, LoRA, kill and resume.

DeepSpeed 0.19.8 runs on CPU here: with no GPU it picks its CPU accelerator and, without oneCCL, the
gloo backend; the trainer wraps the process group accelerate created (common.py).

The resumes start from copies of one uninterrupted run (``straight``: 20 steps, a checkpoint every 4, the last 2 kept;
issue 38, CI's time: test_trainer_unreadable_checkpoint.py and test_resume_at_the_end.py trained their own before):

- a checkpoint marked COMPLETE whose weights or optimizer file was cut short (a volume that filled up, a copy that
  stopped) is not resumed from: the trainer warns naming it, resumes from the previous complete checkpoint and
  finishes the run;
- a re-run whose newest complete checkpoint is the last step (the run died in its export or final evaluation, or was
  evicted then) trains no further step: it exports the same model, with the same step count. transformers 5.23's
  training loop runs a step before it checks ``max_steps`` (``Trainer._run_epoch``), so resuming at ``max_steps``
  trained step ``max_steps + 1`` past the schedule's end and exported another model.
"""

import json
import os
import shutil
import signal
import subprocess
import sys
import time

import pytest
from safetensors.torch import load_file

from components.models.checkpoint_dirs import recorded_sizes, unreadable
from components.train.config import deepspeed_config_path
from components.train.launcher.local_torchrun import run_torchrun
from tests.helpers.trainer import make_workdir, trainer_config

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    return make_workdir(tmp_path_factory.mktemp("trainer"))


# The uninterrupted run the resumes are held to and start from: complete checkpoints at steps 16 and 20. Without
# early stopping (patience 0, the default), as a run trains without it.
STRAIGHT = dict(max_steps=20, save_steps=4, logging_steps=2, save_total_limit=2, early_stopping_patience=0)


@pytest.fixture(scope="module")
def straight(root):
    """``root/straight``, trained once for the module: each test copies it, none changes it."""
    run_torchrun(trainer_config(root, "straight", **STRAIGHT), nproc_per_node=2)
    return root / "straight"


def _copy(straight, name: str) -> tuple:
    """A copy of the straight run's folder under ``name`` and its config (the straight run's settings)."""
    shutil.copytree(straight, straight.parent / name)
    return straight.parent / name, trainer_config(straight.parent, name, **STRAIGHT)


def _params(path):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(path)).num_parameters()


def _logged_losses(out):
    last = max(out.glob("checkpoint-*/trainer_state.json"), key=lambda p: int(p.parent.name.split("-")[1]))
    state = json.loads(last.read_text())
    return {e["step"]: e["loss"] for e in state["log_history"] if "loss" in e}


@pytest.mark.parametrize("stage", ["zero2", "zero3"])
def test_deepspeed_full_fine_tuning_on_two_ranks(root, stage, capfd):
    run_torchrun(
        trainer_config(
            root, stage, deepspeed=deepspeed_config_path(stage), max_steps=10, save_steps=5, logging_steps=2
        ),
        nproc_per_node=2,
    )
    out = root / stage
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["world_size"] == 2 and metrics["global_step"] == 10
    losses = _logged_losses(out)
    assert losses[10] < 0.8 * losses[2], losses  # it learns
    # final/ holds the consolidated model (ZeRO-3 shards gathered), loadable without DeepSpeed.
    assert _params(out / "final") == _params(root / "base")
    card = json.loads((out / "final" / "model.json").read_text())
    assert card["method"] == "full" and card["steps"] == 10 and card["deepspeed"].endswith(f"{stage}.json")
    assert (out / "final" / "tokenizer.json").exists() and (out / "final" / "generation_config.json").exists()
    # serving generates with a KV cache
    assert json.loads((out / "final" / "config.json").read_text())["use_cache"] is True
    assert list((out / "tensorboard").glob("events.out.tfevents.*"))
    assert (out / "checkpoint-10" / "COMPLETE").exists() and (out / "checkpoint-5" / "COMPLETE").exists()
    logs = capfd.readouterr().out
    assert "step 10/10 | loss" in logs and "tokens/s/device" in logs and "ETA" in logs


def test_lora_on_two_ranks_writes_the_adapter_and_a_merged_model(root):
    run_torchrun(
        trainer_config(
            root,
            "lora",
            method="lora",
            lora_target_modules="q_proj,v_proj,gate_proj",
            lora_r=8,
            max_steps=6,
            save_steps=6,
            learning_rate=1e-2,
        ),
        nproc_per_node=2,
    )
    out = root / "lora"
    adapter = json.loads((out / "adapter" / "adapter_config.json").read_text())
    assert adapter["r"] == 8 and set(adapter["target_modules"]) == {"q_proj", "v_proj", "gate_proj"}
    merged = load_file(str(out / "final" / "model.safetensors"))
    base = load_file(str(root / "base" / "model.safetensors"))
    assert set(merged) == set(base)  # a plain model: vLLM serves it without PEFT
    changed = {k for k in base if not (merged[k].float() - base[k].float()).abs().max() < 1e-6}
    assert changed and all(any(t in k for t in ("q_proj", "v_proj", "gate_proj")) for k in changed), changed
    assert json.loads((out / "final" / "model.json").read_text())["method"] == "lora"


def _start(config):
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node",
        "2",
        "-m",
        "components.train.trainer",
        "--config",
        config,
    ]
    return subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)


def test_killed_run_resumes_from_its_last_complete_checkpoint_and_ends_like_an_uninterrupted_one(root, straight, capfd):
    config = trainer_config(root, "killed", **STRAIGHT)
    out = root / "killed"
    proc = _start(config)
    deadline = time.time() + 180
    while not (out / "checkpoint-4" / "COMPLETE").exists():
        assert proc.poll() is None and time.time() < deadline, "the run ended before its first checkpoint"
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGKILL)  # the whole job: torchrun and both ranks, as a lost node would
    proc.wait()
    assert not (out / "metrics.json").exists()
    capfd.readouterr()

    run_torchrun(config, nproc_per_node=2)
    logs = capfd.readouterr().out
    assert "resuming from " + str(out / "checkpoint-") in logs
    a = json.loads((straight / "metrics.json").read_text())
    b = json.loads((out / "metrics.json").read_text())
    assert a["global_step"] == b["global_step"] == 20
    # Same data order, RNG and optimizer state after the resume: the losses agree to float noise.
    assert b["eval_loss"] == pytest.approx(a["eval_loss"], rel=1e-4)
    uninterrupted, resumed = _logged_losses(straight), _logged_losses(out)
    assert resumed.keys() == uninterrupted.keys()
    assert all(resumed[s] == pytest.approx(uninterrupted[s], rel=1e-4) for s in uninterrupted), (uninterrupted, resumed)
    # Keep the last 2 complete checkpoints.
    assert sorted(p.name for p in out.glob("checkpoint-*")) == ["checkpoint-16", "checkpoint-20"]


@pytest.mark.parametrize("name", ["model.safetensors", "optimizer.pt"])
def test_a_truncated_file_in_the_newest_checkpoint_resumes_from_the_previous_one(straight, name, capfd):
    out, config = _copy(straight, name.split(".")[0])
    newest = out / "checkpoint-20"
    assert recorded_sizes(newest)[name] == (newest / name).stat().st_size  # the marker recorded it at save time
    data = (newest / name).read_bytes()
    (newest / name).write_bytes(data[: len(data) // 2])
    (out / "metrics.json").unlink()
    capfd.readouterr()

    run_torchrun(config, nproc_per_node=2)
    captured = capfd.readouterr()
    logs = captured.out + captured.err
    assert f"skipping {newest}" in logs and name in logs, logs[-3000:]
    assert f"resuming from {out / 'checkpoint-16'}" in logs
    assert json.loads((out / "metrics.json").read_text())["global_step"] == 20
    # The step-20 checkpoint was written again, whole: a later re-run resumes from it.
    assert unreadable(newest) is None
    assert sorted(p.name for p in out.glob("checkpoint-*")) == ["checkpoint-16", "checkpoint-20"]


def test_a_rerun_after_the_last_checkpoint_trains_no_further_step(straight, capfd):
    out, config = _copy(straight, "rerun")
    first = load_file(out / "final" / "model.safetensors")
    # As a run that died while exporting leaves it: every checkpoint complete, no final/ and no metrics.json.
    shutil.rmtree(out / "final")
    (out / "metrics.json").unlink()
    capfd.readouterr()

    run_torchrun(config, nproc_per_node=2)
    assert "resuming from " + str(out / "checkpoint-20") in capfd.readouterr().out
    assert json.loads((out / "metrics.json").read_text())["global_step"] == 20
    assert not (out / "checkpoint-21").exists()
    again = load_file(out / "final" / "model.safetensors")
    assert all((again[k] - first[k]).abs().max() == 0 for k in first)


def test_without_early_stopping_a_run_trains_to_the_end_and_evaluates_only_at_its_end(straight):
    """(test_early_stopping.py's own run before; issue 38, CI's time.)"""
    m = json.loads((straight / "metrics.json").read_text())
    assert m["global_step"] == 20 and "eval_loss" in m
    assert not {"stopped_early", "best_step", "best_eval_loss"} & set(m)
    history = json.loads((straight / "checkpoint-20" / "trainer_state.json").read_text())["log_history"]
    assert not [e for e in history if "eval_loss_per_token" in e]  # no evaluation during training
    assert sorted(p.name for p in straight.glob("checkpoint-*")) == ["checkpoint-16", "checkpoint-20"]
