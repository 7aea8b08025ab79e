"""The trainer's config file: what the launcher writes holds inside the trainer image, and bad files fail cleanly.

The trainer runs in another image than the launcher that writes its config, so the config may name
settings (``zero3``) and paths on the shared volumes, never paths of the launcher's own install. A bad
config is one ``error:`` line naming the file or field, exit code 2, before any model loads and with
nothing written to ``output_dir``.
"""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from components.paths import DATA_MOUNT, MODEL_MOUNT
from components.settings import TRAINER_GROUPS, trainer_fields
from components.train.config import DEEPSPEED_DIR, build_trainer_config, deepspeed_config_path
from tests.helpers.repo import run_module
from tests.helpers.trainer import make_workdir, trainer_settings

POD_MOUNTS = (DATA_MOUNT + "/", MODEL_MOUNT + "/")


# As the train step builds it for a PyTorchJob: paths as the pods see them.
_CLUSTER_PATHS = dict(
    dataset_path=f"{DATA_MOUNT}/runs/r1/dataset",
    output_dir=f"{MODEL_MOUNT}/runs/r1/train",
    use_cpu=False,
    model_cache_dir=f"{DATA_MOUNT}/cache",
)


def _cluster_config(deepspeed_config="zero3", packing=True, **settings):
    trainer = trainer_settings(model_name_or_path="Qwen/Qwen3-30B-A3B", deepspeed_config=deepspeed_config, **settings)
    return build_trainer_config(trainer, **_CLUSTER_PATHS, packing=packing)


def test_every_training_setting_reaches_the_trainer_config_under_its_name():
    """One place per setting: every trainer setting (the model, compute, train and preference groups) is a trainer
    config key (three renamed) that SFTConfig takes."""
    import dataclasses

    from components.train.trainer.arguments import SFTConfig

    cfg = _cluster_config(lora_r=32, lora_target_modules="q_proj,v_proj", weight_decay=0.1, learning_rate=1e-5)
    assert (cfg["lora_r"], cfg["lora_target_modules"], cfg["weight_decay"], cfg["learning_rate"]) == (
        32,
        "q_proj,v_proj",
        0.1,
        1e-5,
    )
    renamed = {
        "deepspeed_config": "deepspeed",
        "warmup_ratio": "warmup_steps",
        "recompute_every_n_layers": "activation_checkpointing_kwargs",
    }
    names = {renamed.get(name, name) for name in trainer_fields()}
    assert names <= set(cfg)
    assert set(cfg) <= {f.name for f in dataclasses.fields(SFTConfig)}  # the trainer takes every key


def test_recompute_every_n_layers_is_what_transformers_checkpoints_and_the_memory_fit_counts(tmp_path):
    """recompute_every_n_layers reaches TrainingArguments.activation_checkpointing_kwargs; transformers then
    checkpoints layer i when i % n == 0, the count the memory fit and the plan use (recomputed_layers)."""
    from components.estimate.memory import recomputed_layers
    from components.models.tiny import build_model, build_tokenizer

    assert _cluster_config(recompute_every_n_layers=2)["activation_checkpointing_kwargs"] == {"every_n_layers": 2}
    model = build_model(build_tokenizer())
    layers = model.config.num_hidden_layers
    for n in (1, 2, 3):
        model.activation_checkpointing_enable(every_n_layers=n)
        checkpointed = sum(bool(layer.gradient_checkpointing) for layer in model.model.layers)
        assert checkpointed == recomputed_layers(layers, n), n
    assert recomputed_layers(48, 0) == 0 and recomputed_layers(48, 2) == 24 and recomputed_layers(48, 5) == 10


def _own_fields(cls, base=None) -> dict:
    """``{name: (type, default, help)}`` of the fields ``cls`` declares beyond ``base``'s (all without one)."""
    import dataclasses
    import typing

    hints = typing.get_type_hints(cls)
    inherited = {f.name for f in dataclasses.fields(base)} if base else set()
    return {
        f.name: (hints[f.name], f.default, f.metadata["help"])
        for f in dataclasses.fields(cls)
        if f.name not in inherited
    }


def test_sft_config_writes_out_the_settings_model_field_for_field():
    """SFTConfig repeats the trainer settings that TrainingArguments lacks as plain fields, in the settings model's
    order: duplication accepted, consistency enforced (TRL's rule)."""
    import dataclasses

    from transformers import TrainingArguments

    from components.train.trainer.arguments import RUN_FIELDS, SFTConfig

    own = _own_fields(SFTConfig, TrainingArguments)
    arguments = {f.name for f in dataclasses.fields(TrainingArguments)}
    renamed = {"deepspeed_config", "warmup_ratio", "recompute_every_n_layers"}  # build_trainer_config renames these
    settings = {
        name: field
        for group in TRAINER_GROUPS
        for name, field in _own_fields(group).items()
        if name not in arguments and name not in renamed
    }
    assert list(own) == [*settings, *RUN_FIELDS]  # the same names, in the model's order, then the run's paths
    for name, (kind, default, help) in settings.items():
        assert own[name] == (kind, default, help), name


def test_the_dpo_config_adds_the_same_fields_to_trls():
    import dataclasses

    from transformers import TrainingArguments
    from trl import DPOConfig

    from components.train.trainer.arguments import SFTConfig
    from components.train.trainer.dpo_arguments import DPOStageConfig

    sft, dpo = _own_fields(SFTConfig, TrainingArguments), _own_fields(DPOStageConfig, TrainingArguments)
    assert {name: dpo[name] for name in sft} == sft  # router_aux_loss_coef too, over DPOConfig's own
    assert set(_own_fields(DPOStageConfig, DPOConfig)) == set(sft) - {"router_aux_loss_coef"}  # nothing else new
    # bf16 off unless the train step sets it (GPUs): TRL's own default would turn it on for a CPU run.
    assert next(f for f in dataclasses.fields(DPOStageConfig) if f.name == "bf16").default is False


def test_rendered_config_names_the_deepspeed_setting_not_a_launcher_path():
    cfg = _cluster_config("zero3")
    assert cfg["deepspeed"] == "zero3"
    # Every path in it lies on the pods' volumes: the launcher's install does not exist in the trainer image.
    paths = {k: v for k, v in cfg.items() if isinstance(v, str) and v.startswith("/")}
    assert paths and all(v.startswith(POD_MOUNTS) for v in paths.values()), paths


def test_a_deepspeed_json_on_a_volume_is_kept_and_none_is_left_out():
    assert _cluster_config(f"{DATA_MOUNT}/configs/ds.json")["deepspeed"] == f"{DATA_MOUNT}/configs/ds.json"
    assert "deepspeed" not in _cluster_config("none")
    with pytest.raises(ValueError, match="deepspeed_config 'zero4' is unknown"):
        _cluster_config("zero4")


def test_the_trainer_resolves_a_setting_name_in_its_own_install():
    assert deepspeed_config_path("zero3") == str(DEEPSPEED_DIR / "zero3.json")


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    return make_workdir(tmp_path_factory.mktemp("cfg"), rows=32)


def _run(config_path):
    """The trainer's entry point on ``config_path``, in this process (its config errors end before any work)."""
    return run_module("components.train.trainer", "--config", str(config_path))


def _run_process(config_path):
    """The same as a real process: the one test of the entry point's exit code and error line as a pod sees them."""
    return subprocess.run(
        [sys.executable, "-m", "components.train.trainer", "--config", str(config_path)],
        capture_output=True,
        text=True,
        timeout=300,
    )


def _valid(workdir, out):
    return {
        "model_name_or_path": str(workdir / "base"),
        "dataset_path": str(workdir / "data"),
        "output_dir": str(out),
        "use_cpu": True,
        "report_to": [],
    }


@pytest.mark.parametrize(
    "name, text, message",
    [
        ("empty.yaml", "", "empty.yaml: the config is empty; it must be a mapping of SFTConfig fields"),
        ("list.yaml", "- 1\n- 2\n", "list.yaml: the config must be a mapping of SFTConfig fields, not a list"),
        (
            "broken.json",
            '{"learning_rate": 1e-3,\n "seed": 1\n',
            "broken.json: not valid JSON: Expecting ',' delimiter: line 3",
        ),
        ("broken.yaml", "seed: [1\n", "broken.yaml: not valid YAML"),
    ],
)
def test_unreadable_configs_are_one_error_line(tmp_path, name, text, message):
    path = tmp_path / name
    path.write_text(text)
    result = _run(path)
    assert result.returncode == 2, result.stderr
    assert result.stderr.strip().splitlines() == [result.stderr.strip().splitlines()[0]]
    assert result.stderr.startswith("error: ") and message in result.stderr, result.stderr


def test_a_missing_config_file_is_one_error_line(tmp_path):
    result = _run_process(tmp_path / "nowhere.json")
    assert result.returncode == 2
    assert result.stderr.strip() == (
        f"error: {tmp_path / 'nowhere.json'}: no such file (the trainer config the launcher writes)"
    )


def test_the_entry_point_trains_every_stage_with_a_module_of_its_own():
    from components.stages import STAGES
    from components.train.trainer.__main__ import STAGE_MODULES

    assert set(STAGE_MODULES) == set(STAGES)
    folder = Path(__file__).parents[3] / "components" / "train" / "trainer"
    assert all((folder / f"{module}.py").is_file() for module in STAGE_MODULES.values())


def test_the_entry_point_loads_its_libraries_without_collecting_and_skips_the_final_collection(tmp_path, monkeypatch):
    import gc

    from components import quick_exit

    calls: list[str] = []
    for name in ("pause_collection", "resume_collection", "freeze_heap_at_exit"):
        monkeypatch.setattr(quick_exit, name, lambda name=name: calls.append(name))
    result = _run(tmp_path / "nowhere.json")
    # The collector paused while the libraries load and running again before the config is read (which ends here).
    assert result.returncode == 2 and calls == ["pause_collection", "resume_collection", "freeze_heap_at_exit"]
    monkeypatch.undo()
    quick_exit.pause_collection()
    assert not gc.isenabled()
    quick_exit.resume_collection()
    frozen = gc.get_freeze_count()
    gc.unfreeze()  # this test process's objects: collected as before
    assert gc.isenabled() and frozen > 0


@pytest.mark.parametrize(
    "field, value, message",
    [
        ("learning_rate", "fast", "learning_rate must be a number, got 'fast'"),
        ("per_device_train_batch_size", 1.5, "per_device_train_batch_size must be an integer, got 1.5"),
        ("bf16", "yes", "bf16 must be true or false, got 'yes'"),
        ("max_seq_length", True, "max_seq_length must be an integer, got True"),
        ("lora_target_modules", 3, "lora_target_modules must be a string, got 3"),
    ],
)
def test_wrong_value_types_name_the_field_before_any_model_loads(workdir, tmp_path, field, value, message):
    out = tmp_path / "out"
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**_valid(workdir, out), field: value}))
    result = _run(path)
    assert result.returncode == 2, result.stderr[-2000:]
    assert result.stderr.strip() == f"error: {path}: {message}"
    assert not out.exists()  # nothing that could pass for a run's output


def test_a_valid_config_passes_the_checks(workdir, tmp_path):
    from components.train.trainer.config_file import parse_config

    path = tmp_path / "config.json"
    path.write_text(json.dumps({**_valid(workdir, tmp_path / "out"), "learning_rate": 1, "deepspeed": "zero2"}))
    cfg = parse_config(str(path))
    assert cfg.learning_rate == 1.0 and cfg.deepspeed == str(DEEPSPEED_DIR / "zero2.json")
    assert not Path(tmp_path / "out").exists()


def test_cluster_config_has_no_dataloader_workers_to_die_of_sigterm():
    # torchrun forwards SIGTERM to each rank's whole process group: a data-loader worker dies of it, and the
    # DataLoader then raises in the rank before the SIGTERM checkpoint is saved
    # (components/train/trainer/checkpoints.py).
    # The rows are tokenized and packed already: collating them in the rank costs little.
    assert _cluster_config()["dataloader_num_workers"] == 0


def test_packed_rows_are_sampled_in_a_seeded_order_that_a_mid_epoch_resume_continues():
    # group_by_length draws each epoch's order from the global RNG; a checkpoint restores the RNG as it was after
    # the draw, so a job resumed mid-epoch would skip a different set of rows (seen in the rehearsal's soft
    # eviction: eval loss 3.1521 against 3.1446 uninterrupted). Packed rows have one length: nothing to group.
    assert _cluster_config()["train_sampling_strategy"] == "random"
    unpacked = _cluster_config(packing=False)
    assert unpacked["train_sampling_strategy"] == "group_by_length"  # padding work halves; resume caveat documented
