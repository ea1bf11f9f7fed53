"""The floored calibration score (issue 44): ``|y - ŷ| / max(|ŷ|, s_k)``.

A KPI whose level can be near 0 or change sign (a return, a signed reward) gets a finite interval;
a KPI far from 0 gets the relative one it had; the score calibrated is the score inverted (coverage
of an exchangeable case at the level); and the serialised calibration reads back, old ones too.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from edgetwin.twin.intervals import (
    SCORE,
    Calibration,
    calibration_from_arrays,
    change_interval,
    conformal_quantile,
    interval,
    kpi_scale,
)

MEMBERS, SEEDS = 3, 2


def _episodes(rng: np.random.Generator, truths: np.ndarray, err_sd: float) -> np.ndarray:
    """``(M, E · SEEDS)`` replays of episodes with the given truths, replicates seed-major (replicate
    ``r`` replays episode ``r % E``, as `run_whatif` lays them out): each episode's twin answer is
    off by an additive error shared by its members (what calibration must catch), plus small
    member and seed noise."""
    e = len(truths)
    bias = rng.normal(0.0, err_sd, size=e)
    member = rng.normal(0.0, 0.05 * err_sd, size=(MEMBERS, e))
    out = np.empty((MEMBERS, e * SEEDS))
    for r in range(e * SEEDS):
        ep = r % e
        out[:, r] = truths[ep] + bias[ep] + member[:, ep] + rng.normal(0.0, 0.05 * err_sd, MEMBERS)
    return out


def _relative_quantile(values: np.ndarray, truths: np.ndarray) -> float:
    """The score before issue 44, ``|y - ŷ| / |ŷ|``, its split-conformal quantile (the reference)."""
    e = len(truths)
    centre = np.array([values[:, ep::e].mean() for ep in range(e)])
    return conformal_quantile(np.abs(truths - centre) / np.abs(centre))[0]


def test_a_sign_changing_kpi_gets_a_finite_interval_where_the_relative_score_explodes() -> None:
    rng = np.random.default_rng(3)
    truths = rng.normal(0.0, 5.0, 19)  # a return: either sign, about 0 on average
    values = _episodes(rng, truths, err_sd=1.0)
    e = len(truths)
    # two days the twin put almost exactly at 0 (seed 1 of the what-if gate benchmark had one of 3)
    values[:, 0::e], values[:, 1::e] = 1e-4, -2e-4
    truths[:2] = 1.5, -1.0
    cal = calibration_from_arrays({"return": values}, {"return": truths})
    assert cal.score == SCORE == "floored"
    assert _relative_quantile(values, truths) > 100.0  # the defect: the relative score's quantile
    s = cal.scale["return"]
    assert 2.0 < s < 10.0  # the KPI's spread over days and members (the truths' sd is 5)
    q = cal.quantile["return"]
    assert math.isfinite(q) and q < 2.0 and cal.exact["return"]
    # the interval of a near-zero answer: ± q · s around it, a few units of the KPI, not ± 10^4
    v = np.full((MEMBERS, 4), 0.01)
    lo, hi = interval(v, cal, "return")
    assert lo == pytest.approx(0.01 - q * s) and hi == pytest.approx(0.01 + q * s)
    assert hi - lo < 4.0 * s
    assert cal.problem("return") is None


def test_a_kpi_far_from_zero_keeps_its_relative_interval() -> None:
    rng = np.random.default_rng(4)
    truths = rng.uniform(95.0, 105.0, 19)  # a time or a rate: far from 0 against its spread
    values = _episodes(rng, truths, err_sd=4.0)
    cal = calibration_from_arrays({"k": values}, {"k": truths})
    assert cal.scale["k"] < 0.2 * float(np.min(np.abs(values)))  # the floor never binds here
    q_rel = _relative_quantile(values, truths)
    assert cal.quantile["k"] == pytest.approx(q_rel, rel=1e-9)
    old = Calibration(quantile={"k": q_rel}, quantile_norm=dict(cal.quantile_norm), method=cal.method)  # relative
    v = _episodes(rng, np.array([100.0, 98.0]), err_sd=4.0)
    assert interval(v, cal, "k") == pytest.approx(interval(v, old, "k"), rel=1e-9)
    for method in ("relative", "hybrid", "replayed"):
        cal.method = old.method = method
        va, vb = v * 1.1, v
        assert change_interval((0.05, 0.15), va, vb, cal, "k") == pytest.approx(
            change_interval((0.05, 0.15), va, vb, old, "k"), rel=1e-9)


def test_the_floored_score_covers_an_exchangeable_sign_changing_kpi_at_its_level() -> None:
    """2,000 draws of 19 calibration episodes and one test episode of the same law, a KPI centred
    near 0 whose twin errs in proportion to max(|level|, 1): the interval that inverts the score
    (`Calibration.level_unit`) covers the test truth at 90 % (split conformal with 19 scores: between
    0.90 and 0.90 + 1/20, less a binomial margin of 3 sd at 2,000 draws)."""
    rng = np.random.default_rng(5)
    draws, n = 2000, 19
    covered = covered_interval = 0
    widths = []
    for i in range(draws):
        truths = rng.normal(0.5, 2.0, n + 1)
        err_sd = 0.3 * np.maximum(np.abs(truths), 1.0)
        values = np.stack([_episodes(rng, truths[j:j + 1], float(err_sd[j]))[:, 0] for j in range(n + 1)], axis=1)
        cal = calibration_from_arrays({"k": values[:, :n]}, {"k": truths[:n]})
        q = cal.quantile["k"]
        yhat = float(values[:, n].mean())
        covered += abs(truths[n] - yhat) <= q * cal.level_unit("k", yhat)
        if i < 300:  # the product's interval (bootstrap widened by the score inverted): at least as wide
            lo, hi = interval(values[:, n:], cal, "k", seed=i)
            covered_interval += lo <= truths[n] <= hi
            widths.append(hi - lo)
    margin = 3.0 * math.sqrt(0.9 * 0.1 / draws)
    assert 0.9 - margin <= covered / draws <= 0.9 + 1.0 / (n + 1) + margin
    assert covered_interval / 300 >= 0.9 - 3.0 * math.sqrt(0.09 / 300)
    assert float(np.median(widths)) < 10.0  # finite, in the KPI's units (its spread is 2)


def test_the_unpaired_change_inverts_the_score_on_each_level() -> None:
    cal = Calibration(quantile={"k": 0.5}, method="relative", score="floored", scale={"k": 2.0})
    lo, hi = change_interval((0.0, 0.2), candidate=0.3, baseline=0.25, calibration=cal, kpi="k")
    w = 0.5 * math.hypot(2.0, 2.0) / 0.25  # both levels below the scale: each answer ± q · s
    assert (lo, hi) == pytest.approx((0.0 - w, 0.2 + w))


def test_a_relative_change_reads_its_near_zero_baseline_over_the_calibrated_error() -> None:
    """Below its scale the score reads the baseline's error as additive (``ε · s``): pairing cancels it in
    ``c - b`` but not in ``|b|``, so the change is read over every real baseline ``|b| ± q · s``;
    unbounded on the effect's side when that reaches 0; unchanged above ``s``."""
    cal = Calibration(quantile={"k": 0.25}, quantile_norm={"k": 0.0}, method="hybrid", score="floored", scale={"k": 2.0})
    members = np.ones((2, 3))
    # baseline 1.5 < s: error 0.25 · 2 = 0.5, denominators 1.0 .. 2.0
    assert cal.baseline_error("k", 1.5) == pytest.approx(0.5)
    lo, hi = change_interval((0.1, 0.3), 1.8 * members, 1.5 * members, cal, "k")
    w = 0.25 * (0.3 / 1.5)
    d_lo, d_hi = (0.1 - w) * 1.5, (0.3 + w) * 1.5
    assert (lo, hi) == pytest.approx((d_lo / 2.0, d_hi / 1.0))
    # a negative effect: its far end is divided by the nearest denominator
    lo, hi = change_interval((-0.3, -0.1), 1.2 * members, 1.5 * members, cal, "k")
    d_lo, d_hi = (-0.3 - w) * 1.5, (-0.1 + w) * 1.5
    assert (lo, hi) == pytest.approx((d_lo / 1.0, d_hi / 2.0))
    # baseline 0.4: error 0.5 > 0.4, the real baseline may be 0: the size of the change is unbounded on the
    # effect's side; a surely positive effect keeps its lower bound (at |b| + 0.5)
    lo, hi = change_interval((0.1, 0.3), 0.48 * members, 0.4 * members, cal, "k")
    w = 0.25 * 0.2
    assert lo == pytest.approx((0.1 - w) * 0.4 / 0.9) and hi == math.inf
    assert change_interval((-0.3, 0.3), 0.4 * members, 0.4 * members, cal, "k") == (-math.inf, math.inf)
    assert change_interval((0.0, 0.0), 0.4 * members, 0.4 * members, cal, "k") == (0.0, 0.0)  # no effect: none
    # above the scale nothing moves: the relative construction's pairing argument holds
    assert cal.baseline_error("k", 2.5) == 0.0
    lo, hi = change_interval((0.1, 0.3), 3.0 * members, 2.5 * members, cal, "k")
    assert (lo, hi) == pytest.approx((0.1 - 0.25 * 0.2, 0.3 + 0.25 * 0.2))


def test_kpi_scale_is_the_normal_mad_of_the_answers() -> None:
    a = np.array([[1.0, 2.0, 3.0], [4.0, float("nan"), 6.0]])
    x = np.array([1.0, 2.0, 3.0, 4.0, 6.0])
    assert kpi_scale(a) == pytest.approx(1.4826 * float(np.median(np.abs(x - np.median(x)))), rel=1e-4)
    assert kpi_scale(np.array([[3.0]])) == 0.0


def test_the_serialised_calibration_round_trips_and_old_ones_invert_as_they_were_scored() -> None:
    rng = np.random.default_rng(6)
    truths = rng.normal(0.0, 5.0, 9)
    cal = calibration_from_arrays({"return": _episodes(rng, truths, 1.0)}, {"return": truths})
    back = Calibration.from_dict(json.loads(json.dumps(cal.to_dict())))
    assert back.score == "floored" and back.scale == pytest.approx(cal.scale)
    v = np.full((MEMBERS, 2), 0.05)
    assert interval(v, back, "return") == pytest.approx(interval(v, cal, "return"))
    # an artifact written before the floor: no "score", no "scale"; its scores are |y - ŷ| / |ŷ|, so
    # it is read as the relative score and inverted with |ŷ|, as it was scored
    old = cal.to_dict()
    del old["score"], old["scale"]
    before = Calibration.from_dict(old)
    assert before.score == "relative" and before.scale == {}
    q = before.quantile["return"]
    lo, hi = interval(v, before, "return")
    plain = interval(v, None, "return")
    assert (lo, hi) == pytest.approx((plain[0] - q * 0.05, plain[1] + q * 0.05))
    with pytest.raises(ValueError, match="unknown score 'squared'"):
        Calibration.from_dict({**cal.to_dict(), "score": "squared"})
    with pytest.raises(ValueError, match="scale of return is not a finite number"):
        Calibration.from_dict({**cal.to_dict(), "scale": {"return": -1.0}})
    with pytest.raises(ValueError, match="'relative' score has no scale"):
        Calibration.from_dict({**cal.to_dict(), "score": "relative"})
