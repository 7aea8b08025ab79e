"""Reinforcement learning on a laptop, for real: `python -m pipelines.run -p 'stages=["sft","rm","grpo"]'` runs every
step through kfp.local on 2 CPU cores in under 10 minutes, and the mean reward on held-out prompts rises over the model
before grpo: the whole reward, and the answer and format rewards' part alone (what ``["sft","grpo"]`` is scored by).

The bundled task (builtin:arithmetic): Korean and English arithmetic and word problems whose prompts ask for a closing
answer line ('Answer: N' / '정답은 N입니다.'), the line the chat sample's worked math problems end with. After the one-
minute sft stage the tiny model writes that line in about a fifth of its sampled replies and states the right number
almost never; 60 GRPO steps (2 prompts x 8 completions per step) make the line the rule (the format reward), which is
what raises the held-out reward; the answers stay wrong (a 1M-parameter model does not learn arithmetic in a minute).
"""

import json
from pathlib import Path

import pytest
import yaml

from tests.helpers.load import wall_time_bound
from tests.helpers.repo import ROOT, run_cli

# Measured on the 2-core development machine (README, "Reinforcement learning"): held-out mean reward (greedy answers to
# the 48 held-out prompts, answer 1.0 + format 0.5) before grpo -> tuned. The bound is well below the measured gain.
MIN_REWARD_GAIN = 0.2


def _run(tmp_path, *params: str) -> tuple[dict, str]:
    summary_path = tmp_path / "summary.json"
    args = [a for p in params for a in ("-p", p)]
    result = run_cli(
        "pipelines.run", "--workspace", str(tmp_path / "ws"), "--summary-json", str(summary_path), *args, timeout=900
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return json.loads(summary_path.read_text()), result.stdout + result.stderr


def _answer_and_format(report: str) -> dict[str, float]:
    """Each model's mean reward from the answer and format rewards alone (weights 1.0 and 0.5, the default
    grpo_rewards), from the report's table of rewards by source: the reward of a run without the model reward."""
    lines = report[report.index("| model | mean reward |") :].splitlines()
    sources = [cell.strip() for cell in lines[0].strip("|").split("|")][2:]
    out = {}
    for line in lines[2:]:
        if not line.startswith("| "):
            break
        cells = [cell.strip() for cell in line.strip("|").split("|")]
        means = dict(zip(sources, map(float, cells[2:]), strict=True))
        out[cells[0]] = 1.0 * means["answer"] + 0.5 * means["format"]
    return out


# The preset's 60. 40 steps (issue 38, CI's time) passed three CIs and failed the fourth: the answer and format
# rewards' held-out part went 0.065 -> 0.479 in one run and 0.065 -> 0.151 in another (CI at 461cc9a), short of the
# +0.2 bound; 40 steps of CPU sampling do not raise it reliably.
GRPO_STEPS = 60


def _shorter_rm_and_grpo() -> str:
    """The preset's rm and grpo stage settings with rm's 2 epochs cut to 1 (its held-out accuracy: 0.94, the bound
    0.8) and grpo's ``max_steps`` set to ``GRPO_STEPS``."""
    stages = yaml.safe_load((ROOT / "pipelines/presets/local-tiny.yaml").read_text())["stage_settings"]
    stages["rm"]["num_train_epochs"] = 1.0
    stages["grpo"]["max_steps"] = GRPO_STEPS
    return "stage_settings=" + json.dumps({stage: stages[stage] for stage in ("rm", "grpo")})


@pytest.mark.slow
def test_sft_then_a_reward_model_then_grpo_raises_the_held_out_reward_in_under_ten_minutes(tmp_path):
    """Both recipes of docs/rl.md in one run (two runs before; issue 38, CI's time): sft -> grpo scored by the answer
    and format rewards, with the reward model trained beside it (rm, a side branch) adding its score. What the
    sft -> grpo run asserted holds for the answer and format rewards' part of the reward. rm and grpo train less
    than the preset's recipe (``_shorter_rm_and_grpo``); the README's figures are the whole recipe's."""
    s, out = _run(
        tmp_path,
        'stages=["sft","rm","grpo"]',
        'grpo_rewards={"answer": 1.0, "format": 0.5, "model": 0.1}',
        _shorter_rm_and_grpo(),
    )
    assert s["status"] == "succeeded" and s["wall_seconds"] < wall_time_bound(600), s["wall_seconds"]
    m = s["metrics"]
    assert m["reward_model_accuracy"] >= 0.8, m  # held-out pairs of builtin:preference
    assert m["mean_reward"] >= m["before_grpo_mean_reward"] + MIN_REWARD_GAIN, m
    report = Path(s["reports"]["evaluation"]).read_text(encoding="utf-8")
    assert "## Reward on held-out prompts (grpo)" in report and "| before grpo |" in report
    assert "## Reward model (rm)" in report
    rule_based = _answer_and_format(report)
    assert rule_based["tuned"] >= rule_based["before grpo"] + MIN_REWARD_GAIN, rule_based
    assert rule_based["before grpo"] >= rule_based["base"] - 0.1, rule_based
    models = tmp_path / "ws" / "models" / "runs" / s["run_id"]
    grpo = json.loads((models / "grpo" / "metrics.json").read_text())
    assert grpo["stage"] == "grpo" and grpo["global_step"] == GRPO_STEPS, grpo
    assert grpo["last_reward"] > grpo["first_reward"], grpo
    assert grpo["reward_sources"] == ["answer", "format", "model"]
    # rm is a side branch: grpo trained the sft stage's model and scored it with rm's
    record = json.loads((models / "grpo" / "base_model.json").read_text())
    assert str(models / "train" / "final") in json.dumps(record)
    assert json.loads((models / "rm" / "metrics.json").read_text())["eval_accuracy"] >= 0.8
    assert s["model_uri"].endswith("/grpo/final") and f"sft.grpo: step {GRPO_STEPS}/{GRPO_STEPS} | reward " in out


def test_render_writes_the_rm_and_grpo_stages_and_grpo_trains_the_policy_not_the_reward_model(tmp_path):
    result = run_cli(
        "pipelines.run",
        "--preset",
        "qwen3-30b-a3b-full",
        "-p",
        'stages=["sft","rm","grpo"]',
        "-p",
        "dpo_dataset_source=my-org/pairs",
        "-p",
        "grpo_dataset_source=my-org/prompts",
        "-p",
        'grpo_rewards={"answer": 1.0, "model": 0.5}',
        # Full fine-tuning's grpo stage does not fit an H100 (the policy gathered for generation: memory.py).
        "-p",
        'stage_settings={"grpo": {"method": "lora"}}',
        "--render",
        str(tmp_path),
    )
    assert result.returncode == 0, result.stderr
    rm, grpo = (json.loads((tmp_path / f"train_config-{stage}.json").read_text()) for stage in ("rm", "grpo"))
    assert (rm["stage"], grpo["stage"]) == ("rm", "grpo")
    assert rm["model_name_or_path"] == grpo["model_name_or_path"] == "/mnt/models/runs/render-preview/train/final"
    assert rm["method"] == "full" and rm["learning_rate"] == 1e-4 and grpo["learning_rate"] == 1e-6  # stage defaults
    assert grpo["method"] == "lora"
    assert grpo["dataset_path"] == "/mnt/data/runs/render-preview/dataset-grpo"
    assert grpo["grpo_rewards"] == {"answer": 1.0, "model": 0.5} and grpo["train_sampling_strategy"] == "random"
    names = [
        yaml.safe_load((tmp_path / f"pytorchjob-{stage}.yaml").read_text())["metadata"]["name"]
        for stage in ("rm", "grpo")
    ]
    assert names == ["rm-render-preview", "grpo-render-preview"]


def test_each_stage_starts_from_the_last_earlier_stage_that_hands_its_model_on():
    from components.stages import started_from

    started = started_from(["sft", "rm", "dpo", "grpo"], lambda stage: f"/m/{stage}")
    assert started == {"sft": None, "rm": "/m/sft/final", "dpo": "/m/sft/final", "grpo": "/m/dpo/final"}
    assert started_from(["rm", "grpo"], lambda stage: f"/m/{stage}") == {"rm": None, "grpo": None}  # the base
