"""The search step on a cluster: the Katib Experiment followed as the launcher follows a job (components/hpo/follow.py),
and search_hyperparameters run as the KFP executor runs it, against the fake API server through the real client.

Katib is scripted per GET of the Experiment (``api.on_get("experiments", ...)``): it creates Trials (labelled with
the Experiment's name, as Katib does), moves them on, and keeps ``status.currentOptimalTrial`` as its controller
does. The fake server does not list custom objects; ``KatibAPI`` adds that for the Trials.
"""

from __future__ import annotations

import functools
import json
import os
import signal
import threading

import pytest
from kfp.dsl import Dataset, Markdown

from components import kube
from components.hpo import follow, katib
from components.hpo.component import search_hyperparameters
from components.hpo.follow import run_experiment
from components.kube import RUN_ID_LABEL
from components.settings import defaults
from tests.fakes.katib import (
    NAME,
    NS,
    RUN_ID,
    SPACE,
    T1,
    T2,
    T3,
    KatibAPI,
    experiment,
    katib_ends,
    katib_runs,
    succeeds,
    trial,
)

WHAT = f"Experiment {NS}/{NAME}"
FAST = {"poll_seconds": 0.01}


@pytest.fixture(autouse=True)
def short_api_outages(monkeypatch):
    monkeypatch.setattr(kube, "API_RETRY_WINDOW_SECONDS", 3.0)


def trial_folders(root, *names):
    """What trials leave on the model volume: their config, metrics.json, TensorBoard events and final/ export."""
    for name in names:
        (root / name / "final").mkdir(parents=True)
        (root / name / "final" / "model.safetensors").write_bytes(b"\0" * 1024)
        (root / name / "metrics.json").write_text('{"eval_loss": 2.0}')
    return root


# -- following the Experiment ---------------------------------------------------------------------------------


def test_a_search_that_succeeds_returns_the_best_trial_and_every_trial(tmp_path, capsys):
    trials_dir = trial_folders(tmp_path / "hpo", T1, T2, T3)
    with KatibAPI() as api:
        api.on_get("experiments", api.steps(*succeeds(api)))
        created = []
        exp, trials = run_experiment(
            experiment(), trials_dir=str(trials_dir), api_client=api.client, on_created=created.append, **FAST
        )
        assert len(api.requests_for("POST", "/experiments")) == 1
        assert api.requests_for("GET", "/trials")[0].query["labelSelector"] == [f"{katib.EXPERIMENT_LABEL}={NAME}"]
    assert [c["metadata"]["name"] for c in created] == [NAME]
    assert katib.best_trial(exp)["parameters"] == {"learning_rate": 8.1e-05}
    assert sorted(t["metadata"]["name"] for t in trials) == [T1, T2, T3]
    report = katib.trials_markdown(exp, trials)
    assert f"**Best:** `{T2}`: eval_loss 1.7500 with learning_rate=8.1e-05." in report
    assert [line.split(" | ")[0] for line in report.splitlines() if line.startswith("| `")] == [
        f"| `{T2}`",
        f"| `{T1}`",
        f"| `{T3}`",
    ]
    # The exports are gone, the small files stay (the run's Tensorboard shows the trials' curves).
    assert not list(trials_dir.glob("*/final")) and len(list(trials_dir.glob("*/metrics.json"))) == 3
    out = capsys.readouterr().out
    assert f"created {WHAT}" in out
    assert f"{WHAT}: Running; trials 2/3: 2 running" in out
    assert f"{WHAT}: Succeeded; trials 3/3: 3 succeeded; best eval_loss 1.7500 ({T2}: learning_rate=8.1e-05)" in out


def test_an_ended_trials_export_is_deleted_while_the_others_run(tmp_path):
    trials_dir = trial_folders(tmp_path / "hpo", T1, T2)
    seen = []

    def look(exp):
        seen.append(sorted(p.parent.name for p in trials_dir.glob("*/final")))

    with KatibAPI() as api:
        api.on_get(
            "experiments",
            api.steps(
                katib_runs(api, trial(T1, "3e-05", "Running"), trial(T2, "8.1e-05", "Running")),
                katib_runs(
                    api,
                    trial(T1, "3e-05", "Failed", message="Trial has failed. Job message: OOMKilled"),
                    trial(T2, "8.1e-05", "Running"),
                ),
                look,
                katib_ends(
                    api,
                    "Succeeded",
                    "ExperimentMaxTrialsReached",
                    "done",
                    trial(T1, "3e-05", "Failed"),
                    trial(T2, "8.1e-05", "Succeeded", "1.9"),
                ),
            ),
        )
        run_experiment(experiment(), trials_dir=str(trials_dir), api_client=api.client, **FAST)
    assert seen == [[T2]]  # T1 ended: its export went at the next poll; T2 was still running


def test_a_failed_search_fails_at_once_with_katibs_reason_and_the_failed_trials(tmp_path):
    failed = [
        trial(
            T1,
            "1e-05",
            "Failed",
            message="Trial has failed. Job message: PyTorchJob is failed because 1 Master replica(s) failed.",
        ),
        trial(T2, "9e-05", "Failed", message="Trial has failed. Job message: OOMKilled"),
    ]
    trials_dir = trial_folders(tmp_path / "hpo", T1, T2)
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
                    *failed,
                ),
            ),
        )
        with pytest.raises(RuntimeError) as error:
            run_experiment(experiment(), trials_dir=str(trials_dir), api_client=api.client, **FAST)
        # Deleted: Katib never stops a finished Experiment's running trials (tests/hpo/test_hpo_cleanup.py).
        assert len(api.requests_for("DELETE", f"/experiments/{NAME}")) == 1
    message = str(error.value)
    assert message.startswith(
        f"{WHAT} failed: ExperimentFailed: Experiment has failed because max failed count has reached"
    )
    assert f"trial {T1} (learning_rate=1e-05): Failed: Trial has failed. Job message: PyTorchJob is failed" in message
    assert f"trial {T2} (learning_rate=9e-05): Failed: Trial has failed. Job message: OOMKilled" in message
    assert not list(trials_dir.glob("*/final"))


def one_experiment_followed_then_deleted(api) -> bool:
    """The search ran on one Experiment, which the step deleted at its end (tests/hpo/test_hpo_trial_logs.py)."""
    return (
        len(api.requests_for("DELETE", f"/experiments/{NAME}")) == 1
        and [k for k in api.objects if k[2] == katib.PLURAL] == []
    )


def test_a_retried_step_re_attaches_to_its_experiment_with_exactly_one_create():
    with KatibAPI() as api:
        api.put_object(katib.GROUP, katib.VERSION, katib.PLURAL, experiment())  # the first attempt's
        api.on_get("experiments", api.steps(*succeeds(api)))
        exp, _ = run_experiment(experiment(), api_client=api.client, **FAST)
        assert len(api.requests_for("POST", "/experiments")) == 1  # answered 409 AlreadyExists
        assert one_experiment_followed_then_deleted(api)
    assert katib.best_trial(exp)["name"] == T2


def test_a_lost_create_response_re_attaches_instead_of_creating_twice():
    with KatibAPI() as api:
        real_handle = api.handle

        def create_then_drop(method, path, query, body, content_type):
            answer = real_handle(method, path, query, body, content_type)
            first_post = method == "POST" and len(api.requests_for("POST")) == 1
            return None if first_post else answer  # the Experiment was created, the response was lost

        api.handle = create_then_drop
        api.on_get("experiments", api.steps(*succeeds(api)))
        run_experiment(experiment(), api_client=api.client, **FAST)
        assert len(api.requests_for("POST", "/experiments")) == 2
        assert one_experiment_followed_then_deleted(api)


def test_transient_api_errors_are_retried(capsys):
    with KatibAPI() as api:
        api.fail_next(1, 503, method="POST", path_contains="/experiments")
        api.fail_next(2, 500, method="GET", path_contains=f"/experiments/{NAME}")
        api.drop_next(1, method="GET", path_contains="/trials")
        api.fail_next(1, 429, method="GET", path_contains="/trials")
        api.on_get("experiments", api.steps(*succeeds(api)))
        exp, trials = run_experiment(experiment(), api_client=api.client, **FAST)
        assert one_experiment_followed_then_deleted(api)
    assert katib.best_trial(exp)["name"] == T2 and len(trials) == 3
    out = capsys.readouterr().out
    assert "transient API error (HTTP 503)" in out and "transient API error (HTTP 500)" in out
    assert "transient API error (HTTP 429)" in out


def test_an_api_outage_longer_than_the_window_fails_the_step():
    with KatibAPI() as api:
        api.fail_next(10_000, 500, method="GET", path_contains=f"/experiments/{NAME}")
        with pytest.raises(kube.ApiException) as error:
            run_experiment(experiment(), api_client=api.client, poll_seconds=0.5)
    assert error.value.status == 500


def test_sigterm_deletes_the_experiment_then_exits():
    before = signal.getsignal(signal.SIGTERM)
    with KatibAPI() as api:
        api.on_get("experiments", katib_runs(api, trial(T1, "3e-05", "Running")))
        timer = threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGTERM))
        timer.start()
        try:
            with pytest.raises(SystemExit) as exit_:
                run_experiment(experiment(), api_client=api.client, **FAST)
        finally:
            timer.cancel()
        assert exit_.value.code == 128 + signal.SIGTERM
        assert len(api.requests_for("DELETE", f"/experiments/{NAME}")) == 1
        assert api.get_object(katib.GROUP, katib.VERSION, katib.PLURAL, NS, NAME) is None
    assert signal.getsignal(signal.SIGTERM) is before


def test_a_sigterm_whose_exception_a_finalizer_swallowed_still_cancels(monkeypatch):
    """SIGTERM while the main thread runs a ``__del__``: Python drops the handler's exception (and the handler has
    set SIGTERM to be ignored): the step must still see it, delete the Experiment and exit."""
    real_call_api, calls = follow.call_api, []

    def swallowing(fn, *args, **kwargs):
        calls.append(fn.__name__)
        if len(calls) == 6:
            try:
                signal.getsignal(signal.SIGTERM)(signal.SIGTERM, None)
            except BaseException:  # as Python does with an exception raised in a finalizer
                pass
        return real_call_api(fn, *args, **kwargs)

    monkeypatch.setattr(follow, "call_api", swallowing)
    with KatibAPI() as api:
        api.on_get("experiments", katib_runs(api, trial(T1, "3e-05", "Running")))
        with pytest.raises(SystemExit) as exit_:
            run_experiment(experiment(), api_client=api.client, timeout_seconds=5, **FAST)
        assert exit_.value.code == 128 + signal.SIGTERM
        assert len(api.requests_for("DELETE", f"/experiments/{NAME}")) == 1


def test_a_trial_pod_that_cannot_start_deletes_the_experiment_and_names_the_pod():
    with KatibAPI() as api:

        def image_missing(exp):
            katib_runs(api, trial(T1, "3e-05", "Running"))(exp)
            api.add_pod(
                NS,
                f"{T1}-master-0",
                {RUN_ID_LABEL: RUN_ID, "training.kubeflow.org/job-name": T1},
                state="waiting",
                reason="ImagePullBackOff",
                message='Back-off pulling image "trainer:typo"',
            )
            # The run's other pods (not a trial's) are none of the search's business.
            api.add_pod(
                NS,
                "sft-other-master-0",
                {RUN_ID_LABEL: RUN_ID, "training.kubeflow.org/job-name": "sft-x"},
                state="waiting",
                reason="ErrImagePull",
            )

        api.on_get("experiments", image_missing)
        with pytest.raises(
            RuntimeError,
            match=rf"{WHAT}: a trial cannot start: pod {T1}-master-0: container "
            "pytorch is ImagePullBackOff: Back-off pulling image",
        ):
            run_experiment(experiment(), api_client=api.client, **FAST)
        assert len(api.requests_for("DELETE", f"/experiments/{NAME}")) == 1


def test_no_trial_in_the_pending_timeout_deletes_the_experiment():
    with KatibAPI() as api:
        api.on_get("experiments", lambda exp: api.set_condition(exp, "Created", reason="ExperimentCreated"))
        with pytest.raises(RuntimeError, match=rf"{WHAT} created no trial in 0s: Katib's suggestion service"):
            run_experiment(experiment(), api_client=api.client, pending_timeout_seconds=0.05, **FAST)
        assert len(api.requests_for("DELETE", f"/experiments/{NAME}")) == 1


def test_the_deadline_deletes_the_experiment():
    with KatibAPI() as api:
        api.on_get("experiments", katib_runs(api, trial(T1, "3e-05", "Running")))
        with pytest.raises(TimeoutError, match=rf"{WHAT} did not finish within 0s \(Running; trials 1/3: 1 running\)"):
            run_experiment(experiment(), api_client=api.client, timeout_seconds=0.1, **FAST)
        assert len(api.requests_for("DELETE", f"/experiments/{NAME}")) == 1


def test_an_experiment_deleted_while_it_runs_fails_the_step():
    with KatibAPI() as api:

        def deleted_by_someone(exp):
            api.objects.pop((katib.GROUP, katib.VERSION, katib.PLURAL, NS, NAME))

        api.on_get("experiments", api.steps(katib_runs(api, trial(T1, "3e-05", "Running")), deleted_by_someone))
        with pytest.raises(RuntimeError, match=rf"{WHAT} was deleted while it ran"):
            run_experiment(experiment(), api_client=api.client, **FAST)


def test_a_manifest_that_is_not_an_experiment_is_refused_before_any_request():
    with KatibAPI() as api:
        with pytest.raises(ValueError, match="must be a kubeflow.org/v1beta1 Experiment"):
            run_experiment({**experiment(), "kind": "PyTorchJob"}, api_client=api.client, **FAST)
        assert api.requests == []


# -- the KFP step ------------------------------------------------------------------------------------------------


def step_settings(**over) -> dict:
    return {
        **defaults(),
        "hpo_trials": 3,
        "hpo_parallel_trials": 2,
        "hpo_search_space": SPACE,
        "hpo_trial_steps": 20,
        **over,
    }


def run_step(tmp_path, settings: dict):
    """search_hyperparameters as the KFP executor calls it, with the volumes under ``tmp_path``."""
    data_root, model_root = tmp_path / "data", tmp_path / "models"
    dataset = Dataset(
        uri=str(tmp_path / "artifacts" / "dataset"),
        metadata={"path": str(data_root / "runs" / RUN_ID / "dataset"), "packing": True},
    )
    report = Markdown(uri=str(tmp_path / "artifacts" / "report.md"))
    (tmp_path / "artifacts").mkdir(exist_ok=True)
    best = search_hyperparameters.python_func(
        dataset=dataset,
        settings=settings,
        data_root=str(data_root),
        model_root=str(model_root),
        run_id=RUN_ID,
        report=report,
    )
    return best, (tmp_path / "artifacts" / "report.md").read_text(), model_root / "runs" / RUN_ID / "hpo"


@pytest.fixture
def cluster(monkeypatch):
    """The fake API server as the step's cluster: its client, its namespace, fast polls."""
    with KatibAPI() as api:
        monkeypatch.setattr(kube, "current_namespace", lambda default="default": NS)
        monkeypatch.setattr(
            follow, "run_experiment", functools.partial(follow.run_experiment, api_client=api.client, **FAST)
        )
        yield api


def test_the_step_runs_the_search_as_the_runs_training_job_and_returns_typed_settings(tmp_path, cluster):
    cluster.on_get("experiments", cluster.steps(*succeeds(cluster)))
    best, report, hpo_dir = run_step(tmp_path, step_settings(stage_settings={"sft": {"weight_decay": 0.01}}))
    assert best == {"learning_rate": 8.1e-05}
    assert f"**Best:** `{T2}`" in report and report == (hpo_dir / "report.md").read_text()

    (posted,) = [r.body for r in cluster.requests_for("POST", "/experiments")]
    assert posted["metadata"]["name"] == NAME and posted["metadata"]["namespace"] == NS
    spec = posted["spec"]
    assert (spec["maxTrialCount"], spec["parallelTrialCount"], spec["maxFailedTrialCount"]) == (3, 2, 1)
    assert spec["algorithm"]["algorithmSettings"] == [{"name": "random_state", "value": "42"}]
    job = spec["trialTemplate"]["trialSpec"]
    args = job["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["containers"][0]["args"]
    assert args[:4] == [
        "--base-config",
        f"/mnt/models/runs/{RUN_ID}/hpo/train_config.json",
        "--trial-dir",
        f"/mnt/models/runs/{RUN_ID}/hpo/${{trialParameters.trialName}}",
    ]
    assert args[4:8] == ["--max_steps", "20", "--save_strategy", "no"]

    # The trials' base: the run's sft training from its base model, paths as the pods see them.
    base = json.loads((hpo_dir / "train_config.json").read_text())
    assert base["model_name_or_path"] == defaults()["model_name_or_path"] and base["stage"] == "sft"
    assert base["dataset_path"] == f"/mnt/data/runs/{RUN_ID}/dataset"
    assert base["output_dir"] == f"/mnt/models/runs/{RUN_ID}/hpo" and base["weight_decay"] == 0.01
    assert base["bf16"] is True and "use_cpu" not in base
    assert json.loads((hpo_dir / "experiment.json").read_text())["metadata"]["uid"]


def test_the_step_gives_up_after_the_trials_rounds_of_the_job_deadline(tmp_path, cluster, monkeypatch):
    seen = {}
    monkeypatch.setattr(
        follow,
        "run_experiment",
        lambda manifest, **kw: seen.update(kw) or (_ for _ in ()).throw(TimeoutError("stop here")),
    )
    with pytest.raises(TimeoutError):
        run_step(tmp_path, step_settings(hpo_trials=5, active_deadline_seconds=3600, pending_timeout_seconds=600))
    assert seen["timeout_seconds"] == 3 * (3600 + 600)  # ceil(5 / 2) rounds
    assert seen["pending_timeout_seconds"] == 600


def test_bad_search_settings_fail_the_step_before_anything_is_created(tmp_path, cluster):
    with pytest.raises(ValueError) as error:
        run_step(
            tmp_path,
            step_settings(hpo_search_space={"learning_rate": {"min": 1e-3, "max": 1e-4}}, hpo_parallel_trials=4),
        )
    assert str(error.value).splitlines() == [
        "hpo_search_space.learning_rate: min (0.001) must be below max (0.0001)",
        "hpo_parallel_trials (4) is more than hpo_trials (3); lower hpo_parallel_trials or raise hpo_trials",
    ]
    # Nothing but the step's own failure record, which the run's exit handler reads (components/observe/outcome.py).
    left = [p for p in (tmp_path / "models").rglob("*") if p.is_file()]
    assert cluster.requests == [] and [p.name for p in left] == ["search_hyperparameters.json"]
    assert json.loads(left[0].read_text())["state"] == "FAILED"


def test_with_hpo_off_the_step_returns_no_settings(tmp_path, cluster):
    best, report, hpo_dir = run_step(tmp_path, step_settings(hpo_trials=0))
    assert best == {} and "Off (`hpo_trials` is 0)" in report
    assert cluster.requests == [] and not hpo_dir.exists()


def test_integer_settings_come_back_from_kfps_struct_doubles():
    """KFP hands a dict parameter over as a protobuf Struct: every number a double."""
    space = {
        "lora_r": {"values": [8.0, 16.0]},
        "gradient_accumulation_steps": {"min": 1.0, "max": 8.0, "step": 2.0},
        "learning_rate": {"values": [1.0e-4, 2.0e-4]},
        "lora_alpha": {"values": [8.5, 16.0]},
    }
    typed = katib.typed_search_space(space)
    assert typed == {
        "lora_r": {"values": [8, 16]},
        "gradient_accumulation_steps": {"min": 1, "max": 8, "step": 2},
        "learning_rate": {"values": [1e-4, 2e-4]},
        "lora_alpha": {"values": [8.5, 16]},
    }
    assert [type(v) for v in typed["lora_r"]["values"]] == [int, int]
    errors = katib.check_search(typed, trials=3, parallel_trials=1, max_failed_trials=0, algorithm="tpe", method="lora")
    assert errors == ["hpo_search_space.lora_alpha.values must all be integers; [8.5] are not"]
