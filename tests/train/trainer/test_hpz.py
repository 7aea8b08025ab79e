"""ZeRO++ hierarchical partitioning (hpZ) trains as plain ZeRO-3 does: 4 CPU ranks over gloo, partition size 2.

hpZ changes where the parameters are gathered from (a secondary partition over 2 ranks after each block's first
forward), not what is computed: the losses must equal ZeRO-3's. The shipped components/train/deepspeed/zero3_hpz.json
partitions over 8 GPUs (one node); here the same file with partition size 2, so that 4 ranks make two "nodes".
"""

import json
import os
from collections import Counter

import pytest

from components.train.config import deepspeed_config_path
from components.train.launcher.local_torchrun import run_torchrun
from tests.helpers.trainer import make_workdir, trainer_config

pytestmark = pytest.mark.slow

# hpZ gathers the same fp32 values from a copy of them and reduces the gradients over the same ranks in the same
# order: on CPU in fp32 the losses agree to rounding.
LOSS_REL_TOLERANCE = 1e-5
STEPS = 2
RANKS = 4


# Loaded by every process of the torchrun job (sitecustomize on PYTHONPATH): counts the bytes each rank all-gathers,
# by the size of the group the gather runs over, and writes them out when the process ends. DeepSpeed's torch
# backend looks torch.distributed.all_gather_into_tensor up when it starts, after this has wrapped it.
TRACER = """
import atexit, json, os
import torch.distributed as dist

_bytes = {}
_gather = dist.all_gather_into_tensor

def _traced(output_tensor, input_tensor, group=None, async_op=False):
    size = dist.get_world_size(group)
    _bytes[size] = _bytes.get(size, 0) + output_tensor.numel() * output_tensor.element_size()
    return _gather(output_tensor, input_tensor, group=group, async_op=async_op)

dist.all_gather_into_tensor = _traced

@atexit.register
def _write():
    if "RANK" in os.environ and _bytes:
        path = os.path.join(os.environ["GATHER_TRACE_DIR"], f"rank{os.environ['RANK']}-{os.getpid()}.json")
        with open(path, "w") as f:
            json.dump(_bytes, f)
"""


def _traced_env(trace: "os.PathLike") -> dict:
    (trace / "sitecustomize.py").write_text(TRACER)
    path = os.pathsep.join(p for p in (str(trace), os.environ.get("PYTHONPATH", "")) if p)
    return {**os.environ, "PYTHONPATH": path, "GATHER_TRACE_DIR": str(trace)}


def _gathered(trace) -> Counter:
    """Bytes all-gathered by rank 0, by the size of the group the gathers ran over."""
    total: Counter = Counter()
    for f in trace.glob("rank0-*.json"):
        total.update({int(k): v for k, v in json.loads(f.read_text()).items()})
    return total


def _losses(out):
    state = json.loads((out / f"checkpoint-{STEPS}" / "trainer_state.json").read_text())
    return {e["step"]: e["loss"] for e in state["log_history"] if "loss" in e}


def test_hpz_trains_on_four_cpu_ranks_with_the_losses_of_zero3(tmp_path):
    root = make_workdir(tmp_path)
    shipped = json.loads(open(deepspeed_config_path("zero3_hpz")).read())
    assert shipped["zero_optimization"]["zero_hpz_partition_size"] == 8  # one node of 8 GPUs
    shipped["zero_optimization"]["zero_hpz_partition_size"] = 2
    hpz = tmp_path / "zero3_hpz2.json"
    hpz.write_text(json.dumps(shipped))

    over = dict(
        max_steps=STEPS, save_steps=STEPS, logging_steps=1, gradient_accumulation_steps=2, per_device_train_batch_size=1
    )
    gathered = {}
    for name, config in (("zero3", deepspeed_config_path("zero3")), ("hpz", str(hpz))):
        trace = tmp_path / f"trace-{name}"
        trace.mkdir()
        run_torchrun(trainer_config(root, name, deepspeed=config, **over), nproc_per_node=RANKS, env=_traced_env(trace))
        gathered[name] = _gathered(trace)
    print("bytes all-gathered by rank 0, by group size:", {k: dict(v) for k, v in gathered.items()})
    # hpZ is on: gathers run within groups of 2 (the secondary partition), and fewer gathers span all 4 ranks.
    assert set(gathered["zero3"]) == {RANKS}
    assert gathered["hpz"][2] > 0
    assert gathered["hpz"][RANKS] < gathered["zero3"][RANKS]

    z3, hp = _losses(root / "zero3"), _losses(root / "hpz")
    assert sorted(z3) == sorted(hp) == list(range(1, STEPS + 1))
    assert all(hp[s] == pytest.approx(z3[s], rel=LOSS_REL_TOLERANCE) for s in z3), (z3, hp)
    for name in ("zero3", "hpz"):
        metrics = json.loads((root / name / "metrics.json").read_text())
        assert metrics["world_size"] == RANKS and metrics["global_step"] == STEPS
    assert json.loads((root / "hpz" / "final" / "model.json").read_text())["deepspeed"].endswith("zero3_hpz2.json")
