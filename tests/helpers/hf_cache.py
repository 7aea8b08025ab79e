"""An offline Hugging Face cache holding a tiny block-FP8 Qwen3-MoE checkpoint, for the model-resolution tests.

The checkpoint is laid out as Qwen publishes its FP8 models (Qwen3-30B-A3B-...-FP8): per-expert
``mlp.experts.N.{gate,up,down}_proj.weight`` as float8_e4m3fn, each with a bf16 ``weight_scale_inv`` holding
one scale per 128x128 block, everything else (embeddings, norms, the router ``mlp.gate``, ``lm_head``) in
bf16, sharded with an index, and ``quantization_config`` in config.json. The cache is the real hub layout
(``models--org--name/{blobs,snapshots/<sha>,refs/main}``, snapshot files symlinked to content-named blobs),
so ``snapshot_download`` and ``hf_hub_download`` find it with HF_HUB_OFFLINE=1.
"""

import hashlib
import json
import os
from pathlib import Path

TINY_FP8_REPO = "tiny-org/Tiny-Qwen3-MoE-FP8"
BLOCK = [128, 128]
FP8_MAX = 448.0  # largest finite float8_e4m3fn
NUM_LAYERS = 2


def _quantize(w):
    """The FP8 checkpoints' recipe: per 128x128 block, scale = amax / 448 (stored as bf16), fp8 = w / scale."""
    import torch

    rows, cols = w.shape
    br, bc = BLOCK
    grid = (-(-rows // br), -(-cols // bc))
    padded = torch.zeros(grid[0] * br, grid[1] * bc)
    padded[:rows, :cols] = w.float()
    blocks = padded.view(grid[0], br, grid[1], bc)
    scale = (blocks.abs().amax(dim=(1, 3)) / FP8_MAX).clamp(min=1e-12).to(torch.bfloat16)
    q = (blocks / scale.float()[:, None, :, None]).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
    q = q.view(grid[0] * br, grid[1] * bc)[:rows, :cols].contiguous()
    return q, scale


def build_tiny_fp8_qwen3_moe(folder: Path) -> dict:
    """Write the tiny FP8 Qwen3-MoE checkpoint into ``folder``; return its bf16 dequantised tensors by name.

    Hidden size 256 and expert width 128 put several 128x128 blocks in each matrix (q_proj: 2x2).
    """
    import torch
    from safetensors.torch import load_file, save_file
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

    from components.models.tiny import build_tokenizer

    tok = build_tokenizer()
    config = Qwen3MoeConfig(
        vocab_size=len(tok),
        hidden_size=256,
        num_hidden_layers=NUM_LAYERS,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=64,
        intermediate_size=384,
        num_experts=4,
        num_experts_per_tok=2,
        moe_intermediate_size=128,
        max_position_embeddings=2048,
        pad_token_id=tok.pad_token_id,
        eos_token_id=tok.eos_token_id,
        bos_token_id=None,
        dtype="bfloat16",
    )
    torch.manual_seed(0)
    plain = folder.parent / f".{folder.name}-bf16-original"
    # save_pretrained writes the on-disk layout transformers 5 uses for Qwen3-MoE: one tensor per expert.
    Qwen3MoeForCausalLM(config).to(torch.bfloat16).save_pretrained(plain)
    original = load_file(str(plain / "model.safetensors"))
    assert "model.layers.0.mlp.experts.0.gate_proj.weight" in original, "expected per-expert tensors on disk"

    tensors, dequantised = {}, {}
    for name, w in original.items():
        quantized = name.endswith("_proj.weight") and w.ndim == 2  # attention and expert projections
        if quantized:
            q, scale = _quantize(w)
            tensors[name], tensors[name[: -len("weight")] + "weight_scale_inv"] = q, scale
            rows, cols = w.shape
            full = scale.float().repeat_interleave(BLOCK[0], 0)[:rows].repeat_interleave(BLOCK[1], 1)[:, :cols]
            dequantised[name] = (q.float() * full).to(torch.bfloat16)
        else:
            tensors[name] = w
            dequantised[name] = w
    # Two shards split by layer, as published checkpoints are, with one scale in the other shard than its
    # weight: the index, not the shard, says where a tensor is.
    moved = "model.layers.0.self_attn.q_proj.weight_scale_inv"
    weight_map = {}
    for name in tensors:
        late = name.startswith(("model.norm", "lm_head", f"model.layers.{NUM_LAYERS - 1}.")) or name == moved
        weight_map[name] = f"model-0000{2 if late else 1}-of-00002.safetensors"
    folder.mkdir(parents=True, exist_ok=True)
    for shard in sorted(set(weight_map.values())):
        save_file(
            {n: tensors[n] for n, s in weight_map.items() if s == shard}, str(folder / shard), metadata={"format": "pt"}
        )
    total = sum(t.numel() * t.element_size() for t in tensors.values())
    (folder / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}, indent=2)
    )
    cfg = json.loads((plain / "config.json").read_text())
    cfg["quantization_config"] = {
        "activation_scheme": "dynamic",
        "fmt": "e4m3",
        "quant_method": "fp8",
        "weight_block_size": BLOCK,
        "modules_to_not_convert": ["lm_head", *(f"model.layers.{i}.mlp.gate" for i in range(NUM_LAYERS))],
    }
    (folder / "config.json").write_text(json.dumps(cfg, indent=2))
    (folder / "generation_config.json").write_text((plain / "generation_config.json").read_text())
    tok.save_pretrained(folder)
    for p in plain.iterdir():
        p.unlink()
    plain.rmdir()
    return dequantised


def add_to_hub_cache(hub_cache: Path, repo_id: str, folder: Path) -> Path:
    """Store ``folder``'s files as a download of ``repo_id`` at ``main`` into ``hub_cache``; return the snapshot.

    As huggingface_hub does: each file's bytes in ``blobs/<sha256>``, the snapshot a folder of relative
    symlinks to them, named by the commit sha that ``refs/main`` records.
    """
    repo = hub_cache / ("models--" + repo_id.replace("/", "--"))
    files = sorted(p for p in folder.iterdir() if p.is_file())
    digests = {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in files}
    commit = hashlib.sha1(json.dumps(digests, sort_keys=True).encode()).hexdigest()
    snapshot = repo / "snapshots" / commit
    (repo / "blobs").mkdir(parents=True, exist_ok=True)
    snapshot.mkdir(parents=True, exist_ok=True)
    for p in files:
        blob = repo / "blobs" / digests[p.name]
        if not blob.exists():
            blob.write_bytes(p.read_bytes())
        os.symlink(os.path.relpath(blob, snapshot), snapshot / p.name)
    (repo / "refs").mkdir(exist_ok=True)
    (repo / "refs" / "main").write_text(commit)
    return snapshot


def offline_hub_env(hf_home: Path) -> dict:
    """The environment of a pod with its HF cache on a volume and no Hub access."""
    return {"HF_HOME": str(hf_home), "HF_HUB_OFFLINE": "1"}


def use_offline_hub(monkeypatch, hf_home: Path) -> None:
    """Point this process's huggingface_hub at ``hf_home`` offline, as the env would at start-up.

    huggingface_hub reads HF_HOME and HF_HUB_OFFLINE when first imported; the test process imported it
    long before, so its constants are set too (child processes read the environment).
    """
    from huggingface_hub import constants

    for key, value in offline_hub_env(hf_home).items():
        monkeypatch.setenv(key, value)
    monkeypatch.setattr(constants, "HF_HOME", str(hf_home))
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(hf_home / "hub"))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
