"""train_model as a KFP component: the launcher that runs the trainer and reports the model."""

from typing import NamedTuple

from kfp import dsl
from kfp.dsl import Dataset, Input, Model, Output

from components.version import COMPONENTS_IMAGE


@dsl.component(base_image=COMPONENTS_IMAGE, install_kfp_package=False)
def train_model(
    dataset: Input[Dataset],
    base_model_path: str,
    settings: dict,
    stage: str,
    tuned: dict,
    data_root: str,
    model_root: str,
    run_id: str,
    model: Output[Model],
) -> NamedTuple("TrainOutputs", [("model_uri", str), ("model_path", str), ("job_name", str)]):
    """Train one stage (cpt, sft, dpo, rm or grpo) from ``base`` on the prepared dataset and record where the result is.

    With ``train_backend=pytorchjob`` (or ``trainjob``, Trainer v2) this small CPU pod writes the trainer
    config to the model volume, creates the job (``num_nodes`` pods of ``gpus_per_node`` GPUs) running
    ``torchrun -m components.train.trainer``, follows it to the end and fails with the job's reason; a retried
    pod re-attaches to the job instead of creating a second one, and cancelling the run deletes it. A job that
    failed for a retriable cause (pod evicted or preempted, node lost, rendezvous/NCCL failure) is created again
    up to ``job_restarts`` times and resumes from its last complete checkpoint; deterministic failures (OOMKilled,
    config errors, image errors) fail the step at once. With ``local`` it runs the same entry point under
    ``torchrun --nproc_per_node gpus_per_node`` here. Each stage writes to its own folder of the run
    (``train/`` for sft, ``cpt/``, ``dpo/``) and is its own job (``<stage>-<run id>``).

    Args:
        dataset: prepare_dataset's output for this stage (its metadata names the folder on the data volume).
        base_model_path: the model this stage starts from: the run's model_name_or_path (base_model) or the
            previous stage's final folder (its ``model_path``), as this step sees it.
        settings: every setting, as validate_inputs resolved them (components/settings/): the train settings,
            with the stage's own (stage_settings), go into the trainer config; the job, scheduling, network,
            storage and observability settings shape the job.
        stage: ``cpt``, ``sft`` or ``dpo`` (components/stages.py).
        tuned: the settings a hyper-parameter search chose (search_hyperparameters; {} when none ran): the sft
            stage trains with them.
        data_root: where the data volume is mounted in this step.
        model_root: where the model volume is mounted in this step.
        run_id: the KFP run id; names the job and scopes the output folder.

    Returns:
        model: metadata ``pvc``, ``path`` and ``uri`` (``pvc://claim/.../final``) and the trainer's metrics.
        model_uri: the same ``pvc://`` URI (or local path) as a parameter.
        model_path: the final folder as this step sees it: the next stage's ``base_model_path``.
        job_name: the PyTorchJob's name (empty for local runs).
    """
    from collections import namedtuple

    from components.observe.outcome import recording_outcome
    from components.observe.process import start_step
    from components.settings import Settings, whole_numbers
    from components.train.launcher.run import train_stage

    start_step("train_model")
    # How this step ended, for the run's exit handler (components/observe/outcome.py).
    with recording_outcome(f"train_model[{stage}]", model_root, run_id):
        trained = train_stage(
            Settings.from_flat(settings),
            stage=stage,
            base_model_path=base_model_path,
            tuned=whole_numbers(tuned),
            dataset_path=dataset.metadata["path"],
            packing=dataset.metadata.get("packing", True),
            data_root=data_root,
            model_root=model_root,
            run_id=run_id,
        )
        model.metadata.update(trained.metadata)
        outputs = namedtuple("TrainOutputs", ["model_uri", "model_path", "job_name"])
        return outputs(trained.model_uri, trained.model_path, trained.job_name)


@dsl.component(base_image=COMPONENTS_IMAGE, install_kfp_package=False)
def base_model(settings: dict) -> str:
    """The model the first training stage starts from: the run's ``model_name_or_path``, handed from stage to
    stage as a path (a string: kfp.local cannot choose between artifacts of condition branches).

    Args:
        settings: every setting, as validate_inputs resolved them.

    Returns:
        The Hub id, folder or ``builtin:`` name, as given.
    """
    from components.quick_exit import freeze_heap_at_exit
    from components.settings import Settings

    freeze_heap_at_exit()
    return Settings.from_flat(settings).model.model_name_or_path


@dsl.component(base_image=COMPONENTS_IMAGE, install_kfp_package=False)
def skip_stage(previous: str, stage: str) -> str:
    """Hand the previous model on unchanged: slot ``stage`` has no stage in this run's ``stages``.

    Args:
        previous: the model the stage would have started from.
        stage: the slot that does not run.

    Returns:
        ``previous``.
    """
    from components.quick_exit import freeze_heap_at_exit

    freeze_heap_at_exit()
    return previous
