"""Issue 48, item 3 (planbase15): the plan's expected interval is the verdict's own construction.

The verdict divides the change's interval by every baseline level the baseline's own interval
allows (`edgetwin.loop.ppi.finish_estimate`), so where that interval reaches 0 the relative interval
is unbounded; the plan used to divide by the twin's baseline as if it were known
(``point ± q·se/base``) and promised "expected to decide" where the verdict could not. Here, on
synthetic terms: the plan's interval is `finish_estimate` on the expected change, baseline and
variances (a), an unbounded baseline gives an unbounded interval that does not decide (b), a
negligible baseline error gives back the old interval (c), and the day count is when the loop's own
pooled verdict decides on rounds built from the plan's terms, baseline error included (d)."""

from __future__ import annotations

import math
from types import SimpleNamespace
from typing import Any

import numpy as np
import pandas as pd
import pytest

from edgetwin.contract.margins import KPIMargin
from edgetwin.loop import plan as plan_mod
from edgetwin.loop.day_verdict import _pooled_verdict
from edgetwin.loop.plan import PlanBudget, pooled_days_to_decide, pooled_terms
from edgetwin.loop.ppi import finish_estimate, look_days, look_level, t_quantile, welch_df

KPI, COL = "kpi.x", "x"
N_FLEET, N, H = 60, 10, 6.0


def _preds(base_level: float, base_sd: float, effect_sd: float, seed: int = 0) -> pd.DataFrame:
    """``(N_FLEET,)`` groups' twin predictions of the baseline and the candidate (KPI units)."""
    rng = np.random.default_rng(seed)
    fb = base_level + base_sd * rng.standard_normal(N_FLEET)
    fc = fb + effect_sd * rng.standard_normal(N_FLEET)
    return pd.DataFrame({("candidate", COL): fc, ("baseline", COL): fb}, index=[f"g{i}" for i in range(N_FLEET)])


def _option(preds: pd.DataFrame, s: float, point: float, allowed: float = 0.05, better: str = "lower",
            day: tuple[float, float, float] | None = None) -> Any:
    """`_expected_option` of one KPI on synthetic twin predictions and residual spread ``s``."""
    check = SimpleNamespace(change=point, better=better, allowed_change=allowed, worsening_interval=[0.0, 0.1],
                            interval=[point - 0.2, point + 0.2], abstain_reason=lambda _m: "straddles")  # fmt: skip
    kdefs = {KPI: SimpleNamespace(stat="mean", weight=None, column=COL)}
    return plan_mod._expected_option(
        SimpleNamespace(max_out_of_support=0.1), {KPI: check}, kdefs, preds, {(COL, H): s}, PlanBudget(max_share=0.5),
        N_FLEET, N, H, "random", day_var=None if day is None else {COL: day}, max_days=1,
    )  # fmt: skip


def _by_hand(preds: pd.DataFrame, s: float, point: float, day: tuple[float, float, float] = (0.0, 0.0, math.inf),
             base_known: bool = False) -> tuple[float, float]:
    """The verdict's interval (`finish_estimate`) on the terms a random canary of ``N`` groups is
    expected to leave, written out from the verdict's formulae (`ppi_mean_difference`): the change's
    variance ``var_N(f_c − f_b)/N + s²/n_c + s²/n_b + day``, the baseline level's
    ``var_N(f_b)/N + s²/n_b + day_b``, on Welch's degrees of freedom over the change's terms."""
    fc, fb = preds[("candidate", COL)].to_numpy(), preds[("baseline", COL)].to_numpy()
    base, n_c = abs(float(np.mean(fb))), N // 2
    terms = [(float(np.var(fc - fb, ddof=1)) / N_FLEET, N_FLEET - 1.0), (s * s / n_c, n_c - 1.0),
             (s * s / (N - n_c), N - n_c - 1.0), *([(day[0], day[2])] if day[0] > 0 else [])]  # fmt: skip
    base_var = 0.0 if base_known else float(np.var(fb, ddof=1)) / N_FLEET + s * s / (N - n_c) + day[1]
    got = finish_estimate(point * base, sum(v for v, _ in terms), base, base_var, 0.90, df=welch_df(terms))
    return got["rel_lo"], got["rel_hi"]


@pytest.mark.parametrize("point, s, day", [(0.03, 4.0, None), (-0.12, 9.0, (2.0, 6.0, 4.0)), (0.2, 2.0, (0.5, 30.0, 3.0))])
def test_the_expected_interval_is_the_verdicts_construction(point: float, s: float,
                                                           day: tuple[float, float, float] | None) -> None:
    """(a) The plan's one-day expected interval is `finish_estimate` on the expected change
    (``point·base``), its variance, the baseline level and the baseline's variance (its fleet term,
    the control arm's rectifier and its day-to-day term), not ``point ± q·se/base``."""
    preds = _preds(50.0, 8.0, 3.0)
    _, _, width, planned = _option(preds, s, point, day=day)
    want = _by_hand(preds, s, point, day or (0.0, 0.0, math.inf))
    assert planned[0].expected == pytest.approx(list(want), rel=1e-9)
    assert width == pytest.approx(want[1] - want[0], rel=1e-9)
    old = _by_hand(preds, s, point, day or (0.0, 0.0, math.inf), base_known=True)
    assert want[1] - want[0] > (old[1] - old[0]) * (1 + 1e-6)  # the baseline's error widens it
    assert planned[0].point == point


def test_a_baseline_that_may_be_zero_leaves_the_interval_unbounded_and_undecided() -> None:
    """(b) A baseline level whose expected interval reaches 0 (groups' level 2 ± 1, residual spread
    12 over 5 control groups): the plan's expected interval is unbounded on both sides, as the
    verdict's would be, the option is not expected to decide, the summed width is infinite, and the
    printed plan says so (``±inf%``, as a realised unbounded interval prints, and "unbounded")."""
    preds = _preds(2.0, 1.0, 0.5)
    ok, _, width, planned = _option(preds, 12.0, -0.02)
    k = planned[0]
    assert k.expected == [-math.inf, math.inf] and k.unbounded
    assert not ok and not k.decides and math.isinf(width)
    assert plan_mod._width_rank(planned) == (1, 0.0)  # designs are still ranked on finite numbers
    plan = plan_mod.CanaryPlan("c", "b", plan_mod.PlanSlice(), 6.0, (KPIMargin(COL, 0.05, 0.0, False),), planned, N,
                               N_FLEET, N / N_FLEET, {}, ok, [])  # fmt: skip
    text = plan.describe()
    assert "expected after [-inf%, +inf%] (unbounded: the baseline level's expected interval reaches 0)" in text
    again = plan_mod.CanaryPlan.from_dict(__import__("json").loads(plan.to_json()))
    assert again.kpis[0].expected == [-math.inf, math.inf]


def test_an_interval_unbounded_above_still_regresses_by_its_bounded_side() -> None:
    """(b) The verdict decides a KPI with an infinite end by its bounded side only
    (`check_verdict`): a twin that expects +60 % against a 5 % margin, with the change well measured
    (residual spread 0.3) over a baseline level of 2 whose day-to-day variance (4, KPI units²) lets
    it be 0, leaves ``[lo, +inf]`` with ``lo`` above the margin: expected to decide (a refusal).
    Where higher is better the same numbers are ``[-inf, -lo]`` in worsening, within the margin: ok
    by the bounded side. A small change over the same baseline stays undecided."""
    preds, day = _preds(2.0, 0.1, 0.2), (0.0, 4.0, 5.0)
    ok, _, _, planned = _option(preds, 0.3, 0.6, day=day)
    lo, hi = planned[0].expected
    assert math.isinf(hi) and math.isfinite(lo) and lo > 0.05
    assert ok and planned[0].decides
    assert lo == pytest.approx(_by_hand(preds, 0.3, 0.6, day)[0], rel=1e-9)
    ok_h, _, _, planned_h = _option(preds, 0.3, 0.6, better="higher", day=day)
    assert planned_h[0].decides and ok_h
    ok_s, _, _, planned_small = _option(preds, 0.3, 0.03, day=day)
    assert math.isinf(planned_small[0].expected[1]) and not planned_small[0].decides and not ok_s


def test_a_negligible_baseline_error_gives_back_point_plus_minus_q_se_over_base() -> None:
    """(c) With the baseline's error negligible against its level (a level of 1e4, groups alike,
    residual spread 1: the baseline's relative error ``q·se_b/base`` about 1e-4), the verdict's
    construction is the plan's old interval ``point ± q·se/base`` to within 1e-3 of its ends, and
    `expected_interval` with no baseline variance is that interval (to rounding)."""
    preds = _preds(1e4, 1e-3, 300.0)
    point, s = -0.004, 1.0
    _, _, _, planned = _option(preds, s, point)
    fc, fb = preds[("candidate", COL)].to_numpy(), preds[("baseline", COL)].to_numpy()
    terms = [(float(np.var(fc - fb, ddof=1)) / N_FLEET, N_FLEET - 1.0), (s * s / 5, 4.0), (s * s / 5, 4.0)]
    half = t_quantile(0.90, welch_df(terms)) * math.sqrt(sum(v for v, _ in terms)) / abs(float(np.mean(fb)))
    assert planned[0].expected == pytest.approx([point - half, point + half], rel=1e-3)
    assert plan_mod.expected_interval(point, float(np.mean(fb)), terms, 0.0, 0.90) == pytest.approx(
        (point - half, point + half), rel=1e-12)
    shared, own, day = plan_mod.baseline_var_terms(preds, {(COL, H): s}, COL, N, H, 0.5, None)
    assert (shared, own, day) == pytest.approx((float(np.var(fb, ddof=1)) / N_FLEET, s * s / 5, 0.0))


# ----------------------------------------------------------------------------------- (d) the days
BASE = 10.0
FLEET = (0.01, 99.0)
OWN = [(0.2, 9.0), (0.2, 9.0)]
DAY = (0.5, 0.5, 5.0)
#: the baseline level's one-day terms (shared, own, day), KPI units²: its 90 % interval reaches 0 on
#: one day (sd 6.4 over a level of 10), not after a few
BASE_VAR = (1.0, 30.0, 10.0)


def _rounds(point_worsening: float, k: int, base_var: tuple[float, float, float], sign: float = 1.0) -> list[
        dict[str, dict[str, float]]]:
    """``k`` canary days (one round each) whose terms are the plan's one-day terms (the change's
    ``FLEET``, ``OWN``, ``DAY``; the baseline level's ``base_var``) and whose estimates spread so
    that the rounds' between-day variance is the revealed part (tests/test_plan14_days.py's
    construction, with the baseline's variance the verdict pools beside it)."""
    first, revealed, first_df = DAY
    own = sum(v for v, _ in OWN)
    one = pooled_terms(1, FLEET, OWN, DAY)
    z = np.zeros(1) if k == 1 else (lambda a: (a - a.mean()) / a.std(ddof=1))(np.linspace(-1.0, 1.0, k))
    diffs = sign * point_worsening * BASE + math.sqrt(own + revealed) * z
    b_shared, _b_own, b_day = base_var
    return [{COL: {
        "diff": float(d), "diff_se": math.sqrt(FLEET[0] + own + first), "df": welch_df(one),
        "diff_var_shared": FLEET[0], "diff_var_day": first, "diff_var_day_revealed": revealed, "day_df": first_df,
        "base": BASE, "base_se": math.sqrt(sum(base_var)), "base_var_shared": b_shared, "base_var_day": b_day,
        "twin_diff": float(d), "n_fleet": 100.0, "n_candidate": 5.0, "n_control": 5.0, "day": float(i),
        "exposure": 1.0,
    }} for i, d in enumerate(diffs)]  # fmt: skip


def _verdict(point: float, k: int, max_days: int, base_var: tuple[float, float, float]) -> str:
    plan = SimpleNamespace(margins=(KPIMargin(COL, 0.05, 0.0, False),), kpis=[])
    verdict, *_ = _pooled_verdict(_rounds(point, k, base_var), len(look_days(max_days)), plan,
                                  {COL: (DAY[0], BASE_VAR[2], DAY[2])})  # fmt: skip
    return str(verdict)


def _count(point: float, max_days: int, base_var: tuple[float, float, float] | None) -> int | None:
    level, looks = look_level(0.90, len(look_days(max_days))), look_days(max_days)
    if base_var is None:  # the count before: the baseline taken as known
        return pooled_days_to_decide(point, 0.05, BASE, FLEET, OWN, DAY, level, looks)
    return pooled_days_to_decide(point, 0.05, BASE, FLEET, OWN, DAY, level, looks, base_var=base_var)


@pytest.mark.parametrize("point, want", [(-0.15, "promote"), (0.15, "refuse"), (-0.05, "promote")])
@pytest.mark.parametrize("max_days", [1, 8])
def test_the_day_count_is_when_the_pooled_verdict_decides_with_the_baselines_error(point: float, want: str,
                                                                                   max_days: int) -> None:
    """(d) On rounds that carry the baseline level's error as the verdict pools it (the fleet term
    shared, the control arm's and the day's shrinking with the days), the plan's count is the first
    look (or day past the looks) at which the loop's pooled verdict decides, and no earlier one;
    the count that took the baseline as known is too early for the same verdict."""
    n, old = _count(point, max_days, BASE_VAR), _count(point, max_days, None)
    assert n is not None and old is not None and n > old
    assert _verdict(point, n, max_days, BASE_VAR) == want
    looks = look_days(max_days)
    earlier = [k for k in looks if k < n] + [k for k in range(max(looks) + 1, n)]
    for k in earlier:
        assert _verdict(point, k, max_days, BASE_VAR) == "abstain", k
    assert _verdict(point, old, max_days, BASE_VAR) == "abstain"  # the old count promised a verdict too soon


def test_the_day_count_with_a_known_baseline_is_the_count_before() -> None:
    """(c, for the days) A baseline with no error counts the days the plan counted before."""
    for point, max_days in ((-0.15, 1), (0.15, 8), (-0.05, 8)):
        assert _count(point, max_days, (0.0, 0.0, 0.0)) == _count(point, max_days, None)


def test_the_docs_say_how_the_plan_builds_its_expected_interval() -> None:
    """docs/canary.md's sentences on the plan's expected interval and day count name what the
    planner calls, and those calls are there: the interval is `finish_estimate`'s, the rule
    `check_verdict`'s, the baseline's terms `baseline_var_terms`' (their values: test (c) above),
    and the days pool the baseline's error with its fleet term fixed and the rest as ``1/days``."""
    import inspect
    from pathlib import Path

    from edgetwin.loop import plan_expected

    text = " ".join((Path(__file__).resolve().parents[1] / "docs" / "canary.md").read_text().split())
    for claim in ("That interval is the verdict's own construction (`expected_interval` calls `finish_estimate`) on "
                  "the twin's point estimate, the change's expected variance and the baseline level's "
                  "(`baseline_var_terms`: the fleet's term of the twin's baseline predictions, the control arm's "
                  "rectifier and the level's day-to-day term), so it is unbounded (printed `±inf%`, \"unbounded\") "
                  "where the baseline's expected interval reaches 0, and a KPI so planned is expected to decide only "
                  "by its bounded side, by the verdict's rule (`interval_decides` calls `check_verdict`).",
                  "the baseline level's error shrinking as the verdict pools it (`pooled_base_var`: its fleet term "
                  "held fixed, its control arm's and day terms as 1/days)"):  # fmt: skip
        assert claim in text, claim
    assert "finish_estimate(" in inspect.getsource(plan_expected.expected_interval)
    assert "check_verdict(" in inspect.getsource(plan_expected.interval_decides)
    opt = inspect.getsource(plan_mod._expected_option)
    for call in ("baseline_var_terms(", "verdict_interval(", "interval_decides(", "pooled_days_to_decide("):
        assert call in opt, call
    assert "expected_interval(" in inspect.getsource(plan_expected.verdict_interval)  # interf16: via the hull
    assert "verdict_interval(" in inspect.getsource(plan_expected.pooled_days_to_decide)  # interf16: via the hull
    assert "pooled_base_var(" in inspect.getsource(plan_expected.verdict_interval)
    for k in (1, 3, 40):
        assert plan_expected.pooled_base_var(k, (0.5, 6.0, 2.0)) == pytest.approx(0.5 + 8.0 / k)
