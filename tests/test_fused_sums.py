"""The fused tick's site means (issue 47): a compiled pass that adds a site's rows in numpy's own
pairwise order, so its means are `segment_means`' (``np.add.reduceat``) to the bit, signed zeros,
runs of one row and runs past numpy's 128-value block included."""

from __future__ import annotations

import numpy as np
import pytest

from edgetwin.imitation.steps import segment_means, segment_starts
from edgetwin.twin.fused import _segment_means


@pytest.mark.parametrize("mean_run", [1, 3, 33, 129, 700])
def test_fused_site_means_are_reduceats_to_the_bit(mean_run: int) -> None:
    rng = np.random.default_rng(mean_run)
    n = 3000
    site = np.sort(rng.integers(0, max(1, n // mean_run), n))
    site = np.unique(site, return_inverse=True)[1]
    n_sites = int(site.max()) + 1
    starts = segment_starts(site, n_sites)
    assert starts is not None
    counts = np.bincount(site, minlength=n_sites).astype(np.float64)
    v = rng.standard_normal((n, 9)) * np.logspace(-3, 6, 9)
    v[::7, 2] = -0.0  # signed zeros: a run of them sums to -0.0 in numpy
    v[:, 4] = -0.0
    v[5, 5], v[9, 6] = np.nan, np.inf
    cols = np.array([0, 2, 4, 5, 6, 8], np.int64)
    got = np.empty((n_sites, len(cols)))
    _segment_means(v, cols, starts.astype(np.int64), counts, got)
    want = segment_means(v[:, cols], starts, counts)
    assert got.tobytes() == want.tobytes()
    # and not a plain row-by-row sum, which rounds otherwise on runs of 9+ rows
    if mean_run >= 33:
        plain = np.stack([np.array([sum(v[a:b, j].tolist(), -0.0) for j in cols])
                          for a, b in zip(starts, [*starts[1:], n], strict=True)]) / counts[:, None]
        assert plain.tobytes() != want.tobytes()
