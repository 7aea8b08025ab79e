"""Early stopping on the held-out loss through the trainer's entry point (2-rank torchrun on CPU, the tiny model).

A constant learning rate of 0.03 is too high for the tiny model: its held-out loss falls for about ten steps, then
wanders up and down around a floor, so patience ends the run well before ``max_steps``. A run without patience
trains to its end: tests/train/trainer/test_trainer_distributed.py's uninterrupted run.
"""

import json
import shutil
import sys
from pathlib import Path

import pytest
from safetensors.torch import load_file

from components.train.config import deepspeed_config_path
from components.train.launcher.local_torchrun import run_torchrun
from tests.helpers.trainer import make_workdir, trainer_config

pytestmark = pytest.mark.slow

HIGH_LR = dict(learning_rate=0.03, lr_scheduler_type="constant", warmup_steps=0, max_steps=40, logging_steps=2)


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    return make_workdir(tmp_path_factory.mktemp("early_stopping"))


def _state(checkpoint):
    return json.loads((checkpoint / "trainer_state.json").read_text())


def _evals(checkpoint):
    return {
        e["step"]: e["eval_loss_per_token"] for e in _state(checkpoint)["log_history"] if "eval_loss_per_token" in e
    }


def _counter(checkpoint):
    return _state(checkpoint)["stateful_callbacks"]["HeldOutEarlyStopping"]["attributes"][
        "early_stopping_patience_counter"
    ]


def _steps(out):
    return sorted(int(p.name.split("-")[1]) for p in out.glob("checkpoint-*"))


def _assert_same_weights(final, checkpoint):
    a, b = load_file(final / "model.safetensors"), load_file(checkpoint / "model.safetensors")
    shared = sorted(set(a) & set(b))
    assert len(shared) > 10, (sorted(a), sorted(b))
    assert all(a[k].float().equal(b[k].float()) for k in shared), [k for k in shared if not a[k].equal(b[k])]


def test_a_run_whose_held_out_loss_stops_improving_stops_early_with_the_best_checkpoint_as_its_model(root):
    out = root / "stops"
    over = dict(HIGH_LR, save_steps=4, eval_steps=2, early_stopping_patience=3, save_total_limit=1)
    run_torchrun(trainer_config(root, "stops", **over), nproc_per_node=2)

    m = json.loads((out / "metrics.json").read_text())
    assert m["stopped_early"] is True
    assert m["stopped_at_step"] == m["global_step"] < m["max_steps"] == 40
    evals = _evals(out / f"checkpoint-{m['stopped_at_step']}")
    assert sorted(evals) == list(range(2, m["stopped_at_step"] + 1, 2))  # every eval_steps
    best = m["best_step"]
    assert m["best_eval_loss"] == evals[best] == min(evals.values())
    assert (
        [s for s in evals if s > best]
        == [best + 2, best + 4, best + 6]
        == [m["stopped_at_step"] - 4, m["stopped_at_step"] - 2, m["stopped_at_step"]]
    )
    # The best checkpoint is kept beside the last one (save_total_limit 1), though its step is no multiple of
    # save_steps when it is not: every new best is checkpointed.
    assert _steps(out) == sorted({best, m["stopped_at_step"]})
    assert m["best_checkpoint"].endswith(f"checkpoint-{best}")
    # final/ is the best checkpoint's model, and the reported eval loss is its own.
    _assert_same_weights(out / "final", out / f"checkpoint-{best}")
    assert m["eval_loss"] == pytest.approx(m["best_eval_loss"], rel=1e-5)


def test_under_zero3_the_best_checkpoint_is_loaded_from_deepspeeds_shards(root):
    pytest.importorskip("deepspeed")
    out = root / "zero3"
    over = dict(HIGH_LR, save_steps=4, eval_steps=2, early_stopping_patience=3, save_total_limit=1)
    run_torchrun(trainer_config(root, "zero3", deepspeed=deepspeed_config_path("zero3"), **over), nproc_per_node=2)

    m = json.loads((out / "metrics.json").read_text())
    assert m["stopped_early"] is True and m["stopped_at_step"] < 40
    best = m["best_step"]
    assert _steps(out) == sorted({best, m["stopped_at_step"]})
    assert list((out / f"checkpoint-{best}").glob("global_step*"))  # DeepSpeed's state only, no weights file
    # The engine loaded the best checkpoint's shards: the model evaluated at the end, and exported, is the best.
    assert m["eval_loss"] == pytest.approx(m["best_eval_loss"], rel=1e-5)
    assert m["eval_loss"] < _evals(out / f"checkpoint-{m['stopped_at_step']}")[m["stopped_at_step"]]


def test_under_hsdp_the_best_checkpoint_is_loaded_from_each_ranks_shards(tmp_path):
    # The tiny Qwen3-MoE on 4 ranks, as tests/train/trainer/test_hsdp_trainer.py trains it (untied embeddings: a
    # tied model is refused, components/train/config.py's check_early_stopping_layout).
    sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "benchmarks"))
    import netns_bytes

    model = netns_bytes.make_moe(tmp_path)
    # This model's held-out loss falls steadily at 0.03; at 0.1 it jumps after the first evaluation (3.30, 5.58, 5.01).
    over = dict(HIGH_LR, learning_rate=0.1, save_steps=2, eval_steps=2, early_stopping_patience=2, save_total_limit=1)
    over.update(model_name_or_path=str(model), parallelism="hsdp", per_device_train_batch_size=1)
    run_torchrun(trainer_config(tmp_path, "hsdp", gradient_accumulation_steps=2, **over), nproc_per_node=4)

    out = tmp_path / "hsdp"
    m = json.loads((out / "metrics.json").read_text())
    assert m["stopped_early"] is True and m["stopped_at_step"] < 40
    assert (out / f"checkpoint-{m['best_step']}" / "model").is_dir()  # each rank's shards
    last = _evals(out / f"checkpoint-{m['stopped_at_step']}")[m["stopped_at_step"]]
    assert m["best_step"] < m["stopped_at_step"] and last > m["best_eval_loss"] * 1.05  # the last weights are worse
    assert m["eval_loss"] == pytest.approx(m["best_eval_loss"], rel=1e-5)


def test_a_hyper_parameter_trial_trains_its_steps_with_the_runs_patience(root):
    # A trial's config is the run's with save_strategy no (components/hpo/trial.py): no checkpoint to keep a best in.
    out = root / "trial"
    over = dict(HIGH_LR, max_steps=6, early_stopping_patience=1, eval_steps=2, save_strategy="no")
    run_torchrun(trainer_config(root, "trial", **over), nproc_per_node=2)

    m = json.loads((out / "metrics.json").read_text())
    assert m["global_step"] == 6 and "stopped_early" not in m
    assert not list(out.glob("checkpoint-*"))


def test_a_run_resumed_after_a_kill_keeps_its_patience_counter(root, capfd):
    out = root / "resumed"
    over = dict(HIGH_LR, save_steps=2, eval_steps=2, early_stopping_patience=3, save_total_limit=100)
    config = trainer_config(root, "resumed", **over)
    run_torchrun(config, nproc_per_node=2)
    straight = json.loads((out / "metrics.json").read_text())
    assert straight["stopped_early"] is True
    best, stop = straight["best_step"], straight["stopped_at_step"]

    # The folder as a kill right after checkpoint-K leaves it, where K is past the best: its patience counter is
    # already counting. Without it the resumed run would start counting again and stop later.
    kill_at = best + 2
    assert kill_at < stop and _counter(out / f"checkpoint-{kill_at}") == 1
    for step in _steps(out):
        if step > kill_at:
            shutil.rmtree(out / f"checkpoint-{step}")
    shutil.rmtree(out / "final")
    (out / "metrics.json").unlink()
    capfd.readouterr()

    run_torchrun(config, nproc_per_node=2)
    logs = capfd.readouterr().out
    assert f"resuming from {out / f'checkpoint-{kill_at}'}" in logs
    assert "1 of 3 evaluations without improvement before the resume" in logs
    resumed = json.loads((out / "metrics.json").read_text())
    assert (resumed["stopped_at_step"], resumed["best_step"]) == (stop, best)
    assert resumed["best_eval_loss"] == pytest.approx(straight["best_eval_loss"], rel=1e-5)
    _assert_same_weights(out / "final", out / f"checkpoint-{best}")
