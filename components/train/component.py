"""train_model as a KFP component: the launcher that runs the trainer and reports the model."""

from typing import NamedTuple

from kfp import dsl
from kfp.dsl import Dataset, Input, Model, Output

from components.version import COMPONENTS_IMAGE


@dsl.component(base_image=COMPONENTS_IMAGE, install_kfp_package=False)
def train_model(
    dataset: Input[Dataset],
    model_name_or_path: str,
    method: str,
    max_seq_length: int,
    num_nodes: int,
    gpus_per_node: int,
    per_device_train_batch_size: int,
    gradient_accumulation_steps: int,
    learning_rate: float,
    num_train_epochs: float,
    max_steps: int,
    warmup_ratio: float,
    seed: int,
    deepspeed_config: str,
    save_steps: int,
    save_total_limit: int,
    train_backend: str,
    trainer_image: str,
    data_pvc: str,
    model_pvc: str,
    hf_token_secret: str,
    node_selector: dict,
    tolerations: list,
    affinity: dict,
    job_cleanup: str,
    active_deadline_seconds: int,
    queue_name: str,
    priority_class: str,
    gang_scheduling: bool,
    min_nodes: int,
    max_restarts: int,
    job_restarts: int,
    pending_timeout_seconds: int,
    data_root: str,
    model_root: str,
    run_id: str,
    model: Output[Model],
) -> NamedTuple("TrainOutputs", [("model_uri", str), ("job_name", str)]):
    """Fine-tune the base model on the prepared dataset and record where the result is.

    With ``train_backend=pytorchjob`` (or ``trainjob``, Trainer v2) this small CPU pod writes the trainer
    config to the model volume, creates the job (``num_nodes`` pods of ``gpus_per_node`` GPUs) running
    ``torchrun -m components.train.sft``, follows it to the end and fails with the job's reason; a retried
    pod re-attaches to the job instead of creating a second one, and cancelling the run deletes it. With
    ``local`` it runs the same entry point under ``torchrun --nproc_per_node gpus_per_node`` here.

    Args:
        dataset: prepare_dataset's output (its metadata names the folder on the data volume).
        model_name_or_path: base model: Hub id, mounted folder, or ``builtin:tiny-qwen3``.
        method: ``full`` (DeepSpeed), ``lora`` or ``qlora`` (PEFT).
        max_seq_length: tokens per row (as prepared).
        num_nodes: pods in the job (1 Master + num_nodes-1 Workers).
        gpus_per_node: GPUs (torchrun processes) per pod; CPU processes locally.
        per_device_train_batch_size: rows per process per step.
        gradient_accumulation_steps: steps per optimizer update.
        learning_rate: peak learning rate (cosine schedule).
        num_train_epochs: passes over the data.
        max_steps: optimizer steps; -1 runs all epochs.
        warmup_ratio: fraction of steps of linear warm-up.
        seed: training seed.
        deepspeed_config: ``zero3``, ``zero2``, ``zero3_offload``, ``none`` or a JSON path in the trainer image.
        save_steps: checkpoint every this many optimizer steps (a restarted job resumes from the last one).
        save_total_limit: complete checkpoints kept on the model volume.
        train_backend: ``pytorchjob`` (Training Operator v1), ``trainjob`` (Trainer v2) or ``local``.
        trainer_image: image the job's pods run.
        data_pvc: data claim, mounted by the job's pods.
        model_pvc: model claim, mounted by the job's pods; outputs go under ``runs/<run_id>/train``.
        hf_token_secret: Secret with key ``HF_TOKEN`` for gated models; referenced, never read.
        node_selector: node labels for the job's pods (JSON object).
        tolerations: tolerations for the job's pods (JSON list).
        affinity: affinity for the job's pods (JSON object; {} for none).
        job_cleanup: ``keep``, ``on-success`` or ``always``: delete the job when it ends.
        active_deadline_seconds: fail the job after this long; 0 for no deadline.
        queue_name: Kueue LocalQueue (label ``kueue.x-k8s.io/queue-name``); empty for none.
        priority_class: pods' PriorityClass (PyTorchJob only); empty for none.
        gang_scheduling: all pods scheduled together (``runPolicy.schedulingPolicy``; PyTorchJob only).
        min_nodes: elastic training down to this many nodes (PyTorchJob only); 0 for a fixed size.
        max_restarts: elastic restarts before the job fails (with min_nodes).
        job_restarts: times a job that failed for a retriable cause (pod evicted or preempted, node lost,
            rendezvous/NCCL failure) is deleted and created again; it resumes from its last complete checkpoint.
            Deterministic failures (OOMKilled, config errors, image errors) fail the step at once.
        pending_timeout_seconds: fail the step when a job's pod stays unschedulable this long.
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
    from components.train.config import build_trainer_config, write_trainer_config

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    local = train_backend == "local"
    # Paths as the trainer sees them: the job's pods mount the claims at the standard mounts.
    pod_data, pod_models = (data_root, model_root) if local else (DATA_MOUNT, MODEL_MOUNT)
    out_dir = os.path.join(run_dir(model_root, run_id), "train")
    cfg = build_trainer_config(
        model_name_or_path=model_name_or_path,
        dataset_path=dataset.metadata["path"].replace(data_root, pod_data, 1),
        output_dir=out_dir.replace(model_root, pod_models, 1),
        method=method,
        max_seq_length=max_seq_length,
        per_device_train_batch_size=per_device_train_batch_size,
        gradient_accumulation_steps=gradient_accumulation_steps,
        learning_rate=learning_rate,
        num_train_epochs=num_train_epochs,
        max_steps=max_steps,
        warmup_ratio=warmup_ratio,
        seed=seed,
        deepspeed_config=deepspeed_config,
        save_steps=save_steps,
        save_total_limit=save_total_limit,
        packing=dataset.metadata.get("packing", True),
        use_cpu=local and not torch.cuda.is_available(),
        model_cache_dir=os.path.join(pod_data, "cache"),
    )
    config_path = write_trainer_config(cfg, os.path.join(out_dir, "train_config.json"))
    job_name = ""
    if local:
        from components.train.local import run_torchrun

        run_torchrun(config_path, gpus_per_node)
    else:
        from components.kube import current_namespace
        from components.train.launch import run_training_job, training_job_for_run
        from components.train.pytorchjob import job_name_for

        job_name = job_name_for(run_id)
        manifest = training_job_for_run(
            train_backend=train_backend, affinity=affinity, active_deadline_seconds=active_deadline_seconds,
            queue_name=queue_name, priority_class=priority_class, gang_scheduling=gang_scheduling,
            min_nodes=min_nodes, max_restarts=max_restarts, run_id=run_id, namespace=current_namespace(),
            config_path=config_path.replace(model_root, MODEL_MOUNT, 1), trainer_image=trainer_image,
            num_nodes=num_nodes, gpus_per_node=gpus_per_node, data_pvc=data_pvc, model_pvc=model_pvc,
            hf_token_secret=hf_token_secret, node_selector=node_selector, tolerations=tolerations,
        )

        def record(job: dict) -> None:
            # KFP uploads outputs only when the step returns: the job's identity goes to the volume now.
            with open(os.path.join(out_dir, f"{job['kind'].lower()}.json"), "w") as f:
                json.dump(job, f, indent=2)
            logging.getLogger("train_model").info(
                "%s %s/%s uid %s", job["kind"], job["metadata"]["namespace"], job["metadata"]["name"],
                job["metadata"].get("uid", "?"))

        run_training_job(manifest, cleanup=job_cleanup, on_created=record, job_restarts=job_restarts,
                         pending_timeout_seconds=pending_timeout_seconds)

    final_dir = os.path.join(out_dir, "final")
    uri = final_dir if local else pvc_uri(model_pvc, model_root, final_dir)
    with open(os.path.join(out_dir, "metrics.json")) as f:
        metrics = json.load(f)
    model.metadata.update({"pvc": model_pvc, "path": final_dir, "uri": uri, "base_model": model_name_or_path,
                           "method": method, "job_name": job_name, **metrics})
    return namedtuple("TrainOutputs", ["model_uri", "job_name"])(uri, job_name)
