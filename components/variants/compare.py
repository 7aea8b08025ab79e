"""One comparison of a run's variants (components/variants/__init__.py): every variant and its base scored on the
run's held-out tokens, their training losses in one picture, their answers side by side, and the variant served.

Each variant's evaluate_model recorded its result beside its model (``evaluation.json``, components/paths.py): the
metrics, its own gate's decision against its base, the prompts and the answers. The served variant is the one that
passed its gate with the lowest held-out loss (``deploy_variants=best``), or every one that passed (``all``); none
passed, nothing is served. ``serving_list`` says what the deploy step serves and under which names.
"""

from __future__ import annotations

import base64
import html
import json
import os

from components.paths import evaluation_path

PNG_PREFIX = "data:image/png;base64,"


def read_results(results: list[dict]) -> list[dict]:
    """Each loop item's result (``variant``, ``model_path``, ...) with its evaluation record added."""
    out = []
    for r in results:
        with open(evaluation_path(r["model_path"])) as f:
            out.append({**r, "evaluation": json.load(f)})
    return out


def choose(rows: list[dict]) -> dict | None:
    """The variant to serve: the lowest held-out loss among those whose gate passed (ties: the first listed)."""
    passing = [r for r in rows if r["evaluation"]["passed"]]
    return min(passing, key=lambda r: r["evaluation"]["metrics"]["eval_loss"]) if passing else None


def is_adapter(settings: dict) -> bool:
    """Whether a model trained with ``settings`` (flat) is a LoRA adapter alone: ``method`` lora or qlora with
    ``merge_lora`` false (export.py then writes only the adapter to ``final/``)."""
    return settings.get("method") in ("lora", "qlora") and not settings.get("merge_lora", True)


def serving_list(rows: list[dict], best: dict | None) -> list[dict]:
    """What the deploy step serves: the best row, or with ``deploy_variants=all`` every row whose gate passed (in
    the variants' order); none when none passed. Each: ``variant``, ``model_path``, ``model_uri``, ``settings``,
    ``served_model_name`` (``<serving_name>-<variant>``; ``serving_name`` for a run without variants) and
    ``adapter`` (``is_adapter``)."""
    if best is None:
        return []
    every = best["settings"].get("deploy_variants") == "all"
    chosen = [r for r in rows if r["evaluation"]["passed"]] if every else [best]
    out = []
    for r in chosen:
        serving_name = r["settings"].get("serving_name", "")
        out.append(
            {
                "variant": r["variant"],
                "model_path": r["model_path"],
                "model_uri": r["model_uri"],
                "settings": r["settings"],
                "adapter": is_adapter(r["settings"]),
                "served_model_name": f"{serving_name}-{r['variant']}" if r["variant"] else serving_name,
            }
        )
    return out


def compare(results: list[dict]) -> dict:
    """``passed``, ``reason``, the chosen item (``chosen``: its ``model_path``, ``model_uri``, ``settings``), what
    to serve (``serve``: ``serving_list``), ``metrics`` and the Markdown ``report`` for the variants' loop results
    (each ``variant``, ``run_id``, ``model_path``, ``model_uri``, ``settings``). One result without a name (a run
    without variants) is passed on as its evaluation reported it."""
    rows = read_results(results)
    best = choose(rows)
    if len(rows) == 1 and not rows[0]["variant"]:
        e = rows[0]["evaluation"]
        return {
            "passed": e["passed"],
            "reason": e["reason"],
            "chosen": rows[0],
            "metrics": e["metrics"],
            "report": e["report"],
            "serve": serving_list(rows, rows[0] if e["passed"] else None),
        }
    metrics: dict = {}
    for r in rows:
        for key, value in r["evaluation"]["metrics"].items():
            metrics[f"{r['variant']}_{key}"] = value
    if best:
        metrics.update(best["evaluation"]["metrics"])  # the served variant's, under the usual names
        passed = sum(r["evaluation"]["passed"] for r in rows)
        reason = (
            f"serving variant {best['variant']!r}: lowest eval_loss "
            f"{best['evaluation']['metrics']['eval_loss']:.4f} of the {passed} of {len(rows)} variants that "
            "passed their gate"
        )
        if best["settings"].get("deploy_variants") == "all" and passed > 1:
            reason = (
                f"serving the {passed} of {len(rows)} variants that passed their gate (deploy_variants=all); "
                f"best: {best['variant']!r}, eval_loss {best['evaluation']['metrics']['eval_loss']:.4f}"
            )
    else:
        reason = "no variant passed its gate: " + "; ".join(
            f"{r['variant']}: {r['evaluation']['reason']}" for r in rows
        )
    return {
        "passed": best is not None,
        "reason": reason,
        "chosen": best or rows[0],
        "metrics": metrics,
        "report": report(rows, best, reason),
        "serve": serving_list(rows, best),
    }


def _cell(text: str) -> str:
    """Text safe inside one Markdown table cell: HTML-escaped (quotes kept), pipes escaped, newlines as <br>."""
    return html.escape(text, quote=False).replace("|", "\\|").replace("\n", "<br>") or "*(empty)*"


def report(rows: list[dict], best: dict | None, reason: str) -> str:
    """The comparison in Markdown: the decision, one table, the loss curves in one picture, the answers."""
    lines = [
        "# Variants compared",
        "",
        f"**{'PASSED' if best else 'NOT PASSED'}**: {reason}",
        "",
        "| variant | base model | base loss | tuned loss | delta | perplexity | gate | settings |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        m, e = r["evaluation"]["metrics"], r["evaluation"]
        own = json.dumps(r.get("overrides") or {}, sort_keys=True)
        lines.append(
            f"| {r['variant']}{' (served)' if r is best else ''} | `{e['base_model']}` | "
            f"{m['base_eval_loss']:.4f} | {m['eval_loss']:.4f} | {m['eval_loss_delta']:+.4f} | "
            f"{m['perplexity']:.2f} | {'passed' if e['passed'] else 'not passed'} | {_cell(own)} |"
        )
    lines += [
        "",
        "Every model is scored on the run's held-out split, the same tokens, as the cross-entropy per "
        "label token (the evaluation step's own numbers).",
        "",
    ]
    png = loss_curves_png(rows)
    if png:
        lines += [
            "## Training",
            "",
            f"![training loss]({PNG_PREFIX}{base64.b64encode(png).decode()})",
            "",
            "Each variant's train loss (the trainer's log, the mean of each logging window) and its held-out "
            "loss at the end (a marker).",
            "",
        ]
    prompts = rows[0]["evaluation"]["prompts"]
    lines += [
        "## Answers (greedy)",
        "",
        "| # | prompt | base | " + " | ".join(r["variant"] for r in rows) + " |",
        "|---|---|---|" + "---|" * len(rows),
    ]
    for i, prompt in enumerate(prompts):
        base = rows[0]["evaluation"]["answers"]["base"][i]
        tuned = " | ".join(_cell(r["evaluation"]["answers"]["tuned"][i]) for r in rows)
        lines.append(f"| {i + 1} | {_cell(prompt)} | {_cell(base)} | {tuned} |")
    if len({r["evaluation"]["base_model"] for r in rows}) > 1:
        lines += ["", "The variants start from different base models; the base column is the first variant's."]
    return "\n".join(lines) + "\n"


def loss_curves_png(rows: list[dict]) -> bytes | None:
    """One PNG of every variant's logged train loss, with its held-out loss at its last step; None when no variant
    left a trainer log (no complete checkpoint)."""
    from matplotlib.figure import Figure  # no pyplot: no GUI backend, no global figure state

    from components.evaluate.curves import loss_axes_png, training_log

    logs = [(r, training_log(os.path.dirname(os.path.normpath(r["model_path"])))) for r in rows]
    if not any(log for _, log in logs):
        return None
    fig = Figure(figsize=(7.5, 4.2), dpi=100)
    ax = fig.subplots()
    for r, log in logs:
        if not log or not log["train"]:
            continue
        steps, losses = zip(*log["train"], strict=True)
        (line,) = ax.plot(steps, losses, marker=".", label=f"{r['variant']} train loss")
        ax.plot(
            [log["last_step"]],
            [r["evaluation"]["metrics"]["eval_loss"]],
            marker="o",
            color=line.get_color(),
            linestyle="none",
            label=f"{r['variant']} held-out {r['evaluation']['metrics']['eval_loss']:.3f}",
        )
    return loss_axes_png(fig, ax, "Training loss by variant")
