"""The trainer with its base model named by Hub id, as the cluster presets name it, from an offline HF cache.

On the cluster the pods find the model in the Hugging Face cache on the data volume (HF_HOME); here the
cache is pre-populated and HF_HUB_OFFLINE=1, so the Hub-id path runs without a network.
"""

import json
import os
from pathlib import Path

import pytest

from components.train.launcher.local_torchrun import run_torchrun
from tests.helpers.hf_cache import add_to_hub_cache, offline_hub_env
from tests.helpers.trainer import make_workdir, trainer_config

pytestmark = pytest.mark.slow

REPO = "tiny-org/tiny-qwen3-sft"


def test_a_model_named_by_hub_id_trains_and_exports(tmp_path):
    (tmp_path / "work").mkdir()
    root = make_workdir(tmp_path / "work", rows=48)
    hf_home = tmp_path / "hf"
    add_to_hub_cache(hf_home / "hub", REPO, root / "base")
    config = trainer_config(root, "hub", model_name_or_path=REPO, max_steps=4, save_steps=4, logging_steps=2)
    run_torchrun(config, nproc_per_node=1, env={**os.environ, **offline_hub_env(hf_home)})
    metrics = json.loads((root / "hub" / "metrics.json").read_text())
    assert metrics["global_step"] == 4
    card = json.loads((root / "hub" / "final" / "model.json").read_text())
    assert card["base_model"] == REPO
    assert (root / "hub" / "final" / "config.json").exists()
    # The run recorded the snapshot it trained on: a re-run of the job resumes on that one.
    record = json.loads((root / "hub" / "base_model.json").read_text())
    snapshots = hf_home / "hub" / f"models--{REPO.replace('/', '--')}" / "snapshots"
    assert record["model_name_or_path"] == REPO and Path(record["path"]).parent == snapshots
