"""What the local run reads back from the steps' outputs for its summary (pipelines/local_runner.py), and what it loads
before the first step starts."""

import base64
import subprocess
import sys
from pathlib import Path

from components.evaluate.curves import PNG_PREFIX
from pipelines.local_runner import embedded_png, inductor_cache_default

ROOT = Path(__file__).resolve().parents[2]


def test_the_training_curve_is_read_back_from_the_evaluation_report():
    png = b"\x89PNG\r\n\x1a\n-the-curve"
    report = f"# Evaluation\n\n![training loss]({PNG_PREFIX}{base64.b64encode(png).decode()})\n\nthe rest"
    assert embedded_png(report) == png
    assert embedded_png("# Evaluation\n\nno curve: the run has no complete checkpoint") is None


def test_the_local_run_loads_no_plotting_library_before_its_steps():
    code = "import sys, pipelines.local_runner; print(sorted(m for m in ('matplotlib', 'torch') if m in sys.modules))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert done.stdout.strip() == "[]", done.stderr


def test_the_compile_cache_a_run_leaves_in_place_is_where_torch_keeps_it():
    # RunTemp moves the steps' TMPDIR into the run's own folder, and keeps torch's Inductor cache where torch's
    # default puts it (so that a new run compiles nothing again): the two must name the same folder.
    from torch._inductor.runtime.cache_dir_utils import default_cache_dir

    assert inductor_cache_default() == default_cache_dir()
