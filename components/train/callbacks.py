"""Rank-0 progress lines: step, loss, learning rate, tokens/s, estimated MFU and ETA."""

from __future__ import annotations

import logging
import time

from transformers import TrainerCallback

log = logging.getLogger("sft.progress")

# Dense bf16 peak FLOP/s per GPU, from the vendors' data sheets (no sparsity).
PEAK_BF16_FLOPS = {"H200": 989e12, "H100": 989e12, "A100": 312e12, "L40S": 362e12, "A10G": 70e12}


def peak_flops() -> float | None:
    """Peak bf16 FLOP/s of this process's GPU, or None (CPU, unknown GPU): MFU is then not reported."""
    import torch

    if not torch.cuda.is_available():
        return None
    name = torch.cuda.get_device_name()
    return next((flops for key, flops in PEAK_BF16_FLOPS.items() if key in name), None)


def flops_per_token(active_params: int, layers: int, q_dim: int, seq_len: int) -> float:
    """Training FLOPs per token: 6N for the matmuls (forward + backward) + 12 L d s for attention (PaLM, appendix B)."""
    return 6 * active_params + 12 * layers * q_dim * seq_len


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
    so the rate is of real tokens; MFU uses ``flops_per_token`` and the GPU's peak from ``PEAK_BF16_FLOPS``.
    """

    def __init__(self, flops_per_token: float, world_size: int, peak: float | None):
        self.flops_per_token = flops_per_token
        self.world_size = world_size
        self.peak = peak
        self._last = None  # (time, step, tokens)

    def on_train_begin(self, args, state, control, **kwargs):
        self._last = (time.time(), state.global_step, state.num_input_tokens_seen)
        self._start = self._last

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
                state.global_step, state.max_steps, logs["loss"], logs.get("learning_rate", 0.0), per_gpu,
                f"{mfu:.1%}" if mfu is not None else "n/a (no known GPU peak)", eta,
            )
