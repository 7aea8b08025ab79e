"""The Katib Experiment (components/hpo/katib.py) against Katib itself, offline.

Katib's Experiment CRD has no schema (x-kubernetes-preserve-unknown-fields): the API server keeps any field and
Katib's Go decoding silently drops one it does not know. So the rendered Experiment is checked against

- the Go types it is decoded into (``tests/reference/katib/experiment_types.go``, ``common_types.go``): every
  key must be a json field of its struct, of the right kind (``go_type_errors``);
- the admission webhook's rules (``katib/validator.go``), ported function by function in tests/helpers/katib_go.py
  (``katib_webhook_errors``);
- the CRDs of what Katib creates from it: each trial's PyTorchJob or TrainJob, after Katib's own substitution of
  the trial parameters (manifest/generator.go ``applyParameters``, ported as ``katib_trial_job``).

One slow test runs a trial for real, as the cluster would: the trial's container command after substitution,
wrapped by Katib's pod webhook (``sh -c "... 1>/var/log/katib/metrics.log 2>&1 && echo completed > ..."``,
pod/utils.go ``wrapWorkerContainer``), a real 1-process torchrun of the tiny model, and Katib's StdOut collector
(file-metricscollector.go ``parseLogsInTextFormat``, ported) reading eval_loss back from its output.
"""

from __future__ import annotations

import copy
import json
import os
import re
import shlex
import socket
import subprocess
import sys
import typing
from pathlib import Path

import pytest

from components.hpo import katib, trial
from components.kube import MAX_JOB_NAME
from components.train.launcher.pytorchjob import pytorchjob_for_run
from components.train.launcher.spec import validate_job
from components.train.launcher.trainjob import trainjob_for_run
from tests.helpers.crd_schema import crd_errors
from tests.helpers.katib_go import experiment_type_errors, katib_trial_job, katib_webhook_errors, trial_name

RUN_ID = "9c1f4e2a-5b7d-4c3e-8f1a-2d6b0e9a7c35"
NAMESPACE = "team-a"
SPACE = {"learning_rate": {"min": 1e-5, "max": 1e-4, "scale": "log"}, "lora_r": {"values": [8, 16, 32]}}


def training_job(kind: str = "pytorchjob", **options) -> dict:
    """The run's job as the launcher builds it (pytorchjob_for_run / trainjob_for_run)."""
    common = dict(
        run_id=RUN_ID,
        namespace=NAMESPACE,
        config_path=f"/mnt/models/runs/{RUN_ID}/train/train_config.json",
        trainer_image="ghcr.io/kubeflow-llm-post-training/trainer:0.1.0",
        num_nodes=2,
        gpus_per_node=8,
        data_pvc="llm-data",
        model_pvc="llm-models",
        hf_token_secret="hf-token",
        node_selector={"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"},
        tolerations=[{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
    )
    common.update(options)
    return trainjob_for_run(**common) if kind == "trainjob" else pytorchjob_for_run(**common)


def experiment(job: dict | None = None, **over) -> dict:
    args = dict(
        name=katib.experiment_name_for(RUN_ID),
        namespace=NAMESPACE,
        training_job=job or training_job(),
        trials_dir=katib.trials_dir_for(RUN_ID),
        search_space=SPACE,
        trials=12,
        parallel_trials=2,
        max_failed_trials=3,
        algorithm="tpe",
        trial_steps=50,
        method="lora",
        seed=42,
    )
    args.update(over)
    return katib.experiment_manifest(**args)


# -- the rendered Experiment ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kind, options",
    [("pytorchjob", {}), ("pytorchjob", {"min_nodes": 1}), ("pytorchjob", {"num_nodes": 1}), ("trainjob", {})],
)
def test_the_experiment_passes_katibs_webhook_and_go_types(kind, options):
    exp = experiment(training_job(kind, **options))
    assert katib_webhook_errors(exp) == []
    assert experiment_type_errors(exp) == []
    assert crd_errors(exp, "kubeflow.org_experiments.yaml") == []


def test_the_objective_is_the_trainers_eval_loss_minimised_read_from_its_output():
    spec = experiment()["spec"]
    assert spec["objective"]["type"] == "minimize" and spec["objective"]["objectiveMetricName"] == "eval_loss"
    assert spec["metricsCollectorSpec"]["collector"] == {"kind": "StdOut"}
    assert (spec["maxTrialCount"], spec["parallelTrialCount"], spec["maxFailedTrialCount"]) == (12, 2, 3)
    assert spec["algorithm"] == {"algorithmName": "tpe", "algorithmSettings": [{"name": "random_state", "value": "42"}]}
    assert spec["resumePolicy"] == "Never"


def test_the_search_space_becomes_katib_parameters():
    space = {
        "learning_rate": {"min": 1e-5, "max": 1e-4, "scale": "log"},
        "lora_r": {"values": [8, 16, 32]},
        "lora_alpha": {"min": 16, "max": 64, "step": 16},
        "lr_scheduler_type": {"values": ["cosine", "linear"]},
        "warmup_ratio": {"min": 0.0, "max": 0.1},
    }
    params = {p["name"]: p for p in experiment(search_space=space)["spec"]["parameters"]}
    assert params["learning_rate"] == {
        "name": "learning_rate",
        "parameterType": "double",
        "feasibleSpace": {"min": "1e-05", "max": "0.0001", "distribution": "logUniform"},
    }
    assert params["lora_r"]["parameterType"] == "discrete"
    assert params["lora_r"]["feasibleSpace"] == {"list": ["8", "16", "32"]}
    assert params["lora_alpha"] == {
        "name": "lora_alpha",
        "parameterType": "int",
        "feasibleSpace": {"min": "16", "max": "64", "step": "16", "distribution": "uniform"},
    }
    assert params["lr_scheduler_type"]["parameterType"] == "categorical"
    assert params["warmup_ratio"]["feasibleSpace"]["min"] == "0.0"


def trainer_containers(job: dict) -> list[dict]:
    if job["kind"] == "TrainJob":
        return [job["spec"]["trainer"]]
    return [c for s in job["spec"]["pytorchReplicaSpecs"].values() for c in s["template"]["spec"]["containers"]]


@pytest.mark.parametrize("kind, options", [("pytorchjob", {}), ("pytorchjob", {"min_nodes": 1}), ("trainjob", {})])
def test_each_trial_is_the_runs_job_with_its_own_values_and_folder(kind, options):
    job = training_job(kind, **options)
    before = copy.deepcopy(job)
    exp = experiment(job)
    assert job == before  # the launcher's job is copied, not changed
    name = trial_name(exp)
    run = katib_trial_job(exp, name, {"learning_rate": "3.1e-05", "lora_r": "16"})
    # What Katib creates is a valid job of the kind the launcher runs, under the operator's name rules.
    crd = "trainer.kubeflow.org_trainjobs.yaml" if kind == "trainjob" else "kubeflow.org_pytorchjobs.yaml"
    assert crd_errors(run, crd) == []
    validate_job(run["metadata"]["name"], "image", 1, 1)
    assert len(name) <= MAX_JOB_NAME and run["metadata"]["labels"] == job["metadata"]["labels"]
    originals = trainer_containers(job)
    for container, original in zip(trainer_containers(run), originals, strict=True):
        assert container.pop("command") == ["python", "-m", "components.hpo.trial"]
        base, trial_dir, overrides, command = trial.parse_args(container.pop("args"))
        assert base == f"/mnt/models/runs/{RUN_ID}/train/train_config.json"
        assert trial_dir == f"/mnt/models/runs/{RUN_ID}/hpo/{name}"
        assert overrides == {"max_steps": 50, "save_strategy": "no", "learning_rate": 3.1e-05, "lora_r": 16}
        # The launcher's own torchrun, on the trial's config.
        assert command == [*original["command"], *original["args"][:-1], f"{trial_dir}/train_config.json"]
    # Everything else is the launcher's job.
    for original in originals:
        del original["command"], original["args"]
    assert {**run, "metadata": None} == {**job, "metadata": None}


@pytest.mark.parametrize(
    "kind, options, container, labels",
    [
        ("pytorchjob", {}, "pytorch", {"training.kubeflow.org/job-role": "master"}),
        (
            "pytorchjob",
            {"min_nodes": 1},
            "pytorch",
            {"training.kubeflow.org/replica-type": "worker", "training.kubeflow.org/replica-index": "0"},
        ),
        (
            "trainjob",
            {},
            "node",
            {"jobset.sigs.k8s.io/replicatedjob-name": "node", "batch.kubernetes.io/job-completion-index": "0"},
        ),
    ],
)
def test_katib_collects_from_the_pod_of_node_rank_zero(kind, options, container, labels):
    template = experiment(training_job(kind, **options))["spec"]["trialTemplate"]
    assert template["primaryContainerName"] == container and template["primaryPodLabels"] == labels
    done = "Complete" if kind == "trainjob" else "Succeeded"  # Katib's defaults for these kinds
    assert template["successCondition"] == f'status.conditions.#(type=="{done}")#|#(status=="True")#'


def test_a_job_without_a_config_file_argument_is_refused():
    job = training_job()
    for spec in job["spec"]["pytorchReplicaSpecs"].values():
        spec["template"]["spec"]["containers"][0]["args"] = ["--nnodes", "2"]
    with pytest.raises(ValueError, match="no --config FILE"):
        experiment(job)
    with pytest.raises(ValueError, match="arguments sh would interpret"):
        experiment(training_job(config_path="/mnt/models/runs/my run/train_config.json"))
    with pytest.raises(ValueError, match="PyTorchJob or a TrainJob"):
        experiment({"kind": "Job", "metadata": {}, "spec": {}})


def test_experiment_names_fit_katibs_limit_and_leave_room_for_trial_names():
    assert katib.experiment_name_for("run-1") == "hpo-run-1"
    long = katib.experiment_name_for(RUN_ID)
    assert len(long) <= 40 and long.startswith("hpo-9c1f4e2a") and long == katib.experiment_name_for(RUN_ID)
    assert len(long) + 9 <= MAX_JOB_NAME  # Katib's "-<8 characters>" per trial
    with pytest.raises(ValueError, match="name 'Hpo_1' must be a DNS-1035 label"):
        experiment(name="Hpo_1")


def test_the_go_type_check_catches_a_misspelt_field():
    exp = experiment()
    exp["spec"]["parallelTrialsCount"] = 2
    exp["spec"]["parameters"][0]["feasibleSpace"]["maximum"] = "1"
    exp["spec"]["maxTrialCount"] = "12"
    errors = experiment_type_errors(exp)
    assert any(e.startswith("spec.parallelTrialsCount: not a field of ExperimentSpec") for e in errors)
    assert any(e.startswith("spec.parameters[0].feasibleSpace.maximum: not a field of FeasibleSpace") for e in errors)
    assert "spec.maxTrialCount: must be int32, got '12'" in errors


def test_the_webhook_port_refuses_what_katib_refuses():
    exp = experiment()
    exp["spec"]["parallelTrialCount"] = 20
    exp["spec"]["trialTemplate"]["trialSpec"]["metadata"]["name"] = "fixed"
    exp["spec"]["trialTemplate"]["trialParameters"].pop()  # lora_r is still in the template
    exp["spec"]["metricsCollectorSpec"]["source"]["filter"]["metricsFormat"] = ["eval_loss=(.*)"]
    errors = katib_webhook_errors(exp)
    assert "spec.parallelTrialCount: should be less than or equal to spec.maxTrialCount" in errors
    assert "spec.trialTemplate: metadata.name and metadata.namespace must be omitted" in errors
    assert any("${trialParameters.lora_r}" in e for e in errors)
    assert any("two top subexpressions" in e for e in errors)


# -- check_search: one error per problem, naming the setting and the fix ------------------------------------


def search_errors(space=SPACE, **over) -> list[str]:
    args = dict(trials=12, parallel_trials=2, max_failed_trials=3, algorithm="tpe", method="lora")
    args.update(over)
    return katib.check_search(space, **args)


def test_a_sound_search_has_no_errors():
    assert search_errors() == []
    assert (
        search_errors(
            {"learning_rate": {"min": 1e-5, "max": 1e-4, "step": 2e-5}, "lora_r": {"values": [8, 16]}},
            algorithm="grid",
            trials=10,
        )
        == []
    )


@pytest.mark.parametrize(
    "space, over, expected",
    [
        ({}, {}, "hpo_search_space is empty"),
        (None, {}, "hpo_search_space is empty"),
        (
            SPACE,
            {"trials": 2, "parallel_trials": 4, "max_failed_trials": 1},
            "hpo_parallel_trials (4) is more than hpo_trials (2)",
        ),
        (SPACE, {"trials": 0}, "hpo_trials must be >= 1"),
        (SPACE, {"parallel_trials": 0}, "hpo_parallel_trials must be >= 1"),
        (SPACE, {"max_failed_trials": 13}, "hpo_max_failed_trials must be between 0 and hpo_trials (12)"),
        (SPACE, {"algorithm": "hyperband"}, "hpo_algorithm 'hyperband' is not one of"),
        (
            {"learning_rte": {"min": 1e-5, "max": 1e-4}},
            {},
            "hpo_search_space.learning_rte: not a setting a trial can vary",
        ),
        ({"per_device_train_batch_size": {"values": [1, 2]}}, {}, "per_device_train_batch_size: not a setting"),
        ({"learning_rate": {"min": 1e-4, "max": 1e-5}}, {}, "learning_rate: min (0.0001) must be below max (1e-05)"),
        ({"learning_rate": {"min": 0, "max": 1e-4, "scale": "log"}}, {}, "a log scale needs min > 0"),
        ({"learning_rate": {"min": 1e-5, "max": 1e-4, "scale": "exp"}}, {}, "learning_rate.scale must be one of"),
        ({"learning_rate": {"min": 1e-5}}, {}, "learning_rate needs both min and max"),
        ({"learning_rate": {"min": "1e-5", "max": 1e-4}}, {}, "min and max must be numbers"),
        ({"learning_rate": {"min": 1e-5, "max": 1e-4, "values": [1e-5]}}, {}, "give either values or min/max"),
        ({"learning_rate": {"low": 1e-5, "high": 1e-4}}, {}, "learning_rate: unknown keys ['high', 'low']"),
        ({"learning_rate": [1e-5, 1e-4]}, {}, "hpo_search_space.learning_rate must be an object"),
        ({"lora_r": {"values": [8]}}, {}, "lora_r.values must list two or more values"),
        ({"lora_r": {"values": [8, 8.5]}}, {}, "lora_r.values must all be integers"),
        ({"lora_r": {"values": [8, 16, 8]}}, {}, "lora_r.values lists a value twice"),
        ({"lora_r": {"min": 8, "max": 32.0}}, {}, "lora_r: min and max must be integers"),
        ({"lora_r": {"values": [8, 16]}}, {"method": "full"}, "LoRA settings do nothing with method 'full'"),
        ({"lr_scheduler_type": {"min": 0, "max": 1}}, {}, "lr_scheduler_type is a name, not a number"),
        ({"lr_scheduler_type": {"values": ["cosine", "linear; rm -rf /"]}}, {}, "values must be plain names"),
        ({"learning_rate": {"min": 1e-5, "max": 1e-4, "step": 1e-3}}, {}, "learning_rate.step (0.001) is larger than"),
        (
            {"learning_rate": {"min": 1e-5, "max": 1e-4, "step": -1e-5}},
            {},
            "learning_rate.step must be a positive number",
        ),
        (
            {"learning_rate": {"min": 1e-5, "max": 1e-4}},
            {"algorithm": "grid"},
            "the grid needs a step for a real range",
        ),
        (
            {"learning_rate": {"min": 1e-5, "max": 1e-4, "scale": "log"}},
            {"algorithm": "grid"},
            "the grid steps evenly from min to max and would ignore scale 'log'",
        ),
        (
            {"lora_r": {"values": [8, 16]}},
            {"algorithm": "grid", "trials": 3},
            "hpo_trials (3) is more than the grid's 2 combinations",
        ),
        (
            {"learning_rate": {"min": 1e-5, "max": 1e-4, "scale": "log"}},
            {"algorithm": "sobol"},
            "algorithm 'sobol' draws it uniformly and would ignore scale 'log'",
        ),
        (
            {"lora_r": {"min": 8, "max": 64, "scale": "log"}},
            {"algorithm": "bayesianoptimization"},
            "algorithm 'bayesianoptimization' draws it uniformly",
        ),
        (
            {"weight_decay": {"min": 0.0, "max": 0.1}},
            {"algorithm": "bayesianoptimization"},
            "draws real values log-uniformly, so min must be > 0",
        ),
        (
            {"learning_rate": {"min": 1e-5, "max": 1e-4}},
            {"algorithm": "cmaes"},
            "'cmaes' needs two or more min/max settings",
        ),
    ],
)
def test_each_problem_is_one_error_naming_the_setting(space, over, expected):
    errors = search_errors(space, **over)
    assert len(errors) == 1, errors
    assert expected in errors[0], errors[0]


def test_every_problem_is_reported_at_once():
    errors = search_errors(
        {"learning_rate": {"min": 1e-4, "max": 1e-5}, "lora_r": {"values": [8]}},
        trials=2,
        parallel_trials=4,
        max_failed_trials=1,
        algorithm="annealing",
    )
    assert len(errors) == 4, errors
    with pytest.raises(ValueError) as raised:
        experiment(
            search_space={"lora_r": {"values": [8]}}, trials=2, parallel_trials=4, max_failed_trials=1, trial_steps=0
        )
    assert len(str(raised.value).splitlines()) == 3


def test_searchable_settings_are_settings_and_trainer_fields_of_the_same_type():
    from components.settings import TrainerSettings
    from components.train.trainer.arguments import SFTConfig

    # By setting name and type: the best trial's parameters go straight into the final run's settings.
    settings = {
        name: kind
        for group in typing.get_type_hints(TrainerSettings).values()
        for name, kind in typing.get_type_hints(group).items()
    }
    assert {n: settings.get(n) for n in katib.SEARCHABLE} == katib.SEARCHABLE

    hints = typing.get_type_hints(SFTConfig)
    for name, kind in {**katib.SEARCHABLE, **katib.TRIAL_FIELDS}.items():
        hint = hints[katib.TRAINER_FIELD.get(name, name)]
        options = typing.get_args(hint) or (hint,)
        assert kind in options, (name, hint)
    assert set(trial.FIELD_TYPES) == {katib.TRAINER_FIELD.get(n, n) for n in katib.SEARCHABLE} | set(katib.TRIAL_FIELDS)


# -- the metrics Katib reads ----------------------------------------------------------------------------------


def katib_observations(lines: list[str], metrics: list[str], formats: list[str]) -> list[tuple[str, str]]:
    """file-metricscollector.go ``parseLogsInTextFormat``: (name, value) per match, in order; the objective (the
    first metric) missing is one ``unavailable`` value (``newObservationLog``)."""
    found = []
    for line in lines:
        if not any(m in line for m in metrics):
            continue
        for fmt in formats:
            for match in re.finditer(fmt, line):
                if match.lastindex and match.lastindex >= 2 and match.group(1).strip() in metrics:
                    found.append((match.group(1).strip(), match.group(2).strip()))
    return found if any(n == metrics[0] for n, _ in found) else [(metrics[0], "unavailable")]


def test_the_metrics_format_reads_the_trainers_lines_and_nothing_else():
    metrics = [katib.OBJECTIVE, katib.TRAIN_LOSS]
    lines = [
        '2026-08-21 10:00:00,001 rank0 sft: config (non-default fields): {"eval_strategy": "no", "loss": 1}',
        "2026-08-21 10:00:05,002 rank0 sft.progress: step 5/10 | loss 2.3456 | lr 2e-05 | 310 tokens/s/device | "
        "MFU n/a (no known GPU peak) | ETA 5s",
        "2026-08-21 10:00:09,003 rank0 sft.progress: step 10/10 | loss 1.25e-01 | lr 0 | 300 tokens/s/device | ...",
        "2026-08-21 10:00:11,004 rank0 sft: metrics {'train_loss_logged_mean': 1.2, 'final_train_loss': 0.125, "
        "'eval_loss': 5.376312255859375, 'global_step': 10}",
    ]
    assert katib_observations(lines, metrics, katib.METRICS_FORMAT) == [
        ("loss", "2.3456"),
        ("loss", "1.25e-01"),
        ("eval_loss", "5.376312255859375"),
    ]
    nan = ["rank0 sft: metrics {'eval_loss': nan, 'global_step': 10}"]
    assert katib_observations(nan, metrics, katib.METRICS_FORMAT) == [("eval_loss", "unavailable")]


def test_the_progress_callback_prints_what_the_format_reads(caplog):
    from types import SimpleNamespace

    from components.train.trainer.callbacks import ProgressCallback

    callback = ProgressCallback(flops_per_token=1e6, world_size=1, peak=None)
    state = SimpleNamespace(global_step=0, num_input_tokens_seen=0, max_steps=4, is_world_process_zero=True)
    callback.on_train_begin(None, state, None)
    state.global_step, state.num_input_tokens_seen = 2, 512
    with caplog.at_level("INFO", logger="sft.progress"):
        callback.on_log(None, state, None, logs={"loss": 1.98766, "learning_rate": 1e-4})
    assert katib_observations(caplog.messages, [katib.TRAIN_LOSS], katib.METRICS_FORMAT) == [("loss", "1.9877")]


# -- the trial entry point ---------------------------------------------------------------------------------------


def test_the_trial_entry_point_writes_the_runs_config_with_the_trials_values(tmp_path):
    base = tmp_path / "train_config.json"
    base.write_text(
        json.dumps(
            {
                "learning_rate": 5e-5,
                "output_dir": "/mnt/models/runs/r/train",
                "max_steps": -1,
                "warmup_steps": 0.03,
                "lora_r": 16,
            }
        )
    )
    trial_dir = str(tmp_path / "hpo" / "t1")
    argv = [
        "--base-config",
        str(base),
        "--trial-dir",
        trial_dir,
        "--max_steps",
        "5",
        "--save_strategy",
        "no",
        "--learning_rate",
        "3.1e-05",
        "--warmup_steps",
        "0.1",
        "--lora_r",
        "32",
        "--lr_scheduler_type",
        "linear",
        "--",
        "torchrun",
        "-m",
        "components.train.trainer",
        "--config",
        f"{trial_dir}/train_config.json",
    ]
    b, d, overrides, command = trial.parse_args(argv)
    path = trial.write_trial_config(b, d, overrides)
    assert json.loads(Path(path).read_text()) == {
        "learning_rate": 3.1e-05,
        "output_dir": trial_dir,
        "max_steps": 5,
        "save_strategy": "no",
        "warmup_steps": 0.1,
        "lora_r": 32,
        "lr_scheduler_type": "linear",
    }
    assert [p.name for p in Path(trial_dir).iterdir()] == ["train_config.json"]  # no temporary file left


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--base-config", "b", "--trial-dir", "d"], "no command"),
        (
            ["--trial-dir", "d", "--", "torchrun", "--config", "d/train_config.json"],
            "--base-config FILE and --trial-dir",
        ),
        (
            [
                "--base-config",
                "b",
                "--trial-dir",
                "d",
                "--output_dir",
                "x",
                "--",
                "torchrun",
                "--config",
                "d/train_config.json",
            ],
            "--output_dir is not a setting a trial can set",
        ),
        (
            [
                "--base-config",
                "b",
                "--trial-dir",
                "d",
                "--lora_r",
                "8.5",
                "--",
                "torchrun",
                "--config",
                "d/train_config.json",
            ],
            "--lora_r must be an integer",
        ),
        (
            [
                "--base-config",
                "b",
                "--trial-dir",
                "d",
                "--learning_rate",
                "fast",
                "--",
                "x",
                "--config",
                "d/train_config.json",
            ],
            "--learning_rate must be a number",
        ),
        (["--base-config", "b", "--trial-dir", "d", "--", "torchrun", "--config", "b"], "must read the trial's config"),
        (["--base-config", "b", "--trial-dir", "d", "--lora_r", "--", "torchrun"], "every option takes one value"),
    ],
)
def test_bad_trial_arguments_are_one_line_and_exit_code_2(argv, message, capsys):
    with pytest.raises(SystemExit) as exited:
        trial.main(argv)
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and message in err and len(err.strip().splitlines()) == 1


def test_a_missing_base_config_is_exit_code_2(tmp_path, capsys):
    with pytest.raises(SystemExit) as exited:
        trial.main(
            [
                "--base-config",
                str(tmp_path / "nope.json"),
                "--trial-dir",
                str(tmp_path / "t"),
                "--",
                "torchrun",
                "--config",
                str(tmp_path / "t" / "train_config.json"),
            ]
        )
    assert exited.value.code == 2 and "no such file (the run's trainer config)" in capsys.readouterr().err


# -- reading the results back ---------------------------------------------------------------------------------


def katib_status(exp: dict) -> dict:
    """An Experiment as Katib reports it after 3 trials: one best, one failed, one without metrics."""
    done = {
        **exp,
        "status": {
            "conditions": [
                {"type": "Created", "status": "True"},
                {"type": "Running", "status": "False"},
                {"type": "Succeeded", "status": "True", "reason": "ExperimentMaxTrialsReached"},
            ],
            "currentOptimalTrial": {
                "bestTrialName": "hpo-x-aaaa1111",
                "parameterAssignments": [
                    {"name": "learning_rate", "value": "3.1e-05"},
                    {"name": "lora_r", "value": "16"},
                ],
                "observation": {
                    "metrics": [
                        {"name": "eval_loss", "min": "1.8", "max": "1.8", "latest": "1.8"},
                        {"name": "loss", "min": "1.7", "max": "2.9", "latest": "1.75"},
                    ]
                },
            },
            "succeededTrialList": ["hpo-x-aaaa1111", "hpo-x-cccc3333"],
            "failedTrialList": ["hpo-x-bbbb2222"],
            "trials": 3,
            "trialsSucceeded": 2,
            "trialsFailed": 1,
        },
    }
    assert experiment_type_errors(done) == []  # the fixture is shaped like Katib's ExperimentStatus
    return done


def katib_trial(name: str, created: str, assignments: dict, conditions: list, metrics: dict | None) -> dict:
    observation = (
        {"metrics": [{"name": k, "min": v, "max": v, "latest": v} for k, v in metrics.items()]}
        if metrics is not None
        else None
    )
    return {
        "apiVersion": "kubeflow.org/v1beta1",
        "kind": "Trial",
        "metadata": {"name": name, "creationTimestamp": created, "labels": {katib.EXPERIMENT_LABEL: "hpo-x"}},
        "spec": {"parameterAssignments": [{"name": k, "value": v} for k, v in assignments.items()]},
        "status": {
            "startTime": created,
            "conditions": conditions,
            **({"observation": observation} if observation else {}),
        },
    }


TRIALS = [
    katib_trial(
        "hpo-x-cccc3333",
        "2026-08-21T10:00:00Z",
        {"learning_rate": "9e-05", "lora_r": "32"},
        [{"type": "Created", "status": "True"}, {"type": "Succeeded", "status": "True"}],
        {"eval_loss": "2.25", "loss": "2.0"},
    ),
    katib_trial(
        "hpo-x-bbbb2222",
        "2026-08-21T10:01:00Z",
        {"learning_rate": "1e-05", "lora_r": "8"},
        [
            {"type": "Created", "status": "True"},
            {"type": "Failed", "status": "True", "message": "Trial has failed. Job message: OOMKilled | exit 137"},
        ],
        None,
    ),
    katib_trial(
        "hpo-x-aaaa1111",
        "2026-08-21T10:02:00Z",
        {"learning_rate": "3.1e-05", "lora_r": "16"},
        [{"type": "Created", "status": "True"}, {"type": "Succeeded", "status": "True"}],
        {"eval_loss": "1.8", "loss": "unavailable"},
    ),
]


def test_the_best_trials_parameters_come_back_as_setting_values():
    best = katib.best_trial(katib_status(experiment()))
    assert best == {
        "name": "hpo-x-aaaa1111",
        "parameters": {"learning_rate": 3.1e-05, "lora_r": 16},
        "eval_loss": 1.8,
        "loss": 1.75,
    }
    assert isinstance(best["parameters"]["lora_r"], int)


def test_no_best_trial_is_a_clear_error():
    exp = {**experiment(), "status": {"trials": 2, "trialsFailed": 2, "currentOptimalTrial": {}}}
    with pytest.raises(ValueError, match=r"has no best trial: no trial reported eval_loss \(trials 2, failed 2\)"):
        katib.best_trial(exp)


def test_every_trial_is_summarised_best_first():
    rows = katib.trial_summaries(TRIALS)
    assert [(r["name"], r["state"], r["eval_loss"], r["loss"]) for r in rows] == [
        ("hpo-x-aaaa1111", "Succeeded", 1.8, None),
        ("hpo-x-cccc3333", "Succeeded", 2.25, 2.0),
        ("hpo-x-bbbb2222", "Failed", None, None),
    ]
    assert rows[2]["parameters"] == {"learning_rate": 1e-05, "lora_r": 8} and "OOMKilled" in rows[2]["message"]
    report = katib.trials_markdown(katib_status(experiment()), TRIALS)
    assert "**Best:** `hpo-x-aaaa1111`: eval_loss 1.8000 with learning_rate=3.1e-05, lora_r=16." in report
    assert "| trial | state | learning_rate | lora_r | eval_loss | last loss |" in report
    assert (
        "| `hpo-x-bbbb2222` | Failed: Trial has failed. Job message: OOMKilled \\| exit 137 | 1e-05 | 8 | - | - |"
        in report
    )
    assert len([line for line in report.splitlines() if line.startswith("| `")]) == 3


# -- one trial, run as the cluster runs it -------------------------------------------------------------------


def katib_wrapped_command(container: dict, metrics_file: str) -> list[str]:
    """pod/utils.go ``wrapWorkerContainer`` for the StdOut collector: the primary container becomes ``sh -c``."""
    args = [*container["command"], *container["args"], f"1>{metrics_file} 2>&1"]
    args += ["&&", f"echo completed > {os.path.dirname(metrics_file)}/$$$$.pid"]
    return ["sh", "-c", " ".join(args)]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_a_trial_runs_the_real_trainer_and_katib_reads_its_eval_loss(tmp_path):
    from tests.helpers.trainer import make_workdir

    root = make_workdir(tmp_path)
    # A CPU run's trainer config, as the train step writes it (components/train/config.py), with checkpoints
    # every step and a long run: the trial must override both.
    base = root / "run" / "train_config.json"
    base.parent.mkdir()
    base.write_text(
        json.dumps(
            {
                "model_name_or_path": str(root / "base"),
                "dataset_path": str(root / "data"),
                "output_dir": str(root / "run"),
                "model_cache_dir": str(root / "cache"),
                "method": "full",
                "max_seq_length": 128,
                "seed": 0,
                "per_device_train_batch_size": 2,
                "per_device_eval_batch_size": 2,
                "learning_rate": 3e-3,
                "max_steps": 20,
                "lr_scheduler_type": "cosine",
                "logging_steps": 1,
                "save_strategy": "steps",
                "save_steps": 1,
                "report_to": ["tensorboard"],
                "include_num_input_tokens_seen": "non_padding",
                "remove_unused_columns": False,
                "dataloader_num_workers": 0,
                "use_cpu": True,
                "ddp_backend": "gloo",
                "ddp_find_unused_parameters": False,
            }
        )
    )
    # The job as the pods see it: the config in the run's folder on the models claim (the only folder they may write);
    # run here, the command reads this machine's copy of that folder.
    pod_config = f"/mnt/models/runs/{RUN_ID}/train/train_config.json"
    job = training_job(config_path=pod_config, num_nodes=1, gpus_per_node=1)
    exp = experiment(
        job,
        trials_dir=str(root / "hpo"),
        trial_steps=3,
        method="full",
        algorithm="random",
        search_space={
            "learning_rate": {"min": 1e-3, "max": 1e-2, "scale": "log"},
            "lr_scheduler_type": {"values": ["cosine", "linear"]},
        },
    )
    assert katib_webhook_errors(exp) == []
    name = trial_name(exp)
    run = katib_trial_job(exp, name, {"learning_rate": "0.005", "lr_scheduler_type": "linear"})
    master = run["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["containers"][0]
    katib_dir = tmp_path / "katib"
    katib_dir.mkdir()
    command = [
        arg.replace(pod_config, str(base)) for arg in katib_wrapped_command(master, str(katib_dir / "metrics.log"))
    ]
    assert any(str(base) in arg for arg in command)
    # The container's env, the operator's rendezvous env, and the trainer image's PATH (here: this virtualenv).
    env = {e["name"]: e["value"] for e in master["env"] if "value" in e}
    env.update(
        HF_HOME=str(tmp_path / "hf"),
        PATH=f"{Path(sys.executable).parent}:{os.environ['PATH']}",
        PET_MASTER_ADDR="localhost",
        PET_MASTER_PORT=str(_free_port()),
        PET_NODE_RANK="0",
        PET_NNODES="1",
        PET_NPROC_PER_NODE="1",
        OMP_NUM_THREADS="2",
        HOME=os.environ.get("HOME", str(tmp_path)),
    )
    done = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    output = (katib_dir / "metrics.log").read_text()
    assert done.returncode == 0, f"{shlex.join(command)}\n{output[-4000:]}{done.stderr[-2000:]}"
    assert [p.read_text() for p in katib_dir.glob("*.pid")] == ["completed\n"]

    trial_dir = root / "hpo" / name
    config = json.loads((trial_dir / "train_config.json").read_text())
    assert (config["learning_rate"], config["lr_scheduler_type"], config["max_steps"]) == (0.005, "linear", 3)
    assert config["output_dir"] == str(trial_dir) and config["save_strategy"] == "no"
    metrics = json.loads((trial_dir / "metrics.json").read_text())
    assert metrics["global_step"] == 3
    assert not list(trial_dir.glob("checkpoint-*")) and list((trial_dir / "tensorboard").glob("events.out.*"))
    assert [p.name for p in (root / "run").iterdir()] == ["train_config.json"]  # the run's own folder is untouched

    observed = katib_observations(output.splitlines(), [katib.OBJECTIVE, katib.TRAIN_LOSS], katib.METRICS_FORMAT)
    assert [float(v) for n, v in observed if n == "eval_loss"] == [metrics["eval_loss"]]
    assert len([v for n, v in observed if n == "loss"]) == 3  # one progress line per step (logging_steps 1)
