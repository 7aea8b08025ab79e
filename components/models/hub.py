"""Turning a model reference into a local folder: the built-in tiny model, a mounted folder, or a Hub id.

Every caller (data prep, the trainer, evaluation) gets a folder ``from_pretrained`` loads without a network:

- ``builtin:tiny-qwen3``: built offline into the cache (``components.models.tiny``).
- a local or mounted folder: used where it is.
- a Hugging Face Hub id (``Qwen/Qwen3-30B-A3B-Thinking-2507-FP8``): the files training needs, from the HF
  cache (``snapshot_download``: honours HF_HOME, HF_HUB_OFFLINE and HF_TOKEN); downloaded when missing.

An FP8 checkpoint, by Hub id or folder, resolves to its bf16 copy (``components.models.fp8``): loading the FP8
original dequantised bypasses ZeRO-3 partitioning. In a multi-rank job only global rank 0 (env ``RANK``,
absent = 0) downloads and builds; the other ranks wait for its finished folders on the shared volume. No
process group exists yet when the model is resolved, and a barrier would hit the NCCL timeout while rank 0
writes 60 GB.
"""

from __future__ import annotations

import json
import logging
import os
import time
from pathlib import Path

from components.models import fp8

log = logging.getLogger(__name__)

# What the trainer, evaluation and serving read; the Hub repo's other files (original/ weights, images,
# other formats) are never downloaded.
MODEL_FILES = ["config.json", "*.safetensors", "*.safetensors.index.json", *fp8.TOKENIZER_AND_GENERATION_FILES]
# How long ranks other than 0 wait for rank 0 to download (30 GB) and build (60 GB) the model.
WAIT_TIMEOUT_S = 4 * 3600
POLL_S = 5.0


def global_rank() -> int:
    """This process's global rank in a torchrun job (env ``RANK``); 0 outside one."""
    return int(os.environ.get("RANK", "0"))


def resolve_model(model_name_or_path: str, cache_root: str, *, wait_timeout_s: float = WAIT_TIMEOUT_S) -> str:
    """Return a local folder holding ``model_name_or_path``, ready for ``from_pretrained``.

    Args:
        model_name_or_path: ``builtin:tiny-qwen3``, a local/mounted folder, or a Hugging Face Hub id.
        cache_root: where built models live (``<cache_root>/models/...``): the tiny model and the bf16
            copies of FP8 checkpoints. On the cluster, the data volume's cache folder, shared by every step.
        wait_timeout_s: how long a rank other than 0 waits for rank 0's download and bf16 copy.

    Returns:
        The folder; for an FP8 checkpoint, its bf16 copy ``<cache_root>/models/<slug>-bf16-<fingerprint>``.

    Raises:
        ValueError: an unknown built-in, a missing folder, a Hub id that is not in the cache while
            HF_HUB_OFFLINE=1, or one the Hub does not have (or HF_TOKEN cannot read).
        TimeoutError: a rank other than 0 waited ``wait_timeout_s`` for rank 0's folder.
    """
    from components.models import tiny

    if model_name_or_path == tiny.TINY_QWEN3:
        return tiny.materialize(cache_root)
    if model_name_or_path.startswith("builtin:"):
        raise ValueError(
            f"model_name_or_path {model_name_or_path!r} is not a built-in model; the only one is {tiny.TINY_QWEN3!r}"
        )
    deadline = time.monotonic() + wait_timeout_s
    folder = _local_folder(model_name_or_path)
    if folder is not None:
        slug, identity = Path(folder).name, None
    else:
        folder = _hub_snapshot(model_name_or_path, deadline)
        # The snapshot folder is named by the commit sha: it pins the source without reading the weights.
        slug, identity = model_name_or_path.replace("/", "--"), f"hub:{model_name_or_path}@{Path(folder).name}"
    config_path = Path(folder, "config.json")
    if not config_path.exists():  # a tokenizer-only folder (data prep may name one): nothing to convert
        return folder
    if not fp8.is_fp8_checkpoint(json.loads(config_path.read_text(encoding="utf-8"))):
        return folder
    target = fp8.bf16_copy_path(cache_root, slug, identity or fp8.folder_identity(folder))
    if global_rank() == 0:
        return fp8.build_bf16_copy(folder, target)
    return _wait_for(lambda: target if Path(target, "config.json").exists() else None, deadline,
                     f"the bf16 copy {target} of {model_name_or_path}")


def load_model_config(model_name_or_path: str) -> dict:
    """The ``config.json`` dict of a model reference, without its weights (for memory-fit checks, FLOPs).

    A Hub id reads only ``config.json`` through the HF cache (downloading it if needed). The config is the
    source's as published: an FP8 checkpoint's still carries ``quantization_config``, while training uses
    its bf16 copy, whose shape is the same.
    """
    from components.models import tiny

    if model_name_or_path == tiny.TINY_QWEN3:
        return tiny.tiny_config(tiny.build_tokenizer()).to_dict()
    if model_name_or_path.startswith("builtin:"):
        raise ValueError(
            f"model_name_or_path {model_name_or_path!r} is not a built-in model; the only one is {tiny.TINY_QWEN3!r}"
        )
    folder = _local_folder(model_name_or_path)
    if folder is not None:
        path = Path(folder, "config.json")
        if not path.exists():
            raise ValueError(
                f"model_name_or_path {model_name_or_path!r} has no config.json; point it at a Hugging Face model "
                "folder (config.json + safetensors + tokenizer)"
            )
    else:
        from huggingface_hub import hf_hub_download

        try:
            path = Path(hf_hub_download(model_name_or_path, "config.json"))
        except Exception as e:  # noqa: BLE001 - the Hub's failures become one clear message; others propagate
            _raise_hub_error(model_name_or_path, e)
            raise
    return json.loads(path.read_text(encoding="utf-8"))


def _local_folder(ref: str) -> str | None:
    """The folder ``ref`` names, None when ``ref`` is a Hub id; ValueError when it is neither."""
    from huggingface_hub.utils import HFValidationError, validate_repo_id

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


def _hub_snapshot(repo_id: str, deadline: float) -> str:
    """The HF-cache snapshot folder of ``repo_id`` holding ``MODEL_FILES``; rank 0 downloads what is missing."""
    from huggingface_hub import constants, snapshot_download
    from huggingface_hub.errors import LocalEntryNotFoundError

    try:
        if global_rank() == 0 or constants.is_offline_mode():
            # Offline nobody downloads, so every rank reads the cache at once and fails alike when it is empty.
            return snapshot_download(repo_id, allow_patterns=MODEL_FILES)
        # Online, rank 0 downloads. Wait for the very commit it resolves (an older snapshot may be cached),
        # reading the cache only: snapshot_download checks a cached snapshot against its tree listing.
        from huggingface_hub import HfApi

        commit = HfApi().repo_info(repo_id).sha
    except Exception as e:  # noqa: BLE001 - the Hub's failures become one clear message; others propagate
        _raise_hub_error(repo_id, e)
        raise

    def cached():
        try:
            return snapshot_download(repo_id, revision=commit, allow_patterns=MODEL_FILES, local_files_only=True)
        except LocalEntryNotFoundError:  # not there yet, or partial (IncompleteSnapshotError is one)
            return None

    return _wait_for(cached, deadline, f"the download of {repo_id}@{commit} into the HF cache")


def _raise_hub_error(repo_id: str, error: Exception) -> None:
    """Raise one clear ValueError for the ways a Hub id fails to resolve; return for any other error."""
    from huggingface_hub import constants
    from huggingface_hub.errors import (
        GatedRepoError, LocalEntryNotFoundError, OfflineModeIsEnabled, RepositoryNotFoundError,
    )

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
                f"rank {global_rank()} waited {now - started:.0f} s for {what}, which global rank 0 writes, and it "
                "did not appear; read rank 0's log for its error, and check that every pod mounts the same cache "
                "volume at the same path"
            )
        if now - last_log >= 60:
            log.info("rank %d waiting for %s (%.0f s)", global_rank(), what, now - started)
            last_log = now
        time.sleep(min(POLL_S, max(deadline - now, 0.01)))
