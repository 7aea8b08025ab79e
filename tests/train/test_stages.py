"""Training stages (cpt, sft, dpo) as settings, data, rules, rendered jobs and the compiled pipeline."""

import json

import pytest
import yaml

from components.data import samples
from components.settings import Settings, defaults
from components.stages import STAGES, stage_overrides, stage_train_settings
from components.validate.rules import check, warnings
from pipelines import params as P
from pipelines.errors import UsageError
from tests.helpers.repo import run_cli

ALL = {
    "stages": ["cpt", "sft", "dpo"],
    "cpt_dataset_source": "builtin:domain-text",
    "dpo_dataset_source": "builtin:preference",
}


@pytest.mark.parametrize(
    "override, message",
    [
        ({"stages": ["sft", "rl"]}, "stages=['sft', 'rl']: each entry is one of cpt, sft, dpo"),
        ({"stages": []}, "stages is empty"),
        ({"stages": ["sft", "sft"]}, "stages lists 'sft' 2 times"),
        ({"stages": ["cpt", "sft"]}, "stages includes 'cpt' but cpt_dataset_source is empty"),
        ({"stages": ["sft", "dpo"]}, "stages includes 'dpo' but dpo_dataset_source is empty"),
        (
            {**ALL, "stage_settings": {"dpo": {"learning_rate": 2.0}}},
            "stage_settings.dpo: learning_rate=2.0 must be > 0",
        ),
        ({**ALL, "stage_settings": {"dpo": {"lr": 1e-6}}}, "stage_settings.dpo: ['lr'] are not training settings"),
        ({**ALL, "stage_settings": {"ppo": {}}}, "stage_settings: 'ppo' must be a stage"),
        ({**ALL, "stage_settings": {"dpo": {"method": "qlora"}}}, "stage dpo: method 'qlora' cannot run under ZeRO-3"),
    ],
)
def test_bad_stages_are_refused_before_any_gpu_naming_the_setting(override, message):
    errors = check({**defaults(), **override})
    assert any(message in e for e in errors), errors


def test_dpo_before_sft_is_allowed_with_a_warning():
    values = {**defaults(), **ALL, "stages": ["dpo", "sft"]}
    assert check(values) == []
    assert any("stages puts dpo before sft" in w for w in warnings(values))


def test_the_cli_prints_the_warning_and_refuses_a_stage_without_data(tmp_path):
    result = run_cli(
        "pipelines.run", "--preset", "qwen3-30b-a3b-full", "-p", 'stages=["sft","dpo"]', "--render", str(tmp_path / "r")
    )
    assert result.returncode == 2 and "dpo_dataset_source is empty" in result.stderr
    with pytest.raises(UsageError, match=r"stages=\['ppo'\]: each entry is one of cpt, sft, dpo"):
        P.check(P.resolve("local-tiny", overrides=['stages=["ppo"]']))


def test_each_stage_gets_its_defaults_then_the_runs_overrides_and_the_previous_model():
    s = Settings.from_flat({**defaults(), **ALL, "stage_settings": {"dpo": {"method": "lora"}}})
    dpo = stage_train_settings(s, "dpo", "/mnt/models/runs/r/train/final")
    assert (dpo.train.learning_rate, dpo.train.num_train_epochs, dpo.model.method) == (1e-6, 1.0, "lora")
    assert dpo.model.model_name_or_path == "/mnt/models/runs/r/train/final"
    assert stage_overrides(s, "sft") == {}


def test_render_writes_a_trainer_config_and_a_job_per_stage(tmp_path):
    result = run_cli(
        "pipelines.run",
        "--preset",
        "qwen3-30b-a3b-full",
        "-p",
        'stages=["cpt","sft","dpo"]',
        "-p",
        "cpt_dataset_source=my-org/domain",
        "-p",
        "dpo_dataset_source=my-org/pairs",
        "--render",
        str(tmp_path),
    )
    assert result.returncode == 0, result.stderr
    configs = {
        stage: json.loads((tmp_path / name).read_text())
        for stage, name in (
            ("cpt", "train_config-cpt.json"),
            ("sft", "train_config.json"),
            ("dpo", "train_config-dpo.json"),
        )
    }
    assert [c["stage"] for c in configs.values()] == ["cpt", "sft", "dpo"]
    # Each stage starts from the one before it, writes its own folder and is its own job.
    assert configs["cpt"]["model_name_or_path"] == "Qwen/Qwen3-30B-A3B-Thinking-2507-FP8"
    assert configs["sft"]["model_name_or_path"] == "/mnt/models/runs/render-preview/cpt/final"
    assert configs["dpo"]["model_name_or_path"] == "/mnt/models/runs/render-preview/train/final"
    assert configs["dpo"]["dataset_path"] == "/mnt/data/runs/render-preview/dataset-dpo"
    names = [
        yaml.safe_load((tmp_path / f).read_text())["metadata"]["name"]
        for f in ("pytorchjob-cpt.yaml", "pytorchjob.yaml", "pytorchjob-dpo.yaml")
    ]
    assert names == ["cpt-render-preview", "sft-render-preview", "dpo-render-preview"]
    isvc = yaml.safe_load((tmp_path / "inferenceservice.yaml").read_text())
    assert isvc["spec"]["predictor"]["model"]["storageUri"].endswith("/runs/render-preview/dpo/final")


def test_one_compiled_pipeline_has_a_conditional_slot_per_stage():
    spec = next(yaml.safe_load_all((P.PRESETS_DIR.parents[1] / "compiled" / "llm_finetune.yaml").read_text()))
    conditions = {}
    for component in spec["components"].values():
        for task in component.get("dag", {}).get("tasks", {}).values():
            if "triggerPolicy" in task:
                conditions[task["taskInfo"]["name"]] = task["triggerPolicy"]["condition"]
    for i in range(1, len(STAGES) + 1):
        slot = f"inputs.parameter_values['pipelinechannel--variant-stages-stage_{i}'] != ''"  # per variant
        assert conditions[f"stage-{i}"] == slot and conditions[f"no-stage-{i}"] == f"!({slot})"


def test_the_bundled_samples_cover_every_stage():
    pairs, texts = samples.preference_pairs(), samples.domain_text()
    assert len(pairs) > 300 and len(texts) == 537
    for pair in pairs:
        assert pair["prompt"][-1]["role"] == "user" and pair["chosen"][0]["role"] == "assistant"
        korean = samples._is_korean(pair["prompt"][-1]["content"])
        chosen, rejected = pair["chosen"][0]["content"], pair["rejected"][0]["content"]
        # The same answer, opened by acknowledging the question or by a filler, in the prompt's language.
        answer = chosen.removeprefix(samples.PREFERRED[korean])
        assert chosen != answer and any(rejected == filler + answer for filler in samples.FILLERS[korean])
    path = samples.builtin_path("builtin:preference")
    assert path == samples.builtin_path("builtin:preference")  # written once per content
    assert len(open(path, encoding="utf-8").read().splitlines()) == len(pairs)


def test_preference_rows_without_chosen_and_rejected_are_named(tmp_path):
    from components.data.formats import DataError
    from components.data.prepare import PrepareOptions, prepare
    from components.models.tiny import build_tokenizer

    rows = tmp_path / "pairs.jsonl"
    rows.write_text("\n".join(json.dumps({"prompt": "q", "answer": "a"}) for _ in range(10)))
    tok = tmp_path / "tok"
    build_tokenizer(samples.SAMPLE_PATH).save_pretrained(tok)
    with pytest.raises(DataError, match="chosen"):
        prepare(str(rows), str(tok), str(tmp_path / "out"), PrepareOptions(format="preference", eval_size=0.2))
    assert not (tmp_path / "out").exists()
