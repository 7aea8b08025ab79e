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
