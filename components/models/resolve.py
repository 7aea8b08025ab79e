"""Turning a model reference into a local folder: the built-in tiny model, a mounted folder, or a Hub id.

Every caller (data prep, the trainer, evaluation) gets a folder ``from_pretrained`` loads without a network:

- ``builtin:tiny-qwen3``: built offline into the cache (``components.models.tiny``).
- a local or mounted folder: used where it is.
- a Hugging Face Hub id (``Qwen/Qwen3-30B-A3B-Thinking-2507-FP8``): the files training needs, from the HF
  cache (``snapshot_download``: honours HF_HOME, HF_HUB_OFFLINE and HF_TOKEN); downloaded when missing.

An FP8 checkpoint, by Hub id or folder, resolves to its bf16 copy (``components.models.fp8``): loading the FP8
original dequantised bypasses ZeRO-3 partitioning.

``resolve_model`` is for a single process (data prep, evaluation). A training job resolves once per run with
``resolve_model_for_run``: global rank 0 (env ``RANK``, absent = 0) resolves, downloading and building as
needed, and records the folder in the run's output folder (``base_model.json``); the other ranks wait for
that record on the shared volume and never contact the Hub (GPU nodes often have no internet access). A
re-run of the job (same output folder, after an eviction) reuses the record while its folder exists, so it
trains, and resumes checkpoints, on the same base snapshot even when the Hub repo has moved on.

The others poll the volume rather than wait at a barrier: the process group does exist by then (the
trainer's ``parse_config`` builds SFTConfig, whose ``__post_init__`` sets up the distributed state), but a
barrier or broadcast would hit its timeout (``ddp_timeout``, 30 minutes by default) while rank 0 downloads
30 GB and writes a 60 GB bf16 copy.
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
import time
from pathlib import Path

from huggingface_hub import constants, hf_hub_download, snapshot_download
from huggingface_hub.errors import (
    GatedRepoError,
    LocalEntryNotFoundError,
    OfflineModeIsEnabled,
    RepositoryNotFoundError,
)
from huggingface_hub.utils import HFValidationError, validate_repo_id

from components.distributed import global_rank
from components.models import fp8, tiny

log = logging.getLogger(__name__)

# What the trainer, evaluation and serving read; the Hub repo's other files (original/ weights, images,
# other formats) are never downloaded.
MODEL_FILES = ["config.json", "*.safetensors", "*.safetensors.index.json", *fp8.TOKENIZER_AND_GENERATION_FILES]
# The record of a training run's base model in its output folder (resolve_model_for_run).
BASE_MODEL_RECORD = "base_model.json"
# How long ranks other than 0 wait for rank 0 to download (30 GB) and build (60 GB) the model.
WAIT_TIMEOUT_S = 4 * 3600
POLL_S = 5.0
# The first seconds are polled often: rank 0 usually records within a second or two (a cached or built-in model),
# and the whole job waits at the trainer's first collective for the last rank to read the record.
FIRST_POLL_S, FIRST_POLLS_FOR_S = 0.1, 30.0


def resolve_model(model_name_or_path: str, cache_root: str) -> str:
    """Return a local folder holding ``model_name_or_path``, ready for ``from_pretrained``.

    Downloads and builds what is missing, so one process of a job calls it (a training job calls
    ``resolve_model_for_run``). Concurrent callers are safe: the HF cache locks its downloads and a bf16
    copy is renamed into place when complete.

    Args:
        model_name_or_path: ``builtin:tiny-qwen3``, a local/mounted folder, or a Hugging Face Hub id.
        cache_root: where built models live (``<cache_root>/models/...``): the tiny model and the bf16
            copies of FP8 checkpoints. On the cluster, the data volume's cache folder, shared by every step.

    Returns:
        The folder; for an FP8 checkpoint, its bf16 copy ``<cache_root>/models/<slug>-bf16-<fingerprint>``.

    Raises:
        ValueError: an unknown built-in, a missing folder, a Hub id that is not in the cache while
            HF_HUB_OFFLINE=1 (or the Hub is unreachable), or one the Hub does not have (or HF_TOKEN cannot read).
    """
    if _is_builtin(model_name_or_path):
        return tiny.materialize(cache_root)
    folder = _local_folder(model_name_or_path)
    if folder is not None:
        slug, identity = Path(folder).name, None
    else:
        folder = _hub_snapshot(model_name_or_path)
        # The snapshot folder is named by the commit sha: it pins the source without reading the weights.
        slug, identity = model_name_or_path.replace("/", "--"), f"hub:{model_name_or_path}@{Path(folder).name}"
    config_path = Path(folder, "config.json")
    if not config_path.exists():  # a tokenizer-only folder (data prep may name one): nothing to convert
        return folder
    if not fp8.is_fp8_checkpoint(json.loads(config_path.read_text(encoding="utf-8"))):
        return folder
    return fp8.build_bf16_copy(folder, fp8.bf16_copy_path(cache_root, slug, identity or fp8.folder_identity(folder)))


def resolve_model_for_run(
    model_name_or_path: str, cache_root: str, record_path: str, *, wait_timeout_s: float = WAIT_TIMEOUT_S
) -> str:
    """The base model's folder for one training run: resolved once, by global rank 0, and recorded.

    Global rank 0 reuses the record at ``record_path`` when it names ``model_name_or_path`` and its folder
    still exists (a re-run of the job after an eviction: the same base snapshot, no Hub request); otherwise
    it calls ``resolve_model`` and writes the record atomically. Every other rank waits for a record that
    rank 0 would reuse and returns its folder, without resolving anything or contacting the Hub.

    Args:
        model_name_or_path: as for ``resolve_model``.
        cache_root: as for ``resolve_model``.
        record_path: the run's record, ``<output_dir>/base_model.json``, on a volume every rank mounts.
        wait_timeout_s: how long a rank other than 0 waits for rank 0's record.

    Returns:
        The folder, the same on every rank: ``{"model_name_or_path": ..., "path": ...}`` in the record.

    Raises:
        ValueError: as ``resolve_model`` (on rank 0).
        TimeoutError: a rank other than 0 waited ``wait_timeout_s`` for the record.
    """
    if global_rank() == 0:
        folder = _recorded_folder(record_path, model_name_or_path)
        if folder is not None:
            log.info(
                "base model %s: %s, as recorded in %s by an earlier attempt of this run",
                model_name_or_path,
                folder,
                record_path,
            )
            return folder
        folder = os.path.abspath(resolve_model(model_name_or_path, cache_root))
        _write_record(record_path, {"model_name_or_path": model_name_or_path, "path": folder})
        log.info("base model %s: %s (recorded in %s)", model_name_or_path, folder, record_path)
        return folder
    return _wait_for(
        lambda: _recorded_folder(record_path, model_name_or_path),
        time.monotonic() + wait_timeout_s,
        f"{record_path}, the base model {model_name_or_path} global rank 0 resolves and records there",
    )


def _recorded_folder(record_path: str, model_name_or_path: str) -> str | None:
    """The folder the record names for ``model_name_or_path`` while it exists; None for no or a stale record."""
    try:
        record = json.loads(Path(record_path).read_text(encoding="utf-8"))
        if record["model_name_or_path"] != model_name_or_path:
            return None
        folder = record["path"]
    except (OSError, ValueError, TypeError, KeyError):  # absent, unreadable, or not a record
        return None
    # Rank 0 records a folder once complete; one still there is what the run started from (a deleted
    # folder, e.g. a cleaned cache, makes the record stale: rank 0 resolves again).
    return folder if isinstance(folder, str) and Path(folder).is_dir() else None


def _write_record(record_path: str, record: dict) -> None:
    """Write ``record`` as JSON to ``record_path`` atomically: a temporary file beside it, then a rename."""
    parent = Path(record_path).parent
    parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{Path(record_path).name}-", dir=parent)
    try:
        os.fchmod(fd, 0o644)  # mkstemp's 0600 would hide it from ranks running as another user of the group
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(record, f, indent=2)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, record_path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def load_model_config(model_name_or_path: str) -> dict:
    """The ``config.json`` dict of a model reference, without its weights (for memory-fit checks, FLOPs).

    A Hub id reads only ``config.json`` through the HF cache (downloading it if needed). The config is the
    source's as published: an FP8 checkpoint's still carries ``quantization_config``, while training uses
    its bf16 copy, whose shape is the same.
    """
    if _is_builtin(model_name_or_path):
        return tiny.tiny_config(tiny.build_tokenizer()).to_dict()
    folder = _local_folder(model_name_or_path)
    if folder is not None:
        path = Path(folder, "config.json")
        if not path.exists():
            raise ValueError(
                f"model_name_or_path {model_name_or_path!r} has no config.json; point it at a Hugging Face model "
                "folder (config.json + safetensors + tokenizer)"
            )
    else:
        try:
            path = Path(hf_hub_download(model_name_or_path, "config.json"))
        except Exception as e:  # noqa: BLE001 - the Hub's failures become one clear message; others propagate
            _raise_hub_error(model_name_or_path, e)
            raise
    return json.loads(path.read_text(encoding="utf-8"))


def _is_builtin(ref: str) -> bool:
    """Whether ``ref`` is the built-in tiny model; ValueError for any other ``builtin:`` name."""
    if ref == tiny.TINY_QWEN3:
        return True
    if ref.startswith("builtin:"):
        raise ValueError(f"model_name_or_path {ref!r} is not a built-in model; the only one is {tiny.TINY_QWEN3!r}")
    return False


def _local_folder(ref: str) -> str | None:
    """The folder ``ref`` names, None when ``ref`` is a Hub id; ValueError when it is neither."""
    path = Path(ref).expanduser()
    if path.is_dir():
        return str(path)
    if path.exists():
        raise ValueError(f"model_name_or_path {ref!r} is a file; name the model's folder or a Hub id (org/name)")
    if path.is_absolute() or ref.startswith((".", "~")):
        raise ValueError(
            f"model_name_or_path {ref!r}: no such folder; mount the volume that holds it, or name a Hub id (org/name)"
        )
    try:
        validate_repo_id(ref)
    except HFValidationError as e:
        raise ValueError(
            f"model_name_or_path {ref!r} is neither a folder nor a Hugging Face Hub id; name a mounted folder or "
            f"a Hub id such as 'Qwen/Qwen3-30B-A3B-Thinking-2507-FP8' ({e})"
        ) from e
    return None


def _hub_snapshot(repo_id: str) -> str:
    """The HF-cache snapshot folder of ``repo_id`` holding ``MODEL_FILES``, downloading what is missing."""
    try:
        return snapshot_download(repo_id, allow_patterns=MODEL_FILES)
    except Exception as e:  # noqa: BLE001 - the Hub's failures become one clear message; others propagate
        _raise_hub_error(repo_id, e)
        raise


def _raise_hub_error(repo_id: str, error: Exception) -> None:
    """Raise one clear ValueError for the ways a Hub id fails to resolve; return for any other error."""
    if isinstance(error, GatedRepoError):
        raise ValueError(
            f"model_name_or_path {repo_id!r} is gated on the Hugging Face Hub and HF_TOKEN has no access; accept "
            "its terms on the Hub with the token's account and pass that token's Secret"
        ) from error
    if isinstance(error, RepositoryNotFoundError):
        raise ValueError(
            f"model_name_or_path {repo_id!r} was not found on the Hugging Face Hub (or is private and HF_TOKEN "
            "cannot read it); check the id, or pass a token Secret that can read it"
        ) from error
    if isinstance(error, (LocalEntryNotFoundError, OfflineModeIsEnabled)) and constants.is_offline_mode():
        raise ValueError(
            f"model_name_or_path {repo_id!r} is not (completely) in the Hugging Face cache {constants.HF_HUB_CACHE} "
            f"and HF_HUB_OFFLINE=1 forbids downloading it; download it into that cache first "
            f"(HF_HOME={constants.HF_HOME} hf download {repo_id}) or unset HF_HUB_OFFLINE"
        ) from error
    if isinstance(error, LocalEntryNotFoundError):  # what snapshot_download raises when the Hub is unreachable
        raise ValueError(
            f"model_name_or_path {repo_id!r} is not in the Hugging Face cache {constants.HF_HUB_CACHE} and the Hub "
            "could not be reached to download it; check the network (HF_ENDPOINT, proxy) or pre-download it "
            "into that cache"
        ) from error


def _wait_for(ready, deadline: float, what: str):
    """Poll ``ready()`` until it returns a value; TimeoutError naming ``what`` at ``deadline``."""
    started = last_log = time.monotonic()
    while True:
        value = ready()
        if value is not None:
            return value
        now = time.monotonic()
        if now >= deadline:
            raise TimeoutError(
                f"rank {global_rank()} waited {now - started:.0f} s for {what}, and it did not appear; read rank "
                "0's log for its error, and check that every pod mounts the same volumes at the same paths"
            )
        if now - last_log >= 60:
            log.info("rank %d waiting for %s (%.0f s)", global_rank(), what, now - started)
            last_log = now
        interval = FIRST_POLL_S if now - started < FIRST_POLLS_FOR_S else POLL_S
        time.sleep(min(interval, max(deadline - now, 0.01)))
