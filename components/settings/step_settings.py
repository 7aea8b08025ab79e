"""The evaluate, deploy and publish steps' settings."""

from __future__ import annotations

from dataclasses import dataclass

from components.settings.declare import setting


@dataclass
class EvaluateSettings:
    """The evaluation step and the deploy gate."""

    eval_gpus: int = setting(8, "GPUs of the evaluation pod.", min=0)
    eval_max_samples: int = setting(
        512,
        "Score at most this many held-out rows and examples per lm-eval task (0 = all); bounds the step's time.",
        min=0,
    )
    min_loss_improvement: float = setting(
        0.0, "Relative eval-loss improvement required to deploy (0.0: any improvement).", min=0, below=1
    )
    min_perplexity_improvement: float = setting(
        0.0, "Relative perplexity improvement required to deploy (0.0: no worse)."
    )
    eval_prompts: str = setting(
        "builtin:sample",
        "Prompts answered side by side by base and tuned model: builtin:sample or a JSONL file of "
        '{"messages": [...]} conversations ending with a user turn.',
    )
    max_new_tokens: int = setting(
        512,
        "Length limit of each side-by-side answer (a thinking model needs 512 or more to get past its reasoning).",
        min=1,
    )
    lm_eval_tasks: list = setting(
        [], 'lm-evaluation-harness task names, e.g. ["arc_easy"] (empty: none; needs lm-eval in the image).'
    )
    max_task_regression: float = setting(
        0.01, "Largest drop of an lm-eval task's score (absolute, 0..1) that still passes.", min=0, max=1
    )
    min_reward_improvement: float = setting(
        0.0,
        "grpo runs: gain of the mean reward on held-out prompts over the model before grpo required to deploy "
        "(absolute, in reward units; 0.0: no worse).",
        plain=False,
    )
    # The judged evaluation (components/evaluate/judge.py): a judge model scores both models' answers on a rubric.
    judge_endpoint: str = setting(
        "",
        "Judged evaluation: the judge model's OpenAI-compatible endpoint that scores base and tuned answers to "
        "eval_prompts on judge_rubric: served-base (the run's base model on the local server; local runs), an "
        "InferenceService name in the run's namespace, or an http(s) URL up to /v1; empty: not judged.",
    )
    judge_model: str = setting(
        "",
        "Judged evaluation: the model name sent to judge_endpoint (required for a URL; empty: the base model for "
        "served-base, the service's name for an InferenceService).",
        plain=False,
    )
    judge_api_key_secret: str = setting(
        "llm-judge",
        "Secret whose key JUDGE_API_KEY is judge_endpoint's API key, sent as a bearer token (an optional "
        "reference: no Secret, no key; a local run reads JUDGE_API_KEY from its environment).",
    )
    judge_rubric: str = setting(
        "builtin:default",
        "Judged evaluation: builtin:default (helpfulness, correctness, instruction following, 1-10), a JSON file "
        '({"criteria": {name: description}, "scale": [low, high]}) or a text file with the rubric (scale 1-10).',
        plain=False,
    )
    judge_max_tokens: int = setting(
        256,
        "Judged evaluation: length limit of each judge reply (a JSON verdict needs under 200 tokens; a thinking "
        "judge needs more).",
        plain=False,
        min=1,
    )
    min_judge_score: float = setting(
        0.0,
        "Judged evaluation gate: the lowest mean judge score of the tuned model's answers (in judge_rubric's "
        "units) that still deploys; 0: judged, not gated.",
        plain=False,
        min=0,
    )
    min_judge_win_rate: float = setting(
        0.0,
        "Judged evaluation gate: the lowest share of prompts (0..1, a tie counts half) on which the tuned answer "
        "scores above the base's that still deploys; 0: judged, not gated.",
        plain=False,
        min=0,
        max=1,
    )
    min_judged_fraction: float = setting(
        0.9,
        "Judged evaluation gate (with min_judge_score or min_judge_win_rate): the least share of the tuned model's "
        "answers the judge must have scored (0..1; replies with no readable score and failed requests are not "
        "judged) for its verdict to count; below it the gate fails.",
        plain=False,
        min=0,
        max=1,
    )


@dataclass
class DeploySettings:
    """The deployment step."""

    deploy_backend: str = setting(
        "kserve-vllm",
        "kserve-vllm, kserve-huggingface or local (a local server for a local run).",
        choices=("kserve-vllm", "kserve-huggingface", "local"),
    )
    serving_name: str = setting("qwen3-30b-a3b-sft", "InferenceService name (DNS-1035), also the served model name.")
    serving_gpus: int = setting(4, "GPUs per serving replica (vLLM's tensor-parallel size).", min=0)
    max_model_len: int = setting(8192, "Context length the server accepts (at least max_seq_length).", min=1)
    deployment_mode: str = setting(
        "Standard", "KServe's Standard (Deployment) or Knative (revisions, canary).", choices=("Standard", "Knative")
    )
    canary_traffic_percent: int = setting(
        0, "Knative only: share of traffic for the new revision (0: all at once).", min=0, below=100
    )
    keep_serving: bool = setting(False, "Local runs: leave the model server running after the smoke test.")
    max_ttft_seconds: float = setting(
        0.0,
        "Pre-deploy latency gate: the longest median time to first token (s) of a few concurrent streamed "
        "requests; 0: measured, not gated.",
        min=0,
    )
    min_output_tokens_per_second: float = setting(
        0.0,
        "Pre-deploy latency gate: the fewest output tokens per second the server streams over those requests "
        "together; 0: measured, not gated.",
        min=0,
    )
    serving_service_account: str = setting(
        "",
        "KServe: ServiceAccount of the predictor pods. With model_store_uri set, the InferenceService serves the "
        "uploaded copy (storageUri s3://...): KServe's storage initializer takes the store's keys from this "
        "account's Secret (serving.kserve.io/s3-* annotations, docs/serving.md); empty: served from the claim.",
        plain=False,
    )
    min_replicas: int = setting(1, "KServe: fewest predictor replicas (0: scale to zero, Knative only).", min=0)
    max_replicas: int = setting(
        1, "KServe: most predictor replicas the autoscaler may run (at least min_replicas).", min=1
    )
    scale_metric: str = setting(
        "auto",
        "KServe: the autoscaler's metric: cpu or memory (Standard: an HPA), concurrency or rps (Knative); "
        "auto: KServe's default.",
        plain=False,
        choices=("auto", "cpu", "memory", "concurrency", "rps"),
    )
    scale_target: int = setting(
        0,
        "KServe: the scale_metric's target per replica (cpu/memory: % of requests); 0: KServe's default.",
        plain=False,
        min=0,
    )


@dataclass
class PublishSettings:
    """Where the deployed model is published beside the cluster: Kubeflow Model Registry, the Hugging Face Hub (the
    publish step, components/publish/; the evaluation reaches the run's tracker there too, by report_to)."""

    model_registry_url: str = setting(
        "",
        "Kubeflow Model Registry's REST address, http(s)://host:port (e.g. "
        "http://model-registry-service.kubeflow.svc.cluster.local:8080): the deployed model is registered there "
        "(name, a version per run, its URI, the evaluation's metrics); empty: not registered.",
        plain=False,
    )
    model_registry_model_name: str = setting(
        "", "The registered model's name in the Model Registry; empty: serving_name.", plain=False
    )
    hub_repo_id: str = setting(
        "",
        "Hugging Face Hub repository (namespace/name) the deployed model's files are pushed to, one commit per run; "
        "empty: not pushed.",
        plain=False,
    )
    hub_token_secret: str = setting(
        "hf-token",
        "Secret whose key HF_TOKEN holds a Hub token that may write hub_repo_id (used only when it is set).",
        plain=False,
    )
    hub_private: bool = setting(
        True,
        "Create hub_repo_id private (an existing repository keeps its visibility; never made public).",
        plain=False,
    )
    hub_endpoint: str = setting(
        "",
        "The Hub's address for the push: a team's Hub mirror (HF_ENDPOINT); empty: https://huggingface.co.",
        plain=False,
    )
