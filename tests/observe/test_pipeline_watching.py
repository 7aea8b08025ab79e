"""The compiled pipeline gives the steps what watching a run needs, by Secret reference only: the train steps (whose
launcher posts idle GPUs) the webhook, the evaluate and deploy steps Langfuse's keys; the training pods get theirs
from the job manifest (test_monitoring_manifests.py)."""

from __future__ import annotations

import pytest
import yaml

from components.secrets import LANGFUSE_KEYS
from pipelines.compile import COMPILED


@pytest.fixture(scope="module")
def executors() -> dict:
    docs = list(yaml.safe_load_all(COMPILED.read_text()))
    (platform,) = [d for d in docs if "platforms" in d]
    return platform["platforms"]["kubernetes"]["deploymentSpec"]["executors"]


def secret_env(spec: dict) -> dict:
    """env variable -> (Secret parameter, key, optional) of an executor's secretAsEnv."""
    out = {}
    for entry in spec.get("secretAsEnv", []):
        # Inside the variants' loop a pipeline parameter reaches the task as a channel of the same name.
        name = entry["secretNameParameter"]["componentInputParameter"].removeprefix("pipelinechannel--")
        for pair in entry["keyToEnv"]:
            out[pair["envVar"]] = (name, pair["secretKey"], entry.get("optional", False))
    return out


def test_train_steps_get_the_webhook_and_evaluate_and_deploy_get_langfuse_by_optional_reference(executors):
    trains = [s for n, s in executors.items() if n.startswith("exec-train-model")]
    assert trains
    for spec in trains:
        assert secret_env(spec)["ALERT_WEBHOOK_URL"] == ("alert_webhook_secret", "ALERT_WEBHOOK_URL", True)
    for name in ("exec-evaluate-model", "exec-deploy-model"):
        env = secret_env(executors[name])
        for key in LANGFUSE_KEYS:
            assert env[key] == ("langfuse_secret", key, True), name
