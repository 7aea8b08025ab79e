"""The final export to ``<output_dir>/final``: what evaluation loads and vLLM serves. It is written to
``final.partial/`` and renamed to ``final/`` once complete, so a failed export never leaves a ``final/`` that looks
like a model.

- full: Hugging Face safetensors shards + index, tokenizer, generation config, ``model.json``. Under ZeRO-3
  the weights are gathered one layer at a time and written shard by shard (``export_gathered``); under
  DDP/ZeRO-2 every rank holds them whole and ``Trainer.save_model`` writes them.
- lora: the adapter in ``<output_dir>/adapter``; with ``merge_lora`` the merged model in ``final/``: under
  ZeRO-3 merged in place, one adapted module at a time, into the partitioned base (``merge_lora_zero3``)
  and exported like a full run; otherwise the base is reloaded on rank 0 and merged (``merge_adapter``).
  Without ``merge_lora``, ``final/`` holds the adapter (serve with vLLM ``--enable-lora`` against the base).
- qlora: as lora, but always through ``merge_adapter``: the base is reloaded in its own 16/32-bit dtype,
  never merged into the 4-bit copy (NF4 would round the update away).

Checkpoints are not exports: under DeepSpeed they hold DeepSpeed's sharded state only (checkpoints.py).

Memory at save time (per pod: 8 ranks, ``/dev/shm`` a memory-backed emptyDir of up to 64Gi, limit 128Gi;
Qwen3-30B-A3B, 30.5B parameters, ZeRO-3 over 2 x 8 H100, bf16 weights + fp32 master weights and Adam):

- Steady state: each rank's host memory is the Python/CUDA/DeepSpeed runtime and its data loader, about
  4-6 GB: ~40-48 GB for 8 ranks. ``/dev/shm`` is charged only for what is written there (NCCL's shared
  memory transport and data-loader batches: a few GB at most), not its 64Gi size limit.
- A checkpoint: every rank writes only its own partition (fp32 master weights + Adam's two moments:
  12 bytes x 30.5B / 16 ranks = ~23 GB per rank, ~183 GB per pod, ~366 GB per checkpoint). ``torch.save``
  stages one GPU storage at a time in host memory; the largest is one flat fp32 partition (~7.6 GB), so
  a save adds up to ~61 GB per pod while all 8 ranks write at once: ~110 GB with the runtime, under the
  limit. Written pages also sit in the page cache, charged to the pod but reclaimable.
  Gathering consolidated 16-bit weights into every checkpoint (``stage3_gather_16bit_weights_on_model_save``)
  would add the whole model, ~61 GB, on rank 0 alone: ~170 GB, past the limit. The shipped ZeRO-3
  settings turn it off and the trainer never asks for it.
- The final export: the GPUs gather one decoder layer at a time (~1.3 GB in bf16 for Qwen3-30B-A3B, 128
  experts), rank 0 copies it to host memory and writes a shard whenever ``max_shard_bytes`` (5 GiB) would
  be passed: at most one shard + one layer, ~6.5 GB on rank 0, on top of the steady state.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import shutil
import time
from pathlib import Path

import torch
import torch.distributed as dist
from safetensors.torch import save_file
from transformers import AutoModelForCausalLM
from transformers.core_model_loading import revert_weight_conversion
from transformers.integrations import deepspeed as hf_deepspeed
from transformers.modeling_utils import remove_tied_weights_from_state_dict

from components.train.trainer.tracking import record_final_model

# DeepSpeed and PEFT are imported inside the functions that need them: DeepSpeed only for a ZeRO-3 export, PEFT only
# for a LoRA/QLoRA run; the laptop install has neither, and a full fine-tuning run never needs them.

log = logging.getLogger("sft.export")

MAX_SHARD_BYTES = 5 * 2**30  # the shard size of Hub checkpoints such as Qwen3-30B-A3B's; bounds rank 0's host memory
# What is gathered at once: one decoder layer, everything under the first numbered module
# (``model.layers.7.``); other tensors (embeddings, final norm, head) are a group each. A layer also holds
# every tensor a checkpoint-format conversion combines (Qwen3-MoE: one block's experts), so each group is
# converted on its own, exactly as save_pretrained converts the whole state dict.
_LAYER = re.compile(r"^(.*?\.\d+)\.")


def _is_main_process() -> bool:
    return not (dist.is_available() and dist.is_initialized()) or dist.get_rank() == 0


def _saved_names(model) -> list[str]:
    """The state-dict names ``save_pretrained`` writes, before its renaming: tied aliases and ignored keys dropped.

    transformers' own rule picks which of two tied names stays; it compares storages, which partitioned
    ZeRO-3 parameters do not have, so it is handed one small stand-in tensor per distinct parameter.
    """
    stand_ins: dict[str, torch.Tensor] = {}
    by_tensor: dict[int, torch.Tensor] = {}
    for name, tensor in model.state_dict(keep_vars=True).items():
        stand_ins[name] = by_tensor.setdefault(id(tensor), torch.empty(1))
    for pattern in model._keys_to_ignore_on_save or ():
        stand_ins.pop(pattern, None)
    return list(remove_tied_weights_from_state_dict(stand_ins, model))


def gather_zero3(tensors: dict, names: list[str], main: bool, dtype: torch.dtype | None) -> dict[str, torch.Tensor]:
    """Rank 0's CPU copies of ``tensors[names]`` (one layer of a ZeRO-3 partitioned model), in the dtype the engine
    holds them in (``dtype`` is for the FSDP2 path only); ``{}`` on the other ranks. Collective: every rank calls it,
    and ``deepspeed.zero.GatheredParameters`` gathers the partitions (a no-op for a model that is not partitioned)."""
    import deepspeed

    params = [tensors[n] for n in names if isinstance(tensors[n], torch.nn.Parameter)]
    with deepspeed.zero.GatheredParameters(params, modifier_rank=None):
        # Rank 0 copies while the full tensors exist (they are partitioned again on leaving); the others only gather.
        return {n: tensors[n].detach().to("cpu", copy=True) for n in names} if main else {}


def gather_dtensors(tensors: dict, names: list[str], main: bool, dtype: torch.dtype | None) -> dict[str, torch.Tensor]:
    """Rank 0's CPU copies of ``tensors[names]`` (one layer of a model transformers sharded at load: FSDP2, expert
    parallel), each cast to ``dtype`` before it is gathered (bf16 from fp32 master weights: half the bytes on the
    wire and on rank 0) and made whole by ``DTensor.full_tensor`` (a collective over the tensor's mesh: every rank
    calls it, in the same order); ``{}`` on the other ranks."""
    from torch.distributed.tensor import DTensor

    part = {}
    for name in names:
        tensor = tensors[name].detach()
        if dtype is not None and tensor.is_floating_point():
            tensor = tensor.to(dtype)
        if isinstance(tensor, DTensor):
            tensor = tensor.full_tensor()
        if main:
            part[name] = tensor.to("cpu")
    return part


def export_gathered(
    model, out_dir: str, max_shard_bytes: int = MAX_SHARD_BYTES, *, gather=gather_zero3, dtype=None
) -> None:
    """Write ``model`` to ``out_dir`` as ``save_pretrained`` would, gathering its shards one layer at a time.

    Collective: every rank calls it, in the same order; rank 0 writes. Each layer's tensors are made whole by
    ``gather`` (``gather_zero3`` for a ZeRO-3 engine, ``gather_dtensors`` for a model transformers sharded with
    FSDP2), copied to CPU by rank 0 (in ``dtype``, or the dtype the model holds them in), renamed to the checkpoint
    format with transformers' ``revert_weight_conversion`` (Qwen3-MoE's fused experts become one tensor per expert,
    as ``save_pretrained`` writes them and vLLM loads them) and added to a buffer that is written as a safetensors
    shard before it would pass ``max_shard_bytes``. Then the index (several shards) or ``model.safetensors`` (one),
    the config and the generation config.
    Peak host memory on rank 0: one shard + one layer (tests/train/trainer/test_hsdp_trainer.py measures it).
    """
    main = _is_main_process()
    out = Path(out_dir)
    if main:
        out.mkdir(parents=True, exist_ok=True)
        for stale in out.glob("model*.safetensors*"):  # an earlier, interrupted export of the same run
            stale.unlink()
    tensors = model.state_dict(keep_vars=True)
    groups: dict[str, list[str]] = {}
    for name in _saved_names(model):
        groups.setdefault(m.group(1) if (m := _LAYER.match(name)) else name, []).append(name)

    buffer: dict[str, torch.Tensor] = {}
    buffer_bytes = 0
    shards: list[tuple[Path, list[str]]] = []
    weight_map: dict[str, str] = {}
    total_bytes = total_params = 0
    started = time.time()

    def write_shard(groups_done: int):
        nonlocal buffer, buffer_bytes
        path = out / f"model-{len(shards) + 1:05d}.safetensors.partial"
        save_file(buffer, str(path), metadata={"format": "pt"})
        shards.append((path, list(buffer)))
        elapsed = time.time() - started
        log.info(
            "export: shard %d written (%.2f GiB) | %d/%d layers | %.2f GiB/s | ETA %.0fs",
            len(shards),
            buffer_bytes / 2**30,
            groups_done,
            len(groups),
            total_bytes / 2**30 / max(elapsed, 1e-9),
            elapsed * (len(groups) - groups_done) / max(groups_done, 1),
        )
        buffer, buffer_bytes = {}, 0

    for done, names in enumerate(groups.values(), start=1):
        part = gather(tensors, names, main, dtype)
        if not main:
            continue
        total_params += sum(part[n].numel() for n in names if isinstance(tensors[n], torch.nn.Parameter))
        part = {k: v.contiguous() for k, v in revert_weight_conversion(model, part).items()}
        size = sum(v.numel() * v.element_size() for v in part.values())
        if buffer and buffer_bytes + size > max_shard_bytes:
            write_shard(done - 1)
        buffer.update(part)
        buffer_bytes += size
        total_bytes += size
    if not main:
        return
    write_shard(len(groups))

    if len(shards) == 1:
        shards[0][0].rename(out / "model.safetensors")
    else:
        for i, (path, names) in enumerate(shards, start=1):
            final_name = f"model-{i:05d}-of-{len(shards):05d}.safetensors"
            path.rename(out / final_name)
            weight_map.update(dict.fromkeys(names, final_name))
        index = {"metadata": {"total_parameters": total_params, "total_size": total_bytes}, "weight_map": weight_map}
        (out / "model.safetensors.index.json").write_text(json.dumps(index, indent=2, sort_keys=True) + "\n")
    # What save_pretrained records beside the weights.
    model.config.dtype = str(dtype or model.dtype).split(".")[1]
    model.config.architectures = [type(model).__name__]
    model.config.save_pretrained(out)
    if model.can_generate():
        model.generation_config.save_pretrained(out)
    log.info(
        "export: %.2f GiB in %d shard(s) to %s in %.0fs", total_bytes / 2**30, len(shards), out, time.time() - started
    )


def merge_lora_zero3(peft_model):
    """Merge the LoRA adapter into the ZeRO-3 partitioned base in place; return the plain base model, still partitioned.

    Collective: every rank calls it. Each adapted module (``lora.Linear``, or PEFT's ``ParamWrapper`` for
    ``target_parameters`` such as Qwen3-MoE's fused experts) is gathered with its adapter and merged by PEFT's
    own ``merge``; rank 0's result is written back into the partitions. One module at a time, so no rank
    ever holds the whole model: reloading the base instead would put all of it on one process.
    """
    import deepspeed
    from peft.tuners.tuners_utils import BaseTunerLayer

    tuners = {name: m for name, m in peft_model.named_modules() if isinstance(m, BaseTunerLayer)}
    # ParamWrappers nest (one per targeted parameter of a module): gather from the outermost, merge each.
    outermost = [m for name, m in tuners.items() if not any(name.startswith(other + ".") for other in tuners)]
    for module in outermost:
        with deepspeed.zero.GatheredParameters(list(module.parameters()), modifier_rank=0):
            for layer in module.modules():
                if isinstance(layer, BaseTunerLayer):
                    layer.merge()
    return peft_model.unload()  # swaps every LoRA module for its base layer; the merged weights stay


@contextlib.contextmanager
def outside_zero3():
    """Within: ``from_pretrained`` loads whole models on this process, though the Trainer's ZeRO-3 config is alive.

    The Trainer registers its DeepSpeed config in transformers' global weak reference; while it is set,
    ``from_pretrained`` builds models inside ``deepspeed.zero.Init``, partitioned across ranks that are not
    loading it (the "size of tensor a (0)" crash of merging on rank 0 alone).
    """
    ref = hf_deepspeed._hf_deepspeed_config_weak_ref
    live = ref() if ref is not None else None
    hf_deepspeed.unset_hf_deepspeed_config()
    try:
        yield
    finally:
        if live is not None:
            hf_deepspeed.set_hf_deepspeed_config(live)


def merge_adapter(base_path: str, adapter_dir: str, out_dir: str) -> None:
    """Load the base (a plain bf16/fp32 folder) whole on this process, apply the adapter, merge, save to ``out_dir``.

    Holds the whole base in host memory: the path for QLoRA (whose trained base is 4-bit) and for runs
    whose ranks hold the whole model anyway (DDP, ZeRO-2).
    """
    from peft import PeftModel

    with outside_zero3():
        base = AutoModelForCausalLM.from_pretrained(base_path, dtype="auto")
    merged = PeftModel.from_pretrained(base, adapter_dir).merge_and_unload()
    merged.save_pretrained(out_dir)


def _with_transformers4_rope_keys(config: dict) -> dict:
    rope = config.get("rope_parameters")
    if not isinstance(rope, dict) or "rope_theta" not in rope:
        return config
    out = dict(config)
    out["rope_theta"] = rope["rope_theta"]
    scaling = {k: v for k, v in rope.items() if k not in ("rope_theta", "partial_rotary_factor")}
    out["rope_scaling"] = None if scaling.get("rope_type", "default") == "default" else scaling
    if "partial_rotary_factor" in rope:
        out.setdefault("partial_rotary_factor", rope["partial_rotary_factor"])
    return out


def add_transformers4_rope_keys(config_path: Path) -> None:
    """Also write RoPE's settings where transformers 4.x reads them: ``rope_theta`` and ``rope_scaling``.

    transformers 5 writes them only inside ``rope_parameters``; 4.x ignores that key and falls back to its
    defaults, so a Qwen3 model (base 1,000,000) served by a 4.x-based runtime would quietly run with base 10,000
    (issue 19, defect 8). transformers 5 reads the copies back to the same ``rope_parameters``. Nested
    configurations (``text_config`` and the like) get the same.
    """
    config = json.loads(config_path.read_text())
    config = _with_transformers4_rope_keys(config)
    for key, value in list(config.items()):
        if isinstance(value, dict) and "rope_parameters" in value:
            config[key] = _with_transformers4_rope_keys(value)
    config_path.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")


def readable_by_every_user(folder: str) -> None:
    """Let every user read the files under ``folder`` (and enter its folders).

    safetensors writes weights with mode 0600 (a temporary file renamed into place), so only the trainer pods' user
    could read the model. The serving pod may run as another user: KServe's own runtimes, a namespace that assigns
    user ids, a trainer image that runs as root while vLLM runs as the ServingRuntime's user 1000.
    """
    for path in (Path(folder), *Path(folder).rglob("*")):
        path.chmod(path.stat().st_mode | (0o555 if path.is_dir() else 0o444))


def model_card(cfg, base_path: str, metrics: dict) -> dict:
    """``model.json``: what this model is and how it was made."""
    return {
        "base_model": cfg.model_name_or_path,
        "base_model_path": base_path,
        "method": cfg.method,
        "merged": cfg.method == "full" or cfg.merge_lora,
        "dataset_path": cfg.dataset_path,
        "max_seq_length": cfg.max_seq_length,
        "learning_rate": cfg.learning_rate,
        "seed": cfg.seed,
        "deepspeed": cfg.deepspeed,
        "steps": metrics["global_step"],
        "metrics": metrics,
    }


def export_final(trainer, cfg, tokenizer, base_path: str, metrics: dict) -> str:
    """Write ``final/`` (and ``adapter/`` for LoRA) as the module docstring says; return the final folder.

    Every rank calls it: under ZeRO-3 the gathers are collective.
    """
    final_dir = os.path.join(cfg.output_dir, "final")
    # Written beside final/ and renamed to it once complete: a failed export (a full disk, a killed pod) must not leave
    # a final/ that looks like a model (config without weights) for the run's model link and the next steps.
    staging = final_dir + ".partial"
    if trainer.is_world_process_zero():  # only rank 0 writes into it, whatever the layout
        shutil.rmtree(staging, ignore_errors=True)
    trainer.model.config.use_cache = True  # off for packed training; generation (serving) wants the KV cache
    # On for training only (the MoE router's auxiliary loss, trainer/common.py). Left in the export, transformers 5's
    # Qwen3-MoE generate() fails on a padded batch (the evaluation's answers, served batches).
    if getattr(trainer.model.config, "output_router_logits", False):
        trainer.model.config.output_router_logits = False
    zero3 = trainer.is_deepspeed_enabled and trainer.accelerator.state.deepspeed_plugin.zero_stage == 3
    if cfg.method == "full":
        if zero3:
            # ZeRO-3 may still hold parameters it prefetched (in flight) for a forward that never came, and
            # GatheredParameters then fails on leaving ("Cannot partition a param in flight": the 4-rows,
            # chunked-loss lever on an H100, benchmarks/results/moe-layer-bench.md). DeepSpeed's own release waits for
            # them and partitions every parameter before the layer-by-layer gather.
            trainer.model_wrapped.empty_partition_cache()
            export_gathered(trainer.model, staging)
        elif trainer.is_distributed_loading_by_transformers:
            # hsdp / hsdp_ep: fp32 master weights sharded by FSDP2, exported in the dtype the run computed in.
            dtype = torch.bfloat16 if cfg.bf16 else None
            export_gathered(trainer.model, staging, gather=gather_dtensors, dtype=dtype)
        else:
            trainer.save_model(staging)
    else:
        adapter_dir = os.path.join(cfg.output_dir, "adapter")
        trainer.save_model(adapter_dir)  # only the adapter's parameters are gathered
        if cfg.merge_lora and zero3 and cfg.method == "lora":
            export_gathered(merge_lora_zero3(trainer.model), staging)
        elif trainer.is_world_process_zero():
            if cfg.merge_lora:
                merge_adapter(base_path, adapter_dir, staging)
            else:
                shutil.copytree(adapter_dir, staging, dirs_exist_ok=True)
    if trainer.is_world_process_zero():
        tokenizer.save_pretrained(staging)
        generation = Path(base_path, "generation_config.json")
        if generation.exists() and not Path(staging, "generation_config.json").exists():
            shutil.copy(generation, staging)
        Path(staging, "training_args.bin").unlink(missing_ok=True)  # pickled TrainingArguments: not a model file
        Path(staging, "model.json").write_text(json.dumps(model_card(cfg, base_path, metrics), indent=2, default=str))
        if Path(staging, "config.json").exists():  # a merged or full model; an adapter-only final/ has none
            add_transformers4_rope_keys(Path(staging, "config.json"))
        for folder in (staging, os.path.join(cfg.output_dir, "adapter")):
            if os.path.isdir(folder):
                readable_by_every_user(folder)
        shutil.rmtree(final_dir, ignore_errors=True)  # an earlier run's (a re-run exports again)
        os.replace(staging, final_dir)
        log.info("final model in %s", final_dir)
        record_final_model(list(cfg.report_to or []), final_dir)
    return final_dir
