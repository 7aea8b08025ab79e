"""The grpo stage's generation on a vLLM server (``grpo_generation_backend=vllm-server``): completions over the
server's OpenAI-compatible completions route, and the trainer's weights pushed to it through vLLM's weight-transfer
API, with torch alone on this side (the trainer image has no vllm: no vllm release accepts its transformers).

The server runs the serving image with this package's engine (components/models/vllm_worker/kfp_weight_sync.py,
backend ``kfp_torch``) and vLLM's RL routes. A round trip, driven by the trainer's rank 0:

1. once: this side hosts a ``TCPStore`` and asks the server to join (``/init_weight_transfer_engine``, on a thread:
   it returns when the group has formed) while it creates its end of the group, rank 0 of ``1 + server workers``:
   ``ProcessGroupGloo`` for CPU tensors, ``ProcessGroupNCCL`` for CUDA tensors;
2. each sync: ``/pause`` (in-flight requests finish, the prefix cache is dropped), ``/start_weight_update``,
   ``/update_weights`` with every parameter's name, dtype and shape (on a thread: it returns when the server has
   received them) while this side broadcasts the bytes in buckets, ``/finish_weight_update``, ``/resume``.

Every training rank iterates the parameters in the same order (under ZeRO-3 each one is gathered, a collective; an
FSDP ``DTensor`` is materialized by ``full_tensor()``); rank 0 alone talks to the server.
"""

from __future__ import annotations

import json
import logging
import os
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

# The server side's names and command line (components/models/vllm_worker/): this module must not import the engine
# itself, which imports vllm.
from components.models.vllm_worker import (  # noqa: F401 (server_args, server_env, WORKER_EXTENSION: for callers)
    BACKEND,
    STORE_PREFIX,
    TOKEN_ENV,
    WORKER_EXTENSION,
    engine_dir,
    server_args,
    server_env,
)

log = logging.getLogger("sft.grpo")

DEFAULT_BUCKET_BYTES = 256 << 20
# Prefixes wrappers add to parameter names (activation checkpointing, torch.compile, DDP/DeepSpeed engines).
WRAPPER_PREFIXES = ("_checkpoint_wrapped_module.", "_orig_mod.", "module.")


class VLLMServerError(RuntimeError):
    """The vLLM server refused a request or could not be reached."""


def buckets(nbytes: list[int], bucket_bytes: int) -> list[tuple[int, int]]:
    """The ``[start, end)`` ranges of the parameters each broadcast carries: consecutive parameters, a bucket closing
    once it holds at least ``bucket_bytes`` (the server's engine cuts the same ones from the same sizes)."""
    out, start, held = [], 0, 0
    for i, n in enumerate(nbytes):
        held += n
        if held >= bucket_bytes:
            out.append((start, i + 1))
            start, held = i + 1, 0
    if start < len(nbytes):
        out.append((start, len(nbytes)))
    return out


@dataclass(frozen=True)
class ParamMeta:
    name: str
    dtype: torch.dtype
    shape: tuple[int, ...]

    @property
    def nbytes(self) -> int:
        return int(torch.Size(self.shape).numel()) * torch.empty((), dtype=self.dtype).element_size()


def checkpoint_name(name: str) -> str:
    """A parameter's name as the model's checkpoint has it (what vLLM's ``load_weights`` maps), wrappers removed."""
    for prefix in WRAPPER_PREFIXES:
        name = name.replace(prefix, "")
    return name


def split_fused_experts(name: str, shape: tuple[int, ...]) -> list[tuple[str, tuple[int, ...], tuple[int, slice]]]:
    """transformers 5 holds a MoE layer's experts fused, ``mlp.experts.gate_up_proj`` ``[experts, 2 x inner, hidden]``
    and ``mlp.experts.down_proj`` ``[experts, hidden, inner]``; checkpoints (what vLLM's ``load_weights`` maps) have
    one ``mlp.experts.<e>.gate_proj.weight``, ``up_proj.weight`` and ``down_proj.weight`` per expert. For a fused
    tensor: each checkpoint tensor's name, shape and index into it; else an empty list."""
    prefix, _, leaf = name.rpartition(".")
    if not prefix.endswith("mlp.experts") or leaf not in ("gate_up_proj", "down_proj") or len(shape) != 3:
        return []
    experts, rows, cols = shape
    out: list[tuple[str, tuple[int, ...], tuple[int, slice]]] = []
    for e in range(experts):
        if leaf == "gate_up_proj":
            inner = rows // 2
            out.append((f"{prefix}.{e}.gate_proj.weight", (inner, cols), (e, slice(0, inner))))
            out.append((f"{prefix}.{e}.up_proj.weight", (inner, cols), (e, slice(inner, rows))))
        else:
            out.append((f"{prefix}.{e}.down_proj.weight", (rows, cols), (e, slice(0, rows))))
    return out


def _full_shape(param: torch.Tensor) -> tuple[int, ...]:
    ds_shape = getattr(param, "ds_shape", None)  # ZeRO-3: the local tensor is a flat shard
    return tuple(ds_shape) if ds_shape is not None else tuple(param.shape)  # a DTensor's shape is the global one


def parameters_metadata(model: torch.nn.Module, dtype: torch.dtype | None = None) -> list[ParamMeta]:
    """Each checkpoint tensor's name, wire dtype (``dtype``, else its parameter's) and full shape, without gathering:
    a parameter's own, or each expert's of a fused one (``split_fused_experts``)."""
    meta = []
    for name, p in model.named_parameters():
        name, shape = checkpoint_name(name), _full_shape(p)
        parts = split_fused_experts(name, shape)
        meta += [ParamMeta(n, dtype or p.dtype, s) for n, s, _ in parts] or [ParamMeta(name, dtype or p.dtype, shape)]
    return meta


def full_parameters(model: torch.nn.Module, dtype: torch.dtype | None = None) -> Iterator[tuple[str, torch.Tensor]]:
    """Each parameter whole, in ``named_parameters`` order, as a tensor of its own (a copy, cast to ``dtype``; a fused
    experts tensor as each expert's checkpoint tensors): under ZeRO-3 gathered one at a time and released, a
    ``DTensor`` materialized; on every rank in lockstep."""
    for name, p in model.named_parameters():
        materialize = getattr(p, "full_tensor", None)  # a DTensor (FSDP2)
        if hasattr(p, "ds_id"):
            import deepspeed

            with deepspeed.zero.GatheredParameters([p], modifier_rank=None):
                full = p.data.detach().to(dtype or p.dtype, copy=True)
        elif callable(materialize):
            full = materialize().detach().to(dtype or p.dtype)
        else:
            full = p.detach().to(dtype or p.dtype, copy=True)
        name = checkpoint_name(name)
        parts = split_fused_experts(name, tuple(full.shape))
        if not parts:
            yield name, full
        for part, _, index in parts:
            yield part, full[index]


class VLLMServer:
    """A vLLM server's generation and weight-transfer routes, over HTTP (``url``: its root, ``http://host:port``).

    ``token``: the run's weight-sync token (default: ``TOKEN_ENV`` from the environment, which the grpo stage's pods
    get from the run's server's Secret; none for a server a user started): sent as the bearer token vLLM's
    ``--api-key`` asks for on the OpenAI routes, and in every join and round the weight-sync engine checks."""

    def __init__(self, url: str, timeout: float = 600.0, token: str | None = None):
        self.url = url.rstrip("/").removesuffix("/v1")
        self.timeout = timeout
        self.token = os.environ.get(TOKEN_ENV, "") if token is None else token
        self._model: str | None = None

    def _request(self, method: str, path: str, body: dict | None = None, params: dict | None = None) -> Any:
        url = self.url + path + (("?" + urllib.parse.urlencode(params)) if params else "")
        data = None if body is None else json.dumps(body).encode()
        headers = {"Content-Type": "application/json"}
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        request = urllib.request.Request(url, data=data, method=method, headers=headers)
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as response:
                return json.loads(response.read() or b"null")
        except urllib.error.HTTPError as e:
            detail = e.read().decode(errors="replace")[:2000]
            raise VLLMServerError(f"vLLM server {method} {path}: HTTP {e.code}: {detail}") from None
        except (urllib.error.URLError, OSError) as e:
            raise VLLMServerError(f"vLLM server at {self.url} ({method} {path}): {e}") from None

    def post(self, path: str, body: dict | None = None, params: dict | None = None) -> Any:
        return self._request("POST", path, body if body is not None else {}, params)

    def get(self, path: str, params: dict | None = None) -> Any:
        return self._request("GET", path, None, params)

    def wait_ready(self, timeout: float = 900.0) -> None:
        """Wait until the server answers ``/health``."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                self.get("/health")
                return
            except VLLMServerError as e:
                if time.monotonic() > deadline:
                    raise VLLMServerError(f"vLLM server at {self.url} not ready after {timeout:.0f}s: {e}") from None
                time.sleep(2)

    @property
    def model(self) -> str:
        """The served model's name."""
        if self._model is None:
            self._model = self.get("/v1/models")["data"][0]["id"]
        return self._model

    def world_size(self) -> int:
        """The server's workers across tensor, pipeline and data parallelism (each joins the sync group)."""
        return int(self.get("/get_world_size")["world_size"])

    def generate(
        self,
        prompt_ids: list[list[int]],
        max_tokens: int,
        temperature: float = 1.0,
        top_p: float = 1.0,
        top_k: int | None = None,
        min_p: float | None = None,
        repetition_penalty: float = 1.0,
        n: int = 1,
        seed: int | None = None,
    ) -> tuple[list[list[int]], list[list[float]]]:
        """Sample ``n`` completions of each prompt (token ids in, token ids out): the completions' token ids and
        each sampled token's log-probability, prompt by prompt, ``n`` consecutive completions each."""
        body: dict[str, Any] = {
            "model": self.model,
            "prompt": prompt_ids,
            "n": n,
            "max_tokens": max_tokens,
            "temperature": temperature,
            "top_p": top_p,
            "repetition_penalty": repetition_penalty,
            "logprobs": 0,
            "return_token_ids": True,
            "skip_special_tokens": False,
        }
        if top_k:
            body["top_k"] = top_k
        if min_p:
            body["min_p"] = min_p
        if seed is not None:
            body["seed"] = seed
        choices = sorted(self.post("/v1/completions", body)["choices"], key=lambda c: c["index"])
        if len(choices) != n * len(prompt_ids):
            raise VLLMServerError(f"asked for {n * len(prompt_ids)} completions, the server returned {len(choices)}")
        ids = [list(c["token_ids"]) for c in choices]
        logprobs = [[float(x) for x in c["logprobs"]["token_logprobs"]] for c in choices]
        return ids, logprobs


class WeightSync:
    """Pushes a model's weights to a vLLM server (rank 0 of the trainer) through a torch process group.

    ``master_address``: this pod's address as the server reaches it; ``port`` 0 picks a free one. ``device``: where the
    broadcast buffers live: CPU (gloo) or a CUDA device (nccl).
    """

    def __init__(
        self,
        server: VLLMServer,
        master_address: str,
        port: int = 0,
        device: torch.device | str = "cpu",
        bucket_bytes: int = DEFAULT_BUCKET_BYTES,
        timeout: float = 600.0,
    ):
        self.server = server
        self.master_address = master_address
        self.port = port
        self.device = torch.device(device)
        self.bucket_bytes = bucket_bytes
        self.timeout = timeout
        self.group: Any = None
        self.store: Any = None
        self.version = 0

    @property
    def group_backend(self) -> str:
        return "nccl" if self.device.type == "cuda" else "gloo"

    def connect(self) -> None:
        """Form the group with the server's workers (once)."""
        world = 1 + self.server.world_size()
        timeout = timedelta(seconds=self.timeout)
        store = dist.TCPStore(
            "0.0.0.0", self.port, world, is_master=True, timeout=timeout, wait_for_workers=False, use_libuv=True
        )
        self.port = store.port
        self.store = dist.PrefixStore(STORE_PREFIX, store)
        init = {
            "master_address": self.master_address,
            "master_port": self.port,
            "world_size": world,
            "rank_offset": 1,
            "group_backend": self.group_backend,
            "bucket_bytes": self.bucket_bytes,
            "timeout_seconds": self.timeout,
            "token": self.server.token,
        }
        with ThreadPoolExecutor(max_workers=1) as pool:
            joined = pool.submit(self.server.post, "/init_weight_transfer_engine", {"init_info": init})
            if self.group_backend == "nccl":
                self.group = dist.ProcessGroupNCCL(self.store, 0, world, dist.ProcessGroupNCCL.Options())
            else:
                self.group = dist.ProcessGroupGloo(self.store, 0, world, timeout)
            joined.result()
        shown = {k: v for k, v in init.items() if k != "token"}  # never the token
        log.info("weight sync: group of %d formed with the vLLM server at %s (%s)", world, self.server.url, shown)

    def push(self, meta: list[ParamMeta], tensors: Iterable[tuple[str, torch.Tensor]]) -> dict:
        """One update round: ``tensors`` (whole, in ``meta``'s order) replace the server's weights. Returns its
        seconds and bytes."""
        if self.group is None:
            self.connect()
        started = time.monotonic()
        update = {
            "names": [m.name for m in meta],
            "dtype_names": [str(m.dtype).removeprefix("torch.") for m in meta],
            "shapes": [list(m.shape) for m in meta],
            "token": self.server.token,
        }
        sizes = [m.nbytes for m in meta]
        self.server.post("/pause", params={"mode": "wait"})
        self.server.post("/start_weight_update")
        pool = ThreadPoolExecutor(max_workers=1)
        try:
            received = pool.submit(self.server.post, "/update_weights", {"update_info": update})
            stream = iter(tensors)
            for start, end in buckets(sizes, self.bucket_bytes):
                parts = []
                for i in range(start, end):
                    name, tensor = next(stream)
                    expected = meta[i]
                    if name != expected.name or tensor.dtype != expected.dtype or tuple(tensor.shape) != expected.shape:
                        raise ValueError(
                            f"parameter {i}: declared {expected.name} {expected.dtype} {expected.shape}, got {name} "
                            f"{tensor.dtype} {tuple(tensor.shape)}"
                        )
                    parts.append(tensor.contiguous().view(-1).view(torch.uint8).to(self.device))
                buffer = torch.cat(parts)
                self.group.broadcast(buffer, 0).wait()
                del parts, buffer
            received.result()
        finally:
            pool.shutdown(wait=False)  # a failed broadcast leaves the server's request hanging: do not wait on it
        self.version += 1
        self.server.post("/finish_weight_update", {"weight_version": str(self.version)})
        self.server.post("/resume")
        seconds = time.monotonic() - started
        return {"seconds": seconds, "bytes": sum(sizes), "parameters": len(meta), "version": self.version}

    def push_model(self, model: torch.nn.Module, dtype: torch.dtype | None = None, sender: bool = True) -> dict:
        """Push ``model``'s weights (cast to ``dtype``); every training rank calls it (ZeRO-3 gathers are
        collectives), ``sender`` on rank 0 only."""
        meta = parameters_metadata(model, dtype)
        tensors = full_parameters(model, dtype)
        if not sender:
            for _ in tensors:
                pass
            return {}
        return self.push(meta, tensors)

    def close(self) -> None:
        if self.group is not None:
            try:
                self.server.post("/shutdown_weight_transfer_engine")
            except VLLMServerError as e:
                log.warning("weight sync: shutting the server's side down failed: %s", e)
        self.group = None
        self.store = None


def sync_address(url: str) -> str:
    """This process's address as the server at ``url`` reaches it: loopback for a local server, else the pod's IP
    (``POD_IP``, the downward API's status.podIP, else what the host name resolves to)."""
    import os
    import socket

    host = urllib.parse.urlparse(url).hostname or ""
    if host in ("127.0.0.1", "localhost", "::1"):
        return "127.0.0.1"
    return os.environ.get("POD_IP") or socket.gethostbyname(socket.gethostname())


class ServerGeneration:
    """The grpo trainer's generation on a vLLM server (GRPOCheckpointTrainer._generate_single_turn): before the first
    generation and then every ``sync_steps`` optimizer steps every rank joins the weight push (rank 0 sends, the
    others take part in the gathers, then all wait for it), and each rank samples its own prompts' completions."""

    def __init__(self, url: str, sync_steps: int = 1, rank: int = 0, device: torch.device | str = "cpu"):
        self.server = VLLMServer(url)
        self.sync_steps = sync_steps
        self.rank = rank
        self.sync = WeightSync(self.server, sync_address(url), device=device) if rank == 0 else None
        self.synced_step: int | None = None
        self.syncs: list[dict] = []

    def due(self, step: int) -> bool:
        """Whether the weights go to the server before generating at optimizer step ``step`` (the same answer on
        every rank: it depends on the step alone)."""
        return self.synced_step is None or (step != self.synced_step and step - self.synced_step >= self.sync_steps)

    def push(self, model: torch.nn.Module, step: int, barrier=None) -> None:
        if self.sync is not None:
            self.syncs.append({"step": step, **self.sync.push_model(model)})
            log.info("weight sync at step %d: %s", step, self.syncs[-1])
        else:
            for _ in full_parameters(model):  # the gathers are collectives: every rank takes part
                pass
        if barrier is not None:
            barrier()
        self.synced_step = step

    def generate(self, trainer, prompt_ids: list[list[int]]) -> tuple[list[list[int]], list[list[float]]]:
        """TRL's ``_generate_single_turn`` contract: one completion per entry of ``prompt_ids`` (the sampler already
        repeats each prompt ``num_generations`` times), its token ids and each token's log-probability."""
        step = trainer.state.global_step
        if self.due(step):
            self.push(trainer.model, step, trainer.accelerator.wait_for_everyone)
        return self.server.generate(
            prompt_ids,
            max_tokens=trainer.max_completion_length,
            temperature=trainer.temperature,
            top_p=trainer.top_p,
            top_k=trainer.top_k,
            min_p=trainer.min_p,
            repetition_penalty=trainer.repetition_penalty,
        )
