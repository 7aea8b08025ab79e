"""Packing tokenized examples into rows of exactly ``max_seq_length`` tokens.

Best-fit decreasing: examples, longest first, go into the open row with the least room that still fits
them, so no example is split and rows come out nearly full. ``position_ids`` restart at 0 at every
example start, which lets the trainer attend padding-free without attention across examples. The
tail of a row is pad tokens with labels -100 (its positions also restart, so it is a block of its own).
"""

from __future__ import annotations

from bisect import bisect_left, insort

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

IGNORE_INDEX = -100
CHUNK_ROWS = 256


def best_fit_decreasing(lengths: np.ndarray, capacity: int) -> np.ndarray:
    """The row (bin) number of every example; each row's lengths sum to at most ``capacity``.

    Open rows are indexed by their free space (at most ``capacity`` distinct values), so each
    placement is a binary search: O(n log capacity) instead of scanning every open row.
    """
    if len(lengths) and int(lengths.max()) > capacity:
        raise ValueError(f"an example of {int(lengths.max())} tokens does not fit in {capacity}")
    bin_of = np.empty(len(lengths), dtype=np.int64)
    spaces: list[int] = []  # sorted free-space values that have open rows
    rows_with: dict[int, list[int]] = {}
    n_rows = 0
    for idx in np.argsort(-lengths, kind="stable"):
        n = int(lengths[idx])
        k = bisect_left(spaces, n)
        if k == len(spaces):
            row, space = n_rows, capacity - n
            n_rows += 1
        else:
            free = spaces[k]
            row = rows_with[free].pop()
            if not rows_with[free]:
                del rows_with[free]
                spaces.pop(k)
            space = free - n
        bin_of[idx] = row
        if space > 0:
            if space not in rows_with:
                rows_with[space] = []
                insort(spaces, space)
            rows_with[space].append(row)
    return bin_of


def packed_batches(tokenized, indices: np.ndarray, lengths: np.ndarray, capacity: int, pad_token_id: int):
    """Yield Arrow record batches of packed rows for the examples ``indices`` of ``tokenized``.

    Args:
        tokenized: a ``datasets.Dataset`` with ``input_ids`` and ``labels``.
        indices: which of its rows to pack.
        lengths: their token counts (same order as ``indices``).
        capacity: the row length (``max_seq_length``).
        pad_token_id: the id that fills each row's tail.
    """
    bin_of = best_fit_decreasing(lengths, capacity)
    order = np.argsort(bin_of, kind="stable")  # examples grouped by row
    n_rows = int(bin_of.max()) + 1 if len(bin_of) else 0
    ex_per_row = np.bincount(bin_of, minlength=n_rows)
    row_starts = np.concatenate([[0], np.cumsum(ex_per_row)])
    arrow = tokenized.with_format("arrow")
    for first in range(0, n_rows, CHUNK_ROWS):
        last = min(first + CHUNK_ROWS, n_rows)
        sel = order[row_starts[first] : row_starts[last]]
        table = arrow[indices[sel].tolist()]
        ids = pc.list_flatten(table["input_ids"]).to_numpy()
        labels = pc.list_flatten(table["labels"]).to_numpy()
        ex_len = lengths[sel]
        ex_row = bin_of[sel] - first
        # Where each token lands: its row, its offset in the row, and its offset in its example.
        tok_ex = np.repeat(np.arange(len(sel)), ex_len)
        ex_start = np.concatenate([[0], np.cumsum(ex_len)[:-1]])
        used = np.bincount(ex_row, weights=ex_len, minlength=last - first).astype(np.int64)
        row_flat_start = np.concatenate([[0], np.cumsum(used)[:-1]])
        tok_row = ex_row[tok_ex]
        offset_in_row = np.arange(len(ids)) - row_flat_start[tok_row]
        dest = tok_row * capacity + offset_in_row
        width = (last - first) * capacity
        out_ids = np.full(width, pad_token_id, dtype=np.int32)
        out_labels = np.full(width, IGNORE_INDEX, dtype=np.int32)
        out_pos = (np.tile(np.arange(capacity), last - first) - np.repeat(used, capacity)).astype(np.int32)
        out_ids[dest] = ids
        out_labels[dest] = labels
        out_pos[dest] = np.arange(len(ids)) - ex_start[tok_ex]
        offsets = pa.array(np.arange(0, width + 1, capacity, dtype=np.int32))
        yield pa.RecordBatch.from_arrays(
            [pa.ListArray.from_arrays(offsets, pa.array(a)) for a in (out_ids, out_labels, out_pos)],
            names=["input_ids", "labels", "position_ids"],
        )


# The label of a token no loss counts (prompt, padding): transformers' and the collators' ignore index.
IGNORE_INDEX = -100


def split_examples(row: dict) -> list[tuple[list[int], list[int]]]:
    """The examples inside one dataset row as (input_ids, labels): a packed row (``position_ids``) is cut
    where the positions restart at 0 (the inverse of packing); segments without a scored label (the tail padding)
    are dropped."""
    ids, labels = row["input_ids"], row["labels"]
    starts = [i for i, p in enumerate(row["position_ids"]) if p == 0] if "position_ids" in row else [0]
    bounds = starts[1:] + [len(ids)]
    return [
        (ids[a:b], labels[a:b])
        for a, b in zip(starts, bounds, strict=True)
        if any(x != IGNORE_INDEX for x in labels[a:b])
    ]
