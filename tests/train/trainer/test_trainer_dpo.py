"""The dpo stage of the trainer entry point: TRL's DPOTrainer on preference pairs, under real 2-process torchrun.

Fast: a config's ``stage`` picks its class (TRL's DPOConfig plus the settings for dpo), and what is wrong is named
before any model loads. Slow: full fine-tuning (reference log-probs precomputed, DDP and ZeRO-3) and LoRA (the
adapter-off reference) make a tiny model prefer the right answer over an off-topic one on held-out pairs far more
often than the base did; a re-run resumes from its last complete checkpoint with the same result; a Qwen3-MoE trains
under ZeRO-3 with its router loss.

The task: "Repeat <w> twice. (#i)" -> chosen "<w> <w>. Done.", rejected the answer to another word's prompt (as
fluent, as long, not this prompt's answer). The randomly initialised base prefers chosen on 6 of the 16 held-out pairs
(0.375, by the summed log-probs of the response tokens); full DPO (lr 1e-3, 40 steps) and LoRA (r 16, lr 3e-3, 80
steps) reach 1.0 (0.94-1.0 over training seeds 0-2), TRL's eval reward accuracy 0.94-1.0.
"""

import json
import random
import shutil

import pytest

from components.models.tiny import build_model, build_tokenizer
from components.train.config import build_trainer_config, write_trainer_config
from components.train.launcher.local_torchrun import run_torchrun
from tests.helpers.repo import run_module
from tests.helpers.trainer import CPU_TEST_SETTINGS, WORDS, setting_names, trainer_settings

EVAL_PAIRS = 16


def _pairs(n: int = 96) -> list[dict]:
    rng = random.Random(0)
    pairs = []
    for i in range(n):
        word = WORDS[i % len(WORDS)]
        other = rng.choice([w for w in WORDS if w != word])
        pairs.append(
            {
                "prompt": [{"role": "user", "content": f"Repeat {word} twice. (#{i})"}],
                "chosen": [{"role": "assistant", "content": f"{word} {word}. Done."}],
                "rejected": [{"role": "assistant", "content": f"{other} {other}. Done."}],
            }
        )
    return pairs


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    """``base/`` (tiny model + tokenizer) and ``prefs/``: TRL's conversational preference layout, 80 train + 16 eval."""
    from datasets import Dataset, DatasetDict

    root = tmp_path_factory.mktemp("dpo")
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


def _config(root, name: str, dataset: str = "prefs", **over) -> str:
    """A CPU trainer config as the train step writes it for the dpo stage; returns its path."""
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
    extra = {k: over.pop(k) for k in list(over) if k not in setting_names()}  # not settings
    cfg = build_trainer_config(
        trainer_settings(**{**settings, **over}),
        dataset_path=str(root / dataset),
        output_dir=str(root / name),
        use_cpu=True,
        model_cache_dir=str(root / "cache"),
        stage="dpo",
        # The sampler for packed rows (random): TRL tokenizes the pairs itself, so there is
        # no length to group unpacked rows by (parse_config refuses group_by_length for dpo).
        packing=True,
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


# --- fast: the config ---------------------------------------------------------------------------------------------


def test_an_unknown_stage_is_one_error_line_naming_the_file_and_field(workdir):
    path = _config(workdir, "ppo", stage="ppo")
    result = run_module("components.train.trainer", "--config", path)
    assert result.returncode == 2, result.stderr[-2000:]
    assert result.stderr.strip() == f"error: {path}: stage 'ppo' is not one of ['cpt', 'sft', 'dpo', 'rm', 'grpo']"


def test_a_dpo_config_is_trl_dpo_config_with_beta_length_and_reference_from_the_settings(workdir):
    from trl import DPOConfig

    from components.train.trainer.dpo_arguments import DPOStageConfig

    cfg = _parse(_config(workdir, "parsed", dpo_beta=0.25, max_seq_length=96))
    assert type(cfg) is DPOStageConfig and isinstance(cfg, DPOConfig) and cfg.stage == "dpo"
    assert (cfg.beta, cfg.max_length, cfg.max_seq_length) == (0.25, 96, 96)
    assert cfg.precompute_ref_log_probs  # full: no reference model kept during training
    assert cfg.bf16 is False  # TRL's own default would turn bf16 on for a CPU run
    assert not (workdir / "parsed").exists()  # parsing writes nothing
    lora = _parse(_config(workdir, "parsed-lora", method="lora"))
    assert not lora.precompute_ref_log_probs  # the reference is the model with its adapter off


def test_cpt_parses_into_the_sft_config(tmp_path, workdir):
    from datasets import Dataset, DatasetDict

    from components.train.trainer.arguments import SFTConfig

    rows = Dataset.from_list([{"input_ids": [1, 2, 3], "labels": [1, 2, 3]}])
    DatasetDict(train=rows, eval=rows).save_to_disk(str(tmp_path / "text"))
    path = _config(workdir, "cpt", stage="cpt", dataset_path=str(tmp_path / "text"))
    cfg = _parse(path)
    assert type(cfg) is SFTConfig and cfg.stage == "cpt"


def test_a_dpo_dataset_without_chosen_and_rejected_is_named(tmp_path, workdir):
    from datasets import Dataset, DatasetDict

    rows = Dataset.from_list([{"prompt": p["prompt"], "completion": p["chosen"]} for p in _pairs(4)])
    DatasetDict(train=rows, eval=rows).save_to_disk(str(tmp_path / "sft-shaped"))
    path = _config(workdir, "no-pairs", dataset_path=str(tmp_path / "sft-shaped"))
    with pytest.raises(
        ValueError,
        match=r"split 'train' lacks columns \['chosen', 'rejected'\] \(stage 'dpo' "
        r"needs \['prompt', 'chosen', 'rejected'\]\)",
    ):
        _parse(path)


@pytest.mark.parametrize(
    "over, message",
    [
        ({"bta": 0.1}, r"unknown keys \['bta'\]; valid keys are \[.*'dpo_beta'"),
        # TRL's own DPOConfig fields are keys of the dpo stage only.
        ({"stage": "sft", "loss_type": ["ipo"]}, r"unknown keys \['loss_type'\]"),
        ({"beta": 0.3}, r"\['beta'\] are set by the trainer for stage 'dpo'; set \['dpo_beta'\] instead"),
        ({"train_sampling_strategy": "group_by_length"}, r"train_sampling_strategy 'group_by_length' cannot sort"),
        ({"dpo_beta": "high"}, r"dpo_beta must be a number, got 'high'"),
    ],
)
def test_keys_are_checked_against_the_stage_class(workdir, over, message):
    with pytest.raises(ValueError, match=message):
        _parse(_config(workdir, "bad", **over))


def test_dpo_checkpoints_are_the_sft_checkpoints():
    from transformers import Trainer

    from components.train.trainer.checkpoints import CheckpointMixin, CheckpointTrainer
    from components.train.trainer.dpo import DPOCheckpointTrainer

    for trainer in (CheckpointTrainer, DPOCheckpointTrainer):
        mro = trainer.__mro__
        assert mro.index(CheckpointMixin) < mro.index(Trainer)  # its save_model runs before the Trainer's
        assert trainer._save_checkpoint is CheckpointMixin._save_checkpoint


# --- slow: real 2-rank runs ---------------------------------------------------------------------------------------


def _preference_accuracy(model_dir, workdir) -> float:
    """The share of held-out pairs whose chosen response has the higher summed log-prob of its tokens."""
    import datasets
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(workdir / "base")
    model = AutoModelForCausalLM.from_pretrained(model_dir).eval()

    def logp(prompt, response) -> float:
        prefix = tok.apply_chat_template(prompt, add_generation_prompt=True, tokenize=True, return_dict=False)
        ids = tok.apply_chat_template(prompt + response, tokenize=True, return_dict=False)
        assert ids[: len(prefix)] == prefix
        ids = torch.tensor([ids])
        with torch.no_grad():
            per_token = model(ids).logits[0, :-1].log_softmax(-1).gather(-1, ids[0, 1:, None])[:, 0]
        return per_token[len(prefix) - 1 :].sum().item()  # the response tokens only, as DPO scores them

    pairs = datasets.load_from_disk(str(workdir / "prefs"))["eval"]
    return sum(logp(p["prompt"], p["chosen"]) > logp(p["prompt"], p["rejected"]) for p in pairs) / len(pairs)


def _generates(model_dir, workdir) -> bool:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    prompt = tok.apply_chat_template(
        [{"role": "user", "content": "Repeat stone twice. (#1000)"}],
        add_generation_prompt=True,
        return_tensors="pt",
        return_dict=True,
    )
    out = model.generate(**prompt, max_new_tokens=8, do_sample=False)
    return out.shape[1] > prompt["input_ids"].shape[1]


@pytest.fixture(scope="module")
def full_run(workdir):
    """Full fine-tuning under DDP on 2 CPU ranks, a complete checkpoint every 10 of its 40 steps; its metrics."""
    run_torchrun(_config(workdir, "full", save_steps=10, save_total_limit=3), nproc_per_node=2)
    return json.loads((workdir / "full" / "metrics.json").read_text())


@pytest.mark.slow
def test_full_dpo_makes_the_model_prefer_the_right_answer_on_held_out_pairs(workdir, full_run):
    m = full_run
    assert m["stage"] == "dpo" and m["world_size"] == 2 and m["global_step"] == 40  # 80 pairs / (4 x 2 ranks) x 4
    assert m["eval_rewards/accuracies"] >= 0.9 and m["eval_rewards/margins"] > 0.5, m
    assert m["eval_rewards/chosen"] > 0 > m["eval_rewards/rejected"]
    assert m["eval_loss"] < 0.5 < m["train_loss_logged_mean"]  # DPO's loss starts at log 2 = 0.69
    final = workdir / "full" / "final"
    assert (final / "model.safetensors").exists() and (final / "tokenizer.json").exists()
    assert _generates(final, workdir)
    base, tuned = _preference_accuracy(workdir / "base", workdir), _preference_accuracy(final, workdir)
    assert base <= 0.5 and tuned >= 0.9, (base, tuned)
    # TRL's caches (tokenized rows, reference log-probs) are the run's, never beside the prepared dataset.
    assert {p.name for p in (workdir / "prefs" / "train").iterdir()} == {
        "data-00000-of-00001.arrow",
        "dataset_info.json",
        "state.json",
    }
    assert (workdir / "full" / "pairs" / "train.arrow").exists()


@pytest.mark.slow
def test_a_rerun_resumes_from_the_last_complete_checkpoint_with_its_reference_log_probs(workdir, full_run, capfd):
    out = workdir / "full"
    for done in ("checkpoint-40", "final", "metrics.json"):  # as if evicted after checkpoint-30
        path = out / done
        shutil.rmtree(path) if path.is_dir() else path.unlink()
    run_torchrun(str(workdir / "cfg" / "full.json"), nproc_per_node=2)
    log = capfd.readouterr().out
    assert f"resuming from {out / 'checkpoint-30'}" in log
    assert "Computing reference log probs" not in log  # found beside the dataset, keyed by this run
    resumed = json.loads((out / "metrics.json").read_text())
    for key in ("eval_loss", "eval_rewards/accuracies", "eval_rewards/margins", "global_step"):
        assert resumed[key] == pytest.approx(full_run[key], abs=1e-5), key


@pytest.mark.slow
def test_full_dpo_under_zero3_matches_ddp(workdir, full_run):
    from components.train.config import deepspeed_config_path

    run_torchrun(_config(workdir, "zero3", deepspeed=deepspeed_config_path("zero3"), save_steps=40), nproc_per_node=2)
    checkpoint = workdir / "zero3" / "checkpoint-40"
    assert (checkpoint / "COMPLETE").exists() and not (checkpoint / "model.safetensors").exists()  # shards only
    m = json.loads((workdir / "zero3" / "metrics.json").read_text())
    # The same pairs, reference log-probs (precomputed through DeepSpeed's gathered model) and updates as DDP.
    for key in ("eval_loss", "eval_rewards/accuracies", "eval_rewards/margins"):
        assert m[key] == pytest.approx(full_run[key], abs=1e-3), key
    assert _preference_accuracy(workdir / "zero3" / "final", workdir) >= 0.9


@pytest.mark.slow
def test_lora_dpo_against_the_adapter_off_reference(workdir):
    run_torchrun(
        _config(
            workdir,
            "lora",
            method="lora",
            lora_r=16,
            lora_alpha=64,
            learning_rate=3e-3,
            num_train_epochs=8,
            save_steps=80,
        ),
        nproc_per_node=2,
    )
    out = workdir / "lora"
    m = json.loads((out / "metrics.json").read_text())
    assert m["global_step"] == 80 and m["eval_rewards/accuracies"] >= 0.9, m
    # The trained adapter only: TRL's frozen reference copy ("ref") is not part of the model.
    assert (out / "adapter" / "adapter_model.safetensors").exists() and not (out / "adapter" / "ref").exists()
    assert (out / "final" / "model.safetensors").exists()  # merged (merge_lora)
    assert _generates(out / "final", workdir)
    assert _preference_accuracy(out / "final", workdir) >= 0.9


@pytest.mark.slow
def test_moe_dpo_under_zero3_adds_the_router_loss(workdir):
    import torch
    from transformers import AutoTokenizer, Qwen3MoeConfig, Qwen3MoeForCausalLM

    from components.train.config import deepspeed_config_path

    tok = AutoTokenizer.from_pretrained(workdir / "base")
    torch.manual_seed(0)
    config = Qwen3MoeConfig(
        vocab_size=len(tok),
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        intermediate_size=96,
        num_experts=4,
        num_experts_per_tok=2,
        moe_intermediate_size=32,
        pad_token_id=tok.pad_token_id,
        eos_token_id=tok.eos_token_id,
        bos_token_id=None,
    )
    Qwen3MoeForCausalLM(config).save_pretrained(workdir / "moe")
    tok.save_pretrained(workdir / "moe")
    run_torchrun(
        _config(
            workdir,
            "moe",
            model_name_or_path=str(workdir / "moe"),
            max_steps=10,
            save_steps=10,
            deepspeed=deepspeed_config_path("zero3"),
        ),
        nproc_per_node=2,
    )
    out = workdir / "moe"
    assert json.loads((out / "metrics.json").read_text())["global_step"] == 10
    logged = json.loads((out / "checkpoint-10" / "trainer_state.json").read_text())["log_history"]
    assert all(e["aux_loss"] > 0 for e in logged if "loss" in e)  # router_aux_loss_coef 0.001 reaches TRL's loss
    final, base = (Qwen3MoeForCausalLM.from_pretrained(p) for p in (out / "final", workdir / "moe"))
    assert final.num_parameters() == base.num_parameters()
