"""Checkpoints of a model transformers sharded at load (``parallelism`` hsdp, hsdp_ep): every rank writes its own
shards of the weights and of the optimizer state, nothing is gathered, and a re-run resumes from them.

transformers 5.23's Trainer checkpoints such a model only as consolidated weights (``save_only_model``: the whole
model gathered on rank 0, 114 GiB of fp32 for Qwen3-30B-A3B) and cannot resume it (trainer.py: "Resuming is not
supported for models sharded at load time"). Its distributed-checkpoint functions do what is needed, and this mixin
puts them where the Trainer saves and loads:

    checkpoint-<step>/
      model/       save_pretrained(distributed_checkpoint=True): torch DCP's HuggingFaceStorageWriter, one
                   ``shard-<rank>-model-...safetensors`` per rank holding that rank's shards (replicas write once)
      optimizer/   save_optimizer_distributed: DCP ``.distcp`` files, the Adam moments keyed by parameter name
      scheduler.pt, rng_state_<rank>.pth, trainer_state.json, COMPLETE (written last, checkpoints.py)

What a rank writes per checkpoint is its own shard: 12 bytes per parameter (fp32 weights and two Adam moments) over
one node's GPUs, replicas deduplicated by DCP's planner, so the two nodes of the reference job write one node's worth
between them (~366 GB for Qwen3-30B-A3B, as ZeRO-3's checkpoint). Loading needs the same layout (nodes x GPUs), as
DeepSpeed's checkpoints do; DCP itself could reshard, the Trainer's data position and RNG could not.

The Trainer accepts checkpoints of such a model only with ``save_only_model`` on (``Trainer.__init__``), which also
keeps it from writing an optimizer file of its own: parallelism.py's ``check_parallelism`` sets it, and this mixin
writes the optimizer, scheduler and RNG state itself.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

import torch
from transformers import PreTrainedModel, Trainer

# transformers' loader of what save_pretrained(distributed_checkpoint=True) wrote, into a model already sharded the
# same way: private in 5.23 (its public path, from_pretrained, builds a new model), pinned with the version.
from transformers.distributed.checkpoint import _load_model_checkpoint_distributed as load_model_distributed
from transformers.distributed.checkpoint import load_optimizer_distributed, save_optimizer_distributed
from transformers.trainer import SCHEDULER_NAME

from components.train.trainer.checkpoints import CheckpointTrainer

MODEL_DIR = "model"
OPTIMIZER_DIR = "optimizer"

if TYPE_CHECKING:
    _TrainerBase = Trainer
else:
    _TrainerBase = object


class ShardedCheckpointMixin(_TrainerBase):
    """Put before a ``Trainer`` class: for a model sharded at load, checkpoints and resumes as the module docstring
    says; any other model is the Trainer's (and the mixins' after it) as before."""

    _writing_sharded_checkpoint = False

    @property
    def _sharded(self) -> bool:
        return self.is_distributed_loading_by_transformers

    def _save_checkpoint(self, model, trial):
        if not self._sharded:
            return super()._save_checkpoint(model, trial)
        # The Trainer's own save writes trainer_state.json and the callbacks' state; its save_model call lands in
        # save_model below. The rest it leaves out under save_only_model, so it is written here, before on_save
        # (the complete-marker) runs.
        self._writing_sharded_checkpoint = True
        try:
            super()._save_checkpoint(model, trial)
        finally:
            self._writing_sharded_checkpoint = False
        output_dir = os.path.join(self._get_output_dir(trial=trial), f"checkpoint-{self.state.global_step}")
        save_optimizer_distributed(self.model, self.optimizer, os.path.join(output_dir, OPTIMIZER_DIR))
        if self.args.should_save:
            torch.save(self.lr_scheduler.state_dict(), os.path.join(output_dir, SCHEDULER_NAME))
        self._save_rng_state(output_dir)

    def save_model(self, output_dir: str | None = None, _internal_call: bool = False) -> None:
        """Within a checkpoint of a sharded model: each rank's shards (collective); otherwise the Trainer's."""
        if not self._writing_sharded_checkpoint:
            return super().save_model(output_dir, _internal_call)
        assert output_dir is not None  # the Trainer's checkpoint names its folder
        model: PreTrainedModel = self.model  # type: ignore[assignment]  # sharded at load: the model itself
        model.save_pretrained(os.path.join(output_dir, MODEL_DIR), distributed_checkpoint=True)

    def _load_from_checkpoint(self, resume_from_checkpoint: str, model=None) -> None:
        if not self._sharded:
            return super()._load_from_checkpoint(resume_from_checkpoint, model)
        load_model_distributed(model or self.model, os.path.join(resume_from_checkpoint, MODEL_DIR))

    def _load_optimizer_and_scheduler(self, checkpoint: str | None) -> None:
        if not self._sharded or checkpoint is None:
            return super()._load_optimizer_and_scheduler(checkpoint)
        load_optimizer_distributed(self.model, self.optimizer, os.path.join(checkpoint, OPTIMIZER_DIR))
        assert self.lr_scheduler is not None  # created with the optimizer, before the Trainer loads either
        self.lr_scheduler.load_state_dict(torch.load(os.path.join(checkpoint, SCHEDULER_NAME), weights_only=True))


class ShardedCheckpointTrainer(ShardedCheckpointMixin, CheckpointTrainer):
    """The sft and cpt stages' Trainer: complete-marker checkpoints (checkpoints.py), each rank's own shards for a
    model transformers sharded at load (parallelism hsdp, hsdp_ep), DeepSpeed's for a ZeRO-3 engine."""
