"""A company network (issue 32, item 5): the training pods pull through ``image_pull_secrets`` and reach out through
the proxies and the Hub mirror; rendered through the path the train step and --render take (``training_job_for_run``)
and checked against the real PyTorchJob and TrainJob CRDs (tests/reference/crds), Trainer v2.1's included. Katib's
trials run the same job, so they carry the same."""

from __future__ import annotations

import pytest

from components.hpo import katib
from components.settings import Settings, defaults
from components.stages import job_groups
from components.train.launcher.job import training_job_for_run
from components.train.launcher.trainjob import TRAINER_V2_1, TRAINER_V2_2
from tests.helpers.crd_schema import crd_errors

RUN_ID = "8b0e3f2a-1c2d-4e5f-9a8b-7c6d5e4f3a2b"
CRDS = {
    ("pytorchjob", None): "kubeflow.org_pytorchjobs.yaml",
    ("trainjob", TRAINER_V2_2): "trainer.kubeflow.org_trainjobs.yaml",
    ("trainjob", TRAINER_V2_1): "v2.1.0/trainer.kubeflow.org_trainjobs.yaml",
}
EGRESS = {
    "image_pull_secrets": ["registry-mirror", "team-registry"],
    "http_proxy": "http://proxy.corp.example:3128",
    "https_proxy": "http://proxy.corp.example:3128",
    "no_proxy": ".svc,.cluster.local,10.0.0.0/8",
    "hf_endpoint": "https://hf-mirror.corp.example",
}
WANTED_ENV = {
    "HTTP_PROXY": "http://proxy.corp.example:3128",
    "http_proxy": "http://proxy.corp.example:3128",
    "HTTPS_PROXY": "http://proxy.corp.example:3128",
    "https_proxy": "http://proxy.corp.example:3128",
    "NO_PROXY": ".svc,.cluster.local,10.0.0.0/8",
    "no_proxy": ".svc,.cluster.local,10.0.0.0/8",
    "HF_ENDPOINT": "https://hf-mirror.corp.example",
}
PULL_SECRETS = [{"name": "registry-mirror"}, {"name": "team-registry"}]


def _job(backend: str, trainer_version: str | None, **settings) -> dict:
    s = Settings.from_flat({**defaults(), "train_backend": backend, **settings})
    return training_job_for_run(
        *job_groups(s, "sft"),
        run_id=RUN_ID,
        namespace="team-llm",
        config_path="/mnt/models/runs/r1/train/c.json",
        trainer_version=trainer_version,
    )


def _pods(job: dict) -> list[dict]:
    """Each pod spec the job sets (the TrainJob's: its pod patch), with the trainer container's env."""
    if job["kind"] == "PyTorchJob":
        return [spec["template"]["spec"] for spec in job["spec"]["pytorchReplicaSpecs"].values()]
    if "runtimePatches" in job["spec"]:
        patch = job["spec"]["runtimePatches"][0]["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"][0]
        pod = patch["template"]["spec"]["template"]["spec"]
    else:
        pod = job["spec"]["podTemplateOverrides"][0]["spec"]
    return [{**pod, "containers": [{**pod["containers"][0], "env": job["spec"]["trainer"]["env"]}]}]


@pytest.mark.parametrize("backend, version", list(CRDS))
def test_the_training_pods_pull_with_the_secrets_and_go_out_through_the_proxy_and_mirror(backend, version):
    job = _job(backend, version, **EGRESS)
    assert crd_errors(job, CRDS[backend, version]) == []
    for pod in _pods(job):
        assert pod["imagePullSecrets"] == PULL_SECRETS
        env = {e["name"]: e.get("value") for e in pod["containers"][0]["env"]}
        assert {k: env.get(k) for k in WANTED_ENV} == WANTED_ENV


@pytest.mark.parametrize("backend, version", list(CRDS))
def test_by_default_no_pull_secret_proxy_or_mirror(backend, version):
    job = _job(backend, version)
    assert crd_errors(job, CRDS[backend, version]) == []
    for pod in _pods(job):
        assert "imagePullSecrets" not in pod
        assert not {e["name"] for e in pod["containers"][0]["env"]} & set(WANTED_ENV)


def test_only_the_settings_given_are_set():
    pod = _pods(_job("pytorchjob", None, https_proxy="http://proxy.corp.example:3128"))[0]
    env = {e["name"] for e in pod["containers"][0]["env"]}
    assert env & set(WANTED_ENV) == {"HTTPS_PROXY", "https_proxy"}


@pytest.mark.parametrize("backend, version", [("pytorchjob", None), ("trainjob", TRAINER_V2_2)])
def test_katib_trials_run_the_same_pods(backend, version):
    experiment = katib.experiment_manifest(
        name=katib.experiment_name_for(RUN_ID),
        namespace="team-llm",
        training_job=_job(backend, version, **EGRESS),
        trials_dir=katib.trials_dir_for(RUN_ID),
        search_space={"learning_rate": {"min": 1e-5, "max": 1e-4, "scale": "log"}},
        trials=4,
        parallel_trials=1,
        max_failed_trials=1,
        algorithm="tpe",
        trial_steps=10,
        method="full",
        seed=42,
    )
    assert crd_errors(experiment, "kubeflow.org_experiments.yaml") == []
    for pod in _pods(experiment["spec"]["trialTemplate"]["trialSpec"]):
        assert pod["imagePullSecrets"] == PULL_SECRETS
        env = {e["name"]: e.get("value") for e in pod["containers"][0]["env"]}
        assert {k: env.get(k) for k in WANTED_ENV} == WANTED_ENV
