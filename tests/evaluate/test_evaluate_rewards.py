"""Evaluation of the grpo and rm stages: held-out answers scored with the run's rewards and weights, the gate on the
reward gain over the model before grpo, and the report's section."""

from components.evaluate.reward_gain import reward_gate, rewards_section, score_answers

PATTERN = r"(?:Answer:|정답은)\s*\$?(-?\d[\d,]*(?:\.\d+)?)?"


class _Words:
    """A tokenizer that counts words: what score_answers asks of one (completion ids for the length reward)."""

    def __call__(self, text, add_special_tokens=False):
        return {"input_ids": list(range(len(text.split())))}


def _prompts(n):
    return [[{"role": "user", "content": f"q{i}"}] for i in range(n)]


def test_answers_are_scored_with_the_runs_weights_and_an_unreferenced_answer_is_left_out():
    answers = ["so 7.\n\nAnswer: 7.", "Answer: 8", "no idea", "정답은 3입니다."]
    references = ["7", "7", "7", ""]  # the last prompt has no reference: answer gives None there, as in training
    scores = score_answers(
        _prompts(4),
        references,
        answers,
        _Words(),
        {"answer": 1.0, "format": 0.5, "length": 0},
        pattern=PATTERN,
        length_budget=10,
    )
    assert scores["sources"] == {"answer": 1 / 3, "format": 0.75}  # length has weight 0: not a source
    # per answer: 1 + 0.5, 0 + 0.5, 0 + 0, (left out) + 0.5
    assert scores["mean_reward"] == (1.5 + 0.5 + 0.0 + 0.5) / 4


def test_a_users_function_scores_held_out_answers_too(tmp_path):
    path = tmp_path / "r.py"
    path.write_text(
        "def short(completions, **kwargs):\n"
        "    return [1.0 if len(c[-1]['content']) < 5 else 0.0 for c in completions]\n"
    )
    scores = score_answers(
        _prompts(2),
        ["", ""],
        ["ok", "a long answer"],
        _Words(),
        {"function": 2.0},
        pattern=PATTERN,
        length_budget=10,
        reward_function=f"{path}:short",
    )
    assert scores == {"mean_reward": 1.0, "sources": {"function": 0.5}}


def test_the_gate_requires_the_reward_gain_over_the_model_before_grpo():
    scores = {"before grpo": {"mean_reward": 0.1}, "tuned": {"mean_reward": 0.45}}
    assert reward_gate(scores, 0.0) == (True, "mean reward 0.100 -> 0.450 (+0.350), required >= +0.000")
    passed, reason = reward_gate(scores, 0.5)
    assert not passed and reason == (
        "mean reward 0.100 -> 0.450 (+0.350) is short of the required +0.500 gain over "
        "the model before grpo (lower min_reward_improvement to accept it)"
    )


def test_the_report_shows_rewards_by_model_answers_side_by_side_and_the_reward_models_accuracy():
    scores = {
        role: {"mean_reward": r, "sources": {"answer": 0.0, "format": 2 * r}, "answers": [f"{role} a|b"], "prompts": 1}
        for role, r in (("base", 0.0), ("before grpo", 0.05), ("tuned", 0.4))
    }
    scores["_rows"] = {"prompts": ["What is 3 + 4?"], "references": ["7"]}
    lines = rewards_section(scores, {"accuracy": 0.875, "margin": 1.25, "pairs": 16})
    text = "\n".join(lines)
    assert "| model | mean reward | answer | format |" in text and "| tuned | 0.400 | 0.000 | 0.800 |" in text
    assert "| 1 | What is 3 + 4? | 7 | base a\\|b | before grpo a\\|b | tuned a\\|b |" in text
    assert "Pairwise accuracy on 16 held-out pairs: 0.875" in text
