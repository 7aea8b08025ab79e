"""The vLLM server's side of the grpo stage's weight sync (grpo_generation_backend=vllm-server): a weight-transfer
engine for vLLM's native RL API that joins a plain ``torch.distributed`` process group, so that the trainer, whose
image has no vllm, can push its weights with torch alone (components/train/trainer/vllm_client.py).

vLLM's own ``nccl`` engine needs vLLM on both ends (its ``StatelessProcessGroup`` rendezvous and its PyNccl
communicator, GPUs only); this one speaks what torch has on both ends: a ``TCPStore`` the trainer's rank 0 hosts and a
``ProcessGroupGloo`` (CPU) or ``ProcessGroupNCCL`` (GPU) with the trainer as rank 0 and each vLLM worker after it. The
control plane is vLLM's own (``VLLM_SERVER_DEV_MODE=1`` routes): ``/init_weight_transfer_engine`` (blocks until the
group forms), ``/start_weight_update``, ``/update_weights`` (the names, dtypes and shapes of the round; blocks while
the trainer broadcasts), ``/finish_weight_update``.

The server loads it by its worker extension (importing this module registers the engine)::

    PYTHONPATH=<this folder> VLLM_SERVER_DEV_MODE=1 vllm serve MODEL \\
        --worker-extension-cls kfp_weight_sync.WeightSyncExtension \\
        --weight-transfer-config '{"backend": "kfp_torch"}'

Self-contained on purpose (the standard library, torch and vllm only, no import of this package): the server runs
the serving image, which has vLLM and not this package; the file travels to it alone (``PYTHONPATH`` at its folder).

The wire, which the trainer side repeats without importing this module: tensors travel in buckets, each the bytes of
consecutive parameters (in the round's order) concatenated, a bucket closing once it holds at least
``bucket_bytes``; one ``broadcast`` from rank 0 per bucket.

Trust (docs/security.md): vLLM's RL routes answer whoever reaches the port. Where the server's environment has a
token (``KFP_WEIGHT_SYNC_TOKEN``, from the run's own Secret, which the trainer's pods get too), joining the group and
every round must carry it, compared in constant time; without one (a server a user started) none is asked for. Every
init and round is checked before anything is allocated or connected: the trainer's address a plain IP address or DNS
name, ports, group size and bucket size within bounds, dtypes from a fixed list (never an arbitrary ``torch``
attribute), shapes of non-negative integers, and the round's bytes within a bound set by the model's own size.
"""

from __future__ import annotations

import datetime
import hmac
import ipaddress
import os
import re
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from vllm.distributed.weight_transfer.base import (
    WeightTransferEngine,
    WeightTransferInitInfo,
    WeightTransferUpdateInfo,
)
from vllm.distributed.weight_transfer.factory import WeightTransferEngineFactory

BACKEND = "kfp_torch"
STORE_PREFIX = "kfp-weight-sync"
TOKEN_ENV = "KFP_WEIGHT_SYNC_TOKEN"  # the run's token, when the server has one (components/models/vllm_worker)
# What the trainer may send: its parameters' dtypes, and no other torch attribute by name.
DTYPES = {
    "float32": torch.float32,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
    "float8_e4m3fn": torch.float8_e4m3fn,
    "float8_e5m2": torch.float8_e5m2,
}
MAX_BUCKET_BYTES = 16 << 30
MAX_WORLD_SIZE = 65536
_LABEL = r"[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
_HOSTNAME = re.compile(rf"^(?=.{{1,253}}$){_LABEL}(\.{_LABEL})*$")  # RFC 1123 names (a Service's, a pod's)


def check_token(given: str, expected: str | None) -> None:
    """PermissionError unless ``given`` is the server's token (none expected: any)."""
    if expected and not hmac.compare_digest(str(given).encode(), expected.encode()):
        raise PermissionError("weight transfer refused: the request does not carry this run's weight-sync token")


def check_address(address: str) -> None:
    """ValueError unless ``address`` is a plain IP address or DNS name (no scheme, port, path or spaces)."""
    try:
        ipaddress.ip_address(address)
        return
    except ValueError:
        pass
    if not isinstance(address, str) or not _HOSTNAME.match(address):
        raise ValueError(f"master_address {address!r}: an IP address or a DNS name")


def _bounded(name: str, value: Any, low: float, high: float) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not low <= value <= high:
        raise ValueError(f"{name} {value!r}: must be a number from {low:g} to {high:g}")


def round_bytes(dtype_names: list[str], shapes: list[list[int]]) -> list[int]:
    """Each tensor's bytes in a round; ValueError for a dtype outside ``DTYPES`` or a shape that is not a list of
    non-negative integers."""
    sizes = []
    for name, shape in zip(dtype_names, shapes, strict=True):
        if name not in DTYPES:
            raise ValueError(f"dtype {name!r}: one of {', '.join(DTYPES)}")
        if not isinstance(shape, (list, tuple)) or len(shape) > 8:
            raise ValueError(f"shape {shape!r}: a list of at most 8 dimensions")
        if any(isinstance(n, bool) or not isinstance(n, int) or n < 0 for n in shape):
            raise ValueError(f"shape {shape!r}: non-negative integers")
        sizes.append(int(torch.Size(shape).numel()) * torch.empty((), dtype=DTYPES[name]).element_size())
    return sizes


@dataclass
class TorchGroupInitInfo(WeightTransferInitInfo):
    """Where the trainer's TCPStore listens and the group's shape: the trainer is rank 0, the workers
    ``rank_offset`` on (by their global rank across data-parallel replicas)."""

    master_address: str
    master_port: int
    world_size: int
    rank_offset: int = 1
    group_backend: str = "gloo"  # gloo (CPU tensors) or nccl (CUDA tensors)
    bucket_bytes: int = 256 << 20
    timeout_seconds: float = 600.0
    token: str = ""  # the run's weight-sync token (TOKEN_ENV), where the server has one

    def check(self) -> None:
        """ValueError naming the first field out of bounds (see the module's docstring)."""
        check_address(self.master_address)
        _bounded("master_port", self.master_port, 1, 65535)
        _bounded("world_size", self.world_size, 2, MAX_WORLD_SIZE)
        _bounded("rank_offset", self.rank_offset, 1, self.world_size - 1)
        _bounded("bucket_bytes", self.bucket_bytes, 1, MAX_BUCKET_BYTES)
        _bounded("timeout_seconds", self.timeout_seconds, 1, 86400)
        if self.group_backend not in ("gloo", "nccl"):
            raise ValueError(f"group_backend {self.group_backend!r}: gloo or nccl")


@dataclass
class TorchGroupUpdateInfo(WeightTransferUpdateInfo):
    """One round: every parameter the trainer sends, in order, by its checkpoint (Hugging Face) name."""

    names: list[str]
    dtype_names: list[str]
    shapes: list[list[int]]
    token: str = ""  # the run's weight-sync token (TOKEN_ENV), where the server has one

    def __post_init__(self) -> None:
        if not len(self.names) == len(self.dtype_names) == len(self.shapes):
            raise ValueError(
                f"names, dtype_names and shapes differ in length: {len(self.names)}, {len(self.dtype_names)}, "
                f"{len(self.shapes)}"
            )


def buckets(nbytes: list[int], bucket_bytes: int) -> list[tuple[int, int]]:
    """The ``[start, end)`` index ranges of the parameters each bucket holds (the rule both sides follow)."""
    out, start, held = [], 0, 0
    for i, n in enumerate(nbytes):
        held += n
        if held >= bucket_bytes:
            out.append((start, i + 1))
            start, held = i + 1, 0
    if start < len(nbytes):
        out.append((start, len(nbytes)))
    return out


class TorchGroupWeightTransferEngine(WeightTransferEngine[TorchGroupInitInfo, TorchGroupUpdateInfo]):
    """Receives full checkpoint-format weights over a plain torch process group and loads them with the model's
    ``load_weights`` inside vLLM's layerwise reload (as vLLM's ``nccl`` engine does)."""

    init_info_cls = TorchGroupInitInfo
    update_info_cls = TorchGroupUpdateInfo
    supports_draft_weight_update = False

    def __init__(self, config, vllm_config, device, model) -> None:
        super().__init__(config, vllm_config, device, model)
        self.group: Any = None  # ProcessGroupGloo or ProcessGroupNCCL
        self.store: Any = None
        self.bucket_bytes = 256 << 20
        self.group_device = torch.device("cpu")

    def init_transfer_engine(self, init_info: TorchGroupInitInfo) -> None:
        check_token(init_info.token, os.environ.get(TOKEN_ENV))
        init_info.check()
        parallel = self.parallel_config
        rank = parallel.data_parallel_index * parallel.world_size + parallel.rank + init_info.rank_offset
        timeout = datetime.timedelta(seconds=init_info.timeout_seconds)
        store = dist.TCPStore(
            init_info.master_address,
            init_info.master_port,
            init_info.world_size,
            is_master=False,
            timeout=timeout,
        )
        self.store = dist.PrefixStore(STORE_PREFIX, store)
        if init_info.group_backend == "nccl":
            self.group = dist.ProcessGroupNCCL(self.store, rank, init_info.world_size, dist.ProcessGroupNCCL.Options())
            self.group_device = torch.device("cuda", torch.cuda.current_device())
        else:  # gloo: init_info.check() allows these two
            self.group = dist.ProcessGroupGloo(self.store, rank, init_info.world_size, timeout)
            self.group_device = torch.device("cpu")
        self.bucket_bytes = init_info.bucket_bytes

    def start_weight_update(self) -> None:
        from vllm.model_executor.model_loader.reload import initialize_layerwise_reload

        initialize_layerwise_reload(self.model)

    def finish_weight_update(self) -> None:
        from vllm.model_executor.model_loader.reload import finalize_layerwise_reload

        finalize_layerwise_reload(self.model, self.model_config)
        self._retie_word_embeddings()

    def _retie_word_embeddings(self) -> None:
        """A tied lm_head is the input embeddings' tensor, which the update rewrote, but the layerwise reload loads
        no ``lm_head.weight`` (the checkpoint has none) and so does not redo the head's processing: on CPU the head
        multiplies with a packed copy of the old weights (UnquantizedEmbeddingMethod.process_weights_after_loading).
        Tie the head to the embeddings' tensor again and redo its processing."""
        config = getattr(self.model_config, "hf_text_config", None)
        if not getattr(config, "tie_word_embeddings", False):
            return
        from vllm.model_executor.layers.vocab_parallel_embedding import ParallelLMHead, VocabParallelEmbedding

        modules = list(self.model.modules())
        heads = [m for m in modules if isinstance(m, ParallelLMHead)]
        embeddings = [m for m in modules if isinstance(m, VocabParallelEmbedding) and not isinstance(m, ParallelLMHead)]
        if len(heads) != 1 or len(embeddings) != 1 or heads[0].weight.shape != embeddings[0].weight.shape:
            return
        head, embedding = heads[0], embeddings[0]
        if head.weight is not embedding.weight:
            head.weight = embedding.weight
        process = getattr(getattr(head, "quant_method", None), "process_weights_after_loading", None)
        if callable(process):
            process(head)

    def receive_weights(self, update_info: TorchGroupUpdateInfo) -> None:
        check_token(update_info.token, os.environ.get(TOKEN_ENV))
        sizes = round_bytes(update_info.dtype_names, update_info.shapes)
        # At most 4 bytes for each byte of the model's own weights (fp32 over fp8), and 64 MiB of slack: a round
        # cannot make the server allocate more than the model it serves could need.
        limit = 4 * sum(p.numel() * p.element_size() for p in self.model.parameters()) + (64 << 20)
        if sum(sizes) > limit:
            raise ValueError(f"weight round of {sum(sizes):,} bytes: more than this model's weights can be ({limit:,})")
        if self.group is None:
            raise RuntimeError("weight transfer not initialized: call /init_weight_transfer_engine first")
        dtypes = [DTYPES[name] for name in update_info.dtype_names]
        for start, end in buckets(sizes, self.bucket_bytes):
            buffer = torch.empty(sum(sizes[start:end]), dtype=torch.uint8, device=self.group_device)
            self.group.broadcast(buffer, 0).wait()
            offset, weights = 0, []
            for i in range(start, end):
                raw = buffer[offset : offset + sizes[i]]
                offset += sizes[i]
                weights.append((update_info.names[i], raw.view(dtypes[i]).view(update_info.shapes[i])))
            self.model.load_weights(weights)

    def shutdown(self) -> None:
        self.group = None
        self.store = None


class WeightSyncExtension:
    """vLLM's ``--worker-extension-cls``: adds nothing to the worker; importing it registers the engine in the
    worker's process, before the worker creates its weight-transfer engine."""


if BACKEND not in WeightTransferEngineFactory._registry:
    WeightTransferEngineFactory.register_engine(BACKEND, TorchGroupWeightTransferEngine)
