"""Setting up training from a KFP step, the same for the train step and the hyper-parameter search.

Both write a trainer config beside their output and, on a cluster, render the job that runs it: train_model one
job per stage (components/train/launcher/run.py), search_hyperparameters the job every Katib trial runs
(components/hpo/search.py). What they share is here, once:

- paths: the step sees the volumes at ``data_root`` and ``model_root``; the job's pods mount the claims at
  ``DATA_MOUNT`` and ``MODEL_MOUNT``, a local torchrun sees what the step sees (``TrainerMounts``);
- the config: trained on CPU processes only where this machine runs it (``local``) and has no CUDA GPU;
- the job: rendered for the Trainer release the cluster has installed (a TrainJob's pod patch differs between
  releases, and the API server would silently drop the one the cluster lacks);
- the created object's identity (PyTorchJob, TrainJob or Katib Experiment), written to the volume at once
  (``record_created``): KFP uploads a step's outputs only when it returns.

No ML library and no Kubernetes client at import: the backends' modules are imported when used.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass

from components.paths import DATA_CACHE, DATA_MOUNT, MODEL_MOUNT
from components.settings import (
    JobSettings,
    NetworkSettings,
    ObservabilitySettings,
    SchedulingSettings,
    StorageSettings,
    TrainerSettings,
)


@dataclass(frozen=True)
class TrainerMounts:
    """Where the volumes are mounted in this step (``data_root``, ``model_root``) and where the trainer's processes
    see them: the standard mounts in a job's pods, the same paths for a local torchrun (``local``)."""

    data_root: str
    model_root: str
    local: bool

    @classmethod
    def for_backend(cls, data_root: str, model_root: str, train_backend: str) -> TrainerMounts:
        return cls(data_root, model_root, train_backend == "local")

    @property
    def data(self) -> str:
        """The data volume as the trainer sees it."""
        return self.data_root if self.local else DATA_MOUNT

    @property
    def models(self) -> str:
        """The model volume as the trainer sees it."""
        return self.model_root if self.local else MODEL_MOUNT

    def for_trainer(self, path: str) -> str:
        """``path``, on a volume as this step sees it, as the trainer sees it; a path on neither volume (a Hub id,
        a ``builtin:`` model) unchanged."""
        mounts = sorted(((self.data_root, self.data), (self.model_root, self.models)), key=lambda m: -len(m[0]))
        for root, mount in mounts:
            root = root.rstrip("/")
            if path == root or path.startswith(root + "/"):
                return mount + path[len(root) :]
        return path


def trains_on_cpu(local: bool) -> bool:
    """Whether the trainer runs as CPU processes (gloo, fp32): a local run on a machine without a CUDA GPU. A job's
    pods have theirs."""
    from components.train.launcher.local_torchrun import cuda_available

    return local and not cuda_available()


def write_config(
    trainer: TrainerSettings,
    *,
    stage: str,
    dataset_path: str,
    packing: bool,
    out_dir: str,
    mounts: TrainerMounts,
) -> tuple[dict, str]:
    """The trainer config of ``trainer`` (the stage's settings) for ``stage`` on the prepared dataset at
    ``dataset_path`` (``packing``: its rows are packed), writing to ``out_dir``, with every path as the trainer sees
    it; written to ``<out_dir>/train_config.json``. Returns the config and that file's path as this step sees it."""
    from components.train import config

    cfg = config.build_trainer_config(
        trainer,
        stage=stage,
        dataset_path=mounts.for_trainer(dataset_path),
        output_dir=mounts.for_trainer(out_dir),
        packing=packing,
        use_cpu=trains_on_cpu(mounts.local),
        model_cache_dir=os.path.join(mounts.data, DATA_CACHE),
    )
    # The training pods mount the data volume read-only but for this folder, whose mount point must exist there.
    os.makedirs(os.path.join(mounts.data_root, DATA_CACHE), exist_ok=True)
    return cfg, config.write_trainer_config(cfg, os.path.join(out_dir, "train_config.json"))


def cluster_trainer_version(train_backend: str) -> str | None:
    """The Trainer release a TrainJob is rendered for, read from the cluster (``trainjob``; None for the other
    backends). Read in the launcher pod, once before the job (or the Experiment whose trials create it) exists."""
    if train_backend != "trainjob":
        return None
    from components.train.launcher import trainjob

    return trainjob.installed_trainer_version()


def cluster_job(
    job: JobSettings,
    scheduling: SchedulingSettings,
    network: NetworkSettings,
    storage: StorageSettings,
    observability: ObservabilitySettings,
    *,
    run_id: str,
    namespace: str,
    config_path: str,
    stage: str,
    mounts: TrainerMounts,
) -> dict:
    """The PyTorchJob or TrainJob (``train_backend``) that trains with the config at ``config_path`` (as this step
    sees it), rendered for the cluster's Trainer release."""
    from components.train.launcher.job import training_job_for_run

    return training_job_for_run(
        job,
        scheduling,
        network,
        storage,
        observability,
        run_id=run_id,
        namespace=namespace,
        config_path=mounts.for_trainer(config_path),
        stage=stage,
        trainer_version=cluster_trainer_version(job.train_backend),
    )


def record_created(folder: str, log: logging.Logger) -> Callable[[dict], None]:
    """An ``on_created`` callback: writes the object the API server returned to ``<folder>/<kind>.json``
    (``pytorchjob.json``, ``trainjob.json``, ``experiment.json``) and logs its kind, namespace, name and uid."""

    def record(obj: dict) -> None:
        # KFP uploads outputs only when the step returns: the object's identity goes to the volume now.
        with open(os.path.join(folder, f"{obj['kind'].lower()}.json"), "w") as f:
            json.dump(obj, f, indent=2)
        meta = obj.get("metadata") or {}
        log.info(
            "%s %s/%s uid %s", obj["kind"], meta.get("namespace", "?"), meta.get("name", "?"), meta.get("uid", "?")
        )

    return record
