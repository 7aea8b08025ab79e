"""search_hyperparameters' work without KFP (components/hpo/search.py): off, its deadline, and trials that start from
the very config the sft stage trains with (the setup both share: components/train/launcher/job_setup.py). The searches
themselves: tests/hpo/test_hpo_step.py (Katib, the fake API server) and tests/hpo/test_hpo_local.py (Optuna)."""

import json
from pathlib import Path

import pytest

from components.hpo import local_search as hpo_local
from components.hpo.search import OFF_REPORT, SearchResult, search_sft_settings, search_timeout_seconds
from components.settings import Settings, defaults
from components.train.launcher import local_torchrun as train_local
from components.train.launcher.run import train_stage

RUN_ID = "run-1"


def settings(**over) -> Settings:
    return Settings.from_flat({**defaults(), **over})


def test_with_no_trials_nothing_is_searched_or_written(tmp_path):
    result = search_sft_settings(
        settings(hpo_trials=0),
        dataset_path=str(tmp_path / "data" / "dataset"),
        packing=True,
        data_root=str(tmp_path / "data"),
        model_root=str(tmp_path / "models"),
        run_id=RUN_ID,
    )
    assert result == SearchResult({}, OFF_REPORT) and not (tmp_path / "models").exists()


def test_a_cluster_search_lasts_at_most_its_rounds_of_the_jobs_deadline():
    assert search_timeout_seconds(settings(active_deadline_seconds=0)) is None
    s = settings(hpo_trials=5, hpo_parallel_trials=2, active_deadline_seconds=3600, pending_timeout_seconds=600)
    assert search_timeout_seconds(s) == 3 * (3600 + 600)


class _Stop(Exception):
    pass


def test_the_trials_start_from_the_config_the_sft_stage_trains_with(tmp_path, monkeypatch):
    data, models = tmp_path / "data", tmp_path / "models"
    over = {
        "train_backend": "local",
        "deepspeed_config": "none",
        "metrics_port": 0,
        "hpo_trials": 2,
        "hpo_search_space": {"learning_rate": {"min": 1e-5, "max": 1e-3}},
        "stage_settings": {"sft": {"weight_decay": 0.01}},
    }
    monkeypatch.setattr(train_local, "cuda_available", lambda: False)
    configs = {}

    def run_search(base_config, trials_dir, **kwargs):
        configs["hpo"] = json.loads(Path(base_config).read_text())
        raise _Stop

    def run_torchrun(config_path, nproc_per_node, env=None):
        configs["sft"] = cfg = json.loads(Path(config_path).read_text())
        (Path(cfg["output_dir"]) / "metrics.json").write_text("{}")

    monkeypatch.setattr(hpo_local, "run_search", run_search)
    monkeypatch.setattr(train_local, "run_torchrun", run_torchrun)
    where = dict(packing=True, data_root=str(data), model_root=str(models), run_id=RUN_ID)
    dataset = str(data / "runs" / RUN_ID / "dataset")
    with pytest.raises(_Stop):
        search_sft_settings(settings(**over), dataset_path=dataset, **where)
    s = settings(**over)
    train_stage(s, stage="sft", base_model_path=s.model.model_name_or_path, tuned={}, dataset_path=dataset, **where)

    hpo, sft = configs["hpo"], configs["sft"]
    assert hpo.pop("output_dir") == str(models / "runs" / RUN_ID / "hpo")
    assert sft.pop("output_dir") == str(models / "runs" / RUN_ID / "train")
    assert hpo == sft and hpo["use_cpu"] is True and hpo["weight_decay"] == 0.01
