"""The declared dynamics' site sums in one compiled pass (issue 47): the numbers of ``np.bincount``
and the gather they replace, to the bit, whatever the site order, with NaN and signed zeros; a
constant expression is numexpr's value for every agent."""

from __future__ import annotations

import numpy as np
import pytest

from edgetwin.contract.dynamics import Expression, _reduce, _site_total


@pytest.mark.parametrize("op", ["sum", "mean"])
def test_site_totals_are_bincounts_gathered_to_the_bit(op: str) -> None:
    rng = np.random.default_rng(1)
    n, n_sites = 5000, 300
    site = rng.integers(0, n_sites, n)  # any order, and some sites without agents
    site[site == 7] = 8
    values = rng.standard_normal(n) * np.logspace(-4, 7, n)
    values[::11] = -0.0
    values[3] = np.nan
    strided = np.stack([values, values], axis=1)[:, 1]  # a column of a block, as a tick passes it
    want = _reduce(op, values, site, n_sites)[site]
    for v in (values, strided):
        assert _site_total(v, site, n_sites, op == "mean").tobytes() == want.tobytes()


def test_a_constant_expression_is_numexprs_value_for_every_agent() -> None:
    for text in ("1", "2.5 * 4", "-(3 / 7)"):
        e = Expression.compile(text, "test", "next")
        got = e.evaluate({}, np.zeros(6, np.int64), 1, 60.0)
        assert got.dtype == np.float64 and got.shape == (6,)
        assert got.tobytes() == np.full(6, float(eval(text))).tobytes()  # noqa: S307 - the test's own literals
