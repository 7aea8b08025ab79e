"""validate_inputs as the pipeline runs it: parameter checks, then the cluster preflight.

The preflight talks to the fake API server through a kubeconfig, exactly as the step would load
credentials outside a pod: nothing in the code under test is replaced.
"""

import pytest

from components.settings import ADVANCED, Settings, split_arguments
from components.stages import stage_train_settings
from components.validate.component import validate_inputs
from pipelines import params as P
from tests.helpers.pipeline_args import reference_arguments as _inputs

# The cluster fixture is tests/conftest.py's.


def test_reference_run_passes_parameter_checks_and_preflight(cluster):
    outputs = validate_inputs.python_func(**_inputs(lora_r=32))
    settings = outputs.settings
    assert cluster.requests_for("GET", "persistentvolumeclaims/llm-data")
    # Its output is every setting, resolved: advanced ones (lora_r) included, for the later steps.
    assert settings == P.resolve("qwen3-30b-a3b-full", overrides=["lora_r=32"])
    assert outputs._fields == ("settings",)  # the stage slots come with each variant (components/variants/)


def test_advanced_settings_are_checked_by_name_and_type():
    args = _inputs()
    with pytest.raises(ValueError, match="advanced_settings: unknown setting 'lora_rank'; did you mean 'lora_r'"):
        validate_inputs.python_func(**{**args, "advanced_settings": {"lora_rank": 8}})
    with pytest.raises(ValueError, match="advanced_settings: 'learning_rate' is a pipeline parameter of its own"):
        validate_inputs.python_func(**{**args, "advanced_settings": {"learning_rate": 1e-5}})
    with pytest.raises(ValueError, match="invalid settings: lora_r must be a int, got '8'"):
        validate_inputs.python_func(**{**args, "advanced_settings": {"lora_r": "8"}})
    # KFP carries a dict parameter as a protobuf Struct: every number arrives as a double.
    assert (
        validate_inputs.python_func(
            **{
                **args,
                "train_backend": "local",
                "num_nodes": 1,
                "deploy_backend": "local",
                "advanced_settings": {"lora_r": 8.0},
            }
        ).settings["lora_r"]
        == 8
    )


def test_a_stages_integer_settings_survive_kfps_doubles():
    # KFP carries advanced_settings as a protobuf Struct, nested objects too: stage_settings' 8 arrives as 8.0,
    # and was refused as "stage_settings.sft: lora_r must be a int, got 8.0".
    args = split_arguments(P.resolve("local-tiny"))
    args[ADVANCED] = {**args[ADVANCED], "stage_settings": {"sft": {"lora_r": 8.0, "learning_rate": 1e-4}}}
    settings = validate_inputs.python_func(**args).settings
    assert settings["stage_settings"] == {"sft": {"lora_r": 8, "learning_rate": 1e-4}}
    assert isinstance(settings["stage_settings"]["sft"]["lora_r"], int)
    # And a later step, which reads them through the model, trains with an int.
    model = stage_train_settings(Settings.from_flat(settings), "sft", "base").model
    assert model.lora_r == 8 and isinstance(model.lora_r, int)


def test_missing_claim_and_too_few_gpu_nodes_fail_before_any_job(cluster):
    with pytest.raises(ValueError) as e:
        validate_inputs.python_func(**_inputs(model_pvc="llm-checkpoints", num_nodes=3))
    message = str(e.value)
    assert message.startswith("cluster preflight: ")
    assert "llm-checkpoints" in message and "3" in message
    assert not cluster.requests_for("POST", "pytorchjobs")


def test_invalid_parameters_fail_before_the_cluster_is_asked(cluster):
    with pytest.raises(ValueError, match="invalid settings: .*min_nodes=3 is more than num_nodes=2"):
        validate_inputs.python_func(**_inputs(min_nodes=3))
    assert cluster.requests == []


def test_trainjob_refuses_knobs_that_belong_to_its_runtime():
    params = P.resolve("qwen3-30b-a3b-full", overrides=["train_backend=trainjob", "priority_class=high"])
    with pytest.raises(
        Exception, match="priority_class with train_backend=trainjob: set it in the ClusterTrainingRuntime"
    ):
        P.check(params)


@pytest.mark.parametrize(
    "override, message",
    [
        ("job_restarts=-1", "job_restarts=-1 must be >= 0 (Re-runs of a job that failed for a retriable cause"),
        ("pending_timeout_seconds=10", "pending_timeout_seconds=10 must be >= 60"),
    ],
)
def test_restart_and_pending_limits_are_checked(override, message):
    params = P.resolve("qwen3-30b-a3b-full", overrides=[override])
    with pytest.raises(Exception, match=message.replace("(", r"\(").replace(")", r"\)")):
        P.check(params)


def test_restart_and_pending_limits_reach_the_launcher():
    # The train step hands them to run_training_job from its settings; defaults: 2 re-runs, 15 minutes unschedulable.
    params = P.resolve("qwen3-30b-a3b-full", overrides=["job_restarts=5", "pending_timeout_seconds=1800"])
    scheduling = Settings.from_flat(params).scheduling
    assert (scheduling.job_restarts, scheduling.pending_timeout_seconds) == (5, 1800)
    defaults = P.resolve("qwen3-30b-a3b-full", overrides=[])
    assert (defaults["job_restarts"], defaults["pending_timeout_seconds"]) == (2, 900)
