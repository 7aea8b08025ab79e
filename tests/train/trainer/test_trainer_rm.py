"""The rm stage of the trainer entry point: TRL's RewardTrainer (a one-label sequence-classification head on the
previous stage's model) on preference pairs, under real 2-process torchrun.

Fast: a config's ``stage`` picks TRL's RewardConfig plus the settings, ``max_length`` comes from ``max_seq_length``.
Slow: on pairs that give the same answer opened two ways (chosen "Sure.", rejected a filler), the reward model's
pairwise accuracy on held-out pairs (TRL's ``eval_accuracy``, recorded in metrics.json, and recounted over every pair
with components/evaluate/reward_gain.py) goes from 0.000 (the randomly initialised body and head) to 1.000 in 80 steps;
``final/`` is a sequence classifier that TRL's GRPOTrainer can load as a reward (``AutoModelForSequenceClassification``,
one label).

TRL 1.16 facts this relies on (trl/trainer/reward_trainer.py): a model passed as an instance must have
``num_labels == 1``; conversational prompt/chosen/rejected rows are chat-templated (prompt + chosen, prompt +
rejected); the loss is ``-log sigmoid(r_chosen - r_rejected)``; evaluation logs ``eval_accuracy`` and ``eval_margin``.
"""

import json
import random

import pytest

from components.train.config import build_trainer_config, write_trainer_config
from components.train.launcher.local_torchrun import run_torchrun
from tests.helpers.trainer import CPU_TEST_SETTINGS, WORDS, setting_names, trainer_settings

EVAL_PAIRS = 16


def _pairs(n: int = 96) -> list[dict]:
    """The same answer opened two ways, one preferred (builtin:preference's kind of pair): chosen opens with "Sure.",
    rejected with one of four fillers."""
    rng = random.Random(0)
    pairs = []
    for i in range(n):
        word = WORDS[i % len(WORDS)]
        filler = rng.choice(["Well,", "Hmm,", "Okay so", "Honestly,"])
        pairs.append(
            {
                "prompt": [{"role": "user", "content": f"Repeat {word} twice. (#{i})"}],
                "chosen": [{"role": "assistant", "content": f"Sure. {word} {word}. Done."}],
                "rejected": [{"role": "assistant", "content": f"{filler} {word} {word}. Done."}],
            }
        )
    return pairs


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    """``base/`` (tiny model + tokenizer) and ``prefs/`` (80 train + 16 eval pairs)."""
    from datasets import Dataset, DatasetDict

    from components.models.tiny import build_model, build_tokenizer

    root = tmp_path_factory.mktemp("rm")
    pairs = _pairs()
    corpus = root / "chat.jsonl"
    corpus.write_text("\n".join(json.dumps({"messages": p["prompt"] + p["chosen"]}) for p in pairs))
    tok = build_tokenizer(corpus)
    build_model(tok).save_pretrained(root / "base")
    tok.save_pretrained(root / "base")
    DatasetDict(train=Dataset.from_list(pairs[EVAL_PAIRS:]), eval=Dataset.from_list(pairs[:EVAL_PAIRS])).save_to_disk(
        str(root / "prefs")
    )
    return root


def _config(root, name: str, **over) -> str:
    settings = dict(
        model_name_or_path=str(root / "base"),
        method="full",
        max_seq_length=128,
        per_device_train_batch_size=4,
        gradient_accumulation_steps=1,
        learning_rate=1e-3,
        num_train_epochs=4,
        max_steps=-1,
        warmup_ratio=0.05,
        seed=0,
        deepspeed_config="none",
        **CPU_TEST_SETTINGS,
    )
    extra = {k: over.pop(k) for k in list(over) if k not in setting_names()}
    cfg = build_trainer_config(
        trainer_settings(**{**settings, **over}),
        dataset_path=str(root / "prefs"),
        output_dir=str(root / name),
        use_cpu=True,
        model_cache_dir=str(root / "cache"),
        stage="rm",
        packing=False,
    )
    cfg.update(extra)
    return write_trainer_config(cfg, str(root / "cfg" / f"{name}.json"))


def _parse(path):
    from pathlib import Path

    from components.train.trainer.config_file import parse_config

    cfg = json.loads(Path(path).read_text())
    cfg.pop("ddp_backend")
    Path(path).write_text(json.dumps(cfg))
    return parse_config(path)


def test_an_rm_config_is_trl_reward_config_with_max_length_from_the_settings(workdir):
    from trl import RewardConfig

    from components.train.trainer.rm_arguments import RMStageConfig

    cfg = _parse(_config(workdir, "parsed", max_seq_length=96))
    assert type(cfg) is RMStageConfig and isinstance(cfg, RewardConfig) and cfg.stage == "rm"
    assert (cfg.max_length, cfg.bf16, cfg.train_sampling_strategy) == (96, False, "random")
    with pytest.raises(
        ValueError,
        match=r"\['max_length'\] are set by the trainer for stage 'rm'; set "
        r"\['max_seq_length'\] instead",
    ):
        _parse(_config(workdir, "bad", max_length=64))


def test_two_runs_of_one_config_start_from_the_same_reward_head(workdir, monkeypatch):
    """The one-label head is new: its first weights come from the config's ``seed`` (common.start_run), so two runs of
    one config train the same reward model. Before, they came from whatever state torch's generator was in when the
    model loaded, which the libraries' imports seed differently in every process: the local RL run's reward model, and
    so the rewards GRPO chased, changed from run to run (a CI's RL test failed on it)."""
    import torch

    from components.train.trainer.common import start_run
    from components.train.trainer.rm import load_reward_model

    # start_run points TensorBoard at the config's folder through the environment (unless set): set here, so that
    # monkeypatch takes it away after the test. Left in the worker's environment, it sent a local run that a later
    # test started on this worker to write its TensorBoard files into this config's folder.
    monkeypatch.setenv("TENSORBOARD_LOGGING_DIR", str(workdir / "seeded" / "tensorboard"))
    cfg = _parse(_config(workdir, "seeded"))
    heads = []
    for other_state in (1, 2):
        torch.manual_seed(other_state)  # another process's generator, as the imports left it
        model_path = start_run(cfg)
        heads.append(load_reward_model(cfg, model_path, pad_token_id=0).score.weight.detach().clone())
    assert torch.equal(heads[0], heads[1])


def test_rm_checkpoints_are_the_sft_checkpoints():
    from transformers import Trainer

    from components.train.trainer.checkpoints import CheckpointMixin
    from components.train.trainer.rm import RMCheckpointTrainer

    mro = RMCheckpointTrainer.__mro__
    assert mro.index(CheckpointMixin) < mro.index(Trainer)
    assert RMCheckpointTrainer._save_checkpoint is CheckpointMixin._save_checkpoint


@pytest.mark.slow
def test_the_reward_model_ranks_held_out_pairs(workdir):
    from components.evaluate.reward_gain import reward_model_accuracy

    run_torchrun(_config(workdir, "full", learning_rate=5e-3, num_train_epochs=8, save_steps=80), nproc_per_node=2)
    out = workdir / "full"
    m = json.loads((out / "metrics.json").read_text())
    assert m["stage"] == "rm" and m["global_step"] == 80 and m["world_size"] == 2  # 80 pairs / (4 x 2) x 8
    assert m["eval_accuracy"] >= 0.9, m
    config = json.loads((out / "final" / "config.json").read_text())
    assert config["architectures"] == ["Qwen3ForSequenceClassification"] and len(config["id2label"]) == 1
    base = reward_model_accuracy(str(workdir / "base"), str(workdir / "prefs"))  # a random head: chance
    tuned = reward_model_accuracy(str(out / "final"), str(workdir / "prefs"))
    assert tuned["accuracy"] >= 0.9 and tuned["accuracy"] > base["accuracy"], (base, tuned)
