"""The job's parallel layout on the GPU pods, from torchrun's environment: no per-cluster file edits.

Two families, chosen by the ``parallelism`` setting:

- ``deepspeed`` (the default): the DeepSpeed config named by ``deepspeed_config`` (ZeRO-3 over every GPU, ...). For
  the shipped ``zero3_hpz`` (ZeRO++ hierarchical partitioning) the secondary partition must be one node's GPUs:
  ``job_deepspeed_config`` writes a copy of the file with ``zero_hpz_partition_size`` = torchrun's
  ``LOCAL_WORLD_SIZE`` (the shipped file says 8, a DGX node), and for any ZeRO-3 config the prefetch, live and
  reduce sizes from the model's largest layer where the file says "auto".
- ``hsdp`` and ``hsdp_ep``: transformers' own distributed training (``transformers.distributed.DistributedConfig``,
  applied by ``from_pretrained``): FSDP2 shards the weights, gradients and optimizer states over one node's GPUs
  (``fsdp_size`` = ``LOCAL_WORLD_SIZE``) and replicates them over the nodes (``dp_replicate_size`` = ``WORLD_SIZE``
  / ``LOCAL_WORLD_SIZE``): the parameter all-gathers and gradient reduce-scatters stay within a node, and only an
  all-reduce of each GPU's gradient shard crosses nodes, once per optimizer step (the Trainer defers it over the
  accumulation steps: ``Trainer._defer_fsdp_gradient_reduction``). ``hsdp_ep`` adds expert parallelism within the
  node (``ep_size`` = ``LOCAL_WORLD_SIZE``, the model's ``base_model_ep_plan``): each GPU holds whole experts, a
  node holds them all, and the routed tokens reach their experts by all-to-all instead of gathering the experts.

On GPUs (``bf16``) the model is loaded in fp32 and FSDP2 computes in bf16 (``fsdp_mixed_precision``: bf16
all-gathers, fp32 gradient reductions): fp32 master weights and Adam states, as DeepSpeed keeps them.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from collections.abc import Mapping
from pathlib import Path

from components.train.config import hpz_partition, job_zero_config, load_deepspeed_config

PARALLELISMS = ("deepspeed", "hsdp", "hsdp_ep")


def nodes_and_gpus(env: Mapping[str, str] | None = None) -> tuple[int, int]:
    """(nodes, GPUs per node) from torchrun's ``WORLD_SIZE`` and ``LOCAL_WORLD_SIZE`` in ``env`` (default: this
    process's environment; 1, 1 outside torchrun). A ValueError when the world is not whole nodes."""
    env = os.environ if env is None else env
    world, local = int(env.get("WORLD_SIZE", "1")), int(env.get("LOCAL_WORLD_SIZE", env.get("WORLD_SIZE", "1")))
    if local < 1 or world % local:
        raise ValueError(
            f"WORLD_SIZE {world} is not a whole number of nodes of LOCAL_WORLD_SIZE {local} processes: "
            "torchrun's --nproc_per_node must be the same on every node"
        )
    return world // local, local


def distributed_config(parallelism: str, bf16: bool, env: Mapping[str, str] | None = None):
    """The ``DistributedConfig`` of ``parallelism`` (``hsdp``, ``hsdp_ep``) for this torchrun job, or None for
    ``deepspeed``. ``bf16``: FSDP2's mixed precision (module docstring)."""
    if parallelism == "deepspeed":
        return None
    if parallelism not in PARALLELISMS:
        raise ValueError(f"parallelism {parallelism!r} is not one of {list(PARALLELISMS)}")
    from transformers.distributed import DistributedConfig

    nodes, per_node = nodes_and_gpus(env)
    ep = per_node if parallelism == "hsdp_ep" else 1
    return DistributedConfig(dp_replicate_size=nodes, fsdp_size=per_node, fsdp_mixed_precision=bf16, ep_size=ep)


def hpz_partition_size(env: Mapping[str, str] | None = None) -> int:
    """ZeRO++'s secondary partition for this job: one node's GPUs, or 1 (hpZ off) when the job is one node, where
    every gather stays within the node anyway."""
    return hpz_partition(*nodes_and_gpus(env))


def job_deepspeed_config(name_or_path: str, largest_layer: int = 0, env: Mapping[str, str] | None = None) -> str:
    """The DeepSpeed JSON this job runs with, written to this pod's temporary folder; its path. As
    ``components.train.config.job_zero_config`` says (the rule the memory fit and the plan count with): the shipped
    ``zero3_hpz``'s secondary partition = one node's GPUs (``hpz_partition_size``), and ZeRO-3's "auto" sizes from
    the model's ``largest_layer`` (0: left to transformers); ``name_or_path`` itself where the job changes nothing.
    The same content for every rank of a pod: each writes its own file and renames it into place."""
    config = load_deepspeed_config(name_or_path)
    nodes, gpus = nodes_and_gpus(env)
    zero = job_zero_config(name_or_path, nodes, gpus, largest_layer)
    if zero == config.get("zero_optimization", {}):
        return name_or_path  # nothing of this job's to write (ZeRO-2, DDP, a config with its own sizes)
    config["zero_optimization"] = zero
    digest = hashlib.sha256(json.dumps(config, sort_keys=True).encode()).hexdigest()[:12]
    # In a folder of its own under the file's own name: the run's model card records which config it was.
    target = Path(tempfile.gettempdir(), f"deepspeed-job-{digest}", Path(name_or_path).stem + ".json")
    target.parent.mkdir(exist_ok=True)
    own = target.with_suffix(f".{os.getpid()}.tmp")
    own.write_text(json.dumps(config, indent=2))
    own.replace(target)
    return str(target)


def check_parallelism(data: dict) -> str | None:
    """The error for a trainer config whose ``parallelism`` cannot run with its other fields, else None. For
    ``hsdp``/``hsdp_ep`` it sets ``save_only_model``: the Trainer checkpoints a model sharded at load only so, and
    sharded_checkpoints.py writes the optimizer, scheduler and RNG state beside the shards itself."""
    parallelism = data.get("parallelism", "deepspeed")
    if parallelism not in PARALLELISMS:
        return f"parallelism {parallelism!r} is not one of {list(PARALLELISMS)}"
    if parallelism == "deepspeed":
        return None
    if data.get("deepspeed"):
        return (
            f"parallelism {parallelism!r} shards the model with FSDP2 (transformers' DistributedConfig) in place "
            f"of DeepSpeed: set deepspeed_config none (it is {data['deepspeed']!r}), or parallelism deepspeed"
        )
    if data.get("method", "full") != "full":
        return (
            f"parallelism {parallelism!r} is for method 'full' (not {data.get('method')!r}); use parallelism deepspeed"
        )
    if data.get("stage", "sft") not in ("sft", "cpt"):
        return f"parallelism {parallelism!r} runs the sft and cpt stages only, not {data.get('stage')!r}"
    data["save_only_model"] = True
    return None
