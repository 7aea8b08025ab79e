"""evaluate_model's work without KFP (components/evaluate/run.py): what it asks the evaluation to check for each of
the run's stages, and what it records beside the tuned model. The scoring itself is tests/evaluate/test_evaluate.py's
(the tiny Qwen3) and the local end-to-end run's."""

import json

from components.evaluate.run import evaluate_tuned_model, stage_checks
from components.paths import EVALUATION_FILE
from components.settings import Settings, defaults

RUN = "/mnt/models/runs/r1"
DATA = "/mnt/data/runs/r1"


def settings(**over) -> Settings:
    return Settings.from_flat({**defaults(), **over})


def test_a_single_stage_run_has_nothing_beyond_base_and_tuned():
    checks = stage_checks(
        settings(stages=["sft"]), base="/cache/base", model_path=f"{RUN}/train/final", dataset_path=f"{DATA}/dataset"
    )
    assert checks == {"stage_dirs": None, "preference_path": None, "before_dpo": None, "grpo": None, "rm": None}


def test_each_stage_is_checked_from_its_folder_its_data_and_the_model_it_started_from():
    s = settings(
        stages=["cpt", "sft", "dpo", "rm", "grpo"],
        stage_settings={"grpo": {"grpo_temperature": 0.7}},
        min_reward_improvement=0.1,
    )
    checks = stage_checks(s, base="/cache/base", model_path=f"{RUN}/grpo/final", dataset_path=f"{DATA}/dataset")
    folders = {"cpt": "cpt", "sft": "train", "dpo": "dpo", "rm": "rm", "grpo": "grpo"}
    assert checks["stage_dirs"] == {stage: f"{RUN}/{folder}" for stage, folder in folders.items()}
    assert checks["preference_path"] == f"{DATA}/dataset-dpo" and checks["before_dpo"] == f"{RUN}/train/final"
    assert checks["rm"] == {"model": f"{RUN}/rm/final", "pairs_path": f"{DATA}/dataset-rm"}
    grpo = checks["grpo"]
    # grpo trains from dpo's model (rm's model is a scorer, not the next stage's), scored by the run's reward model.
    assert grpo["before"] == f"{RUN}/dpo/final" and grpo["reward_model"] == f"{RUN}/rm/final"
    assert grpo["prompts_path"] == f"{DATA}/dataset-grpo"
    assert grpo["temperature"] == 0.7 and grpo["min_reward_improvement"] == 0.1


def test_a_grpo_run_without_earlier_stages_starts_from_the_base():
    checks = stage_checks(
        settings(stages=["grpo"]), base="/cache/base", model_path=f"{RUN}/grpo/final", dataset_path=f"{DATA}/dataset"
    )
    assert checks["grpo"]["before"] == "/cache/base" and checks["stage_dirs"] is None


def test_the_result_is_recorded_beside_the_tuned_model_for_the_variants_comparison(tmp_path, monkeypatch):
    from components.evaluate import base_vs_tuned as evaluate_module
    from components.models import resolve

    model = tmp_path / "models" / "runs" / "r1" / "train" / "final"
    model.mkdir(parents=True)
    seen = {}
    result = {
        "metrics": {"eval_loss": 1.0, "base_eval_loss": 2.0},
        "passed": True,
        "reason": "eval_loss 2.0 -> 1.0",
        "prompts": ["hi"],
        "answers": {"base": ["a"], "tuned": ["b"]},
        "report": "# Evaluation",
    }

    def evaluate(base, tuned, dataset, options, **kwargs):
        seen.update(base=base, tuned=tuned, dataset=dataset, max_samples=options.max_samples, **kwargs)
        return result

    monkeypatch.setattr(evaluate_module, "evaluate", evaluate)
    monkeypatch.setattr(resolve, "resolve_model", lambda name, cache: f"{cache}/models/{name}")
    for key in ("LANGFUSE_PUBLIC_KEY", "LANGFUSE_SECRET_KEY", "LANGFUSE_HOST"):
        monkeypatch.delenv(key, raising=False)
    data = tmp_path / "data"
    out = evaluate_tuned_model(
        settings(eval_max_samples=5), model_path=str(model), dataset_path=str(data / "dataset"), data_root=str(data)
    )
    assert out is result
    assert seen["base"] == f"{data}/cache/models/{defaults()['model_name_or_path']}" and seen["tuned"] == str(model)
    assert seen["max_samples"] == 5 and seen["train_dir"] == str(model.parent)
    assert seen["serving_reference"] == str(model.parent / "serving_check.json")
    assert json.loads((model.parent / EVALUATION_FILE).read_text()) == {
        "base_model": seen["base"],
        "tuned_model": str(model),
        **{k: result[k] for k in ("metrics", "passed", "reason", "prompts", "answers", "report")},
    }
