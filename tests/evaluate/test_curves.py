"""The training curves of the evaluation report (components/evaluate/curves.py): what they are drawn from, from the
trainer's log history as a checkpoint keeps it, for an sft stage (its loss) and a grpo stage (its reward above it)."""

from __future__ import annotations

import base64
import io
import json

from components.evaluate.curves import PNG_PREFIX, training_log, training_section

# A grpo stage's log history as TRL 1.16's GRPOTrainer.log writes it: per logging window the mean of its steps, None
# where nothing was scored (here the function source at step 2), and its eval (eval_ keys) at the end.
GRPO_HISTORY = [
    {
        "step": 1,
        "loss": 0.01,
        "reward": 0.2,
        "reward_std": 0.1,
        "rewards/answer/mean": 0.2,
        "rewards/function/mean": 0.4,
    },
    {
        "step": 2,
        "loss": -0.02,
        "reward": 0.3,
        "reward_std": 0.2,
        "rewards/answer/mean": 0.3,
        "rewards/function/mean": None,
    },
    {
        "step": 3,
        "loss": 0.0,
        "reward": 0.5,
        "reward_std": 0.15,
        "rewards/answer/mean": 0.4,
        "rewards/function/mean": 0.6,
    },
    {"step": 3, "eval_loss": 0.0, "eval_reward": 0.45, "eval_rewards/answer/mean": 0.4},
]


def _checkpoint(tmp_path, history, step=3):
    checkpoint = tmp_path / f"checkpoint-{step}"
    checkpoint.mkdir()
    (checkpoint / "COMPLETE").write_text("")
    state = {"log_history": history, "logging_steps": 1, "global_step": step}
    (checkpoint / "trainer_state.json").write_text(json.dumps(state))
    return str(tmp_path)


def _png_size(section: list[str]) -> tuple[int, int]:
    from PIL import Image

    line = next(x for x in section if PNG_PREFIX in x)
    data = base64.b64decode(line.split(PNG_PREFIX)[1].rstrip(")"))
    return Image.open(io.BytesIO(data)).size


def test_a_grpo_log_gives_the_reward_mean_and_spread_per_window_and_each_sources_mean(tmp_path):
    log = training_log(_checkpoint(tmp_path, GRPO_HISTORY))
    assert log["reward"] == [(1, 0.2, 0.1), (2, 0.3, 0.2), (3, 0.5, 0.15)]  # the eval window is not training's
    assert log["rewards"] == {"answer": [(1, 0.2), (2, 0.3), (3, 0.4)], "function": [(1, 0.4), (3, 0.6)]}
    assert log["train"] == [(1, 0.01), (2, -0.02), (3, 0.0)]


def test_the_grpo_picture_draws_the_reward_above_the_loss_and_says_what_it_shows(tmp_path):
    section = training_section(_checkpoint(tmp_path, GRPO_HISTORY), 5.0, 4.0)
    text = "\n".join(section)
    assert "*Reward* (grpo)" in text and "`train/reward_std`" in text and "`train/rewards/<source>/unscored`" in text
    assert _png_size(section) == (750, 740)  # two panels: reward, then loss


def test_an_sft_log_has_no_reward_and_its_picture_only_the_loss(tmp_path):
    history = [{"step": 5, "loss": 3.0}, {"step": 10, "loss": 2.5}, {"step": 10, "eval_loss": 2.7}]
    log = training_log(_checkpoint(tmp_path, history, step=10))
    assert log["reward"] == [] and log["rewards"] == {} and log["train"] == [(5, 3.0), (10, 2.5)]
    section = training_section(str(tmp_path), 5.0, 4.0)
    assert "*Reward*" not in "\n".join(section) and _png_size(section) == (750, 420)


def test_an_early_stopped_run_says_where_it_stopped_and_which_checkpoint_is_the_model(tmp_path):
    """metrics.json's early-stopping figures (components/train/trainer/callbacks.py early_stopping_summary, as
    sft.py writes them) reach the report: the user sees why training ended before max_steps."""
    history = [{"step": s, "loss": 3.0 - 0.1 * s} for s in (5, 10, 15, 20)] + [
        {"step": s, "eval_loss": loss} for s, loss in ((10, 2.6), (15, 2.7), (20, 2.8))
    ]
    train_dir = _checkpoint(tmp_path, history, step=20)
    summary = {
        "eval_loss": 2.6,
        "stopped_early": True,
        "stopped_at_step": 20,
        "max_steps": 100,
        "best_step": 10,
        "best_eval_loss": 2.6,
        "best_checkpoint": f"{train_dir}/checkpoint-10",
    }
    (tmp_path / "metrics.json").write_text(json.dumps(summary))
    text = "\n".join(training_section(train_dir, 5.0, 2.6))
    assert "*Early stopping*: stopped at step 20 of 100" in text
    assert "best held-out loss 2.6000 at step 10" in text and "checkpoint-10" in text
    (tmp_path / "metrics.json").write_text(json.dumps({**summary, "stopped_early": False, "stopped_at_step": 100}))
    assert "trained all 100 steps" in "\n".join(training_section(train_dir, 5.0, 2.6))
    (tmp_path / "metrics.json").write_text(json.dumps({"eval_loss": 2.6}))  # early stopping off
    assert "*Early stopping*" not in "\n".join(training_section(train_dir, 5.0, 2.6))
