"""The training job's settings by concern: placement and resources (job), scheduling, network, storage,
observability and the plan's hardware figures."""

from __future__ import annotations

from dataclasses import dataclass

from components.settings.declare import setting
from components.version import TRAINER_IMAGE


@dataclass
class JobSettings:
    """The training job's shape, images and pods: backend, nodes, GPUs, placement and resources."""

    train_backend: str = setting(
        "pytorchjob",
        "pytorchjob (Training Operator v1), trainjob (Trainer v2) or local (torchrun on this machine).",
        choices=("pytorchjob", "trainjob", "local"),
    )
    num_nodes: int = setting(2, "Training nodes: pods in the job (1 Master + num_nodes-1 Workers).", min=1)
    gpus_per_node: int = setting(8, "GPUs (torchrun processes) per training node; CPU processes locally.", min=1)
    trainer_image: str = setting(TRAINER_IMAGE, "Image the training job's pods run.")
    # The grpo stage's generation server (grpo_generation_backend vllm-server with no grpo_vllm_server_url): the
    # train step runs it beside the stage's job (components/train/launcher/generation_server.py, docs/rl.md).
    grpo_vllm_image: str = setting(
        "vllm/vllm-openai:v0.32.0",
        "grpo stage, grpo_generation_backend vllm-server with no grpo_vllm_server_url: image of the vLLM server the "
        "train step runs beside the stage's job (vLLM's OpenAI server; the weight-sync engine targets 0.32's RL "
        "routes).",
        plain=False,
    )
    grpo_vllm_server_gpus: int = setting(
        1,
        "grpo stage, grpo_generation_backend vllm-server with no grpo_vllm_server_url: GPUs of the vLLM server's pod "
        "(tensor parallel), on a node of node_selector and tolerations, beside the training job's.",
        plain=False,
        min=1,
    )
    # A private or mirror registry (docs/cluster.md#behind-a-proxy-or-a-mirror-registry): the pods the package creates
    # (training job, Katib trials, InferenceService) pull through these Secrets.
    image_pull_secrets: list = setting(
        [],
        "Secrets (type kubernetes.io/dockerconfigjson) the training, trial and serving pods pull their images "
        "with, for a private or mirror registry; preflight checks each exists with that type. The pipeline's own steps "
        "pull with their service account's (docs/cluster.md).",
        plain=False,
    )
    node_selector: dict = setting(
        {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"},
        "Node labels of the GPU pods (training, evaluation, serving).",
    )
    tolerations: list = setting(
        [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
        "Tolerations of the GPU pods (a JSON list).",
    )
    affinity: dict = setting({}, "Affinity of the training pods (a JSON object; {} for none).")
    # The trainer pod's resources (docs/cluster.md#the-trainer-pod): validate_inputs holds the memory limit to the
    # host memory a pod holds while it writes a checkpoint (components/train/trainer/export.py).
    trainer_cpu_request: str = setting("16", "CPUs each training pod requests (a Kubernetes quantity).", plain=False)
    trainer_cpu_limit: str = setting(
        "16", "CPU limit of each training pod; equal to the request: Guaranteed QoS, evicted last.", plain=False
    )
    trainer_memory_request: str = setting(
        "128Gi", "Memory each training pod requests (a Kubernetes quantity, e.g. 96Gi).", plain=False
    )
    trainer_memory_limit: str = setting(
        "128Gi",
        "Memory limit of each training pod, /dev/shm's contents included: at least the ~110 GB (103Gi) 8 ranks "
        "hold while they write a checkpoint.",
        plain=False,
    )
    trainer_shm_size: str = setting(
        "64Gi",
        "Size of each training pod's memory-backed /dev/shm (NCCL, data-loader workers): a cap within "
        "trainer_memory_limit, charged only for what is written there.",
        plain=False,
    )
    trainjob_runtime: str = setting(
        "torch-distributed",
        "ClusterTrainingRuntime the TrainJob runs on (trainjob only; preflight checks the cluster has it).",
        plain=False,
    )


@dataclass
class SchedulingSettings:
    """How the training job is queued, scheduled, restarted and cleaned up."""

    job_cleanup: str = setting(
        "keep",
        "Delete the training job when it ends: keep, on-success or always.",
        choices=("keep", "on-success", "always"),
    )
    active_deadline_seconds: int = setting(0, "Fail the training job after this long; 0 for no deadline.", min=0)
    queue_name: str = setting("", "Kueue LocalQueue of the training job; empty for none.")
    priority_class: str = setting("", "PriorityClass of the training pods (pytorchjob only); empty for none.")
    gang_scheduling: bool = setting(
        False,
        "Schedule all training pods together: pytorchjob: Volcano or scheduler-plugins through the job's "
        "schedulingPolicy; trainjob: the ClusterTrainingRuntime's podGroupPolicy does it, and preflight refuses a "
        "runtime without one.",
    )
    min_nodes: int = setting(
        0, "Elastic training down to this many nodes (pytorchjob only); 0 for a fixed size.", min=0
    )
    max_restarts: int = setting(3, "Elastic restarts before the job fails (with min_nodes).", min=0)
    job_restarts: int = setting(
        2,
        "Re-runs of a job that failed for a retriable cause (eviction, preemption, lost node, NCCL); it resumes "
        "from its last complete checkpoint. 0: a failed job fails the step at once.",
        min=0,
    )
    pending_timeout_seconds: int = setting(
        900,
        "Fail the step when a job's pod stays unschedulable this long (at least 60: an autoscaler needs "
        "minutes to add a GPU node).",
        min=60,
    )


@dataclass
class NetworkSettings:
    """The pods' network: RDMA and NCCL for the training job, the proxies and the Hub mirror for every pod the
    package creates (docs/cluster.md#behind-a-proxy-or-a-mirror-registry)."""

    rdma_resource: str = setting(
        "",
        "Extended resource each training pod requests for its RDMA network, from the cluster's device plugin "
        "(rdma/ib, rdma/rdma_shared_device_a, nvidia.com/hostdev, vpc.amazonaws.com/efa); empty: NCCL runs over "
        "TCP on the pod network, and --plan counts tcp_node_gb_per_s between nodes.",
        plain=False,
    )
    rdma_per_pod: int = setting(
        1,
        "How many of rdma_resource each training pod requests (a DGX H100 with SR-IOV: 8, one per NIC).",
        plain=False,
        min=1,
    )
    ipc_lock: bool = setting(
        False,
        "Add the IPC_LOCK capability to the trainer container: InfiniBand/RoCE verbs pin the memory they "
        "register. The Pod Security Standards' baseline and restricted levels forbid it: the namespace must "
        "enforce privileged.",
        plain=False,
    )
    nccl_env: dict = setting(
        {},
        'NCCL variables of the training pods, over NCCL_DEBUG=WARN (e.g. {"NCCL_IB_HCA": "mlx5", '
        '"NCCL_SOCKET_IFNAME": "eth0"}); keys start with NCCL_.',
        plain=False,
    )
    http_proxy: str = setting(
        "", "HTTP_PROXY (and http_proxy) of the training, trial and serving pods, a URL; empty: none.", plain=False
    )
    https_proxy: str = setting(
        "", "HTTPS_PROXY (and https_proxy) of the training, trial and serving pods, a URL; empty: none.", plain=False
    )
    no_proxy: str = setting(
        "",
        "NO_PROXY (and no_proxy) of the training, trial and serving pods: hosts reached directly, comma-separated "
        "(e.g. .svc,.cluster.local,10.0.0.0/8); empty: none.",
        plain=False,
    )
    hf_endpoint: str = setting(
        "",
        "HF_ENDPOINT of the training, trial and serving pods: a Hugging Face Hub mirror's http(s) URL (e.g. "
        "https://hf-mirror.example.com); empty: huggingface.co.",
        plain=False,
    )


@dataclass
class StorageSettings:
    """Where data and models live: the claims, the Hub token and the object store."""

    data_pvc: str = setting("llm-data", "ReadWriteMany claim for datasets and caches (mounted at /mnt/data).")
    model_pvc: str = setting("llm-models", "ReadWriteMany claim for checkpoints and final models (/mnt/models).")
    hf_token_secret: str = setting(
        "hf-token", "Secret with key HF_TOKEN for gated models; referenced, never read (it may be absent)."
    )
    # Object storage (docs/cluster.md#object-storage, components/storage/): off while model_store_uri is empty.
    model_store_uri: str = setting(
        "",
        "Bucket folder each trained model is uploaded to after it is written and verified, s3://bucket/prefix or "
        "gs://bucket/prefix (to <it>/runs/<run id>/<stage>/final/, with a MANIFEST.json of sizes and sha256); "
        "empty: models stay on the claim only.",
        plain=False,
    )
    model_store_endpoint: str = setting(
        "",
        "An S3-compatible server's URL for model_store_uri (MinIO, Ceph RGW; GCS: https://storage.googleapis.com, "
        "the default for gs://); empty: AWS S3.",
        plain=False,
    )
    model_store_secret: str = setting(
        "",
        "Secret with keys AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (GCS: HMAC keys) for model_store_uri, read "
        "through the Kubernetes API by preflight and the train step; empty: the pod's own credentials (an IAM role "
        "for its service account; locally the environment).",
        plain=False,
    )
    upload_checkpoints: bool = setting(
        False,
        "Also upload each complete checkpoint to model_store_uri (<it>/runs/<run id>/<stage>/checkpoint-<step>/) "
        "while the job trains.",
        plain=False,
    )


@dataclass
class ObservabilitySettings:
    """Watching a run: experiment tracking, traces, alerts, Tensorboard, metrics and the watchdogs."""

    tracking_secret: str = setting(
        "llm-tracking",
        "Secret with the experiment tracker's address and key for the training pods (keys "
        "MLFLOW_TRACKING_URI, MLFLOW_TRACKING_TOKEN or _USERNAME/_PASSWORD, WANDB_API_KEY, "
        "WANDB_BASE_URL; each optional): used when report_to names mlflow or wandb.",
        plain=False,
    )
    langfuse_secret: str = setting(
        "llm-langfuse",
        "Secret with keys LANGFUSE_PUBLIC_KEY, LANGFUSE_SECRET_KEY and LANGFUSE_HOST: the trainer "
        "records the run in Langfuse and evaluation and deployment trace each generation (an "
        "optional reference: no Secret, no traces).",
    )
    alert_webhook_secret: str = setting(
        "llm-alerts",
        "Secret whose key ALERT_WEBHOOK_URL is a Slack-compatible incoming webhook: the run's outcome "
        "is posted there when it ends (an optional reference: no Secret, no alert).",
    )
    tensorboard: bool = setting(
        True,
        "Show the run's training curves (pvc://<model_pvc>/runs/<run id>/...): a Kubeflow Tensorboard, opened "
        "from the dashboard; without Kubeflow's Tensorboard controller a Deployment and Service running the "
        "trainer image's tensorboard (the train step logs the kubectl port-forward command), deleted when the run "
        "ends.",
    )
    stall_timeout_seconds: int = setting(
        2700,
        "End the training job as stalled, and re-run it from its last checkpoint (job_restarts), when its trainer "
        "makes no optimizer step for this long; the Prometheus alert LLMTrainingStalled uses the same limit. "
        "2700 (45 min): about 3x the longest step-free stretch of the reference job, a checkpoint save (~366 GB "
        "for Qwen3-30B-A3B at 0.5 GB/s: 12 min) plus a step. 0: not watched.",
        plain=False,
        min=0,
    )
    # Watching a run (components/train/trainer/metrics.py, components/observe/gpu_watch.py, manifests/monitoring/).
    metrics_port: int = setting(
        9410,
        "Port each training pod's local rank 0 serves Prometheus metrics on (/metrics: step, loss, learning "
        "rate, tokens/s, MFU, ETA, checkpoint age); 0 turns them off. 9410: clear of DCGM's 9400.",
        plain=False,
        min=0,
        max=65535,
    )
    prometheus_url: str = setting(
        "",
        "Prometheus the launcher asks for the job's GPU utilisation (DCGM_FI_DEV_GPU_UTIL) while it follows the "
        "job, e.g. http://prometheus-operated.monitoring:9090; empty: not watched. Unreachable: a warning.",
        plain=False,
    )
    gpu_util_threshold: float = setting(
        50.0,
        "The launcher posts a low-utilisation alert (alert_webhook_secret) when the job's average GPU "
        "utilisation stays below this percentage for gpu_util_window_seconds.",
        plain=False,
        min=0,
        max=100,
    )
    gpu_util_window_seconds: int = setting(
        600,
        "How long the job's GPU utilisation must stay below gpu_util_threshold before the launcher alerts.",
        plain=False,
        min=60,
    )


@dataclass
class PlanSettings:
    """The hardware the plan and the memory-fit estimate assume: GPU memory, compute speed and bandwidths."""

    gpu_memory_gib: float = setting(
        80.0,
        "Memory per GPU, for the memory-fit estimate that fails a job that cannot fit before any GPU is "
        "requested (80 for H100 80GB).",
        min=0,
    )
    achieved_tflops_per_gpu: float = setting(
        159.0,
        "The plan's compute speed: FLOP/s one GPU sustains in training, in TFLOP/s, recomputation included, the "
        "optimizer step apart (the plan counts it): 159 is the reference preset's whole model on one H100, "
        "projected from the trainer at 2 and 4 of Qwen3-30B-A3B's layers in one run, 6,097 tokens/s of compute x "
        "26.1 GFLOP per token, the embedding lookup at 0 (2026-11-28; benchmarks/results/plan.md).",
        plain=False,
        above=0,
    )
    intra_node_gb_per_s: float = setting(
        450.0,
        "The plan's bandwidth within a node, GB/s per GPU and direction (450: H100 NVLink 4).",
        plain=False,
        above=0,
    )
    inter_node_gb_per_s: float = setting(
        50.0,
        "The plan's bandwidth between nodes, GB/s per GPU and direction: the node's network over its GPUs "
        "(50: DGX H100, 8 x 400 Gb/s; one 200 Gb/s NIC for 8 GPUs: 3.125).",
        plain=False,
        above=0,
    )
    tcp_node_gb_per_s: float = setting(
        12.5,
        "The plan's bandwidth between nodes when no rdma_resource is requested: GB/s per node and direction "
        "that NCCL's TCP sockets get over the pod network (12.5: one 100 Gb/s NIC at line rate).",
        plain=False,
        above=0,
    )
