"""Trials run as TrainJobs (train_backend=trainjob): every trial's pods get names JobSet accepts, and a trial whose
job never gets a pod fails the search instead of leaving it to poll forever.

A KFP run id is a 36-character UUID; Katib names a trial ``<experiment>-<8 random characters>``
(suggestionclient.go) and the trial's job after it; the Trainer names the JobSet after the TrainJob, and JobSet's
admission webhook refuses a JobSet whose longest pod name, ``<jobset>-<replicated job>-<job index>-<pod index>``
plus a 6-character suffix, passes 63 characters (kubernetes-sigs/jobset ``pkg/webhooks/jobset_webhook.go``,
``placement.GenPodName``). The Trainer then only records an event (TrainJobResourcesCreationFailed): no pod ever
appears.
"""

from __future__ import annotations

import re

import pytest
import yaml

from components import kube
from components.hpo import katib
from components.hpo.follow import run_experiment
from components.kube import RUN_ID_LABEL
from components.train.launcher import trainjob
from components.train.launcher.trainjob import trainjob_for_run
from tests.fakes.katib import NS, SPACE, KatibAPI, katib_ends, katib_runs, trial
from tests.helpers.katib_go import katib_trial_job, trial_name
from tests.helpers.repo import REFERENCE

UUID = "4d2c9b1e-7a3f-4e6d-8c5b-1f0a9e8d7c6b"  # what KFP's run ids look like
FAST = {"poll_seconds": 0.01}
TRAINJOBS = (trainjob.GROUP, trainjob.VERSION, trainjob.PLURAL)


@pytest.fixture(autouse=True)
def short_api_outages(monkeypatch):
    monkeypatch.setattr(kube, "API_RETRY_WINDOW_SECONDS", 3.0)


def jobset_longest_pod_name(jobset: str, replicated_job: str, replicas: int, completions: int) -> str:
    """What JobSet's webhook checks for an Indexed replicated job (its default completion mode):
    ``placement.GenPodName(jobSet, rJob.Name, replicas - 1, completions - 1) + "-abcde"``."""
    return f"{jobset}-{replicated_job}-{replicas - 1}-{completions - 1}" + "-abcde"


def runtime_replicated_jobs() -> list[str]:
    """The replicated jobs of the torch-distributed ClusterTrainingRuntime, as released (v2.1.0) and on main."""
    ref = REFERENCE / "runtimes"
    released = yaml.safe_load((ref / "v2.1.0_torch_distributed.yaml").read_text())
    names = [r["name"] for r in released["spec"]["template"]["spec"]["replicatedJobs"]]
    chart = (ref / "runtime_torch_distributed.yaml").read_text()  # a Helm template: read its one list by pattern
    names += re.findall(r"replicatedJobs:\s*\n\s*- name: (\S+)", chart)
    return names


def trainjob_experiment(run_id: str, num_nodes: int, **over) -> dict:
    job = trainjob_for_run(
        run_id=run_id,
        namespace=NS,
        config_path=f"/mnt/models/runs/{run_id}/hpo/c.json",
        trainer_image="t:1",
        num_nodes=num_nodes,
        gpus_per_node=8,
        data_pvc="d",
        model_pvc="m",
        hf_token_secret="hf",
        node_selector={},
        tolerations=[],
    )
    args = dict(
        name=katib.experiment_name_for(run_id),
        namespace=NS,
        training_job=job,
        trials_dir=katib.trials_dir_for(run_id),
        search_space=SPACE,
        trials=3,
        parallel_trials=1,
        max_failed_trials=1,
        algorithm="tpe",
        trial_steps=20,
        method="full",
        seed=42,
    )
    return katib.experiment_manifest(**{**args, **over})


@pytest.mark.parametrize("num_nodes", [1, 2, 8, 10, 64, 1000])
def test_every_trials_pods_fit_jobsets_name_limit_with_a_kfp_run_id(num_nodes):
    (replicated_job,) = set(runtime_replicated_jobs())
    assert replicated_job == trainjob.NODE
    exp = trainjob_experiment(UUID, num_nodes)
    run = katib_trial_job(exp, trial_name(exp), {"learning_rate": "3e-05"})
    # The Trainer: the JobSet is named after the TrainJob; one replica of "node", one pod per node.
    longest = jobset_longest_pod_name(run["metadata"]["name"], replicated_job, 1, run["spec"]["trainer"]["numNodes"])
    assert len(longest) <= 63, longest
    assert exp["metadata"]["name"].startswith("hpo-4d2c9b1e") and exp["metadata"]["name"] == katib.experiment_name_for(
        UUID
    )


def test_a_name_whose_trials_pods_would_not_fit_is_refused_naming_the_fix():
    with pytest.raises(ValueError) as error:
        trainjob_experiment(UUID, 2, name=f"hpo-{UUID}")  # 40 characters: within Katib's own limit, not JobSet's
    assert str(error.value) == (
        f"name 'hpo-{UUID}' leaves no room for its trials' pod names: a trial's TrainJob pod would be named like "
        f"'hpo-{UUID}-x7k2p9qd-node-0-1-abcde' (64 characters, at most 63); use experiment_name_for(run_id)"
    )


def test_a_trial_that_never_gets_a_pod_fails_the_search_naming_it_and_where_to_look(capsys):
    exp = trainjob_experiment(UUID, 2)
    name, t1 = exp["metadata"]["name"], trial_name(exp)

    def katib_creates_the_trainjob(e):
        katib_runs(api, trial(t1, "3e-05", "Running"))(e)
        # Katib created the trial's TrainJob; the Trainer could not create its JobSet: no pod, only an event.
        if api.get_object(*TRAINJOBS, NS, t1) is None:
            api.put_object(*TRAINJOBS, katib_trial_job(exp, t1, {"learning_rate": "3e-05"}))

    with KatibAPI() as api:
        api.on_get("experiments", katib_creates_the_trainjob)
        with pytest.raises(RuntimeError) as error:
            # The deadline only so that a search that would poll forever fails this test in seconds.
            run_experiment(exp, api_client=api.client, pending_timeout_seconds=0.05, timeout_seconds=5, **FAST)
        assert len(api.requests_for("DELETE", f"/experiments/{name}")) == 1
    assert str(error.value) == (
        f"Experiment {NS}/{name}: trial {t1} has had no pod for 0s: its TrainJob could not create them "
        f"(kubectl -n {NS} describe trainjob {t1}: the Trainer reports a JobSet it cannot create as a "
        "TrainJobResourcesCreationFailed event)"
    )


def test_a_trial_held_in_a_queue_is_waited_for():
    exp = trainjob_experiment(UUID, 2)
    t1 = trial_name(exp)
    polls = []

    def queued_then_done(e):
        polls.append(1)
        if api.get_object(*TRAINJOBS, NS, t1) is None:
            job = katib_trial_job(exp, t1, {"learning_rate": "3e-05"})
            job["spec"]["suspend"] = True  # Kueue holds it until its queue admits it: no pods meanwhile
            api.put_object(*TRAINJOBS, job)
        if len(polls) < 20:
            katib_runs(api, trial(t1, "3e-05", "Running"))(e)
        else:
            katib_ends(api, "Succeeded", "ExperimentMaxTrialsReached", "done", trial(t1, "3e-05", "Succeeded", "2.0"))(
                e
            )

    with KatibAPI() as api:
        api.on_get("experiments", queued_then_done)
        result, _ = run_experiment(exp, api_client=api.client, pending_timeout_seconds=0.05, **FAST)
    assert katib.best_trial(result)["name"] == t1


def test_a_trial_whose_pods_exist_is_not_podless():
    exp = trainjob_experiment(UUID, 1)
    t1 = trial_name(exp)
    polls = []

    def running_then_done(e):
        polls.append(1)
        if (NS, f"{t1}-node-0-0-abcde") not in api.pods:
            api.add_pod(
                NS,
                f"{t1}-node-0-0-abcde",
                {RUN_ID_LABEL: UUID, trainjob.POD_SELECTOR_LABEL: t1},
                container=trainjob.NODE,
            )
        step = (
            katib_runs(api, trial(t1, "3e-05", "Running"))
            if len(polls) < 20
            else katib_ends(
                api, "Succeeded", "ExperimentMaxTrialsReached", "done", trial(t1, "3e-05", "Succeeded", "2.0")
            )
        )
        step(e)

    with KatibAPI() as api:
        api.on_get("experiments", running_then_done)
        result, _ = run_experiment(exp, api_client=api.client, pending_timeout_seconds=0.05, **FAST)
    assert katib.best_trial(result)["name"] == t1
