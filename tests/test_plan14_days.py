"""Issue 48 (plan14): the plan's day count follows the verdict's own pooling rule.

A canary verdict pooled over ``k`` days carries `edgetwin.loop.day_bound.pooled_day_term` (the
first look's bound counted as one pseudo-day, blended with the rounds' between-day variance on
``k − 1`` degrees of freedom), not the one-day term shrunk as ``1/k``. The plan's ``days``
(`edgetwin.loop.plan.pooled_days_to_decide`) must be the days at which that verdict decides when
the plan's expected terms come true: checked here against the loop's own pooled verdict
(`edgetwin.loop.day_verdict._pooled_verdict`) on synthetic rounds whose terms are the plan's and
whose between-day variance (Paule-Mandel's, from the rounds themselves) is the revealed part the
plan assumes."""

from __future__ import annotations

import math
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from edgetwin.contract.margins import KPIMargin
from edgetwin.loop.day_verdict import _pooled_verdict
from edgetwin.loop.plan import days_to_decide, pooled_days_to_decide, pooled_terms
from edgetwin.loop.ppi import finish_estimate, look_days, look_level, t_quantile, welch_df

KPI = "kpi.x"
BASE = 10.0
FLEET = (0.01, 99.0)
OWN = [(0.2, 9.0), (0.2, 9.0)]


Terms = tuple[float, tuple[float, float], list[tuple[float, float]], tuple[float, float, float]]


def _rounds(point_worsening: float, terms: Terms, k: int, kpi: str = KPI, sign: float = 1.0,
            base_var: tuple[float, float, float] = (0.0, 0.0, 0.0)) -> list[dict[str, dict[str, float]]]:
    """``k`` canary days (one round each) whose terms are the plan's one-day terms ``(base, fleet,
    own, day)`` and whose estimates spread around the twin's point so that the rounds' between-day
    variance is exactly the revealed part: with equal own variances ``v``, Paule-Mandel's ``tau²``
    is the estimates' sample variance less ``v``. ``sign``: −1 for a KPI where higher is better
    (its worsening is the negative change). ``base_var``: the baseline level's one-day terms
    ``(shared, own, day)`` (`edgetwin.loop.plan.baseline_var_terms`), carried as the verdict pools them."""
    base, fleet, own_terms, day = terms
    first, revealed, first_df = day
    own = sum(v for v, _ in own_terms)
    one = pooled_terms(1, fleet, own_terms, day)
    z = np.zeros(1) if k == 1 else (lambda a: (a - a.mean()) / a.std(ddof=1))(np.linspace(-1.0, 1.0, k))
    diffs = sign * point_worsening * base + math.sqrt(own + revealed) * z
    return [{kpi: {
        "diff": float(d), "diff_se": math.sqrt(fleet[0] + own + first), "df": welch_df(one),
        "diff_var_shared": fleet[0], "diff_var_day": first, "diff_var_day_revealed": revealed, "day_df": first_df,
        "base": base, "base_se": math.sqrt(sum(base_var)), "base_var_shared": base_var[0], "base_var_day": base_var[2],
        "twin_diff": float(d),
        "n_fleet": 100.0, "n_candidate": 5.0, "n_control": 5.0, "day": float(i), "exposure": 1.0,
    }} for i, d in enumerate(diffs)]  # fmt: skip


def _verdict(point_worsening: float, day: tuple[float, float, float], k: int, max_days: int,
             terms: Terms | None = None, margin: KPIMargin | None = None,
             base_var: tuple[float, float, float] = (0.0, 0.0, 0.0)) -> str:
    """The loop's pooled verdict after ``k`` such days, at the level of the extension's looks."""
    margin = margin or KPIMargin(KPI, 0.05, 0.0, False)
    plan = SimpleNamespace(margins=(margin,), kpis=[])
    rounds = _rounds(point_worsening, terms or (BASE, FLEET, OWN, day), k, margin.kpi, -1.0 if margin.higher_is_better else 1.0,
                     base_var)
    verdict, *_ = _pooled_verdict(rounds,
                                  len(look_days(max_days)), plan, {margin.kpi: (day[0], 0.0, day[2])})  # fmt: skip
    return str(verdict)


def _planned(point_worsening: float, day: tuple[float, float, float], max_days: int) -> int | None:
    return pooled_days_to_decide(point_worsening, 0.05, BASE, FLEET, OWN, day,
                                 look_level(0.90, len(look_days(max_days))), look_days(max_days))  # fmt: skip


def _old_count(point_worsening: float, day: tuple[float, float, float], max_days: int) -> int | None:
    """What the plan said before: every term but the fleet's shrinking as ``1/days``, at one day's
    degrees of freedom."""
    one = pooled_terms(1, FLEET, OWN, day)
    q = t_quantile(look_level(0.90, len(look_days(max_days))), welch_df(one))
    se = math.sqrt(sum(v for v, _ in one)) / BASE
    return days_to_decide(point_worsening, q * se, 0.05, q * math.sqrt(FLEET[0]) / BASE)


@pytest.mark.parametrize("point, want", [(-0.15, "promote"), (0.30, "refuse")])
@pytest.mark.parametrize("max_days", [1, 8])
def test_a_bound_dominated_kpi_asks_for_the_days_the_pooled_verdict_needs(point: float, want: str, max_days: int) -> None:
    """The day term is mostly the first look's bound (4.0 against 0.2 revealed, KPI units²): the
    plan's count is the first look (or, beyond the extension's looks, the first day) at which the
    loop's pooled verdict decides when the expected terms come true, and not one before."""
    day = (4.0, 0.2, 5.0)
    n = _planned(point, day, max_days)
    assert n is not None and n > 1
    assert _verdict(point, day, n, max_days) == want
    looks = look_days(max_days)
    earlier = [k for k in looks if k < n] if n <= max(looks) else [k for k in range(1, n) if k in looks or k > max(looks)]
    for k in earlier:
        assert _verdict(point, day, k, max_days) == "abstain", k
    if n <= max(looks):  # decided at a look: the looks' days are the only days the verdict is given
        assert n in looks


def test_the_old_count_was_not_the_verdicts() -> None:
    """Shrinking the bound as ``1/days`` (the count before) miscounts a bound-dominated KPI: at the
    old count the loop's verdict has already decided a day earlier, or has not decided yet."""
    day, point = (4.0, 0.2, 5.0), -0.15
    old, new = _old_count(point, day, 1), _planned(point, day, 1)
    assert old is not None and new is not None and old != new
    decided_at_old = _verdict(point, day, old, 1) != "abstain"
    decided_before = _verdict(point, day, old - 1, 1) != "abstain"
    assert not decided_at_old or decided_before


def test_without_a_bound_and_with_known_terms_it_is_the_closed_form() -> None:
    """No bound (the day term all revealed) and every term known exactly (the normal reference):
    every term but the fleet's shrinks as ``1/days``, which `days_to_decide` counts in closed form."""
    inf = float("inf")
    fleet, own, z = (0.04, inf), [(0.3, inf), (0.5, inf)], t_quantile(0.90, inf)
    for first, point in ((0.0, -0.05), (2.0, -0.05), (2.0, 0.40), (6.0, -0.2)):
        day = (first, first, inf)
        half = z * math.sqrt(fleet[0] + sum(v for v, _ in own) + first) / BASE
        want = days_to_decide(point, half, 0.05, z * math.sqrt(fleet[0]) / BASE)
        assert pooled_days_to_decide(point, 0.05, BASE, fleet, own, day, 0.90, (1,)) == want, (first, point)


def test_none_when_no_number_of_days_decides() -> None:
    """A point on its margin, or a fleet term (which days do not shrink) that reaches it: None."""
    day = (4.0, 0.2, 5.0)
    assert pooled_days_to_decide(0.05, 0.05, BASE, FLEET, OWN, day, 0.9) is None
    assert pooled_days_to_decide(0.04, 0.05, BASE, (0.25, 99.0), OWN, day, 0.9) is None  # 1.645·0.05 > 0.01


def test_pooled_terms_reuse_the_verdicts_day_term() -> None:
    """One concept in one place: the plan's k-day day term is `pooled_day_term`'s (the bound as one
    pseudo-day, the revealed part as the rounds' between-day variance), divided by k."""
    from edgetwin.loop.day_bound import pooled_day_term

    day = (4.0, 0.2, 5.0)
    for k in (2, 3, 8):
        v, df = pooled_day_term(4.0, 0.2, 0.2, k, 5.0)
        assert pooled_terms(k, FLEET, OWN, day)[-1] == (pytest.approx(v / k), pytest.approx(df))
    assert pooled_terms(1, FLEET, OWN, day) == [FLEET, *OWN, (4.0, 5.0)]


def test_the_docs_say_how_the_plan_counts_its_days() -> None:
    """docs/canary.md's sentence on the plan's days names the function the planner calls, and that
    function's day term is the verdict's (`pooled_day_term`, with the revealed part as the days'
    between-day variance: checked above) and the fleet's term held fixed."""
    import inspect

    from edgetwin.loop import plan as plan_mod

    text = " ".join((Path(__file__).resolve().parents[1] / "docs" / "canary.md").read_text().split())
    for claim in ("its expected interval carries the day term the first look carries, the bound included",
                  "at which the interval the verdict pools is expected to clear the margin at the looks' level "
                  "(`pooled_days_to_decide`)", "the day term `pooled_day_term`'s with the days' own between-day "
                  "variance taken to be the part the twin reveals"):  # fmt: skip
        assert claim in text, claim
    assert "pooled_days_to_decide(" in inspect.getsource(plan_mod._expected_option)
    assert "pooled_day_term(" in inspect.getsource(plan_mod.pooled_terms)
    fixed = pooled_terms(50, FLEET, OWN, (4.0, 0.2, 5.0))[1]
    assert fixed[0] == FLEET[0]  # the fleet's term: not shrunk by 50 days
    assert pooled_terms(50, FLEET, OWN, (4.0, 0.2, 5.0))[0][0] == pytest.approx(0.4 / 50)  # the arms': 1/days


@pytest.fixture(scope="module")
def planned(canary_world_gate: dict[str, Any]) -> dict[str, Any]:
    """A real plan (a small emulated cluster's twin: tests/conftest.py's `canary_world_dir`, fitted once
    per run; an always-edge candidate the gate cannot judge) whose KPIs' day terms are dominated by
    the first look's bound, the terms the planner weighed recorded per (column, groups, hours, design)."""
    from edgetwin.loop import plan as plan_mod
    from edgetwin.loop.verdict import DayVariance

    g = canary_world_gate
    twin, log, cand, base, decision = g["twin"], g["log"], g["cand"], g["base"], g["decision"]
    budget, kdefs = g["budget"], g["kdefs"]
    columns = {plan_mod._kpi_column(kdefs[c.kpi]) for c in decision.checks if c.kpi in kdefs}
    dv = DayVariance()
    for col in sorted(c for c in columns if c and c in log.columns):  # the bound 10x the revealed part in sd
        level = abs(float(log[col].mean())) or 1.0
        dv[col] = ((0.2 * level) ** 2, (0.05 * level) ** 2, 5.0)
        dv.revealed[col] = (0.02 * level) ** 2
    seen: dict[tuple[str, int, float, str], Terms] = {}
    seen_base: dict[tuple[str, int, float], tuple[float, float, float]] = {}
    real, real_base = plan_mod.kpi_terms, plan_mod.baseline_var_terms

    def spy(preds, spread, col, n, h, design, treat_share, day_var):  # type: ignore[no-untyped-def]
        got = real(preds, spread, col, n, h, design, treat_share, day_var)
        seen[(col, n, h, design)] = got
        return got

    def spy_base(preds, spread, col, n, h, treat_share, day_var):  # type: ignore[no-untyped-def]
        got = real_base(preds, spread, col, n, h, treat_share, day_var)
        seen_base[(col, n, h)] = got
        return got

    # the twin's interference term zeroed (interf16): this file's rounds carry the day term only;
    # tests/test_interf16_real_plan.py checks a real plan's interval with the term
    from edgetwin.loop.plan_expected import NO_INTERFERENCE
    from edgetwin.loop.plan_interference import PlannedInterference

    real_term = PlannedInterference.term
    plan_mod.kpi_terms, plan_mod.baseline_var_terms = spy, spy_base  # type: ignore[assignment]
    PlannedInterference.term = lambda self, column, n, hours: NO_INTERFERENCE  # type: ignore[method-assign]
    try:
        plan = plan_mod.plan_canary(decision, twin, log, cand, base, budget, seed=0, design="random", day_var=dv,
                                    max_days=MAX_DAYS)  # fmt: skip
    finally:
        plan_mod.kpi_terms, plan_mod.baseline_var_terms = real, real_base  # type: ignore[assignment]
        PlannedInterference.term = real_term  # type: ignore[method-assign]
    return {"plan": plan, "terms": seen, "base_terms": seen_base, "dv": dv}


MAX_DAYS = 8


def test_a_real_plans_days_are_when_the_pooled_verdict_decides(planned: dict[str, Any]) -> None:
    """Each KPI of a real plan whose day term the bound dominates: its one-day expected interval
    carries the bound (the term the verdict's first look carries), and "about N days" is when the
    loop's pooled verdict decides it if the plan's expected terms come true — not at an earlier look."""
    plan, dv = planned["plan"], planned["dv"]
    checked = 0
    for k in plan.kpis:
        terms = planned["terms"][(k.column, plan.n_groups, plan.hours, plan.slice.design)]
        base, fleet, own, day = terms
        assert day == (dv[k.column][0], dv.revealed[k.column], dv[k.column][2])  # the bound, its revealed part
        one = pooled_terms(1, fleet, own, day)
        # the verdict's interval division (issue 48, planbase15): the baseline level's variance divides too
        base_var = planned["base_terms"][(k.column, plan.n_groups, plan.hours)]
        want = finish_estimate(k.point * base, sum(v for v, _ in one), base, sum(base_var), 0.90, df=welch_df(one))
        assert k.expected == pytest.approx([want["rel_lo"], want["rel_hi"]], rel=1e-9)
        if k.days is None or k.days == 1:
            continue
        checked += 1
        point = k.point * (-1.0 if k.better == "higher" else 1.0)
        margin = next(m for m in plan.margins if m.kpi == k.column)
        assert _verdict(point, day, k.days, MAX_DAYS, terms, margin, base_var) != "abstain", k.kpi
        looks = look_days(MAX_DAYS)
        before = [d for d in looks if d < k.days] + [d for d in range(max(looks) + 1, k.days)]
        for d in before:
            assert _verdict(point, day, d, MAX_DAYS, terms, margin, base_var) == "abstain", (k.kpi, d)
    assert checked >= 1  # some KPI needs more than a day: the rule was exercised


def test_the_search_finds_the_first_day_a_scan_finds() -> None:
    """`pooled_days_to_decide` bisects on the normal reference's count (a lower bound) before it
    scans: on random terms it returns what a plain scan of every day (the looks first) returns."""
    rng = np.random.default_rng(14)
    cap, found = 120, 0
    for _ in range(60):
        fleet = (float(rng.uniform(0, 0.05)), float(rng.integers(5, 200)))
        own = [(float(rng.uniform(0.01, 1.0)), float(rng.integers(1, 12))) for _ in range(2)]
        first = float(rng.uniform(0, 5))
        day = (first, first * float(rng.uniform(0, 1)), float(rng.integers(1, 8)))
        point, max_days = float(rng.uniform(-0.4, 0.4)), int(rng.choice([1, 4, 8]))
        level, looks = look_level(0.90, len(look_days(max_days))), look_days(max_days)

        def clears(k: int, point: float = point, fleet: tuple[float, float] = fleet,
                   own: list[tuple[float, float]] = own, day: tuple[float, float, float] = day,
                   level: float = level) -> bool:  # fmt: skip
            terms = pooled_terms(k, fleet, own, day)
            h = t_quantile(level, welch_df(terms)) * math.sqrt(sum(v for v, _ in terms)) / BASE
            return point + h <= 0.05 or point - h > 0.05

        want = next((k for k in looks if clears(k)), None)
        if want is None:
            want = next((k for k in range(max(looks) + 1, cap + 1) if clears(k)), None)
        got = pooled_days_to_decide(point, 0.05, BASE, fleet, own, day, level, looks, cap=cap)
        assert got == want, (fleet, own, day, point, max_days)
        found += got is not None and got > max(looks)
    assert found >= 5  # the search past the looks was exercised
