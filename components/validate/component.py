"""validate_inputs: the pipeline's first task. Fails the run with one clear message before any GPU is requested.

Written by ``python -m pipelines.compile`` from the settings model (components/settings/): edit the model, not
this file. Its inputs are the pipeline's parameters (the plain settings and ``advanced_settings``); its output is
every setting, resolved and checked: the ``settings`` input of every later step.
"""

from typing import NamedTuple

from kfp import dsl

from components.version import COMPONENTS_IMAGE


@dsl.component(base_image=COMPONENTS_IMAGE, install_kfp_package=False)
def validate_inputs(
    model_name_or_path: str,
    method: str,
    deepspeed_config: str,
    max_seq_length: int,
    per_device_train_batch_size: int,
    gradient_accumulation_steps: int,
    learning_rate: float,
    num_train_epochs: float,
    max_steps: int,
    warmup_ratio: float,
    seed: int,
    save_steps: int,
    save_total_limit: int,
    stages: list,
    cpt_dataset_source: str,
    dpo_dataset_source: str,
    grpo_dataset_source: str,
    variants: list,
    hpo_trials: int,
    dataset_source: str,
    dataset_format: str,
    column_mapping: dict,
    eval_source: str,
    over_length: str,
    packing: bool,
    num_proc: int,
    data_shards: int,
    data_cpu: str,
    data_memory: str,
    eval_size: float,
    train_backend: str,
    num_nodes: int,
    gpus_per_node: int,
    trainer_image: str,
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
    data_pvc: str,
    model_pvc: str,
    hf_token_secret: str,
    langfuse_secret: str,
    alert_webhook_secret: str,
    tensorboard: bool,
    gpu_memory_gib: float,
    eval_gpus: int,
    eval_max_samples: int,
    min_loss_improvement: float,
    min_perplexity_improvement: float,
    eval_prompts: str,
    max_new_tokens: int,
    lm_eval_tasks: list,
    max_task_regression: float,
    judge_endpoint: str,
    judge_api_key_secret: str,
    deploy_backend: str,
    serving_name: str,
    serving_gpus: int,
    max_model_len: int,
    deployment_mode: str,
    canary_traffic_percent: int,
    keep_serving: bool,
    max_ttft_seconds: float,
    min_output_tokens_per_second: float,
    min_replicas: int,
    max_replicas: int,
    advanced_settings: dict,
) -> NamedTuple("ValidateOutputs", [("settings", dict)]):
    """Check the run's settings and the cluster, and fail with every problem listed, each naming the fix.

    The checks also run in ``python -m pipelines.run`` before a run is submitted; this task repeats them because
    runs started from the KFP UI or a schedule never pass through the CLI. On a cluster (``train_backend`` other
    than ``local``) it then runs the preflight: the job and InferenceService APIs are installed, both claims
    exist, are Bound and ReadWriteMany, the token Secret has its key, the runner's service account may do what
    the steps do, and enough GPU nodes match the node selector. All of it before any GPU is requested.

    Args:
        model_name_or_path: Base model: a Hugging Face Hub id, a folder on a mounted volume, or builtin:tiny-qwen3
            (built offline). An FP8 checkpoint is dequantised once into a bf16 copy that every step loads.
        method: Fine-tuning method: full (every weight, DeepSpeed), lora or qlora (PEFT adapters).
        deepspeed_config: DeepSpeed: zero3, zero3_hpz (ZeRO++: gathers within a node), zero2, zero3_offload (shipped
            configs), none (plain DDP) or a .json path on a mounted volume.
        max_seq_length: Tokens per training row; longer examples are dropped or truncated (over_length). Memory
            grows with it.
        per_device_train_batch_size: Rows per GPU per forward pass (the micro-batch). The reference job's 4 x 4096
            tokens: each expert's grouped GEMM sees 4x the rows of a 1-row micro-batch, and ZeRO-3 gathers each
            layer once per 4 rows.
        gradient_accumulation_steps: Micro-batches per optimizer step (global batch = micro-batch x this x GPUs).
        learning_rate: Peak learning rate of the schedule (typical: 1e-5..5e-5 full, 1e-4 LoRA).
        num_train_epochs: Passes over the training split.
        max_steps: Stop after this many optimizer steps; -1 runs every epoch.
        warmup_ratio: Fraction of the steps spent in linear warm-up.
        seed: Seed of the train/eval split and of training.
        save_steps: Checkpoint every this many optimizer steps (a restarted job resumes from the last complete one).
        save_total_limit: Complete checkpoints kept on the model volume.
        stages: Training stages, in order, from cpt (continued pretraining on raw text), sft (supervised fine-
            tuning), dpo (preference tuning), rm (a reward model on dpo_dataset_source's pairs) and grpo
            (reinforcement learning on grpo_dataset_source's prompts); each trains from the previous stage's final
            model (grpo after rm: from the model before rm).
        cpt_dataset_source: cpt stage: raw domain text (a text column), same syntax as dataset_source;
            builtin:domain-text is a bundled sample.
        dpo_dataset_source: dpo and rm stages: preference pairs (prompt, chosen, rejected), same syntax as
            dataset_source; builtin:preference is a bundled sample.
        grpo_dataset_source: grpo stage: prompts (a prompt column, text or turns) with an optional reference answer
            column (answer), same syntax as dataset_source; builtin:arithmetic is a bundled sample.
        variants: Setting overrides, one JSON object per variant, e.g. [{"learning_rate": 1e-5}, {"learning_rate":
            5e-5, "name": "hi-lr"}]: each trains the stage chain in its own folders and jobs ([]: one model). An
            optional "name" (lowercase letters, digits, '-') names its folders, jobs and served model.
        hpo_trials: Hyper-parameter search: short training trials before the sft stage, which then trains with the
            best trial's settings (Katib Experiment on a cluster, Optuna locally); 0 turns it off.
        dataset_source: Training data, comma-separated: builtin:sample, files/folders/globs (JSONL, JSON, Parquet,
            CSV, saved Arrow) on a mounted volume, pvc://claim/path, hf://... or Hub ids
            (org/name?config=C&split=S&revision=R).
        dataset_format: Row format: auto (detected from the columns), messages, sharegpt, alpaca, prompt_completion
            or text (preference, prompt/chosen/rejected pairs, is the dpo and rm stages' format: those go in
            dpo_dataset_source; prompts, a prompt and an optional answer, the grpo stage's: grpo_dataset_source).
        column_mapping: The format's column name -> your column name, e.g. {"messages": "dialog"}.
        eval_source: Take the eval split from this source (same syntax) instead of holding out eval_size; empty:
            hold out.
        over_length: What happens to examples longer than max_seq_length: drop or truncate (the cpt stage's
            documents are cut into max_seq_length chunks instead: cpt_chunk_overlap).
        packing: Pack examples into rows of exactly max_seq_length (position_ids restart per example); false: one
            example per row, padded per batch.
        num_proc: Tokenizer worker processes in each data step's pod; 0: one per CPU the pod may use (data_cpu).
        data_shards: Pods that tokenize the sft and cpt data at once (a ParallelFor, each a slice of the input
            files), before the data step joins their shards, drops duplicates across them and packs; 1: the data
            step alone. Shards are kept by fingerprint: a retry skips the complete ones.
        data_cpu: CPU request of each data step's pod (and each shard's): a Kubernetes quantity.
        data_memory: Memory request of each data step's pod (and each shard's).
        eval_size: Held-out fraction (< 1) or number of conversations (>= 1).
        train_backend: pytorchjob (Training Operator v1), trainjob (Trainer v2) or local (torchrun on this machine).
        num_nodes: Training nodes: pods in the job (1 Master + num_nodes-1 Workers).
        gpus_per_node: GPUs (torchrun processes) per training node; CPU processes locally.
        trainer_image: Image the training job's pods run.
        node_selector: Node labels of the GPU pods (training, evaluation, serving).
        tolerations: Tolerations of the GPU pods (a JSON list).
        affinity: Affinity of the training pods (a JSON object; {} for none).
        job_cleanup: Delete the training job when it ends: keep, on-success or always.
        active_deadline_seconds: Fail the training job after this long; 0 for no deadline.
        queue_name: Kueue LocalQueue of the training job; empty for none.
        priority_class: PriorityClass of the training pods (pytorchjob only); empty for none.
        gang_scheduling: Schedule all training pods together: pytorchjob: Volcano or scheduler-plugins through the
            job's schedulingPolicy; trainjob: the ClusterTrainingRuntime's podGroupPolicy does it, and preflight
            refuses a runtime without one.
        min_nodes: Elastic training down to this many nodes (pytorchjob only); 0 for a fixed size.
        max_restarts: Elastic restarts before the job fails (with min_nodes).
        job_restarts: Re-runs of a job that failed for a retriable cause (eviction, preemption, lost node, NCCL); it
            resumes from its last complete checkpoint. 0: a failed job fails the step at once.
        pending_timeout_seconds: Fail the step when a job's pod stays unschedulable this long (at least 60: an
            autoscaler needs minutes to add a GPU node).
        data_pvc: ReadWriteMany claim for datasets and caches (mounted at /mnt/data).
        model_pvc: ReadWriteMany claim for checkpoints and final models (/mnt/models).
        hf_token_secret: Secret with key HF_TOKEN for gated models; referenced, never read (it may be absent).
        langfuse_secret: Secret with keys LANGFUSE_PUBLIC_KEY, LANGFUSE_SECRET_KEY and LANGFUSE_HOST: the trainer
            records the run in Langfuse and evaluation and deployment trace each generation (an optional reference:
            no Secret, no traces).
        alert_webhook_secret: Secret whose key ALERT_WEBHOOK_URL is a Slack-compatible incoming webhook: the run's
            outcome is posted there when it ends (an optional reference: no Secret, no alert).
        tensorboard: Show the run's training curves (pvc://<model_pvc>/runs/<run id>/...): a Kubeflow Tensorboard,
            opened from the dashboard; without Kubeflow's Tensorboard controller a Deployment and Service running
            the trainer image's tensorboard (the train step logs the kubectl port-forward command), deleted when the
            run ends.
        gpu_memory_gib: Memory per GPU, for the memory-fit estimate that fails a job that cannot fit before any GPU
            is requested (80 for H100 80GB).
        eval_gpus: GPUs of the evaluation pod.
        eval_max_samples: Score at most this many held-out rows and examples per lm-eval task (0 = all); bounds the
            step's time.
        min_loss_improvement: Relative eval-loss improvement required to deploy (0.0: any improvement).
        min_perplexity_improvement: Relative perplexity improvement required to deploy (0.0: no worse).
        eval_prompts: Prompts answered side by side by base and tuned model: builtin:sample or a JSONL file of
            {"messages": [...]} conversations ending with a user turn.
        max_new_tokens: Length limit of each side-by-side answer (a thinking model needs 512 or more to get past its
            reasoning).
        lm_eval_tasks: lm-evaluation-harness task names, e.g. ["arc_easy"] (empty: none; needs lm-eval in the
            image).
        max_task_regression: Largest drop of an lm-eval task's score (absolute, 0..1) that still passes.
        judge_endpoint: Judged evaluation: the judge model's OpenAI-compatible endpoint that scores base and tuned
            answers to eval_prompts on judge_rubric: served-base (the run's base model on the local server; local
            runs), an InferenceService name in the run's namespace, or an http(s) URL up to /v1; empty: not judged.
        judge_api_key_secret: Secret whose key JUDGE_API_KEY is judge_endpoint's API key, sent as a bearer token (an
            optional reference: no Secret, no key; a local run reads JUDGE_API_KEY from its environment).
        deploy_backend: kserve-vllm, kserve-huggingface or local (a local server for a local run).
        serving_name: InferenceService name (DNS-1035), also the served model name.
        serving_gpus: GPUs per serving replica (vLLM's tensor-parallel size).
        max_model_len: Context length the server accepts (at least max_seq_length).
        deployment_mode: KServe's Standard (Deployment) or Knative (revisions, canary).
        canary_traffic_percent: Knative only: share of traffic for the new revision (0: all at once).
        keep_serving: Local runs: leave the model server running after the smoke test.
        max_ttft_seconds: Pre-deploy latency gate: the longest median time to first token (s) of a few concurrent
            streamed requests; 0: measured, not gated.
        min_output_tokens_per_second: Pre-deploy latency gate: the fewest output tokens per second the server
            streams over those requests together; 0: measured, not gated.
        min_replicas: KServe: fewest predictor replicas (0: scale to zero, Knative only).
        max_replicas: KServe: most predictor replicas the autoscaler may run (at least min_replicas).
        advanced_settings: Any other setting by name, as a JSON object, e.g. {"lora_r": 32}: lora_r, lora_alpha,
            lora_dropout, lora_target_modules, merge_lora, parallelism, activation_checkpointing,
            recompute_every_n_layers, liger_kernels, moe_experts_implementation, attn_implementation,
            chunked_cross_entropy, router_aux_loss_coef, lr_scheduler_type, weight_decay, max_grad_norm, eval_steps,
            early_stopping_patience, early_stopping_min_delta, logging_steps, report_to, dpo_beta, grpo_rewards,
            grpo_answer_pattern, grpo_length_budget, grpo_reward_model, grpo_reward_function, grpo_num_generations,
            grpo_max_completion_length, grpo_beta, grpo_temperature, grpo_generation_backend, grpo_vllm_server_url,
            grpo_weight_sync_steps, grpo_column_mapping, stage_settings, variants_parallel, deploy_variants,
            hpo_search_space, hpo_parallel_trials, hpo_max_failed_trials, hpo_algorithm, hpo_trial_steps,
            cpt_chunk_overlap, near_dedup_threshold, filter_min_chars, filter_max_chars,
            filter_max_duplicate_line_fraction, filter_max_top_ngram_fraction, filter_min_script_fraction,
            filter_scripts, max_bad_rows, dataset_tokens_estimate, grpo_vllm_image, grpo_vllm_server_gpus,
            image_pull_secrets, trainer_cpu_request, trainer_cpu_limit, trainer_memory_request,
            trainer_memory_limit, trainer_shm_size, trainjob_runtime, rdma_resource, rdma_per_pod, ipc_lock,
            nccl_env, http_proxy, https_proxy, no_proxy, hf_endpoint, model_store_uri, model_store_endpoint,
            model_store_secret, upload_checkpoints, tracking_secret, stall_timeout_seconds, metrics_port,
            prometheus_url, gpu_util_threshold, gpu_util_window_seconds, achieved_tflops_per_gpu,
            intra_node_gb_per_s, inter_node_gb_per_s, tcp_node_gb_per_s, min_reward_improvement, judge_model,
            judge_rubric, judge_max_tokens, min_judge_score, min_judge_win_rate, min_judged_fraction,
            serving_service_account, scale_metric, scale_target, model_registry_url, model_registry_model_name,
            hub_repo_id, hub_token_secret, hub_private, hub_endpoint. python -m pipelines.run --help describes each.

    Returns:
        settings: every setting by name, resolved (defaults filled in, advanced_settings merged) and checked.
    """
    arguments = dict(locals())  # every argument, taken before anything else binds a local name
    from components.validate.checks import validate

    return validate(arguments)
