"""What crosses the pod boundary per optimizer step, measured: 2 pods x 2 CPU ranks in their own network namespaces.

benchmarks/netns_bytes.py runs the trainer (tiny Qwen3-MoE, gloo) under ZeRO-3, ZeRO++ hpZ (partition 2 = one
pod's ranks) and transformers' FSDP2 layouts (parallelism hsdp and hsdp_ep: sharded within a pod, replicated across
the pods, experts parallel within the pod) with each pod's torchrun in its own namespace, joined by a veth pair whose
byte counters count what passes between them, read at the optimizer step boundaries. Here in the "regather" regime
(stage3_max_reuse_distance 0: the backward gathers again, as Qwen3-30B-A3B's layers are, see the benchmark's
REGIMES; FSDP2 always gathers again).

Skipped (with the reason) where it cannot run: not root, no ``ip``, namespaces refused. With ``CI=true`` those are
failures instead: CI must run it.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "benchmarks"))

import netns_bytes  # noqa: E402

pytestmark = pytest.mark.slow

# Same values gathered from a copy, same reductions in the same order, fp32 on CPU: the losses agree to rounding
# (they agreed exactly when measured; tests/train/trainer/test_hpz.py uses the same tolerance). HSDP sums each
# gradient within the pod, then across: another order of the same fp32 sums; its losses and eval_loss were equal to
# ZeRO-3's in every printed digit as well.
LOSS_REL_TOLERANCE = 1e-5
# Measured 1.75x (benchmarks/results/plan.md): on gloo a reduce-scatter is an all-reduce (2 B across the boundary,
# calibrated), so ZeRO-3's 4 B per micro-step (2 gathers + reduce-scatter) against hpZ's (1 + 2k) B per step is
# 4k / (1 + 2k) = 16/9 at k = 4. Asserted with a margin for the small traffic besides (loss logging, the store).
MIN_RATIO = 1.6
# HSDP (issue 20's target: >= 4x fewer bytes than ZeRO-3): only the all-reduce of each rank's fp32 gradient shard
# (4P / 2) between the pods crosses, once per optimizer step (the Trainer defers it over the micro-steps), against
# ZeRO-3's 4 B per micro-step: measured 12.3x (hsdp) and 12.2x (hsdp_ep), benchmarks/results/plan.md.
MIN_RATIO_HSDP = 4.0
# The plan with gloo's collectives (all-gather 1 B, reduce-scatter 2 B, as calibrated on the same veth) against the
# measured: within 15% (issue 20 part 3). Measured 8-10% over it: the plan counts the parameters' bytes only; the
# rest is DeepSpeed's padding of each partition, TCP/IP framing and ACKs, and the small all-reduces (loss, norms).
PLAN_TOLERANCE = 0.15


@pytest.fixture(scope="module")
def machine():
    why = netns_bytes.unavailable()
    if why:
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI must run the cross-pod measurement: {why}")
        pytest.skip(why)


def _namespaces() -> set[str]:
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    return {line.split()[0] for line in out.splitlines() if line.strip()}


def test_hpz_and_hsdp_move_fewer_bytes_across_the_pod_boundary_with_zero3s_losses(machine, tmp_path):
    before = _namespaces()
    results = netns_bytes.measure(tmp_path, regimes=("regather",))
    assert _namespaces() == before  # the pods' namespaces (and their veth) are gone
    print(netns_bytes.table(results))
    factors = results["factors"]
    # gloo's all-gather is a ring (B across the boundary), its reduce-scatter an all-reduce (2 B).
    assert factors["all-gather"] == pytest.approx(1.0, rel=0.05), factors
    assert factors["reduce-scatter"] == pytest.approx(2.0, rel=0.05), factors

    # An all-reduce between one rank of each pod sends the ring's 2 S (n - 1) / n, as the plan counts.
    assert factors["all-reduce, one rank per pod"] == pytest.approx(1.0, rel=0.05), factors

    runs = {name: results[("regather", name)] for name in ("zero3", "hpz", "hsdp", "hsdp_ep")}
    z3 = runs["zero3"]
    both = {name: r["tx_per_step"] + r["rx_per_step"] for name, r in runs.items()}
    assert both["zero3"] / both["hpz"] >= MIN_RATIO, both
    assert both["zero3"] / both["hsdp"] >= MIN_RATIO_HSDP, both
    assert both["zero3"] / both["hsdp_ep"] >= MIN_RATIO_HSDP, both
    for r in runs.values():
        # The links are symmetric: what pod 0 sends, pod 1 receives and the other way round.
        assert r["tx_per_step"] == pytest.approx(r["rx_per_step"], rel=0.05), r
        per_direction = (r["tx_per_step"] + r["rx_per_step"]) / 2
        assert per_direction == pytest.approx(r["planned_gloo"], rel=PLAN_TOLERANCE), r

    for r in runs.values():
        assert sorted(r["losses"]) == list(range(1, netns_bytes.STEPS + 1))
        assert all(r["losses"][s] == pytest.approx(z3["losses"][s], rel=LOSS_REL_TOLERANCE) for s in z3["losses"])
        assert r["eval_loss"] == pytest.approx(z3["eval_loss"], rel=LOSS_REL_TOLERANCE)
