"""Code the vLLM server runs for the grpo stage (grpo_generation_backend=vllm-server), and how it is started.

The server runs the serving image (vLLM, not this package): its modules are self-contained and reach the server as
files on its ``PYTHONPATH`` (kfp_weight_sync.py, the weight-sync engine). This module, which imports no ML library,
holds what the trainer (components/train/trainer/vllm_client.py) and the launcher (the server's manifests) share:
the engine's names and the server's command line.
"""

from __future__ import annotations

import json
import os

# kfp_weight_sync.py's names (a test holds them equal; nothing here imports that module: it imports vllm).
BACKEND = "kfp_torch"
STORE_PREFIX = "kfp-weight-sync"
ENGINE_MODULE = "kfp_weight_sync"
WORKER_EXTENSION = f"{ENGINE_MODULE}.WeightSyncExtension"
# The run's token (a Secret's key TOKEN_KEY): the engine checks it on every join and round (TOKEN_ENV), vLLM's own
# --api-key on the OpenAI routes (API_KEY_ENV), and the trainer's pods send it (TOKEN_ENV).
TOKEN_ENV = "KFP_WEIGHT_SYNC_TOKEN"
API_KEY_ENV = "VLLM_API_KEY"
TOKEN_KEY = "token"


def engine_dir() -> str:
    """The folder the server's ``PYTHONPATH`` names locally: this one (kfp_weight_sync.py and this file)."""
    return os.path.dirname(os.path.abspath(__file__))


def engine_source() -> str:
    """kfp_weight_sync.py's text, as a ConfigMap carries it to the server's pod."""
    with open(os.path.join(engine_dir(), f"{ENGINE_MODULE}.py"), encoding="utf-8") as f:
        return f.read()


def server_args(model: str, served_model_name: str, port: int, host: str = "0.0.0.0") -> list[str]:
    """The OpenAI server's arguments (after ``vllm serve``'s executable) for a grpo generation server on ``model``:
    the OpenAI routes plus the weight-sync engine; its environment needs ``server_env()``."""
    return [
        "--model",
        model,
        "--served-model-name",
        served_model_name,
        "--host",
        host,
        "--port",
        str(port),
        "--worker-extension-cls",
        WORKER_EXTENSION,
        "--weight-transfer-config",
        json.dumps({"backend": BACKEND}),
    ]


def server_env(engine_path: str) -> dict[str, str]:
    """The environment a grpo generation server needs beyond its image's: vLLM's RL routes (dev mode: /pause,
    /init_weight_transfer_engine, /update_weights ...) and the engine module's folder on ``PYTHONPATH``."""
    return {"VLLM_SERVER_DEV_MODE": "1", "PYTHONPATH": engine_path}
