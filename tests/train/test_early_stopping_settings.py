"""Early stopping's settings: refused before any GPU when the held-out loss would never be compared, turned into the
Trainer's evaluation and best-model arguments for the cpt and sft stages only, and the best checkpoint kept through
the pruning. The runs themselves: tests/train/trainer/test_early_stopping.py."""

import json

import pytest

from components.models.checkpoint_dirs import prune_checkpoints, write_marker
from components.train.config import check_combination
from components.validate.rules import check
from pipelines import params as P
from tests.helpers.trainer import make_workdir


@pytest.fixture(scope="module")
def tiny():
    return P.resolve("local-tiny")  # sft, save_steps 200, epochs (max_steps -1): valid as it is


def test_early_stopping_is_off_by_default(tiny):
    assert tiny["early_stopping_patience"] == 0 and tiny["eval_steps"] == 0
    assert check(tiny) == []


@pytest.mark.parametrize(
    "over, message",
    [
        (
            {"early_stopping_patience": 2, "eval_steps": 3},
            "eval_steps=3 with early_stopping_patience=2: save_steps=200 must be a multiple of it",
        ),
        (
            {"early_stopping_patience": 2, "max_steps": 50},
            "early_stopping_patience=2 never evaluates: the first evaluation, at step 200 (eval_steps=0: every "
            "save_steps=200), comes after max_steps=50",
        ),
        (
            {"early_stopping_patience": 2, "eval_steps": 100, "max_steps": 50},
            "early_stopping_patience=2 never evaluates: the first evaluation, at step 100 (eval_steps=100)",
        ),
        ({"early_stopping_min_delta": -0.01}, "early_stopping_min_delta=-0.01 must be >= 0"),
        ({"early_stopping_patience": -1}, "early_stopping_patience=-1 must be >= 0"),
    ],
)
def test_settings_that_never_compare_the_held_out_loss_are_one_error_naming_the_setting(tiny, over, message):
    errors = check({**tiny, **over})
    assert len(errors) == 1 and errors[0].startswith(message), errors


def test_settings_that_compare_it_pass(tiny):
    assert check({**tiny, "early_stopping_patience": 3, "eval_steps": 50}) == []
    assert check({**tiny, "early_stopping_patience": 3, "max_steps": 400}) == []


def test_cpt_and_sft_with_the_same_problem_are_one_error_and_other_stages_are_not_checked(tiny):
    both = {**tiny, "stages": ["cpt", "sft", "dpo"], "cpt_dataset_source": "builtin:domain-text"}
    both["dpo_dataset_source"] = "builtin:preference"
    errors = check({**both, "early_stopping_patience": 2, "eval_steps": 3})
    assert len(errors) == 1 and errors[0].startswith("eval_steps=3 with"), errors
    errors = check(
        {**both, "early_stopping_patience": 2, "eval_steps": 3, "stage_settings": {"cpt": {"eval_steps": 0}}}
    )
    assert len(errors) == 1 and errors[0].startswith("stage sft: eval_steps=3 with"), errors


def test_the_trainer_refuses_the_same_config_and_leaves_hyper_parameter_trials_alone():
    config = {"stage": "sft", "early_stopping_patience": 2, "eval_steps": 3, "save_steps": 200}
    assert check_combination(config)[0].startswith("eval_steps=3 with early_stopping_patience=2")
    # A trial has no checkpoints (save_strategy no) and trains its steps; dpo does not stop early.
    assert check_combination({**config, "save_strategy": "no"}) == []
    assert check_combination({**config, "stage": "dpo"}) == []


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    return make_workdir(tmp_path_factory.mktemp("es_cfg"), rows=32)


def _config(workdir, tmp_path, **over):
    path = tmp_path / "config.json"
    base = {"dataset_path": str(workdir / "data"), "output_dir": str(tmp_path / "out"), "use_cpu": True}
    path.write_text(json.dumps({**base, "model_name_or_path": str(workdir / "base"), "report_to": [], **over}))
    return str(path)


def test_patience_turns_on_evaluation_and_the_best_model_at_the_end(workdir, tmp_path):
    from components.train.trainer.config_file import parse_config

    cfg = parse_config(_config(workdir, tmp_path, early_stopping_patience=2, save_steps=20, eval_steps=10))
    assert cfg.eval_strategy == "steps" and cfg.eval_steps == 10
    assert cfg.load_best_model_at_end and cfg.metric_for_best_model == "eval_loss_per_token"
    assert cfg.greater_is_better is False  # transformers would guess True from the name
    cfg = parse_config(_config(workdir, tmp_path, early_stopping_patience=2, save_steps=20))
    assert cfg.eval_steps == 20  # 0: at every checkpoint
    for over in ({}, {"early_stopping_patience": 2, "save_strategy": "no"}):
        cfg = parse_config(_config(workdir, tmp_path, **over))
        assert cfg.eval_strategy == "no" and not cfg.load_best_model_at_end


def test_a_layout_whose_best_checkpoint_would_load_wrong_weights_is_refused(tiny, workdir, tmp_path):
    from components.train.trainer.config_file import parse_config

    # hsdp's per-rank shards of a model with tied word embeddings (the tiny Qwen3, like Qwen3's small dense models).
    hsdp = {"early_stopping_patience": 2, "parallelism": "hsdp", "deepspeed_config": "none"}
    errors = check({**tiny, **hsdp, "model_name_or_path": str(workdir / "base")})
    assert len(errors) == 1 and errors[0].startswith("early_stopping_patience=2 with parallelism=hsdp: "), errors
    assert check({**tiny, **hsdp, "early_stopping_patience": 0, "model_name_or_path": str(workdir / "base")}) == []
    with pytest.raises(ValueError, match="early_stopping_patience=2 with parallelism=hsdp: the best checkpoint"):
        parse_config(_config(workdir, tmp_path, early_stopping_patience=2, parallelism="hsdp"))


def _checkpoint(out, step, best=None):
    folder = out / f"checkpoint-{step}"
    folder.mkdir(parents=True)
    state = {"global_step": step, "best_model_checkpoint": str(out / f"checkpoint-{best}") if best else None}
    (folder / "trainer_state.json").write_text(json.dumps(state))
    write_marker(folder, step)


def test_pruning_keeps_the_best_checkpoint_the_newest_records(tmp_path):
    for step in (2, 4, 6, 8):
        _checkpoint(tmp_path, step, best=4)
    assert prune_checkpoints(str(tmp_path), 1) == [str(tmp_path / "checkpoint-2"), str(tmp_path / "checkpoint-6")]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint-4", "checkpoint-8"]
    _checkpoint(tmp_path, 10)  # no best recorded (early stopping off): the last keep only
    prune_checkpoints(str(tmp_path), 1)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint-10"]
