"""--render writes the run's Tensorboard and, with a search, its Katib Experiment beside the jobs."""

import yaml

from tests.helpers.repo import run_cli


def test_render_writes_the_tensorboard_and_the_experiment(tmp_path):
    from tests.helpers.crd_schema import crd_errors
    from tests.helpers.katib_go import experiment_type_errors, katib_webhook_errors

    result = run_cli(
        "pipelines.run",
        "--preset",
        "qwen3-30b-a3b-full",
        "--namespace",
        "team-a",
        "-p",
        "hpo_trials=6",
        "-p",
        "hpo_parallel_trials=2",
        "-p",
        'hpo_search_space={"learning_rate": {"min": 1e-5, "max": 1e-4, "scale": "log"}}',
        "--render",
        str(tmp_path),
    )
    assert result.returncode == 0, result.stderr
    board = yaml.safe_load((tmp_path / "tensorboard.yaml").read_text())
    assert crd_errors(board, "tensorboard.kubeflow.org_tensorboards.yaml") == []
    assert board["spec"]["logspath"] == "pvc://llm-models/runs/render-preview"
    experiment = yaml.safe_load((tmp_path / "experiment.yaml").read_text())
    assert katib_webhook_errors(experiment) == [] and experiment_type_errors(experiment) == []
    assert experiment["metadata"]["namespace"] == "team-a"
    assert (experiment["spec"]["maxTrialCount"], experiment["spec"]["parallelTrialCount"]) == (6, 2)
    # The trials are the run's sft job (same image, volumes, GPUs), each with its own values and folder.
    job = yaml.safe_load((tmp_path / "pytorchjob.yaml").read_text())
    trial = experiment["spec"]["trialTemplate"]["trialSpec"]
    master, trial_master = (j["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"] for j in (job, trial))
    assert trial_master["volumes"] == master["volumes"]
    assert trial_master["containers"][0]["resources"] == master["containers"][0]["resources"]


def test_no_search_no_experiment_and_no_tensorboard_when_turned_off(tmp_path):
    result = run_cli(
        "pipelines.run", "--preset", "qwen3-30b-a3b-full", "-p", "tensorboard=false", "--render", str(tmp_path)
    )
    assert result.returncode == 0, result.stderr
    assert not (tmp_path / "experiment.yaml").exists() and not (tmp_path / "tensorboard.yaml").exists()


def test_a_bad_search_fails_before_anything_naming_the_setting(tmp_path):
    result = run_cli(
        "pipelines.run",
        "--preset",
        "qwen3-30b-a3b-full",
        "-p",
        "hpo_trials=2",
        "-p",
        "hpo_parallel_trials=3",
        "-p",
        "hpo_algorithm=magic",
        "--render",
        str(tmp_path / "r"),
    )
    assert result.returncode == 2 and "hpo_algorithm='magic' is not one of" in result.stderr
    assert "hpo_parallel_trials (3) is more than hpo_trials (2)" in result.stderr
    assert not (tmp_path / "r").exists()
