"""A checkpoint marked COMPLETE whose weights or optimizer file was cut short (a volume that filled up, a copy that
stopped) is not resumed from: the trainer entry point, under real 2-rank torchrun on CPU, warns naming it, resumes
from the previous complete checkpoint and finishes the run."""

import json
import shutil

import pytest

from components.models.checkpoint_dirs import recorded_sizes, unreadable
from components.train.launcher.local_torchrun import run_torchrun
from tests.helpers.trainer import make_workdir, trainer_config

pytestmark = pytest.mark.slow

OVER = dict(max_steps=8, save_steps=4, logging_steps=2, save_total_limit=2)


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """One finished run with complete checkpoints at steps 4 and 8 (copied by each test, not re-trained)."""
    root = make_workdir(tmp_path_factory.mktemp("unreadable"))
    run_torchrun(trainer_config(root, "clean", **OVER), nproc_per_node=2)
    return root


@pytest.mark.parametrize("name", ["model.safetensors", "optimizer.pt"])
def test_a_truncated_file_in_the_newest_checkpoint_resumes_from_the_previous_one(trained, name, capfd):
    out = trained / name.split(".")[0]
    shutil.copytree(trained / "clean", out)
    config = trainer_config(trained, out.name, **OVER)
    newest = out / "checkpoint-8"
    assert recorded_sizes(newest)[name] == (newest / name).stat().st_size  # the marker recorded it at save time
    data = (newest / name).read_bytes()
    (newest / name).write_bytes(data[: len(data) // 2])
    (out / "metrics.json").unlink()
    capfd.readouterr()

    run_torchrun(config, nproc_per_node=2)
    captured = capfd.readouterr()
    logs = captured.out + captured.err
    assert f"skipping {newest}" in logs and name in logs, logs[-3000:]
    assert f"resuming from {out / 'checkpoint-4'}" in logs
    assert json.loads((out / "metrics.json").read_text())["global_step"] == 8
    # The step-8 checkpoint was written again, whole: a later re-run resumes from it.
    assert unreadable(newest) is None
    assert sorted(p.name for p in out.glob("checkpoint-*")) == ["checkpoint-4", "checkpoint-8"]
