"""The local search (components/hpo/local_search.py) and search_hyperparameters with train_backend=local.

The fast tests replace ``torchrun`` with a stand-in trainer that reads the trial's config and writes what the real one
writes (metrics.json, final/); the slow one runs three real trials of the tiny model, as ``-p hpo_trials=3`` does.
"""

from __future__ import annotations

import json
import logging
import math
from pathlib import Path

import optuna
import pytest
from kfp.dsl import Dataset, Markdown

from components.hpo import katib
from components.hpo import local_search as hpo_local
from components.hpo.component import search_hyperparameters
from components.settings import defaults
from components.train.launcher import local_torchrun as train_local

RUN_ID = "local-run-1"
SPACE = {"learning_rate": {"min": 1e-4, "max": 1e-2, "scale": "log"}}


def fake_trainer(loss_of=lambda cfg: 1.0 + cfg["learning_rate"] * 100, fail_if=lambda cfg: False):
    """A stand-in for ``run_torchrun``: the trainer's outputs for the config it is given, or its failure."""
    calls = []

    def run_torchrun(config_path: str, nproc_per_node: int, env=None):
        cfg = json.loads(Path(config_path).read_text())
        calls.append((cfg, nproc_per_node))
        out = Path(cfg["output_dir"])
        (out / "final").mkdir(parents=True)
        (out / "final" / "model.safetensors").write_bytes(b"\0" * 64)
        if fail_if(cfg):
            raise RuntimeError(
                "torchrun exited with code 1; last lines:\n"
                + "\n".join(f"line {i}" for i in range(30))
                + "\nValueError: learning rate too high"
            )
        (out / "metrics.json").write_text(json.dumps({"eval_loss": loss_of(cfg), "final_train_loss": 3.5}))

    run_torchrun.calls = calls
    return run_torchrun


def base_config(tmp_path, **over) -> str:
    path = tmp_path / "hpo" / "train_config.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(
        json.dumps(
            {
                "learning_rate": 5e-5,
                "max_steps": -1,
                "save_strategy": "steps",
                "seed": 0,
                "output_dir": str(path.parent),
                **over,
            }
        )
    )
    return str(path)


def search(tmp_path, **over):
    args = dict(
        name="hpo-local-run-1",
        search_space=SPACE,
        trials=3,
        algorithm="tpe",
        seed=0,
        trial_steps=4,
        max_failed_trials=0,
        nproc_per_node=2,
    )
    return hpo_local.run_search(base_config(tmp_path), str(tmp_path / "hpo"), **{**args, **over})


# -- the sampler and the space ---------------------------------------------------------------------------------


def test_grid_values_step_through_ranges_and_keep_lists():
    assert hpo_local.grid_values("lora_r", {"values": [8, 16, 32]}) == [8, 16, 32]
    assert hpo_local.grid_values("gradient_accumulation_steps", {"min": 1, "max": 8, "step": 3}) == [1, 4, 7]
    assert hpo_local.grid_values("learning_rate", {"min": 1e-5, "max": 5e-5, "step": 1e-5}) == [
        1e-5,
        2e-5,
        3e-5,
        4e-5,
        5e-5,
    ]  # not 3.0000000000000004e-05


def test_each_katib_algorithm_has_a_seeded_local_sampler(caplog):
    space = {"learning_rate": {"min": 1e-5, "max": 5e-5, "step": 1e-5}}
    assert isinstance(hpo_local.make_sampler("random", space, 1), optuna.samplers.RandomSampler)
    assert isinstance(hpo_local.make_sampler("grid", space, 1), optuna.samplers.GridSampler)
    assert isinstance(hpo_local.make_sampler("tpe", space, 1), optuna.samplers.TPESampler)
    assert hpo_local.make_sampler("multivariate-tpe", space, 1)._multivariate
    with caplog.at_level(logging.WARNING, "search_hyperparameters"):
        assert isinstance(hpo_local.make_sampler("cmaes", space, 1), optuna.samplers.TPESampler)
    assert "hpo_algorithm 'cmaes' runs on a cluster (Katib) only: the local search uses tpe" in caplog.text


def test_suggestions_follow_the_search_space():
    from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution

    def drawn(space, algorithm):
        study = optuna.create_study(sampler=hpo_local.make_sampler(algorithm, space, 0))
        study.optimize(lambda t: [hpo_local.suggest(t, n, s, algorithm) for n, s in space.items()] and 0.0, n_trials=1)
        return study.trials[0].distributions

    space = {
        "learning_rate": {"min": 1e-5, "max": 1e-3, "scale": "log"},
        "lora_r": {"values": [8, 16]},
        "gradient_accumulation_steps": {"min": 1, "max": 9, "step": 4},
        "warmup_ratio": {"min": 0.0, "max": 0.1},
    }
    assert drawn(space, "tpe") == {
        "learning_rate": FloatDistribution(1e-5, 1e-3, log=True),
        "lora_r": CategoricalDistribution([8, 16]),
        "gradient_accumulation_steps": IntDistribution(1, 9, step=4),
        "warmup_ratio": FloatDistribution(0.0, 0.1),
    }
    grid = drawn({"gradient_accumulation_steps": {"min": 1, "max": 9, "step": 4}}, "grid")
    assert grid == {"gradient_accumulation_steps": CategoricalDistribution([1, 5, 9])}


# -- the search, with a stand-in trainer -----------------------------------------------------------------------


def test_each_trial_is_the_runs_config_with_its_values_and_the_best_is_the_lowest_eval_loss(tmp_path, monkeypatch):
    trainer = fake_trainer()
    monkeypatch.setattr(train_local, "run_torchrun", trainer)
    experiment, trials = search(tmp_path, search_space={**SPACE, "warmup_ratio": {"min": 0.0, "max": 0.1}})
    assert len(trainer.calls) == 3 and {n for _, n in trainer.calls} == {2}
    for number, (cfg, _) in enumerate(trainer.calls, 1):
        assert cfg["output_dir"] == str(tmp_path / "hpo" / f"trial-{number}")
        assert (cfg["max_steps"], cfg["save_strategy"], cfg["seed"]) == (4, "no", 0)
        assert 1e-4 <= cfg["learning_rate"] <= 1e-2 and 0.0 <= cfg["warmup_steps"] <= 0.1  # the trainer's name
    lrs = [cfg["learning_rate"] for cfg, _ in trainer.calls]
    best = katib.best_trial(experiment)
    assert best["name"] == f"trial-{lrs.index(min(lrs)) + 1}" and best["parameters"]["learning_rate"] == min(lrs)
    assert best["eval_loss"] == pytest.approx(1 + min(lrs) * 100) and best["loss"] == 3.5
    assert [r["state"] for r in katib.trial_summaries(trials)] == ["Succeeded"] * 3
    assert not list((tmp_path / "hpo").glob("*/final")) and len(list((tmp_path / "hpo").glob("*/metrics.json"))) == 3


def test_the_same_seed_suggests_the_same_trials(tmp_path, monkeypatch):
    runs = []
    for folder, algorithm in [("a", "tpe"), ("b", "tpe"), ("c", "random"), ("d", "random")]:
        trainer = fake_trainer()
        monkeypatch.setattr(train_local, "run_torchrun", trainer)
        (tmp_path / folder).mkdir()
        search(tmp_path / folder, algorithm=algorithm, seed=7)
        runs.append([cfg["learning_rate"] for cfg, _ in trainer.calls])
    assert runs[0] == runs[1] and runs[2] == runs[3] and len(set(runs[0])) == 3


def test_a_grid_visits_every_combination(tmp_path, monkeypatch):
    trainer = fake_trainer()
    monkeypatch.setattr(train_local, "run_torchrun", trainer)
    search(
        tmp_path,
        algorithm="grid",
        trials=4,
        search_space={"learning_rate": {"values": [1e-4, 1e-3]}, "lr_scheduler_type": {"values": ["cosine", "linear"]}},
    )
    assert sorted((cfg["learning_rate"], cfg["lr_scheduler_type"]) for cfg, _ in trainer.calls) == [
        (1e-4, "cosine"),
        (1e-4, "linear"),
        (1e-3, "cosine"),
        (1e-3, "linear"),
    ]


def test_failed_trials_count_and_too_many_end_the_search_with_their_reasons(tmp_path, monkeypatch):
    trainer = fake_trainer(fail_if=lambda cfg: True)
    monkeypatch.setattr(train_local, "run_torchrun", trainer)
    with pytest.raises(RuntimeError) as error:
        search(tmp_path, max_failed_trials=2)
    assert len(trainer.calls) == 2  # the second failure reaches hpo_max_failed_trials
    lines = str(error.value).splitlines()
    assert lines[0] == ("the search hpo-local-run-1 failed: 2 trials failed, which reaches hpo_max_failed_trials=2")
    assert lines[1].startswith("  trial trial-1 (learning_rate=") and lines[1].endswith(
        "): torchrun exited with code 1; last lines:"
    )
    assert "ValueError: learning rate too high" in lines and "line 5" not in lines  # the tail only
    assert not list((tmp_path / "hpo").glob("*/final"))  # a failed trial's export goes too


@pytest.mark.parametrize("max_failed,trials_run", [(0, 1), (1, 1), (2, 2), (3, 3)])
def test_the_search_fails_where_katib_fails_an_experiment(tmp_path, monkeypatch, max_failed, trials_run):
    """Katib fails an Experiment once its failed trials are not 0 and reach maxFailedTrialCount (>=; kubeflow/katib
    experiment/util/status_util.go since v0.14): 0 and 1 both end the search at the first failure."""
    trainer = fake_trainer(fail_if=lambda cfg: True)
    monkeypatch.setattr(train_local, "run_torchrun", trainer)
    with pytest.raises(RuntimeError, match=f"{trials_run} trials? failed"):
        search(tmp_path, trials=3, max_failed_trials=max_failed)
    assert len(trainer.calls) == trials_run
    assert [katib.search_failed(n, max_failed) for n in range(4)] == [False] + [n >= trials_run for n in range(1, 4)]


def test_a_trial_without_a_finite_eval_loss_is_failed_but_the_search_goes_on(tmp_path, monkeypatch):
    trainer = fake_trainer(loss_of=lambda cfg: math.nan if len(trainer.calls) == 1 else 2.0 + len(trainer.calls))
    monkeypatch.setattr(train_local, "run_torchrun", trainer)
    experiment, trials = search(tmp_path, max_failed_trials=2)  # one failure does not end it
    rows = katib.trial_summaries(trials)
    assert [(r["name"], r["state"], r["eval_loss"]) for r in rows] == [
        ("trial-2", "Succeeded", 4.0),
        ("trial-3", "Succeeded", 5.0),
        ("trial-1", "Failed", None),
    ]
    assert rows[2]["message"] == "the trainer reported no finite eval_loss (nan)"
    assert experiment["status"]["trialsFailed"] == 1 and katib.best_trial(experiment)["name"] == "trial-2"


# -- the step ----------------------------------------------------------------------------------------------------


def run_step(tmp_path, settings: dict):
    data_root, model_root = tmp_path / "data", tmp_path / "models"
    (tmp_path / "artifacts").mkdir(exist_ok=True)
    dataset = Dataset(
        uri=str(tmp_path / "artifacts" / "dataset"),
        metadata={"path": str(data_root / "runs" / RUN_ID / "dataset"), "packing": True},
    )
    report = Markdown(uri=str(tmp_path / "artifacts" / "report.md"))
    best = search_hyperparameters.python_func(
        dataset=dataset,
        settings=settings,
        data_root=str(data_root),
        model_root=str(model_root),
        run_id=RUN_ID,
        report=report,
    )
    return best, (tmp_path / "artifacts" / "report.md").read_text(), model_root / "runs" / RUN_ID / "hpo"


def local_settings(**over) -> dict:
    return {
        **defaults(),
        "train_backend": "local",
        "deepspeed_config": "none",
        "num_nodes": 1,
        "gpus_per_node": 2,
        "hpo_trials": 3,
        "hpo_search_space": SPACE,
        "hpo_trial_steps": 4,
        "seed": 0,
        **over,
    }


def test_the_local_step_runs_the_trials_here_and_returns_the_best(tmp_path, monkeypatch, caplog):
    trainer = fake_trainer()
    monkeypatch.setattr(train_local, "run_torchrun", trainer)
    with caplog.at_level(logging.WARNING, "search_hyperparameters"):
        best, report, hpo_dir = run_step(tmp_path, local_settings(hpo_parallel_trials=2))
    assert "hpo_parallel_trials=2: local trials run one at a time" in caplog.text
    lrs = [cfg["learning_rate"] for cfg, _ in trainer.calls]
    assert best == {"learning_rate": min(lrs)}
    cfg = trainer.calls[0][0]
    assert cfg["dataset_path"] == str(tmp_path / "data" / "runs" / RUN_ID / "dataset") and cfg["use_cpu"] is True
    assert cfg["model_cache_dir"] == str(tmp_path / "data" / "cache") and cfg["output_dir"] == str(hpo_dir / "trial-1")
    assert "**Best:** `trial-" in report and len([line for line in report.splitlines() if line.startswith("| `")]) == 3
    assert "tpe over learning_rate; 3 of 3 trials" in report


def test_integer_settings_reach_the_trainer_as_integers_after_kfps_struct(tmp_path, monkeypatch):
    trainer = fake_trainer(loss_of=lambda cfg: 5.0 - cfg["gradient_accumulation_steps"])
    monkeypatch.setattr(train_local, "run_torchrun", trainer)
    # As validate_inputs hands them over: a dict setting's numbers are all doubles.
    best, _, _ = run_step(
        tmp_path,
        local_settings(
            hpo_search_space={"gradient_accumulation_steps": {"values": [1.0, 2.0, 4.0]}}, hpo_algorithm="grid"
        ),
    )
    assert sorted(cfg["gradient_accumulation_steps"] for cfg, _ in trainer.calls) == [1, 2, 4]
    assert all(type(cfg["gradient_accumulation_steps"]) is int for cfg, _ in trainer.calls)
    assert best == {"gradient_accumulation_steps": 4} and type(best["gradient_accumulation_steps"]) is int


# -- three real trials -------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_three_real_trials_of_the_tiny_model(tmp_path):
    from tests.helpers.trainer import CPU_TEST_SETTINGS, make_workdir

    (tmp_path / "work").mkdir()
    root = make_workdir(tmp_path / "work")
    data_root = tmp_path / "data"
    (data_root / "runs" / RUN_ID).mkdir(parents=True)
    (data_root / "runs" / RUN_ID / "dataset").symlink_to(root / "data")
    settings = local_settings(
        model_name_or_path=str(root / "base"),
        max_seq_length=128,
        per_device_train_batch_size=2,
        gradient_accumulation_steps=1,
        **CPU_TEST_SETTINGS,
        hpo_search_space={"learning_rate": {"min": 1e-4, "max": 3e-2, "scale": "log"}},
    )
    best, report, hpo_dir = run_step(tmp_path, settings)

    metrics = {p.parent.name: json.loads(p.read_text()) for p in hpo_dir.glob("trial-*/metrics.json")}
    configs = {p.parent.name: json.loads(p.read_text()) for p in hpo_dir.glob("trial-*/train_config.json")}
    assert sorted(metrics) == ["trial-1", "trial-2", "trial-3"]
    assert all(m["global_step"] == 4 for m in metrics.values())
    lowest = min(metrics, key=lambda t: metrics[t]["eval_loss"])
    assert best == {"learning_rate": configs[lowest]["learning_rate"]}
    assert f"**Best:** `{lowest}`: eval_loss {metrics[lowest]['eval_loss']:.4f}" in report
    assert len([line for line in report.splitlines() if line.startswith("| `trial-")]) == 3
    assert not list(hpo_dir.glob("trial-*/final")) and not list(hpo_dir.glob("trial-*/checkpoint-*"))
    assert all(list(hpo_dir.glob(f"{t}/tensorboard/events.out.*")) for t in metrics)
