"""Checkpoints that survive a killed pod: complete-marker written last, partial ones skipped, last K kept.

The Trainer writes ``checkpoint-<step>/`` (weights, or under DeepSpeed only DeepSpeed's sharded state:
``CheckpointMixin``; optimizer, scheduler, RNG state per rank, trainer_state.json with the step). A pod
can die half-way through that, leaving a folder that looks like a checkpoint but cannot be resumed from.
So a checkpoint counts only once every rank has finished writing and rank 0 has written ``COMPLETE`` into
it, with the size of every file it holds; resuming picks the newest complete one that is still readable (sizes as
recorded, headers that parse: one with a file cut short since is skipped with a warning). A pod told to stop
(SIGTERM) saves one first: ``SaveOnSigtermCallback``. Which folders are complete and readable is read by
checkpoint_dirs.py (no torch: evaluation reads the run's log from the newest complete one too).
"""

from __future__ import annotations

import logging
import signal
from pathlib import Path
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist
from transformers import Trainer, TrainerCallback

from components.models.checkpoint_dirs import (
    MARKER,
    latest_complete_checkpoint,
    prune_checkpoints,
    unmark_newer,
    write_marker,
)

log = logging.getLogger("sft.checkpoints")

__all__ = [
    "EXIT_SIGTERM",
    "MARKER",
    "CheckpointMixin",
    "CheckpointTrainer",
    "CompleteMarkerCallback",
    "SaveOnSigtermCallback",
    "latest_complete_checkpoint",
    "prune_checkpoints",
]

# The exit status of a rank stopped by SIGTERM, as a shell reports a process killed by it: the job is seen
# as interrupted (retriable), not finished and not failed by a bug.
EXIT_SIGTERM = 128 + signal.SIGTERM


class CompleteMarkerCallback(TrainerCallback):
    """After each save: wait for every rank, then rank 0 writes the marker (with every file's size, read back
    before a resume) and prunes to the last ``keep``.

    The Trainer's own rotation (``save_total_limit``) cannot tell complete from partial, so
    common.checkpoint_callbacks turns it off and hands the limit to this callback.
    """

    def __init__(self, keep: int):
        self.keep = keep

    def on_train_begin(self, args, state, control, **kwargs):
        # A marked checkpoint newer than the step resumed from was skipped as unreadable: unmark it, so that it
        # does not count as complete while the Trainer writes the same step's folder again over its files.
        if state.is_world_process_zero:
            for path in unmark_newer(args.output_dir, state.global_step):
                log.warning("%s was skipped at resume as unreadable: unmarked, to be written again", path)
        return control

    def on_save(self, args, state, control, **kwargs):
        if dist.is_available() and dist.is_initialized():
            dist.barrier()  # every rank's shards, optimizer and RNG files are on disk
        if state.is_world_process_zero:
            checkpoint = Path(args.output_dir, f"checkpoint-{state.global_step}")
            sizes = write_marker(checkpoint, state.global_step)
            deleted = prune_checkpoints(args.output_dir, self.keep)
            log.info(
                "checkpoint %s complete (%d files, %.3g GB)%s",
                checkpoint,
                len(sizes),
                sum(sizes.values()) / 1e9,
                f"; deleted {deleted}" if deleted else "",
            )
        return control


# What the mixin is mixed into, for the type checker; at run time it is a plain mixin.
if TYPE_CHECKING:
    _TrainerBase = Trainer
else:
    _TrainerBase = object


class CheckpointMixin(_TrainerBase):
    """Put before a ``Trainer`` class (``class T(CheckpointMixin, SomeTrainer)``): checkpoints under DeepSpeed are
    DeepSpeed's sharded state only.

    The stock Trainer also writes consolidated weights into every checkpoint: under ZeRO-3 that gathers
    the whole model on rank 0 (about 61 GB host memory for Qwen3-30B-A3B in bf16, in a pod that holds 8
    ranks) when ``stage3_gather_16bit_weights_on_model_save`` is on, and writes a second DeepSpeed
    checkpoint into the same folder when it is off. Resuming needs neither: ``deepspeed_load_checkpoint``
    reads the ``global_step*/`` shards that ``save_checkpoint`` writes (module, fp32 master weights,
    optimizer). Consolidated weights are written once, by the final export (export.py).
    """

    _writing_checkpoint = False

    def _run_epoch(self, *args, **kwargs):
        """``Trainer._run_epoch``, except when the run resumed at its last step: transformers 5.23's loop runs a step
        before it checks ``max_steps``, so a re-run that resumes from the checkpoint at ``max_steps`` (the run died
        in its export or evaluation) would train one step past the schedule and export another model."""
        if 0 < self.state.max_steps <= self.state.global_step:
            self.control.should_training_stop = True
            return None
        return super()._run_epoch(*args, **kwargs)

    def _save_checkpoint(self, model, trial):
        self._writing_checkpoint = True
        try:
            super()._save_checkpoint(model, trial)
        finally:
            self._writing_checkpoint = False

    def save_model(self, output_dir: str | None = None, _internal_call: bool = False) -> None:
        """``Trainer.save_model``, except inside a DeepSpeed checkpoint, where the shards already hold the weights."""
        if self._writing_checkpoint and self.is_deepspeed_enabled and not self.args.save_only_model:
            return
        super().save_model(output_dir, _internal_call)


class CheckpointTrainer(CheckpointMixin, Trainer):
    """The Hugging Face ``Trainer`` with ``CheckpointMixin``'s checkpoints (sft and cpt; dpo.py mixes it into TRL's)."""


class SaveOnSigtermCallback(TrainerCallback):
    """On SIGTERM: finish the current step, save a complete checkpoint on every rank at the same step, stop.

    Kubernetes sends SIGTERM to the container's PID 1 (torchrun, which forwards it to every worker) when a
    pod is evicted, preempted or deleted, and SIGKILL ``terminationGracePeriodSeconds`` later (30 s by
    default); torchrun itself SIGKILLs its workers ``--shutdown-timeout`` / ``TORCH_ELASTIC_SHUTDOWN_TIMEOUT``
    seconds (30 by default) after forwarding. Both must cover the rest of a step plus a checkpoint. For
    Qwen3-30B-A3B under ZeRO-3 on 2 x 8 H100 a checkpoint is ~366 GB (fp32 master weights + Adam moments,
    12 bytes per parameter), ~183 GB written by each pod: about 3 minutes at 1 GB/s to the shared volume,
    6 at 0.5 GB/s. So the job's pods need ``terminationGracePeriodSeconds`` of about 600 and torchrun a
    shutdown timeout a little below it (570), or SIGTERM only loses the work since the last ``save_steps``
    checkpoint. No grace period helps where the platform gives less notice (spot VMs: 30 s to 2 min;
    kubelet hard evictions: none): there the periodic checkpoints bound the loss.

    The signal reaches ranks at different times, and other nodes' ranks only through this job (their pods
    are not being stopped), so ranks agree at every step end: an all-reduce of the flag over all ranks
    (one integer; the ``.item()`` waits for the step's GPU work, which the step end is close to anyway).
    A SIGTERM after the last step is not acted on: the checkpoint at ``max_steps`` exists, and evaluation and
    the export go on until they finish or the grace period ends (a re-run then only exports).
    """

    def __init__(self):
        self._received = False
        self.stopped_at: int | None = None  # the step saved and stopped at, once a rank was signalled

    def _handle(self, signum, frame):
        # Only a flag: the step in flight finishes, and every rank acts at the same step end.
        self._received = True

    def on_train_begin(self, args, state, control, **kwargs):
        # Not earlier: before training there is nothing to save, and the default action (exit) is right.
        signal.signal(signal.SIGTERM, self._handle)

    def on_step_end(self, args, state, control, **kwargs):
        signalled = int(self._received)
        if dist.is_available() and dist.is_initialized():
            flag = torch.tensor([signalled], device=args.device)
            dist.all_reduce(flag)
            signalled = int(flag.item())
        if signalled:
            self.stopped_at = state.global_step
            control.should_save = True
            control.should_training_stop = True
            if state.is_world_process_zero:
                log.warning(
                    "SIGTERM: saving checkpoint-%d and stopping (%d of %d ranks signalled)",
                    state.global_step,
                    signalled,
                    args.world_size,
                )
        return control
