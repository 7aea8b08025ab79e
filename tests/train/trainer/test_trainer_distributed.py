"""The trainer entry point under real 2-rank torchrun on CPU (gloo): DeepSpeed ZeRO-2/3, LoRA, kill and resume.

DeepSpeed 0.19.8 runs on CPU here: with no GPU it picks its CPU accelerator and, without oneCCL, the
gloo backend; the trainer wraps the process group accelerate created (common.py).
"""

import json
import os
import signal
import subprocess
import sys
import time

import pytest
from safetensors.torch import load_file

from components.train.config import deepspeed_config_path
from components.train.launcher.local_torchrun import run_torchrun
from tests.helpers.trainer import make_workdir, trainer_config

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    return make_workdir(tmp_path_factory.mktemp("trainer"))


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


def test_killed_run_resumes_from_its_last_complete_checkpoint_and_ends_like_an_uninterrupted_one(root, capfd):
    over = dict(max_steps=20, save_steps=4, logging_steps=2, save_total_limit=2)
    run_torchrun(trainer_config(root, "straight", **over), nproc_per_node=2)

    config = trainer_config(root, "killed", **over)
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
    a = json.loads((root / "straight" / "metrics.json").read_text())
    b = json.loads((out / "metrics.json").read_text())
    assert a["global_step"] == b["global_step"] == 20
    # Same data order, RNG and optimizer state after the resume: the losses agree to float noise.
    assert b["eval_loss"] == pytest.approx(a["eval_loss"], rel=1e-4)
    straight, resumed = _logged_losses(root / "straight"), _logged_losses(out)
    assert resumed.keys() == straight.keys()
    assert all(resumed[s] == pytest.approx(straight[s], rel=1e-4) for s in straight), (straight, resumed)
    # Keep the last 2 complete checkpoints.
    assert sorted(p.name for p in out.glob("checkpoint-*")) == ["checkpoint-16", "checkpoint-20"]
