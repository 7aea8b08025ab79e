"""Which servers serve what: the deploy step's list (compare_variants' ``serve``) grouped into servers.

- A full fine-tune (or a LoRA run merged into its base, ``merge_lora=true``) is a plain model folder: one server
  each, named as it is served (``<serving_name>-<variant>``; ``serving_name`` for a run without variants).
- LoRA adapters (``method`` lora/qlora with ``merge_lora=false``: ``final/`` holds the adapter alone) are served
  without merging by one vLLM server per base model: the base is the server's model (served as
  ``<server>-base``) and each adapter is one of its LoRA modules, addressable by its own served name
  (``--enable-lora --lora-modules name=path ...``). Adapters of different bases cannot share a server (vLLM
  applies LoRA modules to the one model it loaded), so each base gets its own: ``serving_name`` when the adapters
  have one base, ``<serving_name>-1``, ``-2``, ... (in the order the variants are listed) when they have several;
  a number cannot clash with a variant's name, which starts with a letter.

The adapter's base is the folder its training stage started from (``model.json``'s ``base_model_path``, written by
components/train/trainer/export.py), else ``adapter_config.json``'s ``base_model_name_or_path``.

    servers = plan_servers(serve, serving_name="qwen3-sft")
    servers[0].name, servers[0].served_names()      # "qwen3-sft", ["qwen3-sft-base", "qwen3-sft-a", "qwen3-sft-b"]
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field

# vLLM 0.32's allowed --max-lora-rank values (vllm/config/lora.py: MaxLoRARanks); the server refuses an adapter of a
# higher rank than it was started with (vllm/lora/peft_helper.py: "LoRA rank ... is greater than max_lora_rank").
LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)
BASE_SUFFIX = "-base"
# What each KServe deployment mode's autoscaler scales a server's replicas on: a HorizontalPodAutoscaler (Standard) on
# the pods' resource utilisation, Knative's autoscaler on requests in flight or per second (KServe's docs, "Autoscaling
# with Kubernetes HPA" and "Knative Autoscaler"); all four are values of the InferenceService CRD's scaleMetric enum.
SCALE_METRICS = {"Standard": ("cpu", "memory"), "Knative": ("concurrency", "rps")}


@dataclass
class Adapter:
    """One LoRA adapter a server loads as a LoRA module."""

    variant: str
    served_model_name: str
    path: str  # the adapter folder (final/: adapter_config.json, adapter_model.safetensors)
    rank: int


@dataclass
class Server:
    """One model server: a plain model, or a base with LoRA adapters."""

    name: str  # the InferenceService's name (the local server's label)
    model_path: str  # what the server loads: the full model folder, or the adapters' base
    served_model_name: str  # the name of that model in requests
    variant: str | None = None  # a full model's variant (None for a base that serves adapters)
    adapters: list[Adapter] = field(default_factory=list)

    def served_names(self) -> list[str]:
        """Every model name the server answers to: its model's, then each adapter's."""
        return [self.served_model_name, *(a.served_model_name for a in self.adapters)]

    def max_lora_rank(self) -> int:
        """The ``--max-lora-rank`` to start the server with: vLLM's smallest allowed value >= every adapter's."""
        return lora_rank_limit(max(a.rank for a in self.adapters))


def lora_args(lora_modules: list[tuple[str, str]], max_lora_rank: int) -> list[str]:
    """vLLM 0.32's arguments that serve ``lora_modules`` (served name, adapter folder) beside the base model.

    From vllm/engine/arg_utils.py (``--enable-lora``, ``--max-loras``: adapters in one batch, default 1;
    ``--max-lora-rank``: one of vllm/config/lora.py's ``MaxLoRARanks``, default 16) and
    vllm/entrypoints/launchers/cli_args.py (``--lora-modules`` takes one or more ``name=path``; a second
    ``--lora-modules`` would replace the first's list, so every adapter follows one flag). ``--max-loras`` is the
    adapter count: every adapter can be in the same batch.
    """
    return [
        "--enable-lora",
        f"--max-loras={len(lora_modules)}",
        f"--max-lora-rank={max_lora_rank}",
        "--lora-modules",
        *(f"{name}={path}" for name, path in lora_modules),
    ]


def lora_rank_limit(rank: int) -> int:
    """vLLM's smallest ``--max-lora-rank`` value that admits an adapter of ``rank``.

    Raises:
        ValueError: above vLLM's largest (512), naming ``lora_r``.
    """
    fitting = [r for r in LORA_RANKS if r >= rank]
    if not fitting:
        raise ValueError(
            f"an adapter of rank {rank} cannot be served unmerged: vLLM's --max-lora-rank is at most "
            f"{LORA_RANKS[-1]}; set lora_r <= {LORA_RANKS[-1]} or merge_lora=true"
        )
    return fitting[0]


def adapter_rank(path: str) -> int:
    """The adapter's highest rank (``r`` and any ``rank_pattern`` entry), as vLLM checks it."""
    config = _adapter_config(path)
    return int(max([config["r"], *(config.get("rank_pattern") or {}).values()]))


def adapter_base(path: str) -> str:
    """The base model the adapter in ``path`` was trained on: the folder its stage started from (``model.json``),
    else ``adapter_config.json``'s ``base_model_name_or_path``."""
    card = os.path.join(path, "model.json")
    if os.path.isfile(card):
        with open(card) as f:
            base = json.load(f).get("base_model_path")
        if base:
            return str(base)
    return str(_adapter_config(path)["base_model_name_or_path"])


def _adapter_config(path: str) -> dict:
    config = os.path.join(path, "adapter_config.json")
    try:
        with open(config) as f:
            return json.load(f)
    except FileNotFoundError:
        raise FileNotFoundError(
            f"{config} not found: with method=lora/qlora and merge_lora=false the final folder "
            "holds a PEFT adapter (components/train/trainer/export.py); this has none"
        ) from None


def plan_servers(serve: list[dict], serving_name: str) -> list[Server]:
    """The servers for compare_variants' ``serve`` list (each ``variant``, ``model_path``, ``served_model_name``,
    ``adapter``): full models first, one each, in order; then one server per base for the adapters.

    Raises:
        ValueError: two served names alike (a variant named like a server's base, ``<server>-base``), or an
            adapter's rank above vLLM's largest.
    """
    servers: list[Server] = []
    groups: dict[str, list[Adapter]] = {}
    for item in serve:
        if item.get("adapter"):
            adapter = Adapter(
                item["variant"], item["served_model_name"], item["model_path"], adapter_rank(item["model_path"])
            )
            groups.setdefault(adapter_base(item["model_path"]), []).append(adapter)
        else:
            servers.append(
                Server(
                    item["served_model_name"], item["model_path"], item["served_model_name"], variant=item["variant"]
                )
            )
    for k, (base, adapters) in enumerate(groups.items()):
        name = serving_name if len(groups) == 1 else f"{serving_name}-{k + 1}"
        server = Server(name, base, name + BASE_SUFFIX, adapters=adapters)
        server.max_lora_rank()  # an adapter vLLM cannot load fails here, before any server starts
        servers.append(server)
    seen: dict[str, str] = {}
    for server in servers:
        for served in server.served_names():
            if served in seen:
                raise ValueError(
                    f"two models would be served as {served!r} (by {seen[served]} and {server.name}): "
                    f"a variant's name clashes with a server's base model name ({served!r} ends in "
                    f"{BASE_SUFFIX!r}); rename the variant in variants"
                )
            seen[served] = server.name
    return servers
