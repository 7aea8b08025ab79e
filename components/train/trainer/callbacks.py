"""Rank-0 progress lines: step, loss, learning rate, tokens/s, MFU (counted per document, mfu.py) and ETA; early
stopping on the held-out loss."""

from __future__ import annotations

import logging
import operator
import time

from transformers import EarlyStoppingCallback, TrainerCallback

from components.models.mfu import attention_length, flops_per_token, peak_flops
from components.models.shape import model_shape

log = logging.getLogger("sft.progress")


def format_eta(seconds: float) -> str:
    """``1h02m`` / ``3m05s`` / ``42s``."""
    seconds = int(seconds)
    if seconds >= 3600:
        return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"
    if seconds >= 60:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds}s"


class ProgressCallback(TrainerCallback):
    """Logs one line per ``logging_steps`` on rank 0 and adds ``tokens_per_second``(/GPU) and ``mfu`` to the logs.

    Token counts come from the Trainer's ``num_input_tokens_seen`` (non-padding tokens over all ranks),
    so the rate is of real tokens; MFU = that rate x ``flops_per_token`` / ``peak`` (components/models/mfu.py).
    ``for_model`` builds it for a model and its prepared training split.
    """

    def __init__(self, flops_per_token: float, world_size: int, peak: float | None, basis: str = ""):
        self.flops_per_token = flops_per_token
        self.world_size = world_size
        self.peak = peak
        self.basis = basis  # how flops_per_token was counted, logged once at the start
        self._last = None  # (time, step, tokens)

    @classmethod
    def for_model(cls, model_config: dict, train_split, world_size: int) -> ProgressCallback:
        """The callback for training the model of ``model_config`` (config.json fields) on ``train_split``.

        FLOPs per token count attention causally per document, over the documents of ``train_split`` (a prepared
        split: packed rows with ``position_ids``, or one example per row); the peak is this GPU's (None on CPU).
        """
        # From the loaded model's config, not a file: a model named by Hub id has no folder to read.
        shape = model_shape(model_config)
        keys = attention_length(train_split)
        flops = flops_per_token(shape.active, shape.layers, shape.q_dim, keys)
        params = f"{shape.active / 1e9:.3g}B" if shape.active >= 1e9 else f"{shape.active / 1e6:.3g}M"
        basis = (
            f"{flops / 1e9:.3g} GFLOPs/token = 6 x {params} active parameters + causal attention over "
            f"{keys:.0f} keys/token per document"
        )
        return cls(flops, world_size, peak_flops(), basis)

    def on_train_begin(self, args, state, control, **kwargs):
        self._last = (time.time(), state.global_step, state.num_input_tokens_seen)
        self._start = self._last
        if self.basis and state.is_world_process_zero:
            peak = f"{self.peak / 1e12:.0f} TFLOP/s bf16 peak" if self.peak else "no known GPU peak: MFU not reported"
            log.info("MFU basis: %s; %s", self.basis, peak)

    def on_log(self, args, state, control, logs=None, **kwargs):
        if logs is None or "loss" not in logs or self._last is None:
            return
        now = time.time()
        t0, step0, tok0 = self._last
        self._last = (now, state.global_step, state.num_input_tokens_seen)
        elapsed = max(now - t0, 1e-9)
        per_gpu = (state.num_input_tokens_seen - tok0) / elapsed / self.world_size
        logs["tokens_per_second_per_device"] = round(per_gpu, 1)
        mfu = per_gpu * self.flops_per_token / self.peak if self.peak else None
        if mfu is not None:
            logs["mfu"] = round(mfu, 4)
        steps_done = state.global_step - self._start[1]
        rate = steps_done / max(now - self._start[0], 1e-9)
        eta = format_eta((state.max_steps - state.global_step) / rate) if rate > 0 else "?"
        if state.is_world_process_zero:
            log.info(
                "step %d/%d | loss %.4f | lr %.3g | %.0f tokens/s/device | MFU %s | ETA %s",
                state.global_step,
                state.max_steps,
                logs["loss"],
                logs.get("learning_rate", 0.0),
                per_gpu,
                f"{mfu:.1%}" if mfu is not None else "n/a (no known GPU peak)",
                eta,
            )


class HeldOutEarlyStopping(EarlyStoppingCallback):
    """transformers' ``EarlyStoppingCallback`` on the held-out loss (``metric_for_best_model``: config.py's
    ``early_stopping_arguments``), for this trainer's checkpoints and resumes.

    - Its patience counter survives a resume. The Trainer saves it in every checkpoint's trainer_state.json
      (``stateful_callbacks``) but reads it back only with ``restore_callback_states_from_checkpoint``, which also
      restores the saved ``TrainerControl``: a SIGTERM checkpoint's ``should_training_stop`` would then end the
      resumed run after one step. So this callback reads its own entry back when training begins (the Trainer has
      loaded the checkpoint's state by then).
    - Every new best is checkpointed. The Trainer keeps a best only where a checkpoint exists at its step: an
      evaluation between two ``save_steps`` checkpoints that is the best would otherwise be lost, and the run would
      end on an older one than it reports.
    """

    def on_train_begin(self, args, state, control, **kwargs):
        super().on_train_begin(args, state, control, **kwargs)
        saved = state.stateful_callbacks.get(type(self).__name__)
        if isinstance(saved, dict):
            counter = saved.get("attributes", {}).get("early_stopping_patience_counter", 0)
            self.early_stopping_patience_counter = counter
            if counter and state.is_world_process_zero:
                log.info(
                    "early stopping: %d of %d evaluations without improvement before the resume",
                    counter,
                    self.early_stopping_patience,
                )
        return control

    def on_evaluate(self, args, state, control, metrics, **kwargs):
        value = metrics.get(args.metric_for_best_model)
        better = operator.gt if args.greater_is_better else operator.lt
        if value is not None and (state.best_metric is None or better(value, state.best_metric)):
            control.should_save = True  # the Trainer records this step as the best; its checkpoint must exist
        stopping = control.should_training_stop
        super().on_evaluate(args, state, control, metrics, **kwargs)
        if control.should_training_stop and not stopping and state.is_world_process_zero:
            log.info(
                "early stopping at step %d of %d: %s has not improved by more than %g for %d evaluations; best "
                "%.4f at step %s",
                state.global_step,
                state.max_steps,
                args.metric_for_best_model,
                self.early_stopping_threshold,
                self.early_stopping_patience,
                state.best_metric,
                state.best_global_step,
            )
        return control


def early_stopping_summary(state) -> dict:
    """metrics.json's early-stopping figures from the Trainer's final state: where training stopped, of how many
    steps, and the best evaluation, whose checkpoint's weights are the stage's model."""
    return {
        "stopped_early": state.global_step < state.max_steps,
        "stopped_at_step": state.global_step,
        "max_steps": state.max_steps,
        "best_step": state.best_global_step,
        "best_eval_loss": state.best_metric,
        "best_checkpoint": state.best_model_checkpoint,
    }
