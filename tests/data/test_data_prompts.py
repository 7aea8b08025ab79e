"""The grpo stage's prompt data through the data step: the ``prompts`` format (a prompt and an optional reference
answer), kept as text for TRL, and the bundled ``builtin:arithmetic`` sample."""

import re

import datasets
import pytest

from components.data import formats
from components.data.arithmetic import ANSWER_PATTERN, arithmetic_prompts
from components.data.prepare import PrepareOptions, prepare
from components.data.sources import resolve
from components.settings import specs
from tests.helpers.data import write_jsonl


def test_prompt_rows_keep_the_prompt_as_turns_and_the_answer_as_text(tokenizer_dir, tmp_path):
    rows = [{"prompt": f"What is {i} + 1?", "answer": i + 1} for i in range(10)]
    rows[0]["answer"] = None  # the reference is optional
    stats = prepare(
        str(write_jsonl(tmp_path / "p.jsonl", rows)),
        tokenizer_dir,
        str(tmp_path / "o"),
        PrepareOptions(64, 2, 0, format="prompts"),
    )
    ds = datasets.load_from_disk(str(tmp_path / "o"))
    assert stats["format"] == "prompts" and not stats["packing"] and (len(ds["train"]), len(ds["eval"])) == (8, 2)
    assert ds["train"].column_names == ["prompt", "answer"]
    kept = {r["prompt"][0]["content"]: r["answer"] for split in ("train", "eval") for r in ds[split]}
    assert kept["What is 3 + 1?"] == "4" and kept["What is 0 + 1?"] == ""
    assert all(r["prompt"][0]["role"] == "user" for r in ds["train"])


def test_prompt_rows_are_not_guessed_and_a_file_without_prompts_is_named(tokenizer_dir, tmp_path):
    assert "prompts" not in formats.DETECT_ORDER  # a prompt_completion file without completions is not a prompt set
    chat = write_jsonl(
        tmp_path / "chat.jsonl",
        [{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]}] * 4,
    )
    with pytest.raises(
        formats.DataError,
        match=r"format 'prompts' needs column\(s\) \['prompt'\] but found "
        r"\['messages'\]",
    ):
        prepare(str(chat), tokenizer_dir, str(tmp_path / "o"), PrepareOptions(64, 1, 0, format="prompts"))


def test_an_empty_prompt_is_dropped_and_counted(tokenizer_dir, tmp_path):
    rows = [{"prompt": f"Question {i}?", "answer": str(i)} for i in range(6)] + [{"prompt": "  ", "answer": "1"}]
    stats = prepare(
        str(write_jsonl(tmp_path / "p.jsonl", rows)),
        tokenizer_dir,
        str(tmp_path / "o"),
        PrepareOptions(64, 1, 0, format="prompts"),
    )
    assert stats["dropped"] == {"empty_turn": 1} and stats["rows_kept"] == 6


def test_the_bundled_arithmetic_prompts_are_bilingual_with_numeric_answers_in_the_required_format(tmp_path):
    rows = arithmetic_prompts()
    assert len(rows) == 480 and len({r["prompt"][0]["content"] for r in rows}) == 480  # no duplicates to drop
    korean = [r for r in rows if re.search("[\uac00-\ud7a3]", r["prompt"][0]["content"])]
    assert len(korean) == 240
    for r in rows:
        text, answer = r["prompt"][0]["content"], r["answer"]
        assert int(answer) >= 0 and ("'Answer: N'" in text or "'정답은 N입니다.'" in text)
        # The reply the prompt asks for passes the default format, and its number is the answer.
        reply = f"Answer: {answer}." if "'Answer: N'" in text else f"따라서 정답은 {answer}입니다."
        assert re.search(ANSWER_PATTERN, reply).group(1) == answer
    assert ANSWER_PATTERN == specs()["grpo_answer_pattern"].default  # the sample asks for the default format
    assert arithmetic_prompts() == rows  # seeded: the same rows, hence the same held-out split, every run


def test_builtin_arithmetic_prepares_with_a_held_out_split(tokenizer_dir, tmp_path):
    (path,) = resolve("builtin:arithmetic", {})
    stats = prepare(
        "builtin:arithmetic", tokenizer_dir, str(tmp_path / "o"), PrepareOptions(512, 0.1, 42, format="prompts")
    )
    assert path.endswith(".jsonl") and stats["rows_kept"] == 480
    assert (stats["train"]["rows"], stats["eval"]["rows"]) == (432, 48)


def _grpo_component(tmp_path, tokenizer_dir, **settings):
    from kfp.dsl import Dataset, Markdown

    from components.data.component import prepare_dataset
    from components.settings import defaults

    artifacts = tmp_path / "artifacts"
    artifacts.mkdir(exist_ok=True)
    dataset, report = Dataset(uri=str(artifacts / "dataset")), Markdown(uri=str(artifacts / "report.md"))
    values = {
        **defaults(),
        "model_name_or_path": tokenizer_dir,
        "eval_size": 0.2,
        "seed": 0,
        "num_proc": 1,
        "stages": ["sft", "grpo"],
        **settings,
    }
    prepare_dataset.python_func(
        settings=values, stage="grpo", data_root=str(tmp_path / "data"), run_id="run-1", dataset=dataset, report=report
    )
    return dataset


def test_the_grpo_data_step_maps_a_question_answer_file_onto_prompt_rows(tokenizer_dir, tmp_path):
    rows = [{"question": f"What is {i} + 2?", "answer": str(i + 2)} for i in range(10)]  # a GSM8K-like file
    source = write_jsonl(tmp_path / "qa.jsonl", rows)
    md = _grpo_component(
        tmp_path, tokenizer_dir, grpo_dataset_source=str(source), grpo_column_mapping={"prompt": "question"}
    ).metadata
    assert md["path"].endswith("runs/run-1/dataset-grpo") and md["format"] == "prompts"
    ds = datasets.load_from_disk(md["path"])
    assert (len(ds["train"]), len(ds["eval"])) == (8, 2) and ds["train"].column_names == ["prompt", "answer"]


def test_the_grpo_data_step_refuses_a_reward_function_that_does_not_import(tokenizer_dir, tmp_path, capsys):
    broken = tmp_path / "rewards.py"
    broken.write_text("raise RuntimeError('no GPU here')\n")
    with pytest.raises(SystemExit, match="2"):  # bad input: one line on stderr (components/data/component.py)
        _grpo_component(
            tmp_path,
            tokenizer_dir,
            grpo_dataset_source="builtin:arithmetic",
            grpo_rewards={"function": 1.0},
            grpo_reward_function=f"{broken}:f",
        )
    assert capsys.readouterr().err.splitlines()[-1] == (
        f"error: grpo_reward_function '{broken}:f': importing {broken} failed: RuntimeError: no GPU here"
    )
