"""transformers' FSDP2 layouts through the trainer: ``parallelism`` hsdp and hsdp_ep train the tiny Qwen3-MoE on 4
CPU ranks over gloo (torchrun's 4 local ranks stand for 2 "nodes" x 2: ``LOCAL_WORLD_SIZE`` is 4 here, so this is
FSDP2 over 4 ranks, and expert parallelism over 4 ranks; the 2-pod HSDP split is measured in
tests/train/trainer/test_cross_pod_bytes.py) with the losses, eval_loss and exported weights of plain DDP, and write
no periodic checkpoints, so a re-run trains from the start (components/train/trainer/parallelism.py: transformers
5.23 cannot resume them).
"""

import json
import re
import sys
from pathlib import Path

import pytest
from safetensors.torch import load_file

from components.train.launcher.local import run_torchrun
from tests.helpers.trainer import trainer_config

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "benchmarks"))

import netns_bytes  # noqa: E402

pytestmark = pytest.mark.slow

RANKS = 4
STEPS = 2
# fp32 on CPU; FSDP2 sums each gradient in another order than DDP's all-reduce: rounding only (measured: equal in
# every printed digit, weights within 1e-5).
LOSS_REL_TOLERANCE = 1e-5
WEIGHT_TOLERANCE = 1e-4


def _run(root: Path, model: Path, name: str, steps: int = STEPS, **over) -> dict:
    cfg = trainer_config(
        root,
        name,
        model_name_or_path=str(model),
        max_steps=steps,
        save_steps=1,
        logging_steps=1,
        gradient_accumulation_steps=2,
        per_device_train_batch_size=1,
        **over,
    )
    run_torchrun(cfg, nproc_per_node=RANKS)
    return json.loads((root / name / "metrics.json").read_text())


def _weights(root: Path, name: str) -> dict:
    (path,) = (root / name / "final").glob("*.safetensors")
    return load_file(path)


def _first_losses(text: str) -> list[str]:
    """The loss of every progress line for step 1 in the trainer's output (rank 0's ``step 1/N | loss X``)."""
    return re.findall(r"step 1/\d+ \| loss (\S+)", text)


def test_hsdp_layouts_train_and_export_as_ddp_does_and_a_rerun_starts_over(tmp_path, capsys):
    model = netns_bytes.make_moe(tmp_path)
    metrics = {"ddp": _run(tmp_path, model, "ddp")}
    first = {}
    for layout in ("hsdp", "hsdp_ep"):
        capsys.readouterr()
        metrics[layout] = _run(tmp_path, model, layout, parallelism=layout)
        first[layout] = _first_losses(capsys.readouterr().out)
    reference = _weights(tmp_path, "ddp")
    for layout in ("hsdp", "hsdp_ep"):
        m = metrics[layout]
        assert m["world_size"] == RANKS and m["global_step"] == STEPS
        for key in ("train_loss_logged_mean", "final_train_loss", "eval_loss"):
            assert m[key] == pytest.approx(metrics["ddp"][key], rel=LOSS_REL_TOLERANCE), (layout, key, metrics)
        weights = _weights(tmp_path, layout)
        assert sorted(weights) == sorted(reference)  # a plain checkpoint: the names save_pretrained writes
        assert all((weights[k] - reference[k]).abs().max() <= WEIGHT_TOLERANCE for k in reference), layout
        assert not list((tmp_path / layout).glob("checkpoint-*"))  # save_strategy no: nothing to resume from
    assert list((tmp_path / "ddp").glob("checkpoint-*"))

    # A re-run of the hsdp job (as after an eviction) trains from the start: step 1 again, with the same loss.
    again = _run(tmp_path, model, "hsdp", steps=STEPS + 1, parallelism="hsdp")
    out = capsys.readouterr().out
    assert again["global_step"] == STEPS + 1 and "resuming from" not in out
    assert len(first["hsdp"]) == 1 and _first_losses(out) == first["hsdp"]
