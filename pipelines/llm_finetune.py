"""The LLM fine-tuning pipeline: validate -> prepare -> train -> evaluate -> (gate) -> deploy.

``build_pipeline("cluster")`` is what ``compiled/llm_finetune.yaml`` holds: steps mount the data and
model claims, reference the HF token Secret, and the evaluate step gets GPUs, /dev/shm and node
placement. ``build_pipeline("local", workspace)`` is the same graph with the same components for
kfp.local, the volumes replaced by workspace folders (kfp.local ignores platform settings anyway).
The signature's defaults are the ``qwen3-30b-a3b-full`` preset: the seeds' reference job.
"""



from typing import NamedTuple, Optional

from kfp import dsl, kubernetes
from kfp.dsl import Metrics

from components.data.component import prepare_dataset
from components.deploy.component import deploy_model, skip_deployment
from components.evaluate.component import evaluate_model
from components.paths import DATA_MOUNT, MODEL_MOUNT
from components.train.component import train_model
from components.validate.component import validate_inputs
from components.version import TRAINER_IMAGE

PIPELINE_NAME = "llm-finetune"
HF_TOKEN_KEY = "HF_TOKEN"
SHM_SIZE = "64Gi"

Outputs = NamedTuple(
    "Outputs", [("model_uri", str), ("metrics", Metrics), ("passed", bool), ("reason", str), ("endpoint", str),
                ("smoke_reply", str)]
)


def build_pipeline(target: str = "cluster", workspace: Optional[str] = None):
    """The pipeline function for ``target`` ``"cluster"`` (volumes at /mnt/...) or ``"local"`` (under ``workspace``)."""
    if target == "cluster":
        data_root, model_root = DATA_MOUNT, MODEL_MOUNT
    elif target == "local" and workspace:
        data_root, model_root = f"{workspace}/data", f"{workspace}/models"
    else:
        raise ValueError(f"target {target!r}: use 'cluster', or 'local' with a workspace folder")
    cluster = target == "cluster"

    @dsl.pipeline(name=PIPELINE_NAME, description="Fine-tune an LLM with PyTorchJob, evaluate it, serve it with KServe + vLLM.")
    def llm_finetune(
        model_name_or_path: str = "Qwen/Qwen3-30B-A3B-Thinking-2507-FP8",
        dataset_source: str = "builtin:sample",
        dataset_format: str = "auto",
        column_mapping: dict = {},
        eval_source: str = "",
        max_seq_length: int = 4096,
        over_length: str = "drop",
        packing: bool = True,
        num_proc: int = 8,
        eval_size: float = 0.05,
        method: str = "full",
        num_nodes: int = 2,
        gpus_per_node: int = 8,
        per_device_train_batch_size: int = 1,
        gradient_accumulation_steps: int = 4,
        learning_rate: float = 5e-5,
        num_train_epochs: float = 2.0,
        max_steps: int = -1,
        warmup_ratio: float = 0.03,
        seed: int = 42,
        deepspeed_config: str = "zero3",
        save_steps: int = 200,
        save_total_limit: int = 2,
        gpu_memory_gib: float = 80.0,
        train_backend: str = "pytorchjob",
        trainer_image: str = TRAINER_IMAGE,
        data_pvc: str = "llm-data",
        model_pvc: str = "llm-models",
        hf_token_secret: str = "hf-token",
        node_selector: dict = {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"},
        tolerations: list = [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
        affinity: dict = {},
        job_cleanup: str = "keep",
        active_deadline_seconds: int = 0,
        queue_name: str = "",
        priority_class: str = "",
        gang_scheduling: bool = False,
        min_nodes: int = 0,
        max_restarts: int = 3,
        job_restarts: int = 2,
        pending_timeout_seconds: int = 900,
        eval_gpus: int = 8,
        eval_max_samples: int = 512,
        min_loss_improvement: float = 0.0,
        min_perplexity_improvement: float = 0.0,
        eval_prompts: str = "builtin:sample",
        max_new_tokens: int = 512,
        lm_eval_tasks: list = [],
        max_task_regression: float = 0.01,
        deploy_backend: str = "kserve-vllm",
        serving_name: str = "qwen3-30b-a3b-sft",
        serving_gpus: int = 4,
        max_model_len: int = 8192,
        deployment_mode: str = "Standard",
        canary_traffic_percent: int = 0,
        keep_serving: bool = False,
    ) -> Outputs:
        run_id = dsl.PIPELINE_JOB_ID_PLACEHOLDER

        validate = validate_inputs(
            model_name_or_path=model_name_or_path, dataset_source=dataset_source, dataset_format=dataset_format,
            over_length=over_length, num_proc=num_proc, max_seq_length=max_seq_length,
            eval_size=eval_size, method=method, num_nodes=num_nodes, gpus_per_node=gpus_per_node,
            per_device_train_batch_size=per_device_train_batch_size,
            gradient_accumulation_steps=gradient_accumulation_steps, learning_rate=learning_rate,
            num_train_epochs=num_train_epochs, max_steps=max_steps, warmup_ratio=warmup_ratio,
            deepspeed_config=deepspeed_config, save_steps=save_steps, save_total_limit=save_total_limit,
            gpu_memory_gib=gpu_memory_gib, train_backend=train_backend, data_pvc=data_pvc, model_pvc=model_pvc,
            hf_token_secret=hf_token_secret, node_selector=node_selector, tolerations=tolerations,
            job_cleanup=job_cleanup, active_deadline_seconds=active_deadline_seconds, queue_name=queue_name,
            priority_class=priority_class, gang_scheduling=gang_scheduling, min_nodes=min_nodes,
            max_restarts=max_restarts, job_restarts=job_restarts, pending_timeout_seconds=pending_timeout_seconds,
            eval_gpus=eval_gpus, min_loss_improvement=min_loss_improvement,
            deploy_backend=deploy_backend, serving_name=serving_name, serving_gpus=serving_gpus,
            max_model_len=max_model_len, max_new_tokens=max_new_tokens, lm_eval_tasks=lm_eval_tasks,
            deployment_mode=deployment_mode, canary_traffic_percent=canary_traffic_percent,
        ).set_display_name("Validate inputs").set_caching_options(False)

        prepare = prepare_dataset(
            dataset_source=dataset_source, model_name_or_path=model_name_or_path, max_seq_length=max_seq_length,
            eval_size=eval_size, seed=seed, data_pvc=data_pvc, data_root=data_root, run_id=run_id,
            dataset_format=dataset_format, column_mapping=column_mapping, eval_source=eval_source,
            packing=packing, over_length=over_length, num_proc=num_proc,
        ).after(validate).set_display_name("Prepare dataset").set_caching_options(False)

        train = train_model(
            dataset=prepare.outputs["dataset"], model_name_or_path=model_name_or_path, method=method,
            max_seq_length=max_seq_length, num_nodes=num_nodes, gpus_per_node=gpus_per_node,
            per_device_train_batch_size=per_device_train_batch_size,
            gradient_accumulation_steps=gradient_accumulation_steps, learning_rate=learning_rate,
            num_train_epochs=num_train_epochs, max_steps=max_steps, warmup_ratio=warmup_ratio, seed=seed,
            deepspeed_config=deepspeed_config, save_steps=save_steps, save_total_limit=save_total_limit,
            train_backend=train_backend, trainer_image=trainer_image,
            data_pvc=data_pvc, model_pvc=model_pvc, hf_token_secret=hf_token_secret,
            node_selector=node_selector, tolerations=tolerations, affinity=affinity, job_cleanup=job_cleanup,
            active_deadline_seconds=active_deadline_seconds, queue_name=queue_name, priority_class=priority_class,
            gang_scheduling=gang_scheduling, min_nodes=min_nodes, max_restarts=max_restarts,
            job_restarts=job_restarts, pending_timeout_seconds=pending_timeout_seconds,
            data_root=data_root, model_root=model_root, run_id=run_id,
        ).set_display_name("Train (PyTorchJob / TrainJob)" if cluster else "Train (local torchrun)").set_caching_options(False)

        evaluate = evaluate_model(
            dataset=prepare.outputs["dataset"], model=train.outputs["model"], model_name_or_path=model_name_or_path,
            eval_max_samples=eval_max_samples, min_loss_improvement=min_loss_improvement, data_root=data_root,
            min_perplexity_improvement=min_perplexity_improvement, eval_prompts=eval_prompts,
            max_new_tokens=max_new_tokens, lm_eval_tasks=lm_eval_tasks, max_task_regression=max_task_regression,
        ).set_display_name("Evaluate base vs tuned").set_caching_options(False)

        with dsl.If(evaluate.outputs["passed"] == True, name="evaluation-passed"):  # noqa: E712 (a KFP condition)
            deploy = deploy_model(
                model=train.outputs["model"], deploy_backend=deploy_backend, serving_name=serving_name,
                serving_gpus=serving_gpus, max_model_len=max_model_len, keep_serving=keep_serving,
                node_selector=node_selector, tolerations=tolerations, run_id=run_id,
                deployment_mode=deployment_mode, canary_traffic_percent=canary_traffic_percent,
            ).set_display_name("Deploy (KServe + vLLM)" if cluster else "Deploy (local server)").set_caching_options(False)
        with dsl.Else(name="evaluation-not-passed"):
            skipped = skip_deployment(reason=evaluate.outputs["reason"]).set_display_name("Skip deployment")

        if cluster:
            _attach_cluster_resources(prepare, train, evaluate, data_pvc, model_pvc, hf_token_secret,
                                      node_selector, tolerations, eval_gpus)

        return Outputs(
            model_uri=train.outputs["model_uri"],
            metrics=evaluate.outputs["metrics"],
            passed=evaluate.outputs["passed"],
            reason=evaluate.outputs["reason"],
            endpoint=dsl.OneOf(deploy.outputs["endpoint"], skipped.output),
            smoke_reply=dsl.OneOf(deploy.outputs["smoke_reply"], skipped.output),
        )

    return llm_finetune


def _attach_cluster_resources(prepare, train, evaluate, data_pvc, model_pvc, hf_token_secret,
                              node_selector, tolerations, eval_gpus) -> None:
    """Volumes, the HF token reference, GPUs and placement: what the steps need on Kubernetes."""
    for task in (prepare, train, evaluate):
        kubernetes.mount_pvc(task, pvc_name=data_pvc, mount_path=DATA_MOUNT)
    for task in (train, evaluate):
        kubernetes.mount_pvc(task, pvc_name=model_pvc, mount_path=MODEL_MOUNT)
    for task in (prepare, evaluate):
        # optional: public models and datasets need no token, and the pod must start without the Secret.
        kubernetes.use_secret_as_env(task, secret_name=hf_token_secret, secret_key_to_env={HF_TOKEN_KEY: "HF_TOKEN"},
                                     optional=True)
        # Hub downloads land on the data volume once, not in every pod's ephemeral storage.
        task.set_env_variable("HF_HOME", f"{DATA_MOUNT}/cache/huggingface")
    # Tokenisation runs num_proc processes: give the data step the CPUs for them.
    prepare.set_cpu_request("8").set_memory_request("32G")
    evaluate.set_accelerator_type("nvidia.com/gpu").set_accelerator_limit(eval_gpus)
    evaluate.set_cpu_request("8").set_memory_request("64G").set_memory_limit("256G")
    kubernetes.empty_dir_mount(evaluate, volume_name="dshm", mount_path="/dev/shm", medium="Memory", size_limit=SHM_SIZE)
    kubernetes.add_node_selector_json(evaluate, node_selector)
    kubernetes.add_toleration_json(evaluate, tolerations)
