"""validate_inputs: the pipeline's first task. Fails the run with one clear message before any GPU is requested."""

from kfp import dsl

from components.version import COMPONENTS_IMAGE


@dsl.component(base_image=COMPONENTS_IMAGE, install_kfp_package=False)
def validate_inputs(
    model_name_or_path: str,
    dataset_source: str,
    dataset_format: str,
    over_length: str,
    num_proc: int,
    max_seq_length: int,
    eval_size: float,
    method: str,
    num_nodes: int,
    gpus_per_node: int,
    per_device_train_batch_size: int,
    gradient_accumulation_steps: int,
    learning_rate: float,
    num_train_epochs: float,
    max_steps: int,
    warmup_ratio: float,
    deepspeed_config: str,
    save_steps: int,
    save_total_limit: int,
    gpu_memory_gib: float,
    train_backend: str,
    data_pvc: str,
    model_pvc: str,
    hf_token_secret: str,
    node_selector: dict,
    tolerations: list,
    job_cleanup: str,
    active_deadline_seconds: int,
    queue_name: str,
    priority_class: str,
    gang_scheduling: bool,
    min_nodes: int,
    max_restarts: int,
    job_restarts: int,
    pending_timeout_seconds: int,
    eval_gpus: int,
    min_loss_improvement: float,
    deploy_backend: str,
    serving_name: str,
    serving_gpus: int,
    max_model_len: int,
    max_new_tokens: int,
    lm_eval_tasks: list,
    deployment_mode: str,
    canary_traffic_percent: int,
):
    """Check the run's parameters and the cluster, and fail with every problem listed, each naming the fix.

    The parameter checks also run in ``python -m pipelines.run`` before a run is submitted; this task
    repeats them because runs started from the KFP UI or a schedule never pass through the CLI. On a
    cluster (``train_backend`` other than ``local``) it then runs the preflight: the job and
    InferenceService APIs are installed, both claims exist, are Bound and ReadWriteMany, the token
    Secret has its key, the runner's service account may do what the steps do, and enough GPU nodes
    match the node selector. All of it before any GPU is requested.

    Args:
        model_name_or_path: Hugging Face Hub id, mounted folder, or ``builtin:tiny-qwen3``.
        dataset_source: comma-separated sources: ``builtin:sample``, files/folders/globs (JSONL, JSON,
            Parquet, CSV, saved Arrow) on a mounted volume, ``pvc://claim/path``, ``hf://...`` or Hub ids
            (``org/name?config=C&split=S&revision=R``).
        dataset_format: ``auto`` or one of messages, sharegpt, alpaca, prompt_completion, text, preference.
        over_length: ``drop`` or ``truncate`` examples longer than max_seq_length.
        num_proc: tokenisation processes in prepare_dataset.
        max_seq_length: tokens per training row.
        eval_size: held-out fraction (< 1) or conversation count (>= 1).
        method: ``full``, ``lora`` or ``qlora``.
        num_nodes: training nodes (PyTorchJob Master + Workers).
        gpus_per_node: GPUs per training node (torchrun processes per node; CPU processes locally).
        per_device_train_batch_size: rows per GPU per step.
        gradient_accumulation_steps: steps per optimizer update.
        learning_rate: peak learning rate.
        num_train_epochs: passes over the training split.
        max_steps: stop after this many optimizer steps; -1 runs all epochs.
        warmup_ratio: fraction of steps of linear warm-up.
        deepspeed_config: ``zero3``, ``zero2``, ``none`` or a JSON path in the trainer image.
        save_steps: checkpoint every this many optimizer steps.
        save_total_limit: complete checkpoints kept.
        gpu_memory_gib: memory per GPU, for the memory-fit estimate (parameters, ZeRO stage, sequence
            length, micro-batch): a job that cannot fit fails here, naming the knob to change.
        train_backend: ``pytorchjob``, ``trainjob`` (cluster) or ``local`` (torchrun subprocess).
        data_pvc: ReadWriteMany claim for datasets and caches.
        model_pvc: ReadWriteMany claim for checkpoints and the final model.
        hf_token_secret: Secret (key ``HF_TOKEN``) with a Hugging Face token; optional.
        node_selector: node labels of the GPU pods (checked against the cluster's nodes).
        tolerations: tolerations of the GPU pods (checked against the nodes' taints).
        job_cleanup: ``keep``, ``on-success`` or ``always``.
        active_deadline_seconds: training job deadline; 0 for none.
        queue_name: Kueue LocalQueue; empty for none.
        priority_class: PriorityClass of the training pods; empty for none.
        gang_scheduling: schedule all training pods together.
        min_nodes: elastic lower bound; 0 for a fixed-size job.
        max_restarts: elastic restarts.
        job_restarts: re-runs of a job that failed for a retriable cause (eviction, preemption, lost node, NCCL).
        pending_timeout_seconds: how long a job's pod may stay unschedulable before the step fails.
        eval_gpus: GPUs for the evaluation pod.
        min_loss_improvement: relative eval-loss improvement required to deploy.
        deploy_backend: ``kserve-vllm``, ``kserve-huggingface`` or ``local``.
        serving_name: InferenceService name.
        serving_gpus: GPUs per serving replica (vLLM tensor-parallel size).
        max_model_len: serving context length.
        max_new_tokens: generation length of the evaluation's side-by-side answers.
        lm_eval_tasks: lm-evaluation-harness task names (empty: none).
        deployment_mode: KServe ``Standard`` (Deployment) or ``Knative``.
        canary_traffic_percent: Knative only: share of traffic for the new revision (0: all).
    """
    params = dict(locals())  # every argument, taken before anything else binds a local name
    import logging

    from components.validate.checks import check_parameters

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    log = logging.getLogger("validate_inputs")
    errors = check_parameters(params)
    if errors:
        raise ValueError("invalid parameters: " + "; ".join(errors))
    log.info("parameters are valid: %s", params)
    if train_backend != "local":
        from components.validate.preflight import preflight

        problems = preflight(params)
        if problems:
            raise ValueError("cluster preflight: " + "; ".join(problems))
        log.info("cluster preflight passed")
