"""train_model as a KFP component: the launcher that runs the trainer and reports the model."""

from typing import NamedTuple

from kfp import dsl
from kfp.dsl import Dataset, Input, Model, Output

from components.version import COMPONENTS_IMAGE


@dsl.component(base_image=COMPONENTS_IMAGE, install_kfp_package=False)
def train_model(
    dataset: Input[Dataset],
    settings: dict,
    data_root: str,
    model_root: str,
    run_id: str,
    model: Output[Model],
) -> NamedTuple("TrainOutputs", [("model_uri", str), ("job_name", str)]):
    """Fine-tune the base model on the prepared dataset and record where the result is.

    With ``train_backend=pytorchjob`` (or ``trainjob``, Trainer v2) this small CPU pod writes the trainer
    config to the model volume, creates the job (``num_nodes`` pods of ``gpus_per_node`` GPUs) running
    ``torchrun -m components.train.sft``, follows it to the end and fails with the job's reason; a retried
    pod re-attaches to the job instead of creating a second one, and cancelling the run deletes it. A job that
    failed for a retriable cause (pod evicted or preempted, node lost, rendezvous/NCCL failure) is created again
    up to ``job_restarts`` times and resumes from its last complete checkpoint; deterministic failures (OOMKilled,
    config errors, image errors) fail the step at once. With ``local`` it runs the same entry point under
    ``torchrun --nproc_per_node gpus_per_node`` here.

    Args:
        dataset: prepare_dataset's output (its metadata names the folder on the data volume).
        settings: every setting, as validate_inputs resolved them (components/settings.py): the train settings
            go into the trainer config (build_trainer_config), the cluster settings shape the job.
        data_root: where the data volume is mounted in this step.
        model_root: where the model volume is mounted in this step.
        run_id: the KFP run id; names the job and scopes the output folder.

    Returns:
        model: metadata ``pvc``, ``path`` and ``uri`` (``pvc://claim/.../final``) and the trainer's metrics.
        model_uri: the same ``pvc://`` URI (or local path) as a parameter.
        job_name: the PyTorchJob's name (empty for local runs).
    """
    import json
    import logging
    import os
    from collections import namedtuple

    import torch

    from components.paths import DATA_MOUNT, MODEL_MOUNT, pvc_uri, run_dir
    from components.settings import Settings
    from components.train.config import build_trainer_config, write_trainer_config

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    s = Settings.from_flat(settings)
    local = s.cluster.train_backend == "local"
    # Paths as the trainer sees them: the job's pods mount the claims at the standard mounts.
    pod_data, pod_models = (data_root, model_root) if local else (DATA_MOUNT, MODEL_MOUNT)
    out_dir = os.path.join(run_dir(model_root, run_id), "train")
    cfg = build_trainer_config(
        s.train,
        dataset_path=dataset.metadata["path"].replace(data_root, pod_data, 1),
        output_dir=out_dir.replace(model_root, pod_models, 1),
        packing=dataset.metadata.get("packing", True),
        use_cpu=local and not torch.cuda.is_available(),
        model_cache_dir=os.path.join(pod_data, "cache"),
    )
    config_path = write_trainer_config(cfg, os.path.join(out_dir, "train_config.json"))
    job_name = ""
    if local:
        from components.train.local import run_torchrun

        run_torchrun(config_path, s.cluster.gpus_per_node)
    else:
        from components.kube import current_namespace
        from components.train.launch import run_training_job, training_job_for_run
        from components.train.pytorchjob import job_name_for

        job_name = job_name_for(run_id)
        manifest = training_job_for_run(
            s.cluster, run_id=run_id, namespace=current_namespace(),
            config_path=config_path.replace(model_root, MODEL_MOUNT, 1),
        )

        def record(job: dict) -> None:
            # KFP uploads outputs only when the step returns: the job's identity goes to the volume now.
            with open(os.path.join(out_dir, f"{job['kind'].lower()}.json"), "w") as f:
                json.dump(job, f, indent=2)
            logging.getLogger("train_model").info(
                "%s %s/%s uid %s", job["kind"], job["metadata"]["namespace"], job["metadata"]["name"],
                job["metadata"].get("uid", "?"))

        run_training_job(manifest, cleanup=s.cluster.job_cleanup, on_created=record,
                         job_restarts=s.cluster.job_restarts, pending_timeout_seconds=s.cluster.pending_timeout_seconds)

    final_dir = os.path.join(out_dir, "final")
    uri = final_dir if local else pvc_uri(s.cluster.model_pvc, model_root, final_dir)
    with open(os.path.join(out_dir, "metrics.json")) as f:
        metrics = json.load(f)
    model.metadata.update({"pvc": s.cluster.model_pvc, "path": final_dir, "uri": uri,
                           "base_model": s.train.model_name_or_path, "method": s.train.method, "job_name": job_name, **metrics})
    return namedtuple("TrainOutputs", ["model_uri", "job_name"])(uri, job_name)
