"""The keys the package reads from Kubernetes Secrets. Secrets are referenced by name (settings), never read by
the package and never written into manifests, arguments or logs: a pod gets the value as an environment variable
from a ``secretKeyRef``, optional wherever the feature works without it.
"""

# hf_token_secret: the Hub token for gated models, read by huggingface_hub as HF_TOKEN.
HF_TOKEN_KEY = "HF_TOKEN"
# alert_webhook_secret: a Slack-compatible incoming webhook; components/observe/alerts.py reads the variable
# of the same name.
WEBHOOK_SECRET_KEY = "ALERT_WEBHOOK_URL"
# langfuse_secret: Langfuse's project keys and address, read by the Langfuse SDK from the variables of the same names.
LANGFUSE_KEYS = ("LANGFUSE_PUBLIC_KEY", "LANGFUSE_SECRET_KEY", "LANGFUSE_HOST")
# judge_api_key_secret: the key of the judged evaluation's OpenAI-compatible endpoint (components/evaluate/judge.py),
# sent as a bearer token; an optional reference (an in-cluster judge needs none).
JUDGE_API_KEY = "JUDGE_API_KEY"
# model_store_secret: the object store's keys (S3, an S3-compatible server, GCS's HMAC keys), read through the
# Kubernetes API by preflight and the train step's launcher (components/storage/), never put in a pod's env.
STORE_KEYS = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")
# tracking_secret: what the trainer's MLflow and W&B callbacks and the publish step read from the environment, each an
# optional key: whichever the Secret holds reaches the pods, and nothing is set when it is absent.
TRACKING_KEYS = (
    "MLFLOW_TRACKING_URI",
    "MLFLOW_TRACKING_TOKEN",
    "MLFLOW_TRACKING_USERNAME",
    "MLFLOW_TRACKING_PASSWORD",
    "WANDB_API_KEY",
    "WANDB_BASE_URL",
)
# Not secret, beside them: the MLflow experiment and the W&B project every run logs into.
TRACKING_NAMES = {"MLFLOW_EXPERIMENT_NAME": "llm-finetune", "WANDB_PROJECT": "llm-finetune"}
