"""Issue 48 (item 5): a canary the guard stopped refuses on the guard's KPI, and answers every other
declared KPI on the completed canary days before the stopped one only (none: open, saying why) —
the hours before a stop are not the day the verdict is about; a loss-budget stop likewise; and the
pooled interval says what it is made of (`width_terms`)."""

from __future__ import annotations

import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from edgetwin.contract.margins import KPIMargin
from edgetwin.loop.day_verdict import Stop, _guard_verdict
from edgetwin.loop.ppi import ppi_mean_difference, width_terms

ROOT = Path(__file__).resolve().parents[1]


def _est(shift: float, seed: int, day: float = 0.0, day_var: float = 0.0, transport: float = 0.0) -> dict[str, float]:
    """One KPI's estimate from a 400-group fleet and 20 groups per arm whose measurements sit
    ``shift`` (units of the level 10) above the twin's prediction on the candidate arm."""
    rng = np.random.default_rng(seed)
    fleet = rng.normal(10.0, 1.0, 400)
    yc, yb = rng.normal(10.0 + shift, 0.5, 20), rng.normal(10.0, 0.5, 20)
    e = ppi_mean_difference(fleet, fleet, yc, np.full(20, 10.0), yb, np.full(20, 10.0),
                            transport_var=(transport, 0.0), transport_df=2.0, day_var=(day_var, 0.0), day_df=5.0)  # fmt: skip
    e.update(day=day, n_fleet=400.0, n_candidate=20.0, n_control=20.0)
    return e


def _plan(kpis: list[str]) -> Any:
    return SimpleNamespace(margins=[KPIMargin(k, 0.05, 0.0, False) for k in kpis], kpis=[])


def test_a_guard_stop_refuses_and_judges_every_other_kpi_once_on_the_completed_days() -> None:
    # "a": the guard's KPI (its PPI interval straddles: the guard's always-valid regress stands);
    # "b": clearly unchanged (ok); "c": clearly 20 % worse (regress); lower is better for all.
    # ``per_round``: the two completed days before the stopped one (never the stopped day's ticks)
    per_round = [{"a": _est(0.5, 1), "b": _est(0.0, 2), "c": _est(2.0, 3)},
                 {k: v | {"day": 1.0, "local:day": 1.0} for k, v in
                  {"a": _est(0.5, 11), "b": _est(0.0, 12), "c": _est(2.0, 13)}.items()}]  # fmt: skip
    verdict, ests, checks, reason, days = _guard_verdict(Stop("guard", 7, 40, ("a",)), per_round, 5,
                                                         _plan(["a", "b", "c"]), None)  # fmt: skip
    by = {c["kpi"]: c for c in checks}
    assert verdict == "refuse" and set(by) == {"a", "b", "c"} and days == 2
    assert by["a"]["verdict"] == "regress" and by["a"]["by"] == "guard"
    assert by["b"]["verdict"] == "ok" and by["c"]["verdict"] == "regress" and "by" not in by["c"]
    assert "guard stopped it: a regressed" in reason
    assert "judged on the 2 completed day(s) before the one the guard stopped after 7 tick(s)" in reason
    # each look at 98 % (90 % over 5 looks): wider than one look's 90 %
    assert by["b"]["terms"]["level"] == pytest.approx(0.98)


def test_a_guard_stop_on_the_first_day_refuses_on_the_guard_alone_and_says_why() -> None:
    verdict, ests, checks, reason, _ = _guard_verdict(Stop("guard", 9, 40, ("a",)), [], 3, _plan(["a"]), None)
    assert verdict == "refuse" and checks == [] and ests == [] and "a regressed beyond its margin" in reason
    assert "judged on no day: the guard stopped the first day after 9 tick(s)" in reason
    assert "the hours before a stop are not the day the verdict is about" in reason


# --- the loop itself (`canary_loop`) on scripted canaries: which days a stopped day's verdict rests on ---

#: per canary day, the estimates its canary gives: "a" straddles its 5 % margin (so the loop goes on),
#: "b" is unchanged on every whole day; on a stopped day's first hours "b" looks 30 % worse (the
#: bad stretch the stop fired on), which judged on them would be a certain regression
_WHOLE = {"a": 0.25, "b": 0.0}
_STOPPED = {"a": 0.25, "b": 3.0}


def _scripted_loop(monkeypatch: pytest.MonkeyPatch, stops: dict[int, str], max_days: int = 16) -> Any:
    """`canary_loop` with the planner, the edge and the estimator scripted (no twin, no emulator):
    canary day ``d`` (1, 2, …) ends with ``stops.get(d, "completed")``, a stopped day after 9 of
    its 40 ticks; each day's estimates are `_est` of `_WHOLE`, or of `_STOPPED` on a stopped day."""
    import pandas as pd

    import edgetwin.edge.canary as edge_canary
    import edgetwin.loop.fleet as fleet
    import edgetwin.loop.plan as plan_mod
    import edgetwin.loop.rounds as rounds
    from edgetwin.loop.rounds import canary_loop

    plan = SimpleNamespace(margins=[KPIMargin(k, 0.05, 0.0, False) for k in ("a", "b")], kpis=[],
                           describe=lambda: "plan", to_dict=lambda: {"n_groups": 40, "fleet_groups": 400, "hours": 10.0})  # fmt: skip
    cfg = SimpleNamespace(ticks=40, pre_ticks=4, alpha=0.05)
    day = {"n": 0}

    def canary(*a: Any, **k: Any) -> Any:
        day["n"] += 1
        stop = stops.get(day["n"], "completed")
        ticks = cfg.pre_ticks + (9 if stop != "completed" else cfg.ticks)
        return SimpleNamespace(log=pd.DataFrame({"policy": ["cand"] * 3, "t": [4, 5, 6], "agent": ["g1"] * 3}),
                               ticks=ticks, stop_reason=stop, fleet_log=None,
                               guard_stop=SimpleNamespace(kpi="a") if stop == "guard" else None)  # fmt: skip

    def estimates(twin: Any, day_log: Any, res: Any, *a: Any) -> dict[str, dict[str, float]]:
        shifts = _WHOLE if res.stop_reason == "completed" else _STOPPED
        d = float(day["n"] - 1)
        return {k: _est(v, 100 * day["n"] + i) | {"day": d, "local:day": d} for i, (k, v) in enumerate(shifts.items())}

    monkeypatch.setattr(fleet, "canary_on_cluster", canary)
    monkeypatch.setattr(plan_mod, "plan_canary", lambda *a, **k: plan)
    monkeypatch.setattr(plan_mod.CanaryPlan, "from_dict", staticmethod(lambda d: plan))
    monkeypatch.setattr(edge_canary.CanaryConfig, "from_plan", staticmethod(lambda *a, **k: cfg))
    monkeypatch.setattr(rounds, "decision_day_variance", lambda *a, **k: {})
    monkeypatch.setattr(rounds, "balanced", lambda p: p)
    monkeypatch.setattr(rounds, "redraw", lambda p, *a: p)
    monkeypatch.setattr(rounds, "_round_estimates", estimates)
    monkeypatch.setattr(rounds, "_realised_loss", lambda *a, **k: ({}, []))
    decision = SimpleNamespace(verdict="abstain", reason=lambda: "the twin cannot tell")
    return canary_loop(SimpleNamespace(spec=None), pd.DataFrame(), None, None, None,
                       candidate_spec=SimpleNamespace(name="cand"), baseline_spec=SimpleNamespace(name="current"),
                       decision=decision, days=lambda d: (pd.DataFrame(), d), max_days=max_days,
                       log=lambda s: None)  # fmt: skip


def _pooled_b(days: int) -> dict[str, float]:
    """"b" pooled over the first ``days`` whole days at one of 5 looks' level (16 days)."""
    from edgetwin.loop.ppi import LEVEL, combine_estimates, look_level

    return combine_estimates([_est(_WHOLE["b"], 100 * (d + 1) + 1) | {"day": float(d), "local:day": float(d)}
                              for d in range(days)], look_level(LEVEL, 5))  # fmt: skip


def test_a_guard_stop_on_day_one_leaves_the_other_kpis_open(monkeypatch: pytest.MonkeyPatch) -> None:
    res = _scripted_loop(monkeypatch, {1: "guard"})
    assert res.verdict == "refuse" and len(res.rounds) == 1
    last = res.rounds[-1]
    assert last.stop_reason == "guard" and last.checks == []  # "b" open: its 30 % on 9 ticks judges nothing
    assert set(last.estimates) == {"a", "b"}  # the stopped day's estimates kept for the record
    assert "judged on no day: the guard stopped the first day after 9 tick(s)" in res.reason


def test_a_guard_stop_on_day_three_judges_the_other_kpis_on_days_one_and_two(monkeypatch: pytest.MonkeyPatch) -> None:
    res = _scripted_loop(monkeypatch, {3: "guard"})
    assert res.verdict == "refuse" and [r.stop_reason for r in res.rounds] == ["completed", "completed", "guard"]
    by = {c["kpi"]: c for c in res.rounds[-1].checks}
    assert by["a"]["verdict"] == "regress" and by["a"]["by"] == "guard"
    want = _pooled_b(2)  # days 1-2 only; with the stopped day's estimate "b" would regress
    assert by["b"]["verdict"] != "regress" and "by" not in by["b"]
    assert by["b"]["change"] == pytest.approx(want["rel"], rel=1e-6, abs=1e-9)
    assert res.rounds[-1].estimates["b"]["rel"] > 0.2  # what the stopped day's hours said
    assert "judged on the 2 completed day(s) before the one the guard stopped after 9 tick(s)" in res.reason


def test_a_loss_budget_stop_judges_only_the_completed_days_too(monkeypatch: pytest.MonkeyPatch) -> None:
    first = _scripted_loop(monkeypatch, {1: "budget"})
    assert first.verdict == "abstain" and len(first.rounds) == 1 and first.rounds[0].checks == []
    assert "judged on no day: the canary's loss budget stopped the first day after 9 tick(s)" in first.reason
    assert "not extended past day 1" in first.reason
    later = _scripted_loop(monkeypatch, {2: "budget"})
    by = {c["kpi"]: c for c in later.rounds[-1].checks}
    assert len(later.rounds) == 2 and later.verdict != "refuse" and by["b"]["verdict"] != "regress"
    assert by["b"]["change"] == pytest.approx(_pooled_b(1)["rel"], rel=1e-6, abs=1e-9)


def test_width_terms_say_what_shrinks_with_days_and_what_does_not() -> None:
    one = _est(0.0, 4, day=0.0, day_var=0.04, transport=0.01)
    two = {**_est(0.0, 4, day=1.0, day_var=0.04, transport=0.01)}
    same_day = {**two, "day": 0.0}
    t1, t2, t_same = width_terms([one]), width_terms([one, two]), width_terms([one, same_day])
    assert t1["day"] == pytest.approx(0.04) and t1["day_one"] == pytest.approx(0.04) and t1["days"] == 1
    assert t2["day"] == pytest.approx(0.02) and t2["days"] == 2  # two days halve the day-to-day term
    assert t_same["day"] == pytest.approx(0.04)  # two rounds on one day do not
    assert t2["own"] == pytest.approx(t1["own"] / 2)  # the group split halves with two canaries
    assert t2["shared"] == pytest.approx(t1["shared"]) and t2["interference"] == pytest.approx(0.01)  # never shrinks
    assert t1["shared"] >= t1["interference"] > 0 and t1["base"] == pytest.approx(one["base"])


@pytest.fixture(scope="module")
def scale() -> Any:
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import _closed_loop_scale

    yield _closed_loop_scale
    sys.path.remove(str(ROOT / "benchmarks"))


def test_the_benchmark_counts_a_guard_stopped_candidate_s_other_kpis(scale: Any) -> None:
    checks = {"kpi.a": "regress", "kpi.b": "ok", "kpi.c": "straddle"}
    summary = {"rounds": [{"stop": "guard", "guard_kpi": "kpi.a", "look": True, "checks": checks}]}
    got = {c: scale.verdict_at({"column": c, "twin_alone": "abstain"}, summary, 1) for c in checks}
    assert got == checks
    # an older run's guard stop without checks: the guard's KPI alone
    bare = {"rounds": [{"stop": "guard", "guard_kpi": "kpi.a", "look": True, "checks": {}}]}
    assert scale.verdict_at({"column": "kpi.b", "twin_alone": "abstain"}, bare, 1) == "abstain"
    assert scale.verdict_at({"column": "kpi.a", "twin_alone": "abstain"}, bare, 1) == "regress"


@pytest.mark.slow  # fits a small twin and runs one real canary (~20 s on a quiet 2-core machine)
def test_the_loop_judges_every_kpi_of_a_canary_its_guard_stopped(monkeypatch: pytest.MonkeyPatch) -> None:
    """A real canary, marked as the edge marks a guard stop on SLO violations on its first day: the
    loop refuses on the guard's ``regress``, and leaves the other KPI open (no completed day), saying why."""
    import torch

    import edgetwin.loop.fleet as fleet
    from edgetwin.emulator.cluster import ClusterConfig
    from edgetwin.emulator.logs import generate_logs, make_policy
    from edgetwin.loop.plan import PlanBudget
    from edgetwin.loop.rounds import canary_loop
    from edgetwin.policies.gate import Guard, resolve_policy
    from edgetwin.twin.twin import Twin
    from edgetwin.twin.whatif import fixed_policy

    torch.set_num_threads(1)
    cluster = ClusterConfig(n_agents=40, steps=24)
    log, spec = generate_logs(cluster, 2, "random", seed=0)
    twin = Twin.fit(log, spec, seed=0, members=2, progress=False, rounds=0, bc_epochs=2, population_model="empirical")
    fleet_log, _ = generate_logs(cluster, 1, "random", seed=5)
    real = fleet.canary_on_cluster

    def stopped(*a: Any, **k: Any) -> Any:
        res = real(*a, **k)
        res.stop_reason, res.guard_stop = "guard", SimpleNamespace(kpi="kpi.slo_violation")
        res.ticks = min(int(res.ticks), 10)  # stopped after 6 ticks past the 4 pre-period ticks
        return res

    monkeypatch.setattr(fleet, "canary_on_cluster", stopped)

    class Constant:
        def act(self, obs: np.ndarray) -> np.ndarray:
            return np.tile(np.array([1.0, 0.3, 0.2]), (len(obs), 1))

    guards = [Guard("response.offload_ratio", 0.05), Guard("kpi.slo_violation", 0.05)]
    res = canary_loop(twin, fleet_log, Constant(), make_policy("random", spec, seed=1), cluster,
                      candidate_spec=fixed_policy("always-edge", Constant()),
                      baseline_spec=resolve_policy("logging", twin, name="current"), budget=PlanBudget(max_share=0.25),
                      guards=guards, max_rounds=2, seed=0, fleet_seed=5, old_logs=[log], other_days=[log],
                      update_options={"epochs": 1, "max_steps": 20}, log=lambda s: None)  # fmt: skip
    if res.gate["verdict"] != "abstain":
        pytest.skip("the twin alone decided: no canary ran")
    last = res.rounds[-1]
    assert res.verdict == "refuse" and len(res.rounds) == 1 and last.stop_reason == "guard"
    assert last.checks == []  # offload ratio open: the hours before the stop are not a day
    assert "judged on no day: the guard stopped the first day after" in res.reason
    assert "kpi.slo_violation regressed beyond its margin" in res.reason
    assert set(last.estimates) == {"response.offload_ratio", "kpi.slo_violation"}  # kept for the record
