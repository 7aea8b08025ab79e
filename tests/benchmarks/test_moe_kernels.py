"""benchmarks/moe_kernels.py: the raw layers' FLOPs are the plan's count per layer, its rows are packed as the
trainer's, and the --tiny CPU run measures each variant through the trainer's own choice of experts."""

import json
import os
import subprocess
import sys

import pytest

from components.models.mfu import causal_attention_length, model_flops_per_token
from components.models.shape import load_architecture, model_shape
from tests.helpers.repo import ROOT

sys.path.insert(0, str(ROOT / "benchmarks"))
import moe_kernels as bench  # noqa: E402

REFERENCE = load_architecture("Qwen/Qwen3-30B-A3B")


def test_a_layers_flops_are_the_plans_count_per_layer():
    """48 x one layer + the output head (6 h V) = mfu.py's model FLOPs per token of the whole model: the layers'
    TFLOP/s and the whole model's are counted alike (the embedding lookup at 0, attention per document)."""
    keys = 566.75
    shape = model_shape(REFERENCE)
    head = 6 * shape.hidden * shape.vocab
    per_layer = bench.layer_flops_per_token(REFERENCE, None, keys)
    final_norm = 6 * shape.hidden  # the plan counts the final norm's weight with the head
    assert 48 * per_layer + head + final_norm == pytest.approx(model_flops_per_token(shape, keys), rel=1e-12)
    # The EP-8 share keeps the FLOPs per token (top-8 of 16 experts): only the router narrows, 6 x 2048 x 112.
    assert per_layer - bench.layer_flops_per_token(REFERENCE, 16, keys) == 6 * 2048 * 112


def test_rows_are_packed_documents_that_fill_each_row():
    rows = bench.packed_positions(4, 4096)
    assert all(sum(row) == 4096 and min(row) > 0 for row in rows)
    assert 300 < causal_attention_length([n for row in rows for n in row]) < 900  # median document 512


@pytest.mark.slow
def test_the_tiny_run_measures_each_variant_and_skips_liger_without_a_gpu(tmp_path):
    out = subprocess.run(
        [sys.executable, "benchmarks/moe_kernels.py", "--tiny", "--variants", "grouped_mm,ep8-share,liger"]
        + ["--out", str(tmp_path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "CUDA_VISIBLE_DEVICES": ""},
    )
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    results = {r["variant"]: r for r in json.loads((tmp_path / "moe-kernels.json").read_text())}
    assert results["liger"]["status"] == "skipped" and "CUDA" in results["liger"]["reason"]
    for name, experts in (("grouped_mm", 8), ("ep8-share", 16)):
        r = results[name]
        assert r["status"] == "ok" and r["experts"] == experts and r["tokens_per_s"] > 0, r
        # Both figures are rounded from the same unrounded rate, so they agree to within one token/s.
        assert abs(r["tokens_per_s_48_layers"] - r["tokens_per_s"] * r["layers"] / 48) <= 1, r
    assert "| grouped_mm | 8 |" in out.stdout
