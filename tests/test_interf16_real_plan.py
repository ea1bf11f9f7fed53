"""Issue 48 (interf16): a real `plan_canary` on the canary world's twin (tests/conftest.py's
`canary_world_gate`: a 2-member twin, an always-edge candidate the gate cannot judge) records an
expected interval that carries the twin's interference term, read as the verdict reads it.

- the plan's per-group predictions, now built member by member, are `twin_group_predictions`'
  numbers exactly (the replays were reorganised, not changed);
- each KPI's expected interval is `verdict_interval` on the terms the planner read and the
  interference term it read for the chosen slice, and that term is the verdict's
  (`interference_var` and `member_interference` on each member's replay of the canary assignment,
  over the canary's window, as `edgetwin.loop.verdict.canary_verdict` replays it);
- with the term zeroed (monkeypatched), the same plan's expected intervals are narrower."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from edgetwin.loop.plan_expected import NO_INTERFERENCE, verdict_interval


def _inputs(g: dict[str, Any]) -> tuple[Any, ...]:
    from edgetwin.loop import plan as plan_mod
    from edgetwin.loop.verdict import DayVariance

    log, decision, kdefs, budget = g["log"], g["decision"], g["kdefs"], g["budget"]
    checks = plan_mod._deciding_checks(decision, kdefs, budget)[0]
    columns = sorted({plan_mod._kpi_column(kdefs[k]) or k for k in checks} & set(log.columns))
    dv = DayVariance()
    for col in columns:
        level = abs(float(log[col].mean())) or 1.0
        dv[col] = ((0.05 * level) ** 2, (0.02 * level) ** 2, 5.0)
        dv.revealed[col] = (0.05 * level) ** 2
    return columns, dv


@pytest.fixture(scope="module")
def planned(canary_world_gate: dict[str, Any]) -> dict[str, Any]:
    from edgetwin.loop import plan as plan_mod
    from edgetwin.loop.plan_interference import PlannedInterference

    g = canary_world_gate
    columns, dv = _inputs(g)
    seen: dict[tuple[str, int, float, str], Any] = {}
    seen_base: dict[tuple[str, int, float], Any] = {}
    seen_itf: dict[tuple[str, int, float], Any] = {}
    objs: list[PlannedInterference] = []
    real, real_base, real_term = plan_mod.kpi_terms, plan_mod.baseline_var_terms, PlannedInterference.term

    def spy(preds, spread, col, n, h, design, treat_share, day_var):  # type: ignore[no-untyped-def]
        seen[(col, n, h, design)] = got = real(preds, spread, col, n, h, design, treat_share, day_var)
        return got

    def spy_base(preds, spread, col, n, h, treat_share, day_var):  # type: ignore[no-untyped-def]
        seen_base[(col, n, h)] = got = real_base(preds, spread, col, n, h, treat_share, day_var)
        return got

    def spy_term(self, column, n, hours):  # type: ignore[no-untyped-def]
        seen_itf[(column, n, hours)] = got = real_term(self, column, n, hours)
        if not objs:
            objs.append(self)
        return got

    plan_mod.kpi_terms, plan_mod.baseline_var_terms = spy, spy_base  # type: ignore[assignment]
    PlannedInterference.term = spy_term  # type: ignore[method-assign]
    try:
        plan = plan_mod.plan_canary(g["decision"], g["twin"], g["log"], g["cand"], g["base"], g["budget"], seed=0,
                                    design="random", day_var=dv, max_days=4)  # fmt: skip
    finally:
        plan_mod.kpi_terms, plan_mod.baseline_var_terms = real, real_base  # type: ignore[assignment]
        PlannedInterference.term = real_term  # type: ignore[method-assign]
    return {"plan": plan, "terms": seen, "base_terms": seen_base, "itf": seen_itf, "obj": objs[0], "dv": dv,
            "columns": columns}


def test_member_by_member_predictions_are_twin_group_predictions(canary_world_gate: dict[str, Any]) -> None:
    """`member_replays`' mean is the all-member `twin_group_predictions` the plan read before,
    number for number, and each member's series is that member's own replay."""
    from edgetwin.loop.plan_interference import member_replays
    from edgetwin.loop.ppi import twin_group_predictions

    g = canary_world_gate
    columns, _ = _inputs(g)
    pols = {"candidate": g["cand"], "baseline": g["base"]}
    want = twin_group_predictions(g["twin"], pols, g["log"], columns, episodes=1, seed=0, members=None)
    got, per_member = member_replays(g["twin"], g["cand"], g["base"], g["log"], columns, seed=0, members=None)
    assert list(got.columns) == list(want.columns) and list(got.index) == list(want.index)
    assert np.array_equal(got.to_numpy(), want.to_numpy())
    assert len(per_member) == g["twin"].n_members == 2
    one = twin_group_predictions(g["twin"], pols, g["log"], columns, episodes=1, seed=0, members=[1])
    assert np.array_equal(per_member[1][("candidate", columns[0])].mean(axis=1).to_numpy(),
                          one[("candidate", columns[0])].to_numpy())  # fmt: skip


def test_a_real_plans_expected_interval_carries_the_interference_term(planned: dict[str, Any]) -> None:
    """Each KPI: the recorded expected interval is `verdict_interval` on the terms the planner read
    with the interference term of the chosen slice; the term is not zero on this twin (its two
    members disagree). (Not "at least as wide as without it" KPI by KPI: a term far smaller than the
    rest raises the Welch-Satterthwaite degrees of freedom, so its t quantile, and the interval,
    can shrink a hair, in the verdict's interval as in the plan's.)"""
    plan = planned["plan"]
    assert plan.kpis
    nonzero = 0
    for k in plan.kpis:
        base, fleet, own, day = planned["terms"][(k.column, plan.n_groups, plan.hours, "random")]
        base_var = planned["base_terms"][(k.column, plan.n_groups, plan.hours)]
        itf = planned["itf"][(k.column, plan.n_groups, plan.hours)]
        assert itf.df == 1.0  # members − 1
        want = verdict_interval(1, k.point, base, fleet, own, day, base_var, 0.90, itf)
        assert k.expected == pytest.approx(list(want), rel=1e-9), k.kpi
        assert k.interference_sd == pytest.approx(np.sqrt(itf.var) / base, rel=1e-12)
        nonzero += itf.var > 0
    assert nonzero >= 1


def test_the_term_is_the_verdicts_on_a_replay_of_the_canary(planned: dict[str, Any], canary_world_gate: dict[str, Any]) -> None:
    """The chosen slice's term, recomputed as `canary_verdict` computes it: each member's
    `twin_group_predictions` of the full switch and of the canary assignment (`CanaryAssignment`,
    the replayed candidate arm) over the canary's window, then `interference_var` on each drawn
    pair of arms of the slice's size (`PlannedInterference.draws`), averaged."""
    from edgetwin.loop.ppi import (
        CanaryAssignment,
        interference_var,
        member_interference,
        twin_group_predictions,
    )

    g, plan, obj = canary_world_gate, planned["plan"], planned["obj"]
    treated = obj.arms[0]
    pols = {"candidate": g["cand"], "baseline": g["base"], "canary": CanaryAssignment(g["cand"], g["base"],
                                                                                       frozenset(treated))}
    ticks = int(round(plan.hours * 4))
    per_member = [twin_group_predictions(g["twin"], pols, g["log"], planned["columns"], episodes=1, seed=0,
                                         window=(4, 4 + ticks), members=[m]) for m in range(g["twin"].n_members)]
    draws = obj.draws(plan.n_groups)
    n_c = max(2, int(round(0.5 * plan.n_groups)))
    assert len(draws) == 8 and all(len(c) == n_c and len(b) == plan.n_groups - n_c for c, b in draws)
    assert all(set(c) <= set(treated) and not set(b) & set(treated) for c, b in draws)
    for k in plan.kpis:
        itf = planned["itf"][(k.column, plan.n_groups, plan.hours)]
        v, shift = [], []
        for c, b in draws:
            args = (per_member, np.array([True] * len(c) + [False] * len(b)), [*c, *b], k.column, "candidate",
                    "baseline", "canary")  # fmt: skip
            v.append(interference_var(*args))
            shift.append(float(np.mean(member_interference(*args)[0])))
        assert itf.var == pytest.approx(float(np.mean([x[0] for x in v])), rel=1e-9, abs=1e-300)
        assert itf.base_var == pytest.approx(float(np.mean([x[1] for x in v])), rel=1e-9, abs=1e-300)
        assert itf.shift == pytest.approx(float(np.mean(shift)), rel=1e-9, abs=1e-12)


def test_zeroing_the_term_narrows_the_plans_expected_intervals(planned: dict[str, Any],
                                                               canary_world_gate: dict[str, Any],
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """The same plan with the interference term zeroed (every option's `PlannedInterference.term`
    `NO_INTERFERENCE`): the same slice's expected intervals are narrower, some by more than 1 %:
    the term is in the recorded interval."""
    from edgetwin.loop import plan as plan_mod
    from edgetwin.loop.plan_interference import PlannedInterference

    g = canary_world_gate
    monkeypatch.setattr(PlannedInterference, "term", lambda self, column, n, hours: NO_INTERFERENCE)
    bare = plan_mod.plan_canary(g["decision"], g["twin"], g["log"], g["cand"], g["base"], g["budget"], seed=0,
                                design="random", day_var=planned["dv"], max_days=4)  # fmt: skip
    plan = planned["plan"]
    if (bare.n_groups, bare.hours) != (plan.n_groups, plan.hours):  # the term moved the choice: recompute that slice's
        pytest.fail(f"the term changed the slice: {bare.n_groups}x{bare.hours} vs {plan.n_groups}x{plan.hours}")
    wider = 0
    for k, b in zip(plan.kpis, bare.kpis, strict=True):
        assert b.interference_sd == 0.0 and b.interference_shift == 0.0
        wider += (k.expected[1] - k.expected[0]) > (b.expected[1] - b.expected[0]) * 1.01
    assert wider >= 1
    finite = [(k, b) for k, b in zip(plan.kpis, bare.kpis, strict=True) if np.isfinite(k.expected).all()]
    assert sum(k.expected[1] - k.expected[0] for k, _ in finite) > sum(b.expected[1] - b.expected[0] for _, b in finite)
