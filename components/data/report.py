"""The Markdown report the KFP UI shows for prepare_dataset: counts, a length histogram, three examples."""

from __future__ import annotations

import re

import numpy as np

BAR_WIDTH = 40
EXAMPLE_CHARS = 1200


def length_histogram(lengths: np.ndarray, bins: int = 10) -> list[dict]:
    """Equal-width buckets of example lengths in tokens: ``[{"from", "to", "count"}, ...]``."""
    if not len(lengths):
        return []
    counts, edges = np.histogram(lengths, bins=bins, range=(0, max(int(lengths.max()), bins)))
    return [
        {"from": int(np.ceil(edges[i])), "to": int(np.ceil(edges[i + 1])) - 1, "count": int(c)}
        for i, c in enumerate(counts)
    ]


def markdown(stats: dict) -> str:
    """Render ``stats`` (as written to stats.json) as the report."""
    lines = [f"# Prepared dataset ({stats['format']})", ""]
    if stats.get("cache_hit"):
        lines += [f"Reused the cached result for fingerprint `{stats['fingerprint'][:16]}` (inputs unchanged).", ""]
    # Rows read, minus every drop (cleaning, duplicates, then over-length after tokenizing), are the examples kept;
    # a chunked document is one row read and several examples (its chunks).
    chunks, chunked = stats.get("chunks", 0), stats.get("chunked_documents", 0)
    kept = stats["train"]["examples"] + stats["eval"]["examples"] - chunks + chunked
    lines += ["| | examples |", "|---|---:|", f"| read | {stats['rows_in']} |"]
    lines += [f"| dropped: {reason} | {n} |" for reason, n in sorted(stats["dropped"].items()) if n]
    lines += [f"| **kept** (train + eval {'documents' if 'chunks' in stats else 'examples'}) | **{kept}** |"]
    if stats["truncated"]:
        lines += [f"| of which truncated to max_seq_length | {stats['truncated']} |"]
    if "near_dedup_seconds" in stats:
        lines += [
            f"| near-duplicate search (threshold {stats['near_dedup_threshold']}) | "
            f"{stats['dropped'].get('near_duplicate', 0)} dropped in {stats['near_dedup_seconds']} s |"
        ]
    if chunked:
        overlap = f", {stats['chunk_overlap']} tokens of overlap" if stats.get("chunk_overlap") else ""
        lines += [f"| of which cut into max_seq_length chunks{overlap} | {chunked} (-> {chunks} chunks) |"]
    lines.append("")
    lines += [
        "| split | examples | rows | tokens | label tokens | packing efficiency |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for split in ("train", "eval"):
        s = stats[split]
        eff = f"{s['packing_efficiency']:.3f}" if "packing_efficiency" in s else "not packed"
        lines.append(
            f"| {split} | {s['examples']} | {s['rows']} | {s.get('tokens', '-')} | "
            f"{s.get('label_tokens', '-')} | {eff} |"
        )
    if stats.get("length_histogram"):
        top = max(b["count"] for b in stats["length_histogram"]) or 1
        lines += ["", f"## Example lengths (tokens, max_seq_length {stats['max_seq_length']})", "", "```"]
        lines += [
            f"{b['from']:>6}-{b['to']:<6} {'#' * round(BAR_WIDTH * b['count'] / top):<{BAR_WIDTH}} {b['count']}"
            for b in stats["length_histogram"]
        ]
        lines.append("```")
    if stats.get("examples"):
        lines += ["", "## Examples (as the model sees them)"]
        for i, text in enumerate(stats["examples"], 1):
            shown = text if len(text) <= EXAMPLE_CHARS else text[:EXAMPLE_CHARS] + " …"
            fence = "`" * max(3, _longest_backtick_run(shown) + 1)  # a longer fence keeps the example's own fences
            lines += ["", f"### Example {i}", "", fence, shown, fence]
    return "\n".join(lines) + "\n"


def _longest_backtick_run(text: str) -> int:
    return max((len(run) for run in re.findall("`+", text)), default=0)
