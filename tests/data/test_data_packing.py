"""Best-fit-decreasing packing: every example whole in exactly one row, rows nearly full."""

import datasets
import numpy as np
import pyarrow as pa
import pytest

from components.models.packing import best_fit_decreasing, packed_batches


def test_every_row_fits_and_beats_first_fit_in_order():
    rng = np.random.default_rng(0)
    lengths = np.clip(rng.lognormal(5.5, 0.8, 5000).astype(np.int64), 8, 4096)
    bins = best_fit_decreasing(lengths, 4096)
    loads = np.bincount(bins, weights=lengths)
    assert loads.max() <= 4096 and len(bins) == len(lengths)
    assert lengths.sum() / (len(loads) * 4096) >= 0.98
    # the naive alternative: fill rows in arrival order, open a new one when the next example does not fit
    naive, room = 0, 0
    for n in lengths:
        if n > room:
            naive, room = naive + 1, 4096
        room -= n
    assert len(loads) < naive


def test_best_fit_picks_the_tightest_row():
    # 6 goes first (row 0, 4 left), 5 opens row 1 (5 left); 4 fits both and takes row 0 (tightest), 5 takes row 1
    assert best_fit_decreasing(np.array([6, 5, 4, 5]), 10).tolist() == [0, 1, 0, 1]


def test_an_example_longer_than_a_row_is_refused():
    with pytest.raises(ValueError, match="an example of 11 tokens does not fit in 10"):
        best_fit_decreasing(np.array([3, 11]), 10)


def test_packed_rows_restart_positions_and_pad_the_tail():
    examples = [[1, 2, 3], [4, 5], [6, 7, 8, 9], [10]]
    ds = datasets.Dataset.from_dict({"input_ids": examples, "labels": [[-100] + e[1:] for e in examples]})
    idx = np.arange(4)
    table = pa.Table.from_batches(list(packed_batches(ds, idx, np.array([3, 2, 4, 1]), 5, pad_token_id=0)))
    rows = table.to_pydict()
    # longest first: [6..9] opens row 0, [1,2,3] opens row 1, [4,5] fills row 1, [10] fills row 0
    assert rows["input_ids"] == [[6, 7, 8, 9, 10], [1, 2, 3, 4, 5]]
    assert rows["position_ids"] == [[0, 1, 2, 3, 0], [0, 1, 2, 0, 1]]
    assert rows["labels"] == [[-100, 7, 8, 9, -100], [-100, 2, 3, -100, 5]]
    padded = pa.Table.from_batches(
        list(packed_batches(ds, np.array([0, 1]), np.array([3, 2]), 7, pad_token_id=0))
    ).to_pydict()
    assert padded == {
        "input_ids": [[1, 2, 3, 4, 5, 0, 0]],
        "labels": [[-100, 2, 3, -100, 5, -100, -100]],
        "position_ids": [[0, 1, 2, 0, 1, 0, 1]],
    }
