"""prepare_dataset's work without KFP (components/data/run.py): what it hands the step's artifacts, and the grpo
stage's reward check before any data is read. The component itself: tests/data/test_data_component.py."""

import pytest

from components.data.report import markdown
from components.data.run import prepare_stage_dataset
from components.settings import Settings, defaults


def test_a_stages_data_comes_back_with_its_artifacts_metadata_and_report(tmp_path, corpus, tokenizer_dir):
    data = tmp_path / "data"
    s = Settings.from_flat(
        {
            **defaults(),
            "dataset_source": str(corpus),
            "model_name_or_path": tokenizer_dir,
            "max_seq_length": 128,
            "eval_size": 6.0,  # KFP's double for a count of conversations
            "data_pvc": "llm-data",
            "num_proc": 1,
        }
    )
    prepared = prepare_stage_dataset(s, stage="sft", data_root=str(data), run_id="run-1")
    stats, md = prepared.stats, prepared.metadata
    assert md["path"] == str(data / "runs" / "run-1" / "dataset") and md["uri"] == "pvc://llm-data/runs/run-1/dataset"
    assert (md["pvc"], md["stage"], md["packing"], md["cache_hit"]) == ("llm-data", "sft", True, False)
    assert md["eval_examples"] == 6 and md["train_examples"] == 54 == stats["train"]["examples"]
    assert md["train_tokens"] == stats["train"]["tokens"] and 0 < md["packing_efficiency"] <= 1
    assert prepared.report == markdown(stats)


def test_a_grpo_reward_function_missing_from_the_data_volume_fails_before_any_data_is_read(tmp_path):
    s = Settings.from_flat(
        {
            **defaults(),
            "stages": ["sft", "grpo"],
            "grpo_rewards": {"function": 1.0},
            "grpo_reward_function": str(tmp_path / "data" / "missing.py") + ":reward",
        }
    )
    with pytest.raises(ValueError, match="missing.py is not a file"):
        prepare_stage_dataset(s, stage="grpo", data_root=str(tmp_path / "data"), run_id="run-1")
    assert not (tmp_path / "data").exists()
