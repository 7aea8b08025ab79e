"""The training curves in the evaluation report: the trainer's logged losses, drawn with matplotlib, and for a grpo
stage its logged rewards above them.

The trainer keeps its log history in ``trainer_state.json`` inside every checkpoint; the newest complete
checkpoint holds the whole run's. The picture goes into the Markdown report as a base64 PNG, which the KFP
UI renders, and the local run copies it out as ``reports/training_loss.png``.

A grpo stage's loss is TRL's clipped policy loss plus the KL term, which says little about learning (its advantages are
centred per group, so it hovers near zero); what GRPO raises is the reward. TRL 1.16 logs, per logging window (the mean
over its steps, None where no completion was scored): ``reward`` (the weighted sum of grpo_rewards' sources per
completion, its mean), ``reward_std`` (that sum's standard deviation over the step's completions) and
``rewards/<source>/mean`` (grpo.py logs them under grpo_rewards' names).
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

    Returns ``train`` and ``eval`` as ``[(step, loss), ...]``, ``logging_steps`` and ``last_step``; for a grpo stage
    also ``reward`` as ``[(step, mean, std), ...]`` and ``rewards`` as ``{source: [(step, mean), ...]}`` (empty for
    the other stages), the windows whose value TRL logged as None (nothing scored) left out.
    """
    checkpoint = latest_complete_checkpoint(train_dir)
    if checkpoint is None:
        return None
    state = json.loads((Path(checkpoint) / "trainer_state.json").read_text())
    history = state["log_history"]
    rewarded = [e for e in history if e.get("reward") is not None]  # grpo's training windows (eval's: eval_reward)
    return {
        "train": [(e["step"], e["loss"]) for e in history if "loss" in e],
        "reward": [(e["step"], e["reward"], e.get("reward_std") or 0.0) for e in rewarded],
        "rewards": {
            key.removeprefix("rewards/").removesuffix("/mean"): [
                (e["step"], e[key]) for e in rewarded if e.get(key) is not None
            ]
            for key in dict.fromkeys(k for e in rewarded for k in e if k.startswith("rewards/") and k.endswith("/mean"))
        },
        "eval": [(e["step"], e["eval_loss"]) for e in history if "eval_loss" in e],
        "logging_steps": state["logging_steps"],
        "last_step": state["global_step"],
    }


def loss_curve_png(log: dict, base_loss: float, tuned_loss: float) -> bytes:
    """A PNG of the train loss per logging window, any eval losses the trainer logged, and this step's
    held-out loss per label token of the base (step 0) and the tuned model (last step); for a grpo stage (``log``
    has rewards) the reward per logging window above it (``reward_axes``)."""
    fig = Figure(figsize=(7.5, 7.4 if log.get("reward") else 4.2), dpi=100)
    if log.get("reward"):
        reward_ax, ax = fig.subplots(2, 1, sharex=True, height_ratios=(3, 2))
        reward_axes(reward_ax, log)
    else:
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


def reward_axes(ax, log: dict) -> None:
    """The grpo stage's reward on ``ax``: the mean per logging window, a band of one standard deviation of the
    completions' rewards either side, and each reward source's mean."""
    steps, means, stds = zip(*log["reward"], strict=True)
    window = log["logging_steps"]
    ax.plot(steps, means, marker=".", color="C2", label=f"reward (mean of each {window}-step logging window)")
    ax.fill_between(
        steps,
        [m - s for m, s in zip(means, stds, strict=True)],
        [m + s for m, s in zip(means, stds, strict=True)],
        color="C2",
        alpha=0.2,
        label="± one std of the completions' rewards (TRL's reward_std)",
    )
    if len(log["rewards"]) > 1:  # one source: its mean is the reward's (times its weight)
        for i, (name, points) in enumerate(log["rewards"].items()):
            if points:
                s, m = zip(*points, strict=True)
                ax.plot(s, m, "--", marker=".", lw=1, color=f"C{3 + i}", label=f"{name} (its mean, unweighted)")
    ax.set_ylabel("reward (weighted sum of grpo_rewards)")
    ax.set_title("GRPO reward")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)


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
    reward = (
        [
            f"*Reward* (grpo): the mean over each {log['logging_steps']}-step logging window of the steps' mean reward "
            "per completion (the weighted sum of grpo_rewards' sources; TensorBoard `train/reward`), the band one "
            "standard deviation of the completions' rewards either side (`train/reward_std`), the dashed lines each "
            "source's own mean when there are several. Completions a source returned None or NaN for are left out "
            "(`train/rewards/<source>/unscored` counts them). The loss below is TRL's GRPO loss, which stays near zero "
            "by construction: read learning from the reward.",
            "",
        ]
        if log["reward"]
        else []
    )
    return [
        "## Training",
        "",
        f"![training loss]({PNG_PREFIX}{png})",
        "",
        *reward,
        *early_stopping_lines(train_dir),
        f"*Train loss*: the trainer's logged loss, each point the mean of the per-step losses of the "
        f"{log['logging_steps']} optimizer steps before it (TensorBoard `train/loss`). *Held-out loss*: this "
        "step's numbers above, per label token, for the base model (step 0) and the tuned one (last step).",
    ]


def early_stopping_lines(train_dir: str) -> list[str]:
    """What early stopping did (the trainer's metrics.json, ``early_stopping_summary``), or nothing when it was off."""
    path = Path(train_dir, "metrics.json")
    metrics = json.loads(path.read_text()) if path.is_file() else {}
    if "stopped_early" not in metrics:
        return []
    ended = (
        f"stopped at step {metrics['stopped_at_step']} of {metrics['max_steps']}: the held-out loss had not fallen by "
        "early_stopping_min_delta for early_stopping_patience evaluations"
        if metrics["stopped_early"]
        else f"trained all {metrics['max_steps']} steps"
    )
    best = metrics.get("best_eval_loss")
    return [
        f"*Early stopping*: {ended}; best held-out loss {best:.4f} at step {metrics['best_step']}, whose checkpoint "
        f"(`{metrics['best_checkpoint']}`) is the stage's model."
        if best is not None
        else f"*Early stopping*: {ended}.",
        "",
    ]
