"""Issue 48, item 3 (planbase15), (e): a real plan's expected interval is the verdict's construction.

`plan_canary` on tests/conftest.py's small emulated twin (`canary_world_dir`, fitted once per run;
an always-edge candidate the gate cannot judge), with a day-to-day variance whose baseline-level
term is large for one deciding KPI (its sd 5 times the log's level of it: the verdict's baseline
interval then reaches 0 at 90 %). Each KPI's expected interval is `finish_estimate` on the twin's point, the
expected change terms and the baseline level's terms the verdict carries (its fleet term from the
twin's baseline predictions, the control arm's rectifier, its day term); the wide-baseline KPI's is
unbounded, is not expected to decide, and the printed plan and its JSON say so."""

from __future__ import annotations

import json
import math
from typing import Any

import numpy as np
import pytest

from edgetwin.loop.plan import CanaryPlan
from edgetwin.loop.ppi import finish_estimate, welch_df


@pytest.fixture(scope="module")
def planned(canary_world_gate: dict[str, Any]) -> dict[str, Any]:
    from edgetwin.loop import plan as plan_mod
    from edgetwin.loop.verdict import DayVariance

    g = canary_world_gate
    twin, log, cand, base, decision = g["twin"], g["log"], g["cand"], g["base"], g["decision"]
    budget, kdefs = g["budget"], g["kdefs"]
    checks = plan_mod._deciding_checks(decision, kdefs, budget)[0]
    columns = sorted({plan_mod._kpi_column(kdefs[k]) or k for k in checks} & set(log.columns))
    wide = columns[0]
    dv = DayVariance()
    for col in columns:
        level = abs(float(log[col].mean())) or 1.0
        dv[col] = ((0.05 * level) ** 2, ((5.0 if col == wide else 0.02) * level) ** 2, 5.0)
        dv.revealed[col] = (0.05 * level) ** 2
    seen: dict[tuple[str, int, float, str], Any] = {}
    seen_base: dict[tuple[str, int, float], Any] = {}
    real, real_base = plan_mod.kpi_terms, plan_mod.baseline_var_terms

    def spy(preds, spread, col, n, h, design, treat_share, day_var):  # type: ignore[no-untyped-def]
        seen[(col, n, h, design)] = got = real(preds, spread, col, n, h, design, treat_share, day_var)
        return got

    def spy_base(preds, spread, col, n, h, treat_share, day_var):  # type: ignore[no-untyped-def]
        seen_base[(col, n, h)] = got = real_base(preds, spread, col, n, h, treat_share, day_var)
        seen_base[("fb", col)] = preds[("baseline", col)].to_numpy(dtype=np.float64)
        return got

    # the twin's interference term zeroed (interf16): this file checks the baseline level's terms;
    # tests/test_interf16_real_plan.py checks a real plan's interval with the term
    from edgetwin.loop.plan_expected import NO_INTERFERENCE
    from edgetwin.loop.plan_interference import PlannedInterference

    real_term = PlannedInterference.term
    plan_mod.kpi_terms, plan_mod.baseline_var_terms = spy, spy_base  # type: ignore[assignment]
    PlannedInterference.term = lambda self, column, n, hours: NO_INTERFERENCE  # type: ignore[method-assign]
    try:
        plan = plan_mod.plan_canary(decision, twin, log, cand, base, budget, seed=0, design="random", day_var=dv)
    finally:
        plan_mod.kpi_terms, plan_mod.baseline_var_terms = real, real_base  # type: ignore[assignment]
        PlannedInterference.term = real_term  # type: ignore[method-assign]
    return {"plan": plan, "terms": seen, "base_terms": seen_base, "dv": dv, "wide": wide}


def test_a_real_plans_expected_interval_is_finish_estimate_on_its_terms(planned: dict[str, Any]) -> None:
    """Each KPI: the expected interval is `finish_estimate(point·base, Σ v, base, shared + own + day)`
    on the terms the planner read, the baseline's fleet term is ``var_N(f_b)/N`` of the twin's
    baseline predictions and its day term the day-to-day map's baseline entry."""
    plan, dv = planned["plan"], planned["dv"]
    assert plan.slice.design == "random" and plan.kpis
    for k in plan.kpis:
        base, fleet, own, day = planned["terms"][(k.column, plan.n_groups, plan.hours, "random")]
        shared, b_own, b_day = planned["base_terms"][(k.column, plan.n_groups, plan.hours)]
        fb = planned["base_terms"][("fb", k.column)]
        assert shared == pytest.approx(float(np.var(fb, ddof=1)) / len(fb), rel=1e-12)
        assert b_day == pytest.approx(dv[k.column][1], rel=1e-12) and b_own > 0
        terms = [fleet, *own, (day[0], day[2])]
        got = finish_estimate(k.point * base, sum(v for v, _ in terms), base, shared + b_own + b_day, 0.90,
                              df=welch_df(terms))  # fmt: skip
        assert k.expected == pytest.approx([got["rel_lo"], got["rel_hi"]], rel=1e-9), k.kpi


def test_a_real_plans_wide_baseline_is_unbounded_and_not_expected_to_decide(planned: dict[str, Any]) -> None:
    """The KPI whose baseline level may be 0 at the verdict's level: its expected interval has an
    infinite end on the side the change may take, so the plan does not expect it to be ok (a
    regression could still decide by the bounded side, `check_verdict`), the plan as a whole is not
    expected to decide, its summed expected width is infinite, the text says "unbounded" and the
    JSON keeps the infinite end."""
    plan = planned["plan"]
    k = next(k for k in plan.kpis if k.column == planned["wide"])
    assert k.unbounded and any(math.isinf(v) for v in k.expected)
    sign = -1.0 if k.better == "higher" else 1.0
    w = sorted((sign * k.expected[0], sign * k.expected[1]))
    assert k.decides == (w[0] > k.margin + 1e-12)  # only a bounded lower end beyond the margin decides
    assert not plan.decides and math.isinf(plan.expected_width["random"])
    assert f"{k.kpi}: now" in plan.describe() and "(unbounded: the baseline level's expected interval reaches 0)" in (
        next(line for line in plan.describe().splitlines() if line.strip().startswith(f"{k.kpi}:")))
    again = CanaryPlan.from_dict(json.loads(plan.to_json()))
    assert next(x for x in again.kpis if x.column == k.column).expected == k.expected
