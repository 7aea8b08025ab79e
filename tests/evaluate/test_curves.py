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
