"""Issue 9, defects 1 and 3: every model reference resolves to a local folder; FP8 checkpoints to a bf16 copy.

The Hub is an offline HF cache (tests/hf_cache.py) holding a tiny FP8 Qwen3-MoE laid out as Qwen's
Qwen3-30B-A3B-...-FP8, named by Hub id with HF_HOME and HF_HUB_OFFLINE=1, as the cluster's pods see it.
"""

import contextlib
import json
import os
import re
import shutil
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from components.models import fp8, resolve
from components.models.resolve import load_model_config, resolve_model
from tests.helpers.hf_cache import TINY_FP8_REPO, add_to_hub_cache, build_tiny_fp8_qwen3_moe, use_offline_hub

SLUG = TINY_FP8_REPO.replace("/", "--")
PLAIN_REPO = "tiny-org/Tiny-Qwen3"


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """``src/`` (the FP8 checkpoint), its dequantised tensors, and ``hf/`` (HF_HOME) with it and a bf16 model."""
    from components.models.tiny import build_model, build_tokenizer

    root = tmp_path_factory.mktemp("hub")
    dequantised = build_tiny_fp8_qwen3_moe(root / "src")
    add_to_hub_cache(root / "hf" / "hub", TINY_FP8_REPO, root / "src")
    tok = build_tokenizer()
    build_model(tok).save_pretrained(root / "plain")
    tok.save_pretrained(root / "plain")
    add_to_hub_cache(root / "hf" / "hub", PLAIN_REPO, root / "plain")
    return {"root": root, "dequantised": dequantised}


@pytest.fixture
def offline(store, monkeypatch):
    use_offline_hub(monkeypatch, store["root"] / "hf")
    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.setattr(resolve, "POLL_S", 0.05)
    return store


def _weights(folder) -> dict:
    out = {}
    for shard in Path(folder).glob("*.safetensors"):
        out.update(load_file(str(shard)))
    return out


def test_an_fp8_hub_id_resolves_to_a_complete_bf16_copy_of_the_dequantised_weights(offline, tmp_path):
    path = Path(resolve_model(TINY_FP8_REPO, str(tmp_path)))
    assert path.parent == tmp_path / "models" and path.name.startswith(f"{SLUG}-bf16-")
    config = json.loads((path / "config.json").read_text())
    assert "quantization_config" not in config and config["model_type"] == "qwen3_moe"
    weights, expected = _weights(path), offline["dequantised"]
    assert weights.keys() == expected.keys()  # no weight_scale_inv left
    assert all(weights[k].dtype == torch.bfloat16 and torch.equal(weights[k], expected[k]) for k in expected)
    index = json.loads((path / "model.safetensors.index.json").read_text())
    assert index["weight_map"].keys() == expected.keys()
    assert index["metadata"]["total_size"] == sum(t.numel() * 2 for t in expected.values())
    assert all((path / shard).exists() for shard in set(index["weight_map"].values()))
    # The same weights as loading the FP8 original with transformers' own dequantisation.
    from transformers import AutoModelForCausalLM, AutoTokenizer, FineGrainedFP8Config

    ours = AutoModelForCausalLM.from_pretrained(path, dtype=torch.bfloat16).state_dict()
    theirs = AutoModelForCausalLM.from_pretrained(
        offline["root"] / "src", dtype=torch.bfloat16, quantization_config=FineGrainedFP8Config(dequantize=True)
    ).state_dict()
    assert ours.keys() == theirs.keys() and all(torch.equal(ours[k], theirs[k]) for k in ours)
    tok = AutoTokenizer.from_pretrained(path)
    assert tok.chat_template and (path / "generation_config.json").exists()


def test_a_second_call_reuses_the_copy(offline, tmp_path, monkeypatch):
    first = resolve_model(TINY_FP8_REPO, str(tmp_path))
    inode = os.stat(first).st_ino

    def no_writes(*args, **kwargs):
        raise AssertionError("the copy was rebuilt")

    monkeypatch.setattr("safetensors.torch.save_file", no_writes)
    assert resolve_model(TINY_FP8_REPO, str(tmp_path)) == first and os.stat(first).st_ino == inode


def test_an_interrupted_build_leaves_nothing_that_looks_complete(offline, tmp_path, monkeypatch):
    from safetensors import torch as safetensors_torch

    real_save, calls = safetensors_torch.save_file, []

    def dies_on_the_second_shard(*args, **kwargs):
        calls.append(1)
        if len(calls) == 2:
            raise OSError("No space left on device")
        return real_save(*args, **kwargs)

    monkeypatch.setattr(safetensors_torch, "save_file", dies_on_the_second_shard)
    with pytest.raises(OSError, match="No space left"):
        resolve_model(TINY_FP8_REPO, str(tmp_path))
    assert list((tmp_path / "models").iterdir()) == []  # neither the target nor the temporary folder
    monkeypatch.setattr(safetensors_torch, "save_file", real_save)
    path = resolve_model(TINY_FP8_REPO, str(tmp_path))
    assert _weights(path).keys() == offline["dequantised"].keys()


# One resolution per training run (resolve_model_for_run): global rank 0 resolves and records the folder in
# the run's output folder; the other ranks read that record from the shared volume and never contact the Hub;
# a re-run of the job (same output folder) reuses the record, so it trains on the same base snapshot.
def _point_hub_at(monkeypatch, endpoint: str) -> None:
    """Online (HF_HUB_OFFLINE unset) with the Hub at ``endpoint``, as a pod whose image sets no offline mode."""
    from huggingface_hub import constants

    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setenv("HF_ENDPOINT", endpoint)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(constants, "ENDPOINT", endpoint)
    monkeypatch.setattr(constants, "HUGGINGFACE_CO_URL_TEMPLATE", endpoint + "/{repo_id}/resolve/{revision}/{filename}")


def _closed_port() -> int:
    """A local port nothing listens on: connecting to it is refused, as on a GPU node without internet access."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def _fake_hub(answer):
    """A Hub over HTTP on a local port: ``answer(path)`` gives ``(status, json_body, extra_headers)`` for every GET
    and HEAD. Yields its address and the requests it got."""
    requests = []

    class Hub(BaseHTTPRequestHandler):
        def do_GET(self):
            requests.append(f"{self.command} {self.path}")
            status, info, headers = answer(self.path)
            body = json.dumps(info).encode()
            self.send_response(status)
            for key, value in {**headers, "Content-Type": "application/json", "Content-Length": str(len(body))}.items():
                self.send_header(key, value)
            self.end_headers()
            self.wfile.write(body)

        do_HEAD = do_GET

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Hub)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_port}", requests
    finally:
        server.shutdown()


@pytest.fixture
def newer_commit_hub():
    """A Hub whose main has moved on to a commit that is not in the cache: its address and the requests it got."""
    # repo_info names the new commit; its file listing (the tree) is empty.
    with _fake_hub(
        lambda path: (200, [] if "/tree/" in path else {"id": TINY_FP8_REPO, "sha": "f" * 40, "siblings": []}, {})
    ) as hub_and_requests:
        yield hub_and_requests


def _no_resolving(*args, **kwargs):
    raise AssertionError("resolved the model instead of reading the run's record")


def test_rank_0_records_the_resolved_folder_atomically_in_the_run_folder(offline, tmp_path):
    record = tmp_path / "run" / "train" / resolve.BASE_MODEL_RECORD  # the output folder does not exist yet
    folder = resolve.resolve_model_for_run(TINY_FP8_REPO, str(tmp_path / "cache"), str(record))
    assert Path(folder).parent == tmp_path / "cache" / "models" and Path(folder).name.startswith(f"{SLUG}-bf16-")
    assert json.loads(record.read_text()) == {"model_name_or_path": TINY_FP8_REPO, "path": folder}
    assert os.listdir(record.parent) == [resolve.BASE_MODEL_RECORD]  # no temporary file left beside it


def test_a_failed_record_write_leaves_no_record_and_no_temporary_file(offline, tmp_path, monkeypatch):
    record = tmp_path / "train" / resolve.BASE_MODEL_RECORD

    def full_disk(*args, **kwargs):
        raise OSError("No space left on device")

    monkeypatch.setattr(resolve.os, "replace", full_disk)
    with pytest.raises(OSError, match="No space left"):
        resolve.resolve_model_for_run(PLAIN_REPO, str(tmp_path / "cache"), str(record))
    assert os.listdir(record.parent) == []


def test_other_ranks_take_rank_0s_recorded_folder_without_any_hub_request(offline, tmp_path, monkeypatch):
    # Rank 0 resolves from the HF cache prepare_dataset filled, builds the bf16 copy and records it.
    attempt = tmp_path / "rank0" / resolve.BASE_MODEL_RECORD
    folder = resolve.resolve_model_for_run(TINY_FP8_REPO, str(tmp_path / "cache"), str(attempt))
    # Rank 1 on a GPU node without internet access: HF_HUB_OFFLINE unset and nothing listening at HF_ENDPOINT.
    # It starts before rank 0's record exists and gets it when it appears.
    _point_hub_at(monkeypatch, f"http://127.0.0.1:{_closed_port()}")
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setattr(resolve, "resolve_model", _no_resolving)
    record = tmp_path / "train" / resolve.BASE_MODEL_RECORD
    record.parent.mkdir()
    rank0 = threading.Timer(0.5, os.replace, args=(attempt, record))  # the record lands as rank 0 renames it
    rank0.start()
    try:
        assert (
            resolve.resolve_model_for_run(TINY_FP8_REPO, str(tmp_path / "cache"), str(record), wait_timeout_s=60)
            == folder
        )
    finally:
        rank0.join()


def test_a_rerun_reuses_the_recorded_copy_even_when_the_hub_has_a_newer_commit(
    offline, tmp_path, monkeypatch, newer_commit_hub
):
    # A copy of the HF cache: following the Hub below moves its refs/main.
    shutil.copytree(offline["root"] / "hf", tmp_path / "hf", symlinks=True)
    use_offline_hub(monkeypatch, tmp_path / "hf")
    record, cache = tmp_path / "train" / resolve.BASE_MODEL_RECORD, str(tmp_path / "cache")
    first = resolve.resolve_model_for_run(TINY_FP8_REPO, cache, str(record))  # the first attempt
    assert Path(first).name.startswith(f"{SLUG}-bf16-")
    # Evicted and re-run; meanwhile the Hub repo got a new commit. Nobody asks the Hub, downloads or builds.
    endpoint, requests = newer_commit_hub
    _point_hub_at(monkeypatch, endpoint)

    def no_writes(*args, **kwargs):
        raise AssertionError("a new bf16 copy was built")

    monkeypatch.setattr("safetensors.torch.save_file", no_writes)
    for rank in ("0", "1"):
        monkeypatch.setenv("RANK", rank)
        assert resolve.resolve_model_for_run(TINY_FP8_REPO, cache, str(record), wait_timeout_s=5) == first
    assert requests == []
    # What the record prevents: resolving afresh follows the Hub to its newer commit.
    monkeypatch.setenv("RANK", "0")
    assert Path(resolve_model(TINY_FP8_REPO, cache)).name == "f" * 40 and requests


def test_a_stale_record_is_replaced_by_rank_0_and_never_taken_by_other_ranks(offline, tmp_path, monkeypatch):
    record, cache = tmp_path / "train" / resolve.BASE_MODEL_RECORD, str(tmp_path / "cache")
    record.parent.mkdir()
    plain = resolve_model(PLAIN_REPO, cache)
    stale = {
        "its folder is gone": {"model_name_or_path": TINY_FP8_REPO, "path": str(tmp_path / "cache" / "gone")},
        "another model": {"model_name_or_path": PLAIN_REPO, "path": plain},
        "unreadable": None,
    }
    for why, content in stale.items():
        record.write_text("{not json" if content is None else json.dumps(content))
        monkeypatch.setenv("RANK", "1")
        with pytest.raises(TimeoutError, match="rank 1 waited"):
            resolve.resolve_model_for_run(TINY_FP8_REPO, cache, str(record), wait_timeout_s=0.3)
        monkeypatch.setenv("RANK", "0")
        folder = resolve.resolve_model_for_run(TINY_FP8_REPO, cache, str(record))
        assert Path(folder).name.startswith(f"{SLUG}-bf16-"), why
        assert json.loads(record.read_text()) == {"model_name_or_path": TINY_FP8_REPO, "path": folder}, why


def test_a_missing_record_times_out_with_a_clear_message_and_rank_1_builds_nothing(offline, tmp_path, monkeypatch):
    name = Path(resolve_model(TINY_FP8_REPO, str(tmp_path / "elsewhere"))).name  # the same on every volume
    partial = tmp_path / "cache" / "models" / f".{name}-interrupted"  # what a killed rank 0 leaves behind
    partial.mkdir(parents=True)
    (partial / "config.json").write_text("{}")
    record = tmp_path / "train" / resolve.BASE_MODEL_RECORD
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setattr(resolve, "resolve_model", _no_resolving)
    with pytest.raises(
        TimeoutError,
        match=rf"rank 1 waited \d+ s for {re.escape(str(record))}, the base model "
        rf"{re.escape(TINY_FP8_REPO)} global rank 0 resolves.*rank 0's log.*same "
        r"volumes at the same paths",
    ):
        resolve.resolve_model_for_run(TINY_FP8_REPO, str(tmp_path / "cache"), str(record), wait_timeout_s=0.5)
    assert os.listdir(tmp_path / "cache" / "models") == [partial.name] and not record.exists()


def test_an_fp8_folder_resolves_to_its_bf16_copy_and_a_bf16_hub_id_to_its_snapshot(offline, tmp_path):
    path = Path(resolve_model(str(offline["root"] / "src"), str(tmp_path)))
    assert path.parent == tmp_path / "models" and path.name.startswith("src-bf16-")
    assert _weights(path).keys() == offline["dequantised"].keys()
    plain = Path(resolve_model(PLAIN_REPO, str(tmp_path)))
    assert plain.parent.parent.name == "models--tiny-org--Tiny-Qwen3" and plain.parent.name == "snapshots"
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= {p.name for p in plain.iterdir()}
    assert resolve_model(str(offline["root"] / "plain"), str(tmp_path)) == str(offline["root"] / "plain")


def test_an_uncached_hub_id_offline_is_one_clear_error(offline, tmp_path):
    for call in (
        lambda: resolve_model("tiny-org/Not-Cached", str(tmp_path)),
        lambda: load_model_config("tiny-org/Not-Cached"),
    ):
        with pytest.raises(
            ValueError,
            match=r"model_name_or_path 'tiny-org/Not-Cached' is not .*in the Hugging "
            r"Face cache .*HF_HUB_OFFLINE=1.*download it into that cache",
        ):
            call()


def test_a_hub_id_the_hub_does_not_have_is_one_clear_error(offline, tmp_path, monkeypatch):
    # The Hub's answer for a repository that does not exist (or that the token cannot see).
    with _fake_hub(lambda path: (404, {"error": "Repository not found"}, {"X-Error-Code": "RepoNotFound"})) as (url, _):
        _point_hub_at(monkeypatch, url)
        for call in (
            lambda: resolve_model("tiny-org/No-Such-Model", str(tmp_path)),
            lambda: load_model_config("tiny-org/No-Such-Model"),
        ):
            with pytest.raises(
                ValueError,
                match="model_name_or_path 'tiny-org/No-Such-Model' was not found on the Hugging Face Hub.*check the id",
            ):
                call()


def test_references_that_are_neither_folders_nor_hub_ids_are_clear_errors(offline, tmp_path):
    with pytest.raises(ValueError, match="model_name_or_path '/mnt/models/gone': no such folder; mount"):
        resolve_model("/mnt/models/gone", str(tmp_path))
    with pytest.raises(ValueError, match="neither a folder nor a Hugging Face Hub id"):
        resolve_model("not a//hub id", str(tmp_path))
    with pytest.raises(ValueError, match="not a built-in model"):
        resolve_model("builtin:huge", str(tmp_path))


def test_load_model_config_reads_only_the_config(offline, tmp_path, monkeypatch):
    config = load_model_config(TINY_FP8_REPO)
    assert config["model_type"] == "qwen3_moe" and config["quantization_config"]["quant_method"] == "fp8"
    assert load_model_config(str(offline["root"] / "src")) == config
    assert load_model_config("builtin:tiny-qwen3")["num_hidden_layers"] == 4
    # A cache holding config.json alone (what validate_inputs fetches before any weights) is enough.
    (tmp_path / "only").mkdir()
    (tmp_path / "only" / "config.json").write_text(json.dumps(config))
    add_to_hub_cache(tmp_path / "hf" / "hub", "tiny-org/Config-Only", tmp_path / "only")
    use_offline_hub(monkeypatch, tmp_path / "hf")
    assert load_model_config("tiny-org/Config-Only") == config


def test_block_dequantisation_handles_ragged_edges_and_rejects_a_wrong_scale_grid():
    torch.manual_seed(0)
    w = (torch.randn(300, 200) * 100).to(torch.float8_e4m3fn)
    s = torch.rand(3, 2) + 0.5  # ceil(300/128) x ceil(200/128) blocks; the last row and column are partial
    expected = torch.empty(300, 200)
    for i in range(300):
        for j in range(200):
            expected[i, j] = w[i, j].float() * s[i // 128, j // 128]
    assert torch.equal(fp8.dequantize_fp8_weight(w, s, [128, 128]), expected.to(torch.bfloat16))
    with pytest.raises(ValueError, match=r"does not match a weight of shape \(300, 200\)"):
        fp8.dequantize_fp8_weight(w, torch.ones(2, 2), [128, 128])


def test_cached_model_folders_are_readable_by_other_users(tmp_path):
    # The data step builds the copy; the trainer's and the evaluation's pods may run as other users.
    from components.models.tiny import materialize

    folder = Path(materialize(str(tmp_path)))
    assert folder.stat().st_mode & 0o755 == 0o755
