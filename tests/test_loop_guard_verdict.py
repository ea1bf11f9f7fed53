"""Issue 48 (item 5): a canary the guard stopped answers every declared KPI on the ticks it ran, not
only the one the guard fired on; and the pooled interval says what it is made of (`width_terms`)."""

from __future__ import annotations

import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from edgetwin.contract.margins import KPIMargin
from edgetwin.loop.ppi import ppi_mean_difference, width_terms
from edgetwin.loop.rounds import _guard_verdict

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


def test_a_guard_stop_refuses_and_judges_every_other_kpi_once() -> None:
    # "a": the guard's KPI (its PPI interval straddles: the guard's always-valid regress stands);
    # "b": clearly unchanged (ok); "c": clearly 20 % worse (regress); lower is better for all
    per_round = [{"a": _est(0.5, 1), "b": _est(0.0, 2), "c": _est(2.0, 3)}]
    res = SimpleNamespace(guard_stop=SimpleNamespace(kpi="a"))
    verdict, ests, checks, reason, days = _guard_verdict(res, SimpleNamespace(alpha=0.05), per_round, 5,
                                                         _plan(["a", "b", "c"]), None, 7)  # fmt: skip
    by = {c["kpi"]: c for c in checks}
    assert verdict == "refuse" and set(by) == {"a", "b", "c"} and days == 1
    assert by["a"]["verdict"] == "regress" and by["a"]["by"] == "guard"
    assert by["b"]["verdict"] == "ok" and by["c"]["verdict"] == "regress" and "by" not in by["c"]
    assert "guard stopped it: a regressed" in reason and "on the 7 tick(s) it ran" in reason
    # each look at 98 % (90 % over 5 looks): wider than one look's 90 %
    assert by["b"]["terms"]["level"] == pytest.approx(0.98)


def test_a_guard_stop_with_nothing_measured_refuses_on_the_guard_alone() -> None:
    res = SimpleNamespace(guard_stop=SimpleNamespace(kpi="a"))
    verdict, ests, checks, reason, _ = _guard_verdict(res, SimpleNamespace(alpha=0.05), [], 3, _plan(["a"]), None, 1)
    assert verdict == "refuse" and checks == [] and ests == [] and "a regressed beyond its margin" in reason


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
    """A real canary, marked as the edge marks a guard stop on SLO violations: the loop refuses, and
    its last round answers every guarded KPI (the guard's one ``regress`` by the guard)."""
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
    by = {c["kpi"]: c for c in last.checks}
    assert set(by) == {"response.offload_ratio", "kpi.slo_violation"}
    assert by["kpi.slo_violation"]["verdict"] == "regress" and by["kpi.slo_violation"]["by"] == "guard"
    assert by["response.offload_ratio"]["verdict"] in ("ok", "regress", "straddle") and "by" not in by["response.offload_ratio"]
    assert "every KPI on the" in res.reason and set(last.estimates) == set(by)
