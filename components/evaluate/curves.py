"""The training loss curve in the evaluation report: the trainer's logged losses, drawn with matplotlib.

The trainer keeps its log history in ``trainer_state.json`` inside every checkpoint; the newest complete
checkpoint holds the whole run's. The picture goes into the Markdown report as a base64 PNG, which the KFP
UI renders, and the local run copies it out as ``reports/training_loss.png``.
"""

from __future__ import annotations

import base64
import io
import json
from pathlib import Path

from matplotlib.figure import Figure  # no pyplot: no GUI backend, no global figure state

from components.models.checkpoint_dirs import latest_complete_checkpoint

PNG_PREFIX = "data:image/png;base64,"


def training_log(train_dir: str) -> dict | None:
    """The trainer's logged losses under ``train_dir``, or None when it has no complete checkpoint.

    Returns ``train`` and ``eval`` as ``[(step, loss), ...]``, ``logging_steps`` and ``last_step``.
    """
    checkpoint = latest_complete_checkpoint(train_dir)
    if checkpoint is None:
        return None
    state = json.loads((Path(checkpoint) / "trainer_state.json").read_text())
    history = state["log_history"]
    return {
        "train": [(e["step"], e["loss"]) for e in history if "loss" in e],
        "eval": [(e["step"], e["eval_loss"]) for e in history if "eval_loss" in e],
        "logging_steps": state["logging_steps"],
        "last_step": state["global_step"],
    }


def loss_curve_png(log: dict, base_loss: float, tuned_loss: float) -> bytes:
    """A PNG of the train loss per logging window, any eval losses the trainer logged, and this step's
    held-out loss per label token of the base (step 0) and the tuned model (last step)."""
    fig = Figure(figsize=(7.5, 4.2), dpi=100)
    ax = fig.subplots()
    if log["train"]:
        steps, losses = zip(*log["train"], strict=True)
        ax.plot(
            steps, losses, marker=".", label=f"train loss (mean of each {log['logging_steps']}-step logging window)"
        )
    if log["eval"]:
        steps, losses = zip(*log["eval"], strict=True)
        ax.plot(steps, losses, marker="s", linestyle="none", label="trainer's eval loss (mean of per-batch means)")
    # Two measurements, not a trajectory: markers only.
    ax.plot(
        [0, log["last_step"]],
        [base_loss, tuned_loss],
        marker="o",
        linestyle="none",
        color="black",
        label="held-out loss per label token (evaluate step)",
    )
    for step, loss, name in ((0, base_loss, "base"), (log["last_step"], tuned_loss, "tuned")):
        ax.annotate(f"{name} {loss:.3f}", (step, loss), textcoords="offset points", xytext=(6, 6), fontsize=8)
    return loss_axes_png(fig, ax, "Training loss")


def loss_axes_png(fig: Figure, ax, title: str) -> bytes:
    """``fig`` as a PNG, its loss axes labelled, titled ``title``, with a grid and a legend."""
    ax.set_xlabel("optimizer step")
    ax.set_ylabel("cross-entropy (nats per token)")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    return buf.getvalue()


def training_section(train_dir: str, base_loss: float, tuned_loss: float) -> list[str]:
    """The report's ``## Training`` lines: the curve as an embedded PNG and what each line on it is."""
    log = training_log(train_dir)
    if log is None:
        return ["## Training", "", f"No complete checkpoint under `{train_dir}`: no trainer log to draw."]
    png = base64.b64encode(loss_curve_png(log, base_loss, tuned_loss)).decode()
    return [
        "## Training",
        "",
        f"![training loss]({PNG_PREFIX}{png})",
        "",
        f"*Train loss*: the trainer's logged loss, each point the mean of the per-step losses of the "
        f"{log['logging_steps']} optimizer steps before it (TensorBoard `train/loss`). *Held-out loss*: this "
        "step's numbers above, per label token, for the base model (step 0) and the tuned one (last step).",
    ]
