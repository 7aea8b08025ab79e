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


# -- bad data in a run: the errors name the pipeline's settings, not the standalone command's flags ---------------


def _settings(tokenizer_dir, source, **over) -> Settings:
    return Settings.from_flat(
        {
            **defaults(),
            "dataset_source": str(source),
            "model_name_or_path": tokenizer_dir,
            "max_seq_length": 128,
            "eval_size": 0.1,
            "num_proc": 1,
            **over,
        }
    )


def test_a_broken_row_names_the_max_bad_rows_setting_which_skips_it(tmp_path, corpus, tokenizer_dir):
    rows = tmp_path / "rows.jsonl"
    lines = corpus.read_text(encoding="utf-8").splitlines()
    rows.write_text("\n".join([*lines[:2], "{not json", *lines[2:]]), encoding="utf-8")
    with pytest.raises(ValueError) as e:
        prepare_stage_dataset(_settings(tokenizer_dir, rows), stage="sft", data_root=str(tmp_path / "d"), run_id="r")
    assert "rows.jsonl:3: not valid JSON" in str(e.value) and "max_bad_rows=10" in str(e.value)
    assert "--" not in str(e.value)
    s = _settings(tokenizer_dir, rows, max_bad_rows=1)
    prepared = prepare_stage_dataset(s, stage="sft", data_root=str(tmp_path / "d"), run_id="r2")
    assert prepared.stats["dropped"]["unparseable"] == 1


def test_rows_of_no_known_format_name_dataset_format_and_column_mapping(tmp_path, tokenizer_dir):
    rows = tmp_path / "rows.jsonl"
    rows.write_text('{"dialog": [{"role": "user", "content": "a"}]}\n')
    with pytest.raises(ValueError) as e:
        prepare_stage_dataset(_settings(tokenizer_dir, rows), stage="sft", data_root=str(tmp_path / "d"), run_id="r")
    assert 'column_mapping={"messages": "dialog"}' in str(e.value) and "set dataset_format" in str(e.value)
    assert "--" not in str(e.value)


def test_too_few_rows_after_deduplication_say_how_many_were_duplicates(tmp_path, corpus, tokenizer_dir):
    rows = tmp_path / "rows.jsonl"
    rows.write_text("\n".join([corpus.read_text(encoding="utf-8").splitlines()[0]] * 50), encoding="utf-8")
    with pytest.raises(ValueError) as e:
        prepare_stage_dataset(_settings(tokenizer_dir, rows), stage="sft", data_root=str(tmp_path / "d"), run_id="r")
    assert "eval_size=0.1 gives 0 eval rows out of 1 (50 rows read, 49 of them exact duplicates" in str(e.value)


def test_eval_prompts_missing_from_the_data_volume_fail_the_data_step_before_training(tmp_path, corpus, tokenizer_dir):
    data = tmp_path / "data"
    s = _settings(tokenizer_dir, corpus, eval_prompts=str(data / "prompts.jsonl"))
    with pytest.raises(ValueError, match=r"eval_prompts=.*prompts.jsonl.*is not a file"):
        prepare_stage_dataset(s, stage="sft", data_root=str(data), run_id="r")
    assert not (data / "runs").exists()
