"""The final model on the experiment tracker's run (``report_to`` mlflow, wandb): where it is, not its bytes.

transformers' MLflowCallback and WandbCallback log the metrics while the run trains; the final model is written after
training (export.py), so rank 0 adds it then. A reference, not an upload: the model is tens of GB on the run's claim,
and the tracker's own store is rarely where a serving step reads from.

- MLflow: the tag ``final_model`` (the folder) on the stage's one run (``OneMLflowRunCallback``), then the run ends.
- W&B: ``final_model`` in the run's summary and a ``model`` artifact holding a ``file://`` reference to the folder
  (``checksum=False``: hashing the weights would read them all again).
"""

from __future__ import annotations

import logging
import os

from transformers import TrainerCallback

from components.names import TRACKER_RUN_TAG, TRACKER_STAGE_TAG, tracker_run_id
from components.train.trainer.metrics import RUN_ID_ENV

log = logging.getLogger("sft.tracking")


class OneMLflowRunCallback(TrainerCallback):
    """One MLflow run per stage, from its first step to its final model. transformers' MLflowCallback ends the run it
    starts when training ends, and the final evaluation's metrics then went to a second run (MLflow's fluent API starts
    one on any log); the final model, recorded after both, landed on that one. Put first in the trainer's callbacks
    (common.use_progress), this starts the run before MLflowCallback looks for one: MLflowCallback then logs into it
    and leaves it open, and ``record_final_model`` ends it."""

    def on_train_begin(self, args, state, control, **kwargs):
        if "mlflow" in (args.report_to or []) and state.is_world_process_zero:
            import mlflow

            if mlflow.active_run() is None:
                if experiment := os.environ.get("MLFLOW_EXPERIMENT_NAME"):
                    mlflow.set_experiment(experiment)
                mlflow.start_run(run_id=os.environ.get("MLFLOW_RUN_ID"), run_name=args.run_name)
            # What the publish step finds the run by, to add the evaluation and the served model to it.
            mlflow.set_tags(
                {TRACKER_RUN_TAG: os.environ.get(RUN_ID_ENV, ""), TRACKER_STAGE_TAG: getattr(args, "stage", "")}
            )
        return control


def name_wandb_run(report_to: list[str], stage: str) -> None:
    """Give the stage's W&B run a known id (``tracker_run_id``) before WandbCallback starts it, unless the user's
    environment names one: a restarted job resumes the same run, and the publish step adds the evaluation to it."""
    if "wandb" in report_to and (run_id := os.environ.get(RUN_ID_ENV)):
        os.environ.setdefault("WANDB_RUN_ID", tracker_run_id(run_id, stage))
        os.environ.setdefault("WANDB_RESUME", "allow")


def record_final_model(report_to: list[str], final_dir: str) -> None:
    """Record ``final_dir`` on the runs of the trackers ``report_to`` names (rank 0, after the export)."""
    if "mlflow" in report_to:
        import mlflow

        run = mlflow.active_run() or mlflow.last_active_run()
        if run is not None:
            mlflow.MlflowClient().set_tag(run.info.run_id, "final_model", final_dir)
            log.info("mlflow: run %s tagged final_model=%s", run.info.run_id, final_dir)
            mlflow.end_run()
    if "wandb" in report_to:
        import wandb

        if wandb.run is not None:
            wandb.run.summary["final_model"] = final_dir
            artifact = wandb.Artifact(f"model-{wandb.run.id}", type="model")
            artifact.add_reference(f"file://{final_dir}", checksum=False)
            wandb.run.log_artifact(artifact)
            log.info("wandb: run %s has the final model's reference %s", wandb.run.id, final_dir)
