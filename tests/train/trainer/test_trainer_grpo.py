"""The grpo stage of the trainer entry point: TRL's GRPOTrainer on prompts with verifiable rewards, under real 2-process
torchrun.

Fast: a config's ``stage`` picks TRL's GRPOConfig plus the settings; TRL's own knobs come from the settings (one name
per knob); the rewards load before any model does (an unknown reward, a user function that does not import or takes
the wrong arguments, a missing reward model: one error naming the setting); the built-in rewards score as documented.
Slow: a tiny randomly initialised model learns, from a user's reward function in a file, to write with the letters of
the word its prompt names (the reward rises from the first logged step to the last: 0.076 -> 0.238 in 30 steps,
TRL's sampled eval 0.166), exports ``final/``, and a re-run resumes from its last complete checkpoint.

TRL 1.16 facts this relies on (trl/trainer/grpo_trainer.py, grpo_config.py): reward functions are called with
keywords ``prompts``, ``completions``, ``completion_ids``, ``trainer_state``, ``log_extra``, ``log_metric`` and every
other dataset column (``_calculate_rewards``), and return one float or None per completion; ``reward_weights`` weighs
them in ``reward_funcs`` order; the generation batch (micro-batch x accumulation x processes) must be divisible by
``num_generations`` (``GRPOConfig.__post_init__``); ``beta`` 0 keeps no reference model.
"""

import json
import random
import shutil

import pytest

from components.evaluate.curves import training_log
from components.rewards import answer_reward, format_reward, length_reward, load_reward_function
from components.train.config import build_trainer_config, write_trainer_config
from components.train.launcher.local_torchrun import run_torchrun
from tests.helpers.repo import run_module
from tests.helpers.trainer import CPU_TEST_SETTINGS, WORDS, setting_names, trainer_settings

PATTERN = r"(?:Answer:|정답은)\s*\$?(-?\d[\d,]*(?:\.\d+)?)?"
# The user's reward, as a file on a volume: the share of the completion's characters that are letters of the prompt's
# word (a dense reward: a randomly initialised model names the word itself in 2.5% of its samples, too rarely for 30
# steps to learn from).
USER_REWARD = """
def names_the_word(prompts, completions, answer, **kwargs):
    texts = [c[-1]["content"] for c in completions]
    return [sum(ch in a for ch in t) / max(1, len(t)) for t, a in zip(texts, answer)]
"""


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    """``base/`` (tiny model + tokenizer), ``prompts/`` (train 64 + eval 16 prompt rows) and ``reward.py``."""
    from datasets import Dataset, DatasetDict

    from components.models.tiny import build_model, build_tokenizer

    root = tmp_path_factory.mktemp("grpo")
    rng = random.Random(0)
    rows = [
        {"prompt": [{"role": "user", "content": f"Say {w}. (#{i})"}], "answer": w}
        for i, w in enumerate(rng.choice(WORDS) for _ in range(80))
    ]
    corpus = root / "chat.jsonl"
    corpus.write_text(
        "\n".join(json.dumps({"messages": r["prompt"] + [{"role": "assistant", "content": r["answer"]}]}) for r in rows)
    )
    tok = build_tokenizer(corpus)
    build_model(tok).save_pretrained(root / "base")
    tok.save_pretrained(root / "base")
    DatasetDict(train=Dataset.from_list(rows[16:]), eval=Dataset.from_list(rows[:16])).save_to_disk(str(root / "data"))
    (root / "reward.py").write_text(USER_REWARD)
    return root


def _config(root, name: str, **over) -> str:
    """A CPU trainer config as the train step writes it for the grpo stage; returns its path."""
    settings = dict(
        model_name_or_path=str(root / "base"),
        method="full",
        max_seq_length=128,
        per_device_train_batch_size=8,
        gradient_accumulation_steps=1,
        learning_rate=3e-3,
        num_train_epochs=1,
        max_steps=30,
        warmup_ratio=0.0,
        seed=0,
        deepspeed_config="none",
        grpo_rewards={"function": 1.0},
        grpo_reward_function=f"{root / 'reward.py'}:names_the_word",
        grpo_num_generations=8,
        grpo_max_completion_length=8,
        grpo_beta=0.04,
        **CPU_TEST_SETTINGS,
    )
    extra = {k: over.pop(k) for k in list(over) if k not in setting_names()}
    cfg = build_trainer_config(
        trainer_settings(**{**settings, **over}),
        dataset_path=str(root / "data"),
        output_dir=str(root / name),
        use_cpu=True,
        model_cache_dir=str(root / "cache"),
        stage="grpo",
        packing=False,
    )
    cfg.update(extra)
    return write_trainer_config(cfg, str(root / "cfg" / f"{name}.json"))


def _parse(path):
    """parse_config in this process: without ddp_backend, which outside torchrun has no process group to join."""
    from pathlib import Path

    from components.train.trainer.config_file import parse_config

    cfg = json.loads(Path(path).read_text())
    cfg.pop("ddp_backend")
    Path(path).write_text(json.dumps(cfg))
    return parse_config(path)


# --- fast: the rewards -------------------------------------------------------------------------------------------


def _turns(*texts):
    return [[{"role": "assistant", "content": t}] for t in texts]


def test_the_answer_reward_checks_the_number_in_the_answer_line_against_the_reference():
    reward = answer_reward(PATTERN)
    completions = _turns(
        "so 3 + 4 = 7.\n\nAnswer: 7.",
        "Answer: 7.0",
        "정답은 1,000ml입니다.",
        "Answer: 8",
        "It is 7.",
        "Answer: soon",
        "Answer: 7",
    )
    references = ["7", "7", "1000", "7", "7", "7", ""]
    assert reward(prompts=[None] * 7, completions=completions, answer=references) == [
        1.0,
        1.0,
        1.0,
        0.0,
        0.0,
        0.0,
        None,
    ]  # None: no reference, not applicable (TRL leaves it out of the sum)


def test_the_format_reward_pays_for_the_answer_line_and_the_length_reward_for_brevity():
    assert format_reward(PATTERN)(prompts=None, completions=_turns("Answer: 3", "three", "따라서 정답은")) == [
        1.0,
        0.0,
        1.0,
    ]
    assert length_reward(10)(
        prompts=None, completions=_turns("a", "b", "c"), completion_ids=[[1] * 5, [1] * 15, [1] * 25]
    ) == [1.0, 0.5, 0.0]


def test_a_user_function_gets_only_the_keywords_it_names(tmp_path):
    path = tmp_path / "r.py"
    path.write_text("def r(completions, answer):\n    return [float(len(answer[0]))] * len(completions)\n")
    reward = load_reward_function(f"{path}:r")
    # TRL passes these and more; a function without **kwargs gets only its own.
    out = reward(
        prompts=["p"],
        completions=["c"],
        completion_ids=[[1]],
        answer=["abc"],
        trainer_state=None,
        log_extra=None,
        log_metric=None,
    )
    assert out == [3.0] and reward.__name__ == "r"  # TRL logs the reward under the function's name


# --- fast: the config ---------------------------------------------------------------------------------------------


def test_a_grpo_config_is_trl_grpo_config_with_its_knobs_from_the_settings(workdir):
    from trl import GRPOConfig

    from components.train.trainer.grpo_arguments import GRPOStageConfig

    cfg = _parse(
        _config(
            workdir,
            "parsed",
            grpo_num_generations=4,
            grpo_max_completion_length=16,
            grpo_beta=0.1,
            grpo_temperature=0.7,
            grpo_rewards={"answer": 1.0, "format": 0.25, "length": 0},
        )
    )
    assert type(cfg) is GRPOStageConfig and isinstance(cfg, GRPOConfig) and cfg.stage == "grpo"
    assert (cfg.num_generations, cfg.max_completion_length, cfg.beta, cfg.temperature) == (4, 16, 0.1, 0.7)
    # The final sampled evaluation: one completion per held-out prompt (groups matter only for training's advantages).
    assert cfg.num_generations_eval == 1
    assert cfg.reward_weights == [1.0, 0.25]  # the sources with a non-zero weight, in order
    assert cfg.use_vllm is False  # no CUDA here: transformers' generate
    assert cfg.bf16 is False and cfg.train_sampling_strategy == "random"
    assert not (workdir / "parsed").exists()  # parsing writes nothing


@pytest.mark.parametrize(
    "over, message",
    [
        (
            {"num_generations": 4},
            r"\['num_generations'\] are set by the trainer for stage 'grpo'; set "
            r"\['grpo_num_generations'\] instead",
        ),
        ({"grpo_rewards": {"acc": 1.0}}, r"grpo_rewards names \['acc'\], which are not rewards"),
        ({"grpo_rewards": {"answer": 0}}, r"grpo_rewards gives no reward a non-zero weight"),
        (
            {"grpo_reward_function": "/nowhere/r.py:f"},
            r"grpo_reward_function '/nowhere/r.py:f': /nowhere/r.py is not a "
            r"file",
        ),
        (
            {"grpo_rewards": {"model": 1.0}},
            r"grpo_rewards uses model and grpo_reward_model is empty, but the run's rm "
            r"stage has no model at .*/rm/final",
        ),
        ({"grpo_answer_pattern": "Answer: (", "grpo_rewards": {"format": 1.0}}, r"grpo_answer_pattern is not a valid"),
    ],
)
def test_what_is_wrong_is_named_before_any_model_loads(workdir, over, message):
    with pytest.raises(ValueError, match=message):
        _parse(_config(workdir, "bad", **over))


def test_a_user_function_with_the_wrong_signature_exits_2_with_one_line(workdir):
    (workdir / "bad_reward.py").write_text("def f(text):\n    return []\n")
    path = _config(workdir, "bad-sig", grpo_reward_function=f"{workdir / 'bad_reward.py'}:f")
    result = run_module("components.train.trainer", "--config", path)
    assert result.returncode == 2, result.stderr[-2000:]
    assert result.stderr.strip().startswith(
        f"error: {path}: grpo_reward_function '{workdir / 'bad_reward.py'}:f': f(text) does not take completions"
    )


def test_grpo_checkpoints_are_the_sft_checkpoints():
    from transformers import Trainer

    from components.train.trainer.checkpoints import CheckpointMixin
    from components.train.trainer.grpo import GRPOCheckpointTrainer

    mro = GRPOCheckpointTrainer.__mro__
    assert mro.index(CheckpointMixin) < mro.index(Trainer)
    assert GRPOCheckpointTrainer._save_checkpoint is CheckpointMixin._save_checkpoint


# --- slow: real 2-rank runs ---------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def run(workdir):
    """30 GRPO steps on 2 CPU ranks (2 prompts x 8 completions per step), a complete checkpoint every 10."""
    run_torchrun(_config(workdir, "full", save_steps=10, save_total_limit=3), nproc_per_node=2)
    return json.loads((workdir / "full" / "metrics.json").read_text())


@pytest.mark.slow
def test_grpo_raises_the_reward_of_a_users_function_and_exports_the_policy(workdir, run):
    m = run
    assert m["stage"] == "grpo" and m["world_size"] == 2 and m["global_step"] == 30
    assert m["reward_sources"] == ["function"] and m["reward_weights"] == [1.0]
    assert m["last_reward"] > m["first_reward"] + 0.1, m  # measured: 0.076 -> 0.238
    assert m["eval_reward"] > m["first_reward"], m
    final = workdir / "full" / "final"
    assert (final / "model.safetensors").exists() and (final / "tokenizer.json").exists()


@pytest.mark.slow
def test_a_rerun_resumes_from_the_last_complete_checkpoint(workdir, run, capfd):
    out = workdir / "full"
    for done in ("checkpoint-30", "final", "metrics.json"):  # as if evicted after checkpoint-20
        path = out / done
        shutil.rmtree(path) if path.is_dir() else path.unlink()
    run_torchrun(str(workdir / "cfg" / "full.json"), nproc_per_node=2)
    assert f"resuming from {out / 'checkpoint-20'}" in capfd.readouterr().out
    resumed = json.loads((out / "metrics.json").read_text())
    assert resumed["global_step"] == 30 and (out / "final" / "model.safetensors").exists()


# --- slow: rewards that are None or NaN ---------------------------------------------------------------------------

# A user's reward that does not apply everywhere: None (TRL: "not applicable") for every completion of even steps,
# NaN for the first completion of each call on odd ones, the names_the_word score otherwise.
PATCHY_REWARD = """
import math

def patchy(prompts, completions, answer, trainer_state, **kwargs):
    if trainer_state.global_step % 2 == 0:
        return [None] * len(completions)
    texts = [c[-1]["content"] for c in completions]
    scores = [sum(ch in a for ch in t) / max(1, len(t)) for t, a in zip(texts, answer)]
    return [math.nan] + scores[1:]


def never(prompts, completions, **kwargs):
    return [None if i % 2 else math.nan for i in range(len(completions))]
"""


@pytest.mark.slow
def test_lora_grpo_keeps_the_trained_adapter_only_and_a_reward_that_returns_none_or_nan_is_counted(workdir, capfd):
    """One LoRA run (two tests before; issue 38, CI's time), rewarded beside the format reward by a function that is
    None for whole steps and NaN for some completions.

    - LoRA: TRL's reference is the model with a frozen copy of the adapter ("ref", GRPOTrainer.__init__); the export
      holds the trained adapter and the merged model, never that copy.
    - The run finishes; each progress line says how many completions per step the function left unscored."""
    (workdir / "patchy.py").write_text(PATCHY_REWARD)
    path = _config(
        workdir,
        "patchy",
        method="lora",
        lora_r=8,
        lora_alpha=32,
        learning_rate=1e-2,
        max_steps=4,
        logging_steps=1,
        save_steps=4,
        grpo_rewards={"format": 1.0, "function": 1.0},
        grpo_reward_function=f"{workdir / 'patchy.py'}:patchy",
    )
    run_torchrun(path, nproc_per_node=2)
    out = capfd.readouterr()
    m = json.loads((workdir / "patchy" / "metrics.json").read_text())
    assert m["global_step"] == 4 and m["first_reward"] is not None, m
    adapter = workdir / "patchy" / "adapter"
    assert (adapter / "adapter_model.safetensors").exists() and not (adapter / "ref").exists()
    assert (workdir / "patchy" / "final" / "model.safetensors").exists()  # merged (merge_lora)
    lines = [line for line in out.out.splitlines() if "| reward " in line and "rank0" in line]
    assert len(lines) == 4, out.out[-3000:]
    # 2 ranks x 8 completions per step: 16 unscored on the even steps (0, 2: the step TRL's state says), 2 on odd.
    assert "function n/a (None/NaN 16/16)" in lines[0] and "function " in lines[1], lines
    assert "(None/NaN 2/16)" in lines[1], lines
    assert "grpo_reward_function" in out.out  # the warning names the setting
    # The report's picture reads TRL's keys from the checkpoint's log: the reward every step, the function's where it
    # scored anything (the odd steps: TRL logs None for the others).
    log = training_log(str(workdir / "patchy"))
    assert [s for s, _, _ in log["reward"]] == [1, 2, 3, 4], log
    assert [s for s, _ in log["rewards"]["format"]] == [1, 2, 3, 4] and [s for s, _ in log["rewards"]["function"]] == [
        2,
        4,
    ], log


@pytest.mark.slow
def test_a_step_with_no_reward_at_all_stops_the_run_naming_the_function_and_the_setting(workdir, capfd):
    (workdir / "patchy.py").write_text(PATCHY_REWARD)
    path = _config(workdir, "never", max_steps=2, grpo_reward_function=f"{workdir / 'patchy.py'}:never")
    with pytest.raises(RuntimeError):
        run_torchrun(path, nproc_per_node=2)
    out = capfd.readouterr().out
    # Both ranks see every rank's rewards (gathered) and stop at the same step: no rank waits for the other.
    for rank in ("rank0", "rank1"):
        assert (
            f"[{rank}]: components.train.trainer.grpo.NoRewardError: grpo step 1: every completion of the step has no "
            f"reward: all 16 were None or NaN from each of function (grpo_reward_function "
            f"'{workdir / 'patchy.py'}:never')"
        ) in out, out[-3000:]
