"""A bf16 copy of a block-FP8 checkpoint, dequantised once, shard by shard, onto the cache volume.

Why a copy: ``from_pretrained(..., quantization_config=FineGrainedFP8Config(dequantize=True))`` marks the
model as quantized, and transformers then builds it without ``deepspeed.zero.Init``: every rank materialises
the whole model (Qwen3-30B-A3B: ~61 GB in bf16, times 8 ranks per pod) and the pods are OOMKilled. A plain
bf16 checkpoint is partitioned as it loads. Training, evaluation and serving all read the same copy.

The format is the one Qwen (and DeepSeek) publish: ``X.weight`` stored as ``float8_e4m3fn`` next to
``X.weight_scale_inv`` with one scale per ``weight_block_size`` block (128 x 128), so that
``bf16 = fp8 * scale`` of the block; ``config.json`` carries ``quantization_config: {quant_method: fp8,
weight_block_size, activation_scheme: dynamic, ...}``. Tensors without a scale (embeddings, norms, the MoE
router ``mlp.gate``, ``lm_head``) are copied unchanged. The arithmetic is transformers' own
(``Fp8Dequantize``: fp32 product, then the cast), so the copy holds exactly the weights that loading with
``dequantize=True`` gives.
"""

from __future__ import annotations

import fnmatch
import hashlib
import json
import logging
import math
import os
import shutil
import tempfile
import time
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors import torch as safetensors_torch  # its save_file looked up at call time: tests replace it

log = logging.getLogger(__name__)

# Bump when the copy's recipe changes so copies made by older code are not reused.
RECIPE_VERSION = "1"
WEIGHTS_INDEX = "model.safetensors.index.json"
SINGLE_WEIGHTS = "model.safetensors"
SCALE_SUFFIX = "weight_scale_inv"
# Everything besides the weights that training, evaluation and serving read from a model folder.
TOKENIZER_AND_GENERATION_FILES = [
    "tokenizer*",
    "vocab.*",
    "merges.txt",
    "special_tokens_map.json",
    "added_tokens.json",
    "chat_template.jinja",
    "chat_template.json",
    "generation_config.json",
]


def is_fp8_checkpoint(config: dict) -> bool:
    """Whether a ``config.json`` dict describes a fine-grained FP8 checkpoint (``quant_method: fp8``)."""
    return (config.get("quantization_config") or {}).get("quant_method") == "fp8"


def bf16_copy_path(cache_root: str, slug: str, source_identity: str) -> str:
    """``<cache_root>/models/<slug>-bf16-<fingerprint>``: where the bf16 copy of a source lives.

    ``source_identity`` pins the source's contents (a Hub repo id and commit sha, or a folder's file names
    and sizes); a different source, or a new recipe, gets a new folder instead of a stale copy.
    """
    fingerprint = hashlib.sha256(f"{RECIPE_VERSION}\n{source_identity}".encode()).hexdigest()[:12]
    return str(Path(cache_root) / "models" / f"{slug}-bf16-{fingerprint}")


def folder_identity(folder: str) -> str:
    """A cheap identity of a checkpoint folder: its config and the names and sizes of its model files.

    Reading 30 GB to hash them would take minutes on a network volume; a re-exported checkpoint changes
    its config or some shard's size.
    """
    root = Path(folder)
    files = sorted(p for p in root.iterdir() if p.is_file() and _is_model_file(p.name))
    listing = "\n".join(f"{p.name}\t{p.stat().st_size}" for p in files)
    return f"{listing}\n{(root / 'config.json').read_text(encoding='utf-8')}"


def _is_model_file(name: str) -> bool:
    return (
        name == "config.json"
        or name.endswith((".safetensors", ".safetensors.index.json"))
        or any(fnmatch.fnmatch(name, p) for p in TOKENIZER_AND_GENERATION_FILES)
    )


def dequantize_fp8_weight(weight, scale_inv, block_size):
    """``weight`` (float8_e4m3fn, ``(..., rows, cols)``) times the scale of its block, as bf16.

    ``scale_inv`` holds one scale per ``block_size = [block_rows, block_cols]`` block, shaped
    ``(ceil(rows / block_rows), ceil(cols / block_cols))`` (the last block of a ragged edge is partial), or a
    single scale for the whole tensor. Scales may be fp32 or bf16; the product is taken in fp32.
    """
    if weight.dtype != torch.float8_e4m3fn:
        raise ValueError(f"expected a float8_e4m3fn weight next to its {SCALE_SUFFIX}, got {weight.dtype}")
    w = weight.to(torch.float32)
    s = scale_inv.to(torch.float32)
    if s.numel() == 1:
        return (w * s.reshape(())).to(torch.bfloat16)
    if not block_size:
        raise ValueError(f"{SCALE_SUFFIX} of shape {tuple(s.shape)} needs quantization_config.weight_block_size")
    rows, cols = w.shape[-2:]
    block_rows, block_cols = block_size
    grid = (math.ceil(rows / block_rows), math.ceil(cols / block_cols))
    if tuple(s.shape[-2:]) != grid or s.shape[:-2] != w.shape[:-2]:
        raise ValueError(
            f"{SCALE_SUFFIX} of shape {tuple(s.shape)} does not match a weight of shape {tuple(w.shape)} in "
            f"{block_rows}x{block_cols} blocks (expected {(*w.shape[:-2], *grid)})"
        )
    s = s.repeat_interleave(block_rows, dim=-2)[..., :rows, :].repeat_interleave(block_cols, dim=-1)[..., :cols]
    return (w * s).to(torch.bfloat16)


def _check_supported(config: dict, source: Path) -> list[int] | None:
    quant = config["quantization_config"]
    problems = []
    if quant.get("activation_scheme", "dynamic") != "dynamic":
        problems.append(f"activation_scheme {quant['activation_scheme']!r} (only 'dynamic': no activation scales)")
    if quant.get("fmt", "e4m3") != "e4m3":
        problems.append(f"fmt {quant['fmt']!r} (only 'e4m3' is dequantised)")
    if quant.get("scale_fmt", "float") != "float":
        problems.append(f"scale_fmt {quant['scale_fmt']!r} (only 'float' scales are dequantised)")
    if problems:
        raise ValueError(
            f"quantization_config of {source / 'config.json'}: unsupported {'; '.join(problems)}; use the bf16 "
            "release of the model as model_name_or_path instead"
        )
    return quant.get("weight_block_size")


def _weight_map(source: Path) -> dict[str, str]:
    index = source / WEIGHTS_INDEX
    if index.exists():
        return json.loads(index.read_text(encoding="utf-8"))["weight_map"]
    if (source / SINGLE_WEIGHTS).exists():
        with safe_open(str(source / SINGLE_WEIGHTS), framework="pt") as f:
            return {name: SINGLE_WEIGHTS for name in f.keys()}
    raise ValueError(f"{source} holds no {WEIGHTS_INDEX} or {SINGLE_WEIGHTS}; an FP8 checkpoint needs safetensors")


def _check_free_space(source: Path, shards: list[str], parent: Path) -> None:
    # The copy is at most twice the FP8 shards (1-byte weights become 2-byte ones); fail before writing
    # tens of GB into a volume that cannot hold them.
    need = 2 * sum((source / s).stat().st_size for s in shards)
    free = shutil.disk_usage(parent).free
    if free < need:
        raise ValueError(
            f"the bf16 copy of {source} needs about {need / 2**30:.1f} GiB but {parent} has {free / 2**30:.1f} GiB "
            "free; grow the data volume or free space in its cache/models folder"
        )


def build_bf16_copy(source: str, target: str) -> str:
    """Write the bf16 copy of the FP8 checkpoint folder ``source`` to ``target`` (if absent); return ``target``.

    One output shard per source shard (same file names), so host memory holds one bf16 shard at a time;
    scales are read wherever the index puts them. The copy gets ``config.json`` without
    ``quantization_config``, a rewritten index, and the tokenizer, chat template and generation files.
    It is written into a temporary folder beside ``target`` and renamed when complete, so ``target`` is only
    ever seen complete; of concurrent builders the first rename wins and the others discard their work.
    """
    source_dir, target_dir = Path(source), Path(target)
    if (target_dir / "config.json").exists():
        log.info("reusing the bf16 copy %s", target_dir)
        return str(target_dir)
    config = json.loads((source_dir / "config.json").read_text(encoding="utf-8"))
    block_size = _check_supported(config, source_dir)
    weight_map = _weight_map(source_dir)
    shards = sorted(set(weight_map.values()))
    target_dir.parent.mkdir(parents=True, exist_ok=True)
    _check_free_space(source_dir, shards, target_dir.parent)
    leftovers = [p.name for p in target_dir.parent.glob(f".{target_dir.name}-*")]
    if leftovers:
        log.warning(
            "partial copies from interrupted builds in %s: %s (safe to delete when no build is running)",
            target_dir.parent,
            ", ".join(leftovers),
        )

    tmp = Path(tempfile.mkdtemp(prefix=f".{target_dir.name}-", dir=target_dir.parent))
    # mkdtemp makes it 0700: the steps and the trainer pods may run as different users on the volume.
    tmp.chmod(0o755)
    readers = {}

    def tensor(name):
        shard = weight_map[name]
        if shard not in readers:
            readers[shard] = safe_open(str(source_dir / shard), framework="pt")
        return readers[shard].get_tensor(name)

    try:
        log.info("dequantising %s (%d shards) to bf16 in %s", source_dir, len(shards), target_dir)
        started, done_bytes, total_bytes = time.time(), 0, sum((source_dir / s).stat().st_size for s in shards)
        new_map, total_size = {}, 0
        for i, shard in enumerate(shards, 1):
            out = {}
            for name in sorted(n for n, s in weight_map.items() if s == shard):
                if name.endswith(SCALE_SUFFIX):
                    if name[: -len(SCALE_SUFFIX)] + "weight" not in weight_map:
                        raise ValueError(f"{source_dir}: {name} has no weight to scale")
                    continue
                value = tensor(name)
                scale_name = name[: -len("weight")] + SCALE_SUFFIX if name.endswith("weight") else None
                if scale_name in weight_map:
                    value = dequantize_fp8_weight(value, tensor(scale_name), block_size)
                elif value.dtype == torch.float8_e4m3fn:
                    raise ValueError(f"{source_dir}: {name} is float8_e4m3fn but has no {SCALE_SUFFIX}")
                out[name] = value
                new_map[name] = shard
                total_size += value.numel() * value.element_size()
            safetensors_torch.save_file(out, str(tmp / shard), metadata={"format": "pt"})
            del out
            done_bytes += (source_dir / shard).stat().st_size
            elapsed = time.time() - started
            rate = done_bytes / max(elapsed, 1e-9)
            log.info(
                "bf16 copy: shard %d/%d | %.0f MB/s read | ETA %.0f s",
                i,
                len(shards),
                rate / 1e6,
                (total_bytes - done_bytes) / max(rate, 1e-9),
            )
        if (source_dir / WEIGHTS_INDEX).exists():
            index = {"metadata": {"total_size": total_size}, "weight_map": dict(sorted(new_map.items()))}
            (tmp / WEIGHTS_INDEX).write_text(json.dumps(index, indent=2), encoding="utf-8")
        del config["quantization_config"]
        (tmp / "config.json").write_text(json.dumps(config, indent=2), encoding="utf-8")
        for p in sorted(source_dir.iterdir()):
            if p.is_file() and any(fnmatch.fnmatch(p.name, pat) for pat in TOKENIZER_AND_GENERATION_FILES):
                shutil.copyfile(p, tmp / p.name)  # follows the Hub cache's symlinks to their blobs
        readers.clear()
        try:
            os.rename(tmp, target_dir)
        except OSError:
            if not (target_dir / "config.json").exists():
                raise
            # Another builder finished first; its copy is of the same source by the same recipe.
            shutil.rmtree(tmp, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    log.info("bf16 copy ready: %s (%.1f GiB, %.0f s)", target_dir, total_size / 2**30, time.time() - started)
    return str(target_dir)
