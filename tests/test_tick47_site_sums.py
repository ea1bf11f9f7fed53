"""Issue 47, fifth round: `edgetwin.twin.fused._segment_means` adds a site's columns together, row by
row. Every run length at the edges of numpy's pairwise order (below 8 values one by one, 8 partial
sums up to 128, halves above) must give `segment_means`' (``np.add.reduceat``) bits, for all the
columns and for a gathered subset, with NaN, infinities and signed zeros among the values."""

from __future__ import annotations

import numpy as np
import pytest

from edgetwin.imitation.steps import segment_means
from edgetwin.twin.fused import _segment_means

#: run lengths (rows of a site): the first row is added to the pairwise sum of the other ``len - 1``
RUNS = [1, 2, 8, 9, 10, 16, 17, 24, 25, 33, 128, 129, 130, 131, 137, 257, 300, 1100]


@pytest.mark.parametrize("cols", [np.arange(11), np.array([0, 3, 4, 5, 9, 10])], ids=["all", "gathered"])
def test_every_run_length_at_the_pairwise_edges_is_reduceats(cols: np.ndarray) -> None:
    rng = np.random.default_rng(47)
    runs = np.array(RUNS)[rng.permutation(len(RUNS))]
    n = int(runs.sum())
    starts = np.concatenate([[0], np.cumsum(runs)[:-1]]).astype(np.int64)
    counts = runs.astype(np.float64)
    v = rng.standard_normal((n, 11)) * np.logspace(-4, 8, 11)  # magnitudes apart: the order shows in the bits
    v[:, 3] = -0.0  # a column of -0.0: sums of -0.0 from -0.0
    v[::5, 4] = -0.0
    v[7, 5], v[400, 9], v[401, 10] = np.nan, np.inf, -np.inf
    cols = cols.astype(np.int64)
    got = np.full((len(runs), len(cols)), 7.0)
    _segment_means(v, cols, starts, counts, got)
    want = segment_means(v[:, cols], starts, counts)
    assert got.tobytes() == want.tobytes()
    assert np.signbit(got[:, list(cols).index(3)]).all()  # -0.0 kept where every value is -0.0
