"""The relative change over an uncertain baseline (`edgetwin.contract.relative_change`) and the
loop's verdict interval built on it (`edgetwin.loop.ppi.finish_estimate`).

The coverage checks draw ``(diff, base)`` estimates from a bivariate normal with known standard
errors and a correlation (the verdict bounds it, it does not know it) and count how often the
interval holds the true ratio ``d / |b|``; the delta method the verdict used before is computed
beside it, as it was, to show what the change fixes (the module docstring's numbers)."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
from scipy import stats

from edgetwin.contract.relative_change import relative_change_interval
from edgetwin.loop.ppi import finish_estimate

LEVEL = 0.9
Z = float(stats.norm.ppf(0.5 + LEVEL / 2))


def _delta_method(d: np.ndarray, b: np.ndarray, d_se: float, b_se: float) -> tuple[np.ndarray, np.ndarray]:
    """The verdict's interval before: ``rel ± z·(se_d + |rel|·se_b)/|b|`` (Cauchy-Schwarz bound)."""
    den = np.abs(b)
    rel = d / den
    se = np.sqrt(d_se**2 + rel**2 * b_se**2 + 2 * np.abs(rel) * d_se * b_se) / den
    return rel - Z * se, rel + Z * se


def _draws(ratio: float, d_se: float, b_se: float, rho: float, n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """``n`` estimates of (diff, base) around the truth (ratio, 1) with the given errors."""
    rng = np.random.default_rng(seed)
    e1, e2 = rng.standard_normal(n), rng.standard_normal(n)
    return ratio + d_se * e1, 1.0 + b_se * (rho * e1 + math.sqrt(1 - rho * rho) * e2)


def _verdict_intervals(d: np.ndarray, b: np.ndarray, d_se: float, b_se: float) -> tuple[np.ndarray, np.ndarray]:
    """`finish_estimate`'s interval at the normal reference (what it computes, without its scipy
    quantile per call; `test_the_verdict_interval_is_the_effect_over_the_baseline_interval` ties the two)."""
    got = [relative_change_interval(x - Z * d_se, x + Z * d_se, y, Z * b_se) for x, y in zip(d.tolist(), b.tolist(), strict=True)]
    return np.array([g[0] for g in got]), np.array([g[1] for g in got])


def test_error_zero_is_plain_division_and_the_ends_move_outwards_with_the_baseline_error() -> None:
    assert relative_change_interval(-2.0, 4.0, -8.0, 0.0) == (-0.25, 0.5)
    lo, hi = relative_change_interval(-2.0, 4.0, 8.0, 2.0)
    assert lo == pytest.approx(-2.0 / 6.0) and hi == pytest.approx(4.0 / 6.0)  # both ends over the nearest level
    lo, hi = relative_change_interval(1.0, 4.0, 8.0, 2.0)
    assert lo == pytest.approx(1.0 / 10.0) and hi == pytest.approx(4.0 / 6.0)  # a positive low end over the farthest


def test_a_baseline_that_may_be_zero_unbounds_the_side_the_effect_may_take() -> None:
    assert relative_change_interval(-1.0, 2.0, 0.5, 1.0) == (-math.inf, math.inf)
    lo, hi = relative_change_interval(1.0, 2.0, 0.5, 1.0)  # surely worse: keeps its low end
    assert lo == pytest.approx(1.0 / 1.5) and hi == math.inf
    lo, hi = relative_change_interval(-3.0, -1.0, 0.5, 1.0)  # surely better: keeps its high end
    assert lo == -math.inf and hi == pytest.approx(-1.0 / 1.5)
    assert relative_change_interval(0.0, 0.0, 0.5, 1.0) == (0.0, 0.0)


def test_the_verdict_interval_is_the_effect_over_the_baseline_interval() -> None:
    e = finish_estimate(2.78, 0.79**2, 1.65, 0.79**2, LEVEL, df=7.0)  # the demo's revenue, one canary day
    q = float(stats.t.ppf(0.95, 7.0))
    assert e["rel"] == pytest.approx(2.78 / 1.65)
    assert e["rel_lo"] == pytest.approx((2.78 - q * 0.79) / (1.65 + q * 0.79))
    assert e["rel_hi"] == pytest.approx((2.78 + q * 0.79) / (1.65 - q * 0.79))
    # the delta method put the low end at -76 %: a certain gain in revenue read as a possible loss
    assert e["rel_lo"] > 0.2
    near_zero = finish_estimate(0.10, 0.44**2, -0.32, 0.42**2, LEVEL, df=4.2)  # the demo's reward
    assert near_zero["rel_lo"] == -math.inf and near_zero["rel_hi"] == math.inf
    normal = finish_estimate(0.3, 0.02**2, 1.1, 0.3**2, LEVEL)  # df inf: the normal reference the draws use
    assert (normal["rel_lo"], normal["rel_hi"]) == pytest.approx(tuple(x[0] for x in _verdict_intervals(
        np.array([0.3]), np.array([1.1]), 0.02, 0.3)))  # fmt: skip


@pytest.mark.parametrize("b_se", [0.05, 0.3, 0.5])
@pytest.mark.parametrize("d_se", [0.02, 0.1])
@pytest.mark.parametrize("rho", [-0.7, 0.0, 0.7])
def test_the_verdict_interval_covers_the_true_ratio_at_its_level(b_se: float, d_se: float, rho: float) -> None:
    for ratio in (0.0, 0.06, 0.3):
        d, b = _draws(ratio, d_se, b_se, rho, 6000, seed=int(1000 * (b_se + d_se + rho + ratio + 1)))
        lo, hi = _verdict_intervals(d, b, d_se, b_se)
        covered = float(np.mean((lo <= ratio) & (ratio <= hi)))
        assert covered >= LEVEL - 0.015, (ratio, covered)  # 6,000 draws: binomial sd 0.4 pp


def test_the_delta_method_did_not_hold_where_the_baseline_is_noisy() -> None:
    """The numbers of `edgetwin.contract.relative_change`'s docstring, old and new side by side."""
    d, b = _draws(0.3, 0.02, 0.5, -0.7, 20000, seed=3)
    lo, hi = _delta_method(d, b, 0.02, 0.5)
    assert float(np.mean((lo <= 0.3) & (hi >= 0.3))) < 0.88  # ~87 % at a stated 90 %
    lo, hi = _verdict_intervals(d, b, 0.02, 0.5)
    assert float(np.mean((lo <= 0.3) & (hi >= 0.3))) >= 0.90
    # a true +6 % judged within a 5 % margin: the upper end at or below it (a false "ok"; 5 % promised)
    d, b = _draws(0.06, 0.02, 0.5, -0.7, 20000, seed=4)
    assert float(np.mean(_delta_method(d, b, 0.02, 0.5)[1] <= 0.05)) > 0.065  # ~7.6 %
    assert float(np.mean(_verdict_intervals(d, b, 0.02, 0.5)[1] <= 0.05)) <= 0.05


def test_the_readme_says_how_the_verdict_reads_a_relative_change() -> None:
    """README's loop paragraph: the sentence, and what it claims of `finish_estimate`."""
    from pathlib import Path

    text = " ".join((Path(__file__).resolve().parents[1] / "README.md").read_text().split())
    assert ("its relative change is the effect's interval over every baseline level the baseline's own interval "
            "allows (interval division, `edgetwin.contract.relative_change`; the delta method it replaced covered a "
            "large effect over a noisy baseline in 87 % of draws at a stated 90 %), unbounded on the effect's side "
            "where that level may be 0") in text  # fmt: skip
    d, b = _draws(0.3, 0.02, 0.5, 0.0, 20000, seed=3)
    lo, hi = _delta_method(d, b, 0.02, 0.5)
    assert 0.85 < float(np.mean((lo <= 0.3) & (hi >= 0.3))) < 0.90  # the delta method: ~87-89 % here
    e = finish_estimate(-0.5, 0.1**2, 0.2, 0.2**2, LEVEL)  # a baseline within its interval of 0
    assert e["rel_lo"] == -math.inf and math.isfinite(e["rel_hi"]) and e["rel_hi"] < 0  # the sign is known


def _check(change: float, interval: tuple[float, float], allowed: float = 0.05) -> Any:
    """A straddling PPI check, lower is better (worsening = change)."""
    from types import SimpleNamespace

    return SimpleNamespace(kpi="k", verdict="straddle", better="lower", change=change, allowed_change=allowed,
                           worsening_interval=list(interval))  # fmt: skip


def test_more_days_reads_the_side_that_must_clear_the_margin() -> None:
    from edgetwin.loop.day_verdict import days_needed, more_days

    # point 0.0 below the 5 % margin: the upper end must come down; its reach is 0.10, the gap 0.05
    assert more_days([_check(0.0, (-0.5, 0.10))], 1) == 3  # (0.10/0.05)^2 - 1; the far lower end does not count
    assert more_days([_check(0.0, (-0.10, 0.5))], 1) == 99  # (0.5/0.05)^2 - 1
    # point above the margin: the lower end must come up
    assert more_days([_check(0.15, (0.0, 2.0))], 1) == 2  # ceil((0.15/0.10)^2 - 1) = ceil(1.25); the far upper end does not count
    assert "run 2 more day(s)" in days_needed([_check(0.15, (0.0, 2.0))], 1)


def test_an_interval_unbounded_towards_its_margin_is_not_futile() -> None:
    from edgetwin.loop.day_verdict import days_needed, more_days, unbounded_towards_margin

    open_ = _check(0.1, (-math.inf, math.inf))
    assert more_days([open_], 1) is None and unbounded_towards_margin(open_)
    assert "its baseline level's interval reaches 0" in days_needed([open_], 1)
    assert not unbounded_towards_margin(_check(0.0, (-math.inf, 0.2)))  # unbounded away from the margin
    on_margin = _check(0.05, (-0.1, 0.2))
    assert more_days([on_margin], 1) is None and not unbounded_towards_margin(on_margin)
    assert "sits on its margin" in days_needed([on_margin], 1)


def test_the_extension_goes_on_for_an_interval_unbounded_towards_its_margin() -> None:
    """`_not_extended`'s futility: a point on its margin alone stops an extension; an interval over a
    baseline level that may be 0 beside it does not (more days may bound it)."""
    from edgetwin.loop.rounds import _not_extended

    on_margin = _check(0.05, (-0.1, 0.2))
    assert _not_extended("completed", [], [on_margin], 1, 1, 16) is not None  # futile: stop
    assert _not_extended("completed", [], [on_margin, _check(0.1, (-math.inf, math.inf))], 1, 1, 16) is None
