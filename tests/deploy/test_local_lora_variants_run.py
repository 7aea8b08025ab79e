"""Two LoRA variants of one local run served together (issue 23), for real: ``python -m pipelines.run`` trains two
unmerged LoRA adapters of the tiny model (``lora_r`` 8 and 16), compares them and, with ``deploy_variants=all``,
serves both from one real vLLM server (the CPU build in the serving virtualenv) with the adapters as LoRA modules;
the deploy step smoke-tests the base and both adapters by name and checks each adapter against its own evaluation.
With ``--keep-serving`` the server outlives the run: the test scores the same tokens under each name there (the
adapters are applied: each name scores them differently; a test of its own with hand-built adapters before, issue 38:
CI's time) and stops it.

    pytest -m slow tests/deploy/test_local_lora_variants_run.py     # measured: 213 s on 2 busy cores

The serving virtualenv is built first where it is absent; skipped where it cannot be (a failure with ``CI=true``).
"""

import json
import os
import re
import shutil
import signal
import socket
import tempfile
import time
import urllib.parse
from pathlib import Path

import psutil
import pytest

from components.models.logprobs import read_reference, reference_path, server_logprobs
from pipelines.local_runner import inductor_cache_default
from tests.helpers.repo import run_cli
from tests.helpers.serving import serving_vllm

VARIANTS = '[{"lora_r": 8, "name": "r8"}, {"lora_r": 16, "learning_rate": 0.002, "name": "r16"}]'


@pytest.mark.slow
def test_two_lora_variants_are_trained_compared_and_served_together(tmp_path):
    serving_vllm()  # built first where a clean clone has none
    ws = tmp_path / "ws"
    summary_path = tmp_path / "summary.json"
    # The user's temporary folder: short, as /tmp is (vLLM's sockets are files in it: 107 bytes a path at most).
    user_tmp = Path(tempfile.mkdtemp(prefix="user-tmp-"))
    result = run_cli(
        "pipelines.run",
        "--workspace",
        str(ws),
        "--summary-json",
        str(summary_path),
        "-p",
        "method=lora",
        "-p",
        "merge_lora=false",
        "-p",
        "deploy_variants=all",
        "-p",
        f"variants={VARIANTS}",
        "-p",
        "max_steps=20",  # what is asserted (adapters served together, each as evaluated) does not need the full recipe
        "--keep-serving",
        timeout=1200,
        env={**os.environ, "TMPDIR": str(user_tmp)},
    )
    try:
        _assert_trained_compared_and_served(result, ws, summary_path)
        # The kept server's temporary files (vLLM's sockets among them) stay with it in the run's temporary folder,
        # named in the summary; nothing else of the run's is left there (pipelines/local_runner.py::RunTemp).
        kept = Path(json.loads(summary_path.read_text())["temp_dir"])
        assert kept.parent == user_tmp and kept.is_dir() and f"temp files:  {kept} " in result.stdout, kept
        left = {p.name for p in user_tmp.iterdir()} - {Path(inductor_cache_default()).name}
        assert left == {kept.name}, left
    finally:
        stopped = _stop_kept_server(summary_path)  # also when an assertion failed: no server outlives the test
        shutil.rmtree(user_tmp, ignore_errors=True)
    assert stopped, "the kept server did not stop on SIGTERM"


def _assert_trained_compared_and_served(result, ws, summary_path) -> None:
    out = result.stdout + result.stderr
    assert result.returncode == 0, out[-4000:]
    s = json.loads(summary_path.read_text())
    assert s["passed"] and "(deploy_variants=all)" in s["reason"], s["reason"]
    run_id = s["model_uri"].split("/")[-3].rsplit("-", 1)[0]
    for variant in ("r8", "r16"):
        final = ws / "models" / "runs" / f"{run_id}-{variant}" / "train" / "final"
        config = json.loads((final / "adapter_config.json").read_text())  # an adapter alone: merge_lora=false
        assert config["r"] == int(variant[1:]) and not (final / "config.json").exists()
    # One server: every name answered at the same endpoint, and each adapter matched its evaluation.
    answered = re.findall(r"(tiny-qwen3-sft-(?:base|r8|r16)) at (http://127\.0\.0\.1:\d+/v1) answered", out)
    assert sorted(name for name, _ in answered) == ["tiny-qwen3-sft-base", "tiny-qwen3-sft-r16", "tiny-qwen3-sft-r8"]
    assert len({url for _, url in answered}) == 1
    checked = re.findall(
        r"(tiny-qwen3-sft-r(?:8|16)) serves the evaluated model: mean \|log-probability "
        r"difference\| ([0-9.]+) nats",
        out,
    )
    assert sorted(name for name, _ in checked) == ["tiny-qwen3-sft-r16", "tiny-qwen3-sft-r8"]
    assert all(float(diff) <= 0.05 for _, diff in checked), checked
    # --keep-serving: the server outlives the run; the same tokens score differently under each name (the adapters
    # are applied, each its own).
    assert "still serving" in result.stdout and "0.32.0" in open(s["server_log"], errors="replace").read()
    final = ws / "models" / "runs" / f"{run_id}-r8" / "train" / "final"
    ids = read_reference(reference_path(str(final)))["examples"][0]["token_ids"]
    scored = {name: server_logprobs(s["endpoint"], f"tiny-qwen3-sft-{name}", ids)[1:] for name in ("base", "r8", "r16")}
    differ = {
        (x, y): max(abs(p - q) for p, q in zip(scored[x], scored[y], strict=True))
        for x, y in (("base", "r8"), ("base", "r16"), ("r8", "r16"))
    }
    assert all(d > 0.05 for d in differ.values()), differ


def _stop_kept_server(summary_path) -> bool:
    """SIGTERM to the process group of whatever listens on the summary's endpoint (the kept server; nothing when the
    run wrote no endpoint); whether the port is closed within 60 s."""
    endpoint = json.loads(summary_path.read_text()).get("endpoint") if summary_path.exists() else ""
    if not endpoint:
        return True
    port = urllib.parse.urlparse(endpoint).port
    for pid in {c.pid for c in psutil.net_connections("tcp") if c.laddr.port == port and c.status == "LISTEN"}:
        os.killpg(os.getpgid(pid), signal.SIGTERM)
    deadline = time.monotonic() + 60
    while _listening(port):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.5)
    return True


def _listening(port: int) -> bool:
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) == 0
