"""The train step's uploads to object storage (``model_store_uri``; the transfers are components/storage/'s).

Who uploads: the train step's own pod (the launcher), which mounts the model claim, after the job succeeded and the
final model is on the claim; not the trainer's rank 0. The GPU pods never hold the store's keys (the launcher reads
``model_store_secret`` through the Kubernetes API, as preflight does), the GPUs are released before the transfer
starts, and an upload cut short is resumed by the step's retry, whatever happened to the job. A local run uploads from
its own process with the environment's credentials.

Where: the model's path on the claim under ``model_store_uri`` (``<uri>/runs/<run id>/<stage folder>/final/``), so the
deploy step finds a served model's copy from its path alone (``store_uri_of``). With ``upload_checkpoints`` each
complete, readable checkpoint goes to ``.../checkpoint-<step>/`` while the job trains (polled every
``CHECKPOINT_POLL_SECONDS``), and once more after it ends: a checkpoint the trainer pruned before it was sent is
skipped with a warning.
"""

from __future__ import annotations

import logging
import os
import threading
from pathlib import Path

from components import storage
from components.models.checkpoint_dirs import _checkpoints, is_complete, unreadable
from components.settings import StorageSettings

log = logging.getLogger("train_model")

CHECKPOINT_POLL_SECONDS = 60.0


def store_uri_of(model_store_uri: str, model_root: str, path: str) -> storage.StoreURI:
    """Where the folder ``path`` on the model claim (mounted at ``model_root``) goes in the store."""
    relative = os.path.relpath(path, model_root)
    if relative.startswith(".."):
        raise ValueError(f"{path} is not under the model volume {model_root}")
    return storage.parse_store_uri(model_store_uri).join(relative)


def store_credentials(store: StorageSettings, *, local: bool) -> dict | None:
    """``model_store_secret``'s keys, read through the Kubernetes API on a cluster; None (boto3's chain: the
    environment, the pod's role) locally or with no Secret named."""
    if local or not store.model_store_secret:
        return None
    from kubernetes import client as k8s

    from components.kube import current_namespace, load_api_client

    core = k8s.CoreV1Api(load_api_client())
    return storage.secret_credentials(core, store.model_store_secret, current_namespace())


def verify_model_folder(folder: str) -> None:
    """The final model is whole before it is sent: a config.json (an adapter-only final/, merge_lora=false: an
    adapter_config.json), and every safetensors and torch file readable to its end (the headers and sizes
    checkpoint_dirs checks); a RuntimeError naming the file otherwise."""
    path = Path(folder)
    if not any((path / name).is_file() for name in ("config.json", "adapter_config.json")):
        raise RuntimeError(f"{folder} has no config.json: the trainer did not write a whole model there")
    if problem := unreadable(path):
        raise RuntimeError(f"{folder} is not a whole model, not uploaded: {problem}")


def upload_model(store: StorageSettings, final_dir: str, *, model_root: str, local: bool) -> str:
    """Verify ``final_dir`` and upload it (resuming an earlier attempt's upload); its store URI."""
    verify_model_folder(final_dir)
    dest = store_uri_of(store.model_store_uri, model_root, final_dir)
    log.info("uploading the model to %s", dest)
    storage.upload_folder(
        dest, final_dir, endpoint=store.model_store_endpoint, credentials=store_credentials(store, local=local)
    )
    return str(dest)


class CheckpointUploads:
    """With ``upload_checkpoints``: while the body runs, a thread uploads each complete, readable checkpoint under
    ``out_dir`` not yet sent; once more when it ends (the job's last checkpoints). Failures only warn: the final
    model's upload is what the step answers for."""

    def __init__(
        self,
        store: StorageSettings,
        out_dir: str,
        *,
        model_root: str,
        local: bool,
        poll: float = CHECKPOINT_POLL_SECONDS,
    ):
        self.store, self.out_dir, self.model_root, self.local, self.poll = store, out_dir, model_root, local, poll
        self.on = bool(store.model_store_uri and store.upload_checkpoints)
        self.sent: dict[str, str] = {}  # checkpoint folder -> its store URI
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def upload_new(self) -> None:
        for _, path in _checkpoints(self.out_dir):
            if str(path) in self.sent or not is_complete(path) or unreadable(path):
                continue
            dest = store_uri_of(self.store.model_store_uri, self.model_root, str(path))
            try:
                storage.upload_folder(
                    dest,
                    str(path),
                    endpoint=self.store.model_store_endpoint,
                    credentials=store_credentials(self.store, local=self.local),
                )
            except Exception as exc:  # pruned while it was sent, the store unreachable for a while: the next pass
                log.warning("checkpoint %s not uploaded (yet): %s", path.name, exc)
                continue
            self.sent[str(path)] = str(dest)

    def _run(self) -> None:
        while not self._stop.wait(self.poll):
            self.upload_new()

    def __enter__(self) -> CheckpointUploads:
        if self.on:
            self._thread = threading.Thread(target=self._run, name="checkpoint-uploads", daemon=True)
            self._thread.start()
        return self

    def __exit__(self, kind, *_) -> None:
        if not self.on:
            return
        self._stop.set()
        if self._thread:
            self._thread.join()
        if kind is None:
            self.upload_new()
