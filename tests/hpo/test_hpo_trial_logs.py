"""Failed trials leave their logs (components/hpo/follow.py, katib.py): the trial template keeps a trial's job and pods
(``retain: true``; without it Katib deletes them as soon as the trial ends), the step copies each failed trial's last
lines into its error and its report, and then deletes the Experiment itself, success or failure, so that nothing is
left holding GPUs. Against the fake API server through the real client.

Katib's StdOut collector runs the primary pod's trainer as ``sh -c "<command> 1>file 2>&1 && ..."`` and its
``metrics-logger-and-collector`` sidecar prints that file behind klog headers (file-metricscollector main.go); the
other pods' trainer containers log as usual.
"""

from __future__ import annotations

import pytest

from components import kube
from components.hpo import katib
from components.hpo.follow import METRICS_COLLECTOR, run_experiment
from components.kube import RUN_ID_LABEL
from components.train.launcher.trainjob import trainjob_for_run
from tests.fakes.katib import NAME, NS, RUN_ID, T1, T2, T3, KatibAPI, experiment, katib_ends, katib_runs, trial

WHAT = f"Experiment {NS}/{NAME}"
FAST = {"poll_seconds": 0.01}
GVP = (katib.GROUP, katib.VERSION, katib.PLURAL)
JOB_LABEL = "training.kubeflow.org/job-name"
CRASH = [
    "Traceback (most recent call last):",
    '  File "/app/components/train/trainer/sft.py", line 212, in main',
    "ValueError: learning_rate 0.0009 makes the loss diverge at step 3",
]
NCCL = "torch.distributed.DistBackendError: NCCL error in: ProcessGroupNCCL.cpp:1970, remote process exited"


@pytest.fixture(autouse=True)
def short_api_outages(monkeypatch):
    monkeypatch.setattr(kube, "API_RETRY_WINDOW_SECONDS", 3.0)


def klog(line: str) -> str:
    """A line as Katib's collector prints it (klog.Info)."""
    return f"I1124 02:13:25.123456      14 main.go:146] {line}"


def trial_crashes(api, name: str):
    """A 2-node PyTorchJob trial: its master (Katib's primary pod) crashes, its worker loses its peer."""

    def step(exp):
        master, worker = f"{name}-master-0", f"{name}-worker-0"
        labels = {RUN_ID_LABEL: RUN_ID, JOB_LABEL: name}
        api.add_pod(NS, master, labels, sidecars=(METRICS_COLLECTOR,))
        api.add_pod(NS, worker, labels)
        api.log(
            NS,
            master,
            *(klog(f"step {i}/20 | loss 2.{i} |") for i in range(1, 30)),
            klog(CRASH[0]),
            *map(klog, CRASH[1:]),
            container=METRICS_COLLECTOR,
        )
        api.set_container_state(NS, master, "terminated", reason="Error", exit_code=1)
        api.log(NS, worker, "step 3/20", NCCL)
        api.set_container_state(NS, worker, "terminated", reason="Error", exit_code=1)

    return step


def test_trials_keep_their_jobs_and_pods_until_the_step_deletes_the_experiment():
    job = trainjob_for_run(
        run_id=RUN_ID,
        namespace=NS,
        config_path=f"/mnt/models/runs/{RUN_ID}/hpo/c.json",
        trainer_image="t:1",
        num_nodes=2,
        gpus_per_node=8,
        data_pvc="d",
        model_pvc="m",
        hf_token_secret="hf",
        node_selector={},
        tolerations=[],
    )
    for exp in (experiment(), experiment(training_job=job)):
        assert exp["spec"]["trialTemplate"]["retain"] is True


def test_a_failed_search_reports_each_failed_trials_last_lines_and_deletes_the_experiment():
    message = "Trial has failed. Job message: PyTorchJob is failed because 1 Master replica(s) failed."
    with KatibAPI() as api:
        api.on_get(
            "experiments",
            api.steps(
                katib_runs(api, trial(T1, "9e-04", "Running")),
                trial_crashes(api, T1),
                katib_ends(
                    api,
                    "Failed",
                    "ExperimentFailed",
                    "Experiment has failed because max failed count has reached",
                    trial(T1, "9e-04", "Failed", message=message),
                ),
            ),
        )
        with pytest.raises(RuntimeError) as error:
            run_experiment(experiment(max_failed_trials=1), api_client=api.client, **FAST)
        assert len(api.requests_for("DELETE", f"/experiments/{NAME}")) == 1
        assert api.get_object(*GVP, NS, NAME) is None
    text = str(error.value)
    assert f"trial {T1} (learning_rate=0.0009): Failed: {message}" in text
    # The master is to blame (an unexplained error), not the worker that only lost its peer; klog headers stripped.
    assert f"pod {T1}-master-0: container pytorch terminated Error (exit code 1)" in text
    tail = text[text.index(f"last {katib.TRIAL_TAIL_LINES} lines of {T1}-master-0:") :].splitlines()[1:]
    assert [line.strip() for line in tail[-3:]] == [line.strip() for line in CRASH]
    assert len(tail) == katib.TRIAL_TAIL_LINES and "main.go" not in text and NCCL not in text


def test_a_search_that_succeeds_reports_its_failed_trials_last_lines_and_deletes_the_experiment():
    done = [trial(T2, "3e-05", "Succeeded", "1.75"), trial(T3, "1e-05", "Succeeded", "2.5")]
    with KatibAPI() as api:
        api.on_get(
            "experiments",
            api.steps(
                katib_runs(api, trial(T1, "9e-04", "Running"), trial(T2, "3e-05", "Running")),
                trial_crashes(api, T1),
                katib_runs(api, trial(T1, "9e-04", "Failed", message="Trial has failed"), *done),
                katib_ends(
                    api,
                    "Succeeded",
                    "ExperimentMaxTrialsReached",
                    "max trial count has reached",
                    trial(T1, "9e-04", "Failed", message="Trial has failed"),
                    *done,
                ),
            ),
        )
        exp, trials = run_experiment(experiment(max_failed_trials=2), api_client=api.client, **FAST)
        (delete,) = api.requests_for("DELETE", f"/experiments/{NAME}")
        assert api.get_object(*GVP, NS, NAME) is None  # its trials' jobs and pods go with it
    assert delete.body["propagationPolicy"] == "Background"
    report = katib.trials_markdown(exp, trials)
    assert f"**Best:** `{T2}`" in report
    section = report[report.index("### Why trials failed") :]
    assert f"`{T1}`: pod {T1}-master-0: container pytorch terminated Error (exit code 1)" in section
    assert "\n".join(CRASH) in section and "main.go" not in section
    assert [katib.trial_summaries([t])[0]["log_tail"] is None for t in trials if t["metadata"]["name"] != T1] == [
        True,
        True,
    ]


def test_a_trial_that_left_no_pod_says_so():
    with KatibAPI() as api:
        api.on_get(
            "experiments",
            api.steps(
                katib_runs(api, trial(T1, "9e-04", "Running")),
                katib_ends(
                    api,
                    "Failed",
                    "ExperimentFailed",
                    "max failed count has reached",
                    trial(T1, "9e-04", "Failed", message="Trial has failed"),
                ),
            ),
        )
        with pytest.raises(RuntimeError) as error:
            run_experiment(experiment(), api_client=api.client, **FAST)
    assert f"no pod of trial {T1} is left to read (kubectl -n {NS} describe pytorchjob {T1})" in str(error.value)
