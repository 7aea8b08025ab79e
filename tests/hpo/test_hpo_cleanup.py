"""What a search leaves on the cluster (components/hpo/follow.py): a failed Experiment is deleted, since Katib never
stops the trials still running in a finished Experiment and they hold GPUs; a retried step that finds a failed
Experiment under its name deletes it and searches again. Against the fake API server through the real client."""

from __future__ import annotations

import pytest

from components import kube
from components.hpo import katib
from components.hpo.follow import run_experiment
from tests.fakes.katib import NAME, NS, T1, T2, KatibAPI, experiment, katib_ends, katib_runs, succeeds, trial

WHAT = f"Experiment {NS}/{NAME}"
FAST = {"poll_seconds": 0.01}
GVP = (katib.GROUP, katib.VERSION, katib.PLURAL)


@pytest.fixture(autouse=True)
def short_api_outages(monkeypatch):
    monkeypatch.setattr(kube, "API_RETRY_WINDOW_SECONDS", 3.0)


def test_a_failed_search_deletes_its_experiment_and_with_it_the_trials_still_running():
    with KatibAPI() as api:
        api.on_get(
            "experiments",
            api.steps(
                katib_runs(api, trial(T1, "1e-05", "Running"), trial(T2, "9e-05", "Running")),
                katib_ends(
                    api,
                    "Failed",
                    "ExperimentFailed",
                    "Experiment has failed because max failed count has reached",
                    trial(T1, "1e-05", "Failed", message="Trial has failed"),
                    trial(T2, "9e-05", "Running"),
                ),
            ),
        )  # still holding its GPUs
        with pytest.raises(RuntimeError, match=f"{WHAT} failed: ExperimentFailed"):
            run_experiment(experiment(), api_client=api.client, **FAST)
        assert len(api.requests_for("DELETE", f"/experiments/{NAME}")) == 1
        assert api.get_object(*GVP, NS, NAME) is None


def test_a_retried_step_replaces_a_failed_experiment_and_searches_again(capsys):
    with KatibAPI() as api:
        failed = experiment()
        api.set_condition(
            failed,
            "Failed",
            reason="ExperimentFailed",
            message="Experiment has failed because max failed count has reached",
        )
        old = api.put_object(*GVP, failed)  # what the first attempt of the step left
        katib_steps = api.steps(*succeeds(api))
        api.on_get(
            "experiments", lambda exp: katib_steps(exp) if exp["metadata"]["uid"] != old["metadata"]["uid"] else None
        )  # Katib leaves a finished Experiment alone
        exp, trials = run_experiment(experiment(), api_client=api.client, **FAST)
        posts = api.requests_for("POST", "/experiments")
        deletes = api.requests_for("DELETE", f"/experiments/{NAME}")
    assert len(posts) == 2  # 409 AlreadyExists, then the create once the failed one was gone
    # Foreground: the old trials and their pods are gone before the new trials ask for GPUs.
    assert deletes[0].body["propagationPolicy"] == "Foreground"
    assert exp["metadata"]["uid"] != old["metadata"]["uid"] and katib.best_trial(exp)["name"] == T2
    out = capsys.readouterr().out
    assert f"deleting {WHAT}: it failed in an earlier attempt (ExperimentFailed: Experiment has failed" in out
    assert f"created {WHAT}" in out


def test_a_retried_step_re_attaches_to_a_succeeded_experiment():
    with KatibAPI() as api:
        done = experiment()
        succeeds(api)[-1](done)  # Katib's last step: Succeeded, with its trials and best trial
        api.put_object(*GVP, done)
        exp, _ = run_experiment(experiment(), api_client=api.client, **FAST)
        assert len(api.requests_for("POST", "/experiments")) == 1
    assert katib.best_trial(exp)["name"] == T2
