"""A re-run whose newest complete checkpoint is the last step (the run died in its export or final evaluation, or
was evicted then) trains no further step: it exports the same model, with the same step count.

transformers 5.23's training loop runs a step before it checks ``max_steps`` (``Trainer._run_epoch``), so resuming
at ``max_steps`` trained step ``max_steps + 1`` past the schedule's end and exported another model.
"""

import json
import shutil

import pytest
from safetensors.torch import load_file

from components.train.launcher.local_torchrun import run_torchrun
from tests.helpers.trainer import make_workdir, trainer_config

pytestmark = pytest.mark.slow


def test_a_rerun_after_the_last_checkpoint_trains_no_further_step(tmp_path, capfd):
    root = make_workdir(tmp_path)
    config = trainer_config(root, "run", max_steps=4, save_steps=2, logging_steps=1)
    run_torchrun(config, nproc_per_node=2)
    out = root / "run"
    first = load_file(out / "final" / "model.safetensors")
    # As a run that died while exporting leaves it: every checkpoint complete, no final/ and no metrics.json.
    shutil.rmtree(out / "final")
    (out / "metrics.json").unlink()
    capfd.readouterr()

    run_torchrun(config, nproc_per_node=2)
    assert "resuming from " + str(out / "checkpoint-4") in capfd.readouterr().out
    assert json.loads((out / "metrics.json").read_text())["global_step"] == 4
    assert not (out / "checkpoint-5").exists()
    again = load_file(out / "final" / "model.safetensors")
    assert all((again[k] - first[k]).abs().max() == 0 for k in first)
