"""search_hyperparameters as a KFP component: short training trials before the sft stage, the best settings out."""

from kfp import dsl
from kfp.dsl import Dataset, Input, Markdown, Output

from components.version import COMPONENTS_IMAGE


@dsl.component(base_image=COMPONENTS_IMAGE, install_kfp_package=False)
def search_hyperparameters(
    dataset: Input[Dataset],
    settings: dict,
    data_root: str,
    model_root: str,
    run_id: str,
    report: Output[Markdown],
) -> dict:
    """Search the sft stage's training settings with short trials and return the best trial's values.

    Every trial is the run's own sft training from ``model_name_or_path`` on the prepared dataset (the sft stage's
    settings, ``stage_settings`` included), with the values it searches (``hpo_search_space``), ``max_steps`` =
    ``hpo_trial_steps`` and no checkpoints; the objective is the trainer's held-out ``eval_loss``, minimised.
    With ``train_backend=pytorchjob`` or ``trainjob`` this small CPU pod creates a Katib ``Experiment``
    (kubeflow.org/v1beta1, ``hpo-<run id>``) whose trials are the PyTorchJob or TrainJob the train step would
    create, ``hpo_parallel_trials`` at a time, and follows it: a retried step re-attaches to it, a failed
    Experiment fails the step with Katib's reason and the failed trials' messages, a trial pod that cannot start
    fails it in ``pending_timeout_seconds``, cancelling the run deletes the Experiment. With
    ``active_deadline_seconds`` set, the search is given up after ceil(hpo_trials / hpo_parallel_trials) rounds
    of that deadline (plus ``pending_timeout_seconds`` each). With ``local``, Optuna runs the same search here,
    one trial at a time under ``torchrun --nproc_per_node gpus_per_node``. Trials write under
    ``<model_root>/runs/<run id>/hpo/<trial>/``; each trial's ``final/`` model is deleted once it has ended.
    Bad search settings fail the step before any trial starts, one line per problem, naming the setting.

    Args:
        dataset: prepare_dataset's sft output (its metadata ``path`` is the prepared folder, ``packing`` its
            row layout).
        settings: every setting, as validate_inputs resolved them (components/settings/): the hpo settings
            shape the search, the train settings each trial, the job, scheduling, network, storage and
            observability settings its jobs.
        data_root: where the data volume is mounted in this step.
        model_root: where the model volume is mounted in this step (the trials' folders are deleted from it).
        run_id: the KFP run id; names the Experiment and scopes the trials' folder.

    Returns:
        report: Markdown for the KFP UI: the best trial, then every trial (values, state, eval_loss, last
            training loss), best first.
        Output: the best trial's values, ``{setting name: value}`` typed as the settings model types them
            (``{"learning_rate": 3.1e-05}``), for the sft stage's training; ``{}`` when ``hpo_trials`` is 0.
    """
    from components.hpo.search import search_sft_settings
    from components.observe.outcome import recording_outcome
    from components.observe.process import start_step
    from components.settings import Settings

    start_step("search_hyperparameters")
    # How this step ended, for the run's exit handler (components/observe/outcome.py).
    with recording_outcome("search_hyperparameters", model_root, run_id):
        result = search_sft_settings(
            Settings.from_flat(settings),
            dataset_path=dataset.metadata["path"],
            packing=dataset.metadata.get("packing", True),
            data_root=data_root,
            model_root=model_root,
            run_id=run_id,
        )
        with open(report.path, "w") as f:
            f.write(result.report)
        return result.best
