"""Extended canaries (issue 48): rounds on several days pooled with the terms they share, judged at
a fixed schedule of looks that spends alpha, and extended only while the candidate is not hurting."""

from __future__ import annotations

import numpy as np
import pytest


def _round(day: int, diff: float = 0.0, own: float = 0.01**2, shared: float = 0.005**2, dayv: float = 0.02**2,
           ) -> dict[str, float]:
    from edgetwin.loop.ppi import finish_estimate

    e = finish_estimate(diff, own + shared + dayv, 1.0, 1e-8, df=30.0)
    e.update(diff_var_shared=shared, diff_var_day=dayv, base_var_shared=0.0, base_var_day=0.0, day_df=20.0,
             twin_diff=0.0, twin_rel=0.0, day=float(day))  # fmt: skip
    return e


def test_the_day_to_day_term_shrinks_with_days_not_with_rounds_on_one_day() -> None:
    from edgetwin.loop.ppi import combine_estimates

    one = combine_estimates([_round(0)])
    same_day = combine_estimates([_round(0) for _ in range(4)])
    four_days = combine_estimates([_round(d) for d in range(4)])
    own, shared, dayv = 0.01**2, 0.005**2, 0.02**2
    # one day, four rounds: only the rounds' own rectifiers average out
    assert same_day["diff_se"] == pytest.approx(np.sqrt(own / 4 + shared + dayv))
    # four days: the day-to-day term averages out too; the fleet and interference terms never do
    assert four_days["diff_se"] == pytest.approx(np.sqrt(own / 4 + shared + dayv / 4))
    assert four_days["diff_se"] < same_day["diff_se"] < one["diff_se"]
    assert four_days["days"] == 4 and same_day["days"] == 1


def test_two_rounds_on_each_of_two_days_pool_their_day_terms_per_day() -> None:
    from edgetwin.loop.ppi import combine_estimates

    got = combine_estimates([_round(0), _round(0), _round(1), _round(1)])
    own, shared, dayv = 0.01**2, 0.005**2, 0.02**2
    assert got["diff_se"] == pytest.approx(np.sqrt(own / 4 + shared + dayv / 2))


def test_looks_double_and_spend_alpha_over_the_schedule() -> None:
    from edgetwin.loop.ppi import look_days, look_level

    assert look_days(1) == (1,)
    assert look_days(16) == (1, 2, 4, 8, 16)
    assert look_days(10) == (1, 2, 4, 8, 10)
    assert look_level(0.9, len(look_days(16))) == pytest.approx(0.98)


def test_looks_over_the_schedule_keep_the_level_under_an_aa_candidate() -> None:
    """Simulated extension: a true change of 0 with day-to-day spread; a look "errs" when its pooled
    interval excludes 0. Over the 5 looks of 16 days, the share of runs in which any look errs stays
    below 10 %; judged at 90 % at every look instead, it does not."""
    from edgetwin.loop.ppi import combine_estimates, look_days, look_level

    rng = np.random.default_rng(0)
    own, shared, dayv = 0.01**2, 0.0, 0.02**2
    looks = look_days(16)
    runs, err_spent, err_naive = 400, 0, 0
    for _ in range(runs):
        rounds = []
        spent = naive = False
        for d in range(1, 17):
            diff = rng.normal(0, np.sqrt(dayv)) + rng.normal(0, np.sqrt(own))
            rounds.append(_round(d, diff, own, shared, dayv))
            if d in looks:
                a = combine_estimates(rounds, look_level(0.9, len(looks)))
                b = combine_estimates(rounds, 0.9)
                spent |= not (a["rel_lo"] <= 0.0 <= a["rel_hi"])
                naive |= not (b["rel_lo"] <= 0.0 <= b["rel_hi"])
        err_spent += spent
        err_naive += naive
    assert err_spent / runs <= 0.10
    assert err_naive / runs > err_spent / runs


def test_a_candidate_that_hurts_is_not_extended() -> None:
    from edgetwin.loop.rounds import hurting

    assert hurting("completed", []) is None
    assert "budget" in (hurting("budget", []) or "")
    assert "guard" in (hurting("guard", []) or "")
    assert "kpi.slo_violation" in (hurting("completed", ["kpi.slo_violation"]) or "")


def test_days_to_decide_counts_the_terms_days_do_not_shrink() -> None:
    from types import SimpleNamespace

    from edgetwin.loop.plan import CanaryPlan, PlannedKPI, days_to_decide

    assert days_to_decide(-0.05, 0.2, 0.05) == 4  # all of it shrinks: (0.2 / 0.1)²
    # a fixed half-width of 0.05 (the fleet's term): (0.04 − 0.0025) / (0.01 − 0.0025) = 5 days
    assert days_to_decide(-0.05, 0.2, 0.05, fixed_half=0.05) == 5
    assert days_to_decide(-0.05, 0.2, 0.05, fixed_half=0.1) is None  # the fixed part alone reaches the margin
    assert days_to_decide(0.049, 0.5, 0.05) is None  # over a year of days

    def kpi(mid: float, days: int | None) -> PlannedKPI:
        return PlannedKPI("k", "k", "lower", "", [0, 0], [mid - 0.1, mid + 0.1], 0.05, False, 0.0, 0.0, None, days)

    days = CanaryPlan.days.fget  # type: ignore[attr-defined]
    assert days(SimpleNamespace(kpis=[kpi(0.0, 3), kpi(0.0, 7)])) == 7  # a promotion needs every KPI
    assert days(SimpleNamespace(kpis=[kpi(0.0, 3), kpi(0.2, 2), kpi(0.3, 5)])) == 2  # one regression refuses
    assert days(SimpleNamespace(kpis=[kpi(0.0, 3), kpi(0.0, None)])) is None


@pytest.fixture(scope="module")
def world():  # type: ignore[no-untyped-def]
    import torch

    from edgetwin.emulator.cluster import ClusterConfig
    from edgetwin.emulator.logs import generate_logs
    from edgetwin.twin.twin import Twin

    torch.set_num_threads(1)
    cluster = ClusterConfig(n_agents=40, steps=24)
    log, spec = generate_logs(cluster, 2, "random", seed=0)
    twin = Twin.fit(log, spec, seed=0, members=2, progress=False, rounds=0, bc_epochs=2, population_model="empirical")
    fleet, _ = generate_logs(cluster, 1, "random", seed=5)
    return {"log": log, "spec": spec, "twin": twin, "fleet": fleet, "cluster": cluster}


def _extended(world, action: list[float], max_loss: dict[str, float], max_days: int = 3):  # type: ignore[no-untyped-def]
    from edgetwin.emulator.logs import generate_logs, make_policy
    from edgetwin.loop.plan import PlanBudget
    from edgetwin.loop.rounds import canary_loop
    from edgetwin.policies.gate import Guard, resolve_policy
    from edgetwin.twin.whatif import fixed_policy

    class Constant:
        def __init__(self, spec, a):  # type: ignore[no-untyped-def]
            self.spec, self.a = spec, np.asarray(a, dtype=np.float64)

        def act(self, obs: np.ndarray) -> np.ndarray:
            return np.tile(self.a, (len(obs), 1))

    asked: list[int] = []

    def day(d: int):  # type: ignore[no-untyped-def]
        asked.append(d)
        return generate_logs(world["cluster"], 1, "random", seed=100 + d)[0], 100 + d

    cand = Constant(world["spec"], action)
    res = canary_loop(
        world["twin"], world["fleet"], cand, make_policy("random", world["spec"], seed=1), world["cluster"],
        candidate_spec=fixed_policy("cand", cand), baseline_spec=resolve_policy("logging", world["twin"], name="current"),
        budget=PlanBudget(max_share=0.5, max_loss=max_loss),
        guards=[Guard("response.offload_ratio", 0.05), Guard("kpi.slo_violation", 0.05)],
        seed=0, fleet_seed=5, old_logs=[world["log"]], other_days=[world["log"]],
        update_options={"epochs": 1, "max_steps": 20}, log=lambda s: None, days=day, max_days=max_days,
    )  # fmt: skip
    return res, asked


@pytest.mark.slow
def test_an_extended_canary_runs_one_round_per_day_and_judges_at_the_looks(world) -> None:  # type: ignore[no-untyped-def]
    res, asked = _extended(world, [0.5, 1.0, 0.5], {}, max_days=3)
    assert res.gate["verdict"] == "abstain" and res.rounds
    # round r ran on day r - 1: the day source was asked for days 1, 2, ... in order, one per round
    assert asked == list(range(1, len(res.rounds)))
    for r in res.rounds:
        days = {e["day"] for e in r.estimates.values()}
        assert days == {float(r.round - 1)} or r.stop_reason == "guard"
    assert [r.look for r in res.rounds] == [True] * len(res.rounds)  # look_days(3) = (1, 2, 3)
    if len(res.rounds) > 1:  # pooled over distinct days
        last = res.rounds[-1].checks
        assert last and all(c["interval"][0] <= c["change"] <= c["interval"][1] for c in last)


@pytest.mark.slow
def test_a_candidate_whose_canary_the_edge_stopped_is_not_extended(world, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """The edge's loss-budget stop (what a hurting candidate's canary gets) ends the extension: the
    real canary runs, and its result is marked as the edge marks a budget stop."""
    import edgetwin.loop.fleet as fleet

    real = fleet.canary_on_cluster

    def stopped(*a, **k):  # type: ignore[no-untyped-def]
        res = real(*a, **k)
        res.stop_reason = "budget"
        return res

    monkeypatch.setattr(fleet, "canary_on_cluster", stopped)
    res, asked = _extended(world, [0.5, 1.0, 0.5], {}, max_days=4)
    assert len(res.rounds) == 1 and asked == []  # no second day
    if res.verdict == "abstain":
        assert "not extended past day 1: the canary stopped (budget)" in res.reason
