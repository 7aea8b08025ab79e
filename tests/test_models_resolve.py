"""Issue 9, defects 1 and 3: every model reference resolves to a local folder; FP8 checkpoints to a bf16 copy.

The Hub is an offline HF cache (tests/hf_cache.py) holding a tiny FP8 Qwen3-MoE laid out as Qwen's
Qwen3-30B-A3B-...-FP8, named by Hub id with HF_HOME and HF_HUB_OFFLINE=1, as the cluster's pods see it.
"""

import json
import os
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from components.models import fp8, hub
from components.models.hub import load_model_config, resolve_model
from tests.hf_cache import TINY_FP8_REPO, add_to_hub_cache, build_tiny_fp8_qwen3_moe, use_offline_hub

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
    monkeypatch.setattr(hub, "POLL_S", 0.05)
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


def test_a_waiting_rank_gets_rank_0s_folder_once_complete(offline, tmp_path, monkeypatch):
    name = Path(resolve_model(TINY_FP8_REPO, str(tmp_path / "elsewhere"))).name  # the same on every volume
    target = tmp_path / "models" / name
    snapshot = next((offline["root"] / "hf" / "hub" / f"models--{SLUG}" / "snapshots").iterdir())
    monkeypatch.setenv("RANK", "1")
    rank0 = threading.Timer(0.5, fp8.build_bf16_copy, args=(str(snapshot), str(target)))
    rank0.start()
    try:
        assert resolve_model(TINY_FP8_REPO, str(tmp_path), wait_timeout_s=60) == str(target)
    finally:
        rank0.join()
    assert _weights(target).keys() == offline["dequantised"].keys()


def test_a_waiting_rank_never_takes_a_partial_folder_and_times_out_clearly(offline, tmp_path, monkeypatch):
    name = Path(resolve_model(TINY_FP8_REPO, str(tmp_path / "elsewhere"))).name
    partial = tmp_path / "models" / f".{name}-interrupted"  # what a killed rank 0 leaves behind
    partial.mkdir(parents=True)
    (partial / "config.json").write_text("{}")
    monkeypatch.setenv("RANK", "1")
    with pytest.raises(TimeoutError, match=rf"rank 1 waited .* bf16 copy .*{name}.* global rank 0"):
        resolve_model(TINY_FP8_REPO, str(tmp_path), wait_timeout_s=0.5)
    assert not (tmp_path / "models" / name).exists()  # rank 1 builds nothing


def test_an_fp8_folder_resolves_to_its_bf16_copy_and_a_bf16_hub_id_to_its_snapshot(offline, tmp_path):
    path = Path(resolve_model(str(offline["root"] / "src"), str(tmp_path)))
    assert path.parent == tmp_path / "models" and path.name.startswith("src-bf16-")
    assert _weights(path).keys() == offline["dequantised"].keys()
    plain = Path(resolve_model(PLAIN_REPO, str(tmp_path)))
    assert plain.parent.parent.name == "models--tiny-org--Tiny-Qwen3" and plain.parent.name == "snapshots"
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= {p.name for p in plain.iterdir()}
    assert resolve_model(str(offline["root"] / "plain"), str(tmp_path)) == str(offline["root"] / "plain")


def test_an_uncached_hub_id_offline_is_one_clear_error(offline, tmp_path):
    for call in (lambda: resolve_model("tiny-org/Not-Cached", str(tmp_path)),
                 lambda: load_model_config("tiny-org/Not-Cached")):
        with pytest.raises(ValueError, match=r"model_name_or_path 'tiny-org/Not-Cached' is not .*in the Hugging "
                                             r"Face cache .*HF_HUB_OFFLINE=1.*download it into that cache"):
            call()


class _NoSuchRepo(BaseHTTPRequestHandler):
    """The Hub's answer for a repository that does not exist (or that the token cannot see)."""

    def do_GET(self):
        body = b'{"error": "Repository not found"}'
        self.send_response(404)
        self.send_header("X-Error-Code", "RepoNotFound")
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_HEAD = do_GET

    def log_message(self, *args):
        pass


def test_a_hub_id_the_hub_does_not_have_is_one_clear_error(offline, tmp_path, monkeypatch):
    from huggingface_hub import constants

    server = ThreadingHTTPServer(("127.0.0.1", 0), _NoSuchRepo)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(constants, "ENDPOINT", f"http://127.0.0.1:{server.server_port}")
    monkeypatch.setattr(constants, "HUGGINGFACE_CO_URL_TEMPLATE",
                        constants.ENDPOINT + "/{repo_id}/resolve/{revision}/{filename}")
    try:
        for call in (lambda: resolve_model("tiny-org/No-Such-Model", str(tmp_path)),
                     lambda: load_model_config("tiny-org/No-Such-Model")):
            with pytest.raises(ValueError, match="model_name_or_path 'tiny-org/No-Such-Model' was not found on the "
                                                 "Hugging Face Hub.*check the id"):
                call()
    finally:
        server.shutdown()


class _NewerCommit(BaseHTTPRequestHandler):
    """The Hub's repo_info for a repository whose main has moved on to a commit not in the cache yet."""

    def do_GET(self):
        body = json.dumps({"id": TINY_FP8_REPO, "sha": "f" * 40, "siblings": []}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


def test_online_a_waiting_rank_waits_for_the_commit_rank_0_downloads_not_an_older_cached_one(
        offline, tmp_path, monkeypatch):
    from huggingface_hub import constants

    server = ThreadingHTTPServer(("127.0.0.1", 0), _NewerCommit)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(constants, "ENDPOINT", f"http://127.0.0.1:{server.server_port}")
    monkeypatch.setenv("RANK", "1")
    try:
        with pytest.raises(TimeoutError, match=f"rank 1 waited .* the download of {TINY_FP8_REPO}@{'f' * 40}"):
            resolve_model(TINY_FP8_REPO, str(tmp_path), wait_timeout_s=0.5)
    finally:
        server.shutdown()


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
