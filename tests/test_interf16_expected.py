"""Issue 48 (interf16): the plan's expected interval carries the twin's interference term, as the
verdict's does (`edgetwin.loop.ppi.ppi_mean_difference`'s ``transport_var``, `interference_var`).

On hand-written terms: `verdict_interval` is `finish_estimate` on the change's terms plus the
interference's (on members − 1 degrees of freedom in the Welch count) and the baseline level's
terms plus its interference term, hulled with the no-interference estimate the verdict keeps
beside it; pooled over days the interference stays whole (the verdict's shared term); and a plan
whose twin members disagree on the interference expects a wider interval, more days or none."""

from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest

from edgetwin.loop.plan_expected import (
    NO_INTERFERENCE,
    Interference,
    expected_interval,
    pooled_base_var,
    pooled_days_to_decide,
    pooled_terms,
    verdict_interval,
)
from edgetwin.loop.ppi import combine_estimates, finish_estimate, ppi_mean_difference, welch_df

FLEET = (0.02, 99.0)  # (variance in KPI units², df): the fleet's term
OWN = [(0.3, 4.0), (0.2, 5.0)]  # the arms' rectifiers
DAY = (0.1, 0.05, 5.0)  # the first look's day term, its revealed part, df
BASE_VAR = (0.01, 0.2, 0.03)  # the baseline level's (shared, own, day)
BASE = 20.0


def test_one_days_interval_is_finish_estimate_with_the_interference_term() -> None:
    """The transporting estimate's interval: the change's variance and Welch degrees of freedom
    with the interference's ``(var, members − 1)`` term, the baseline level's variance with its
    interference term; with no shift (members agree on the mean 0) there is nothing to hull."""
    itf = Interference(var=0.8, base_var=0.05, df=4.0)
    point = 0.03
    got = verdict_interval(1, point, BASE, FLEET, OWN, DAY, BASE_VAR, 0.90, itf)
    terms = [FLEET, *OWN, (0.8, 4.0), (DAY[0], DAY[2])]
    want = finish_estimate(point * BASE, sum(v for v, _ in terms), BASE, sum(BASE_VAR) + 0.05, 0.90,
                           df=welch_df(terms))  # fmt: skip
    assert got == pytest.approx((want["rel_lo"], want["rel_hi"]), rel=1e-12)
    without = verdict_interval(1, point, BASE, FLEET, OWN, DAY, BASE_VAR, 0.90)
    assert got[1] - got[0] > without[1] - without[0]
    assert without == expected_interval(point, BASE, pooled_terms(1, FLEET, OWN, DAY), pooled_base_var(1, BASE_VAR), 0.90)


def test_the_interval_is_the_verdicts_hull_with_the_no_interference_estimate() -> None:
    """With a mean interference (``shift``), the no-interference estimate the verdict keeps
    (``local:*``) is expected at ``point·base − shift`` over ``base + base_shift``, without the
    interference terms; the expected interval is the hull of the two, as `ppi_verdict` judges."""
    itf = Interference(var=0.4, base_var=0.02, df=2.0, shift=1.5, base_shift=-0.5)
    point = 0.02
    got = verdict_interval(1, point, BASE, FLEET, OWN, DAY, BASE_VAR, 0.90, itf)
    t_terms = [FLEET, *OWN, (0.4, 2.0), (DAY[0], DAY[2])]
    l_terms = [FLEET, *OWN, (DAY[0], DAY[2])]
    tr = finish_estimate(point * BASE, sum(v for v, _ in t_terms), BASE, sum(BASE_VAR) + 0.02, 0.90, df=welch_df(t_terms))
    lo = finish_estimate(point * BASE - 1.5, sum(v for v, _ in l_terms), BASE - 0.5, sum(BASE_VAR), 0.90,
                         df=welch_df(l_terms))  # fmt: skip
    assert got == pytest.approx((min(tr["rel_lo"], lo["rel_lo"]), max(tr["rel_hi"], lo["rel_hi"])), rel=1e-12)
    assert got[0] == pytest.approx(lo["rel_lo"]) and got[0] < tr["rel_lo"]  # the shift widens it downwards


def test_the_term_is_what_the_verdicts_estimate_carries() -> None:
    """`ppi_mean_difference` with a ``transport_var`` on ``members − 1`` degrees of freedom: its
    interval is `finish_estimate` with the same Welch count the plan's one-day terms give."""
    rng = np.random.default_rng(3)
    fc, fb = rng.normal(10.5, 1.0, 60), rng.normal(10.0, 1.0, 60)
    yc, pc, yb, pb = rng.normal(10.4, 1.0, 5), rng.normal(10.5, 0.1, 5), rng.normal(10.0, 1.0, 6), rng.normal(10, 0.1, 6)
    est = ppi_mean_difference(fc, fb, yc, pc, yb, pb, 0.90, transport_var=(0.7, 0.04), transport_df=2.0)
    v_fleet = float(np.var(fc - fb, ddof=1)) / 60
    own = [(float(np.var(yc - pc, ddof=1)) / 5, 4.0), (float(np.var(yb - pb, ddof=1)) / 6, 5.0)]
    terms = pooled_terms(1, (v_fleet, 59.0), own, (0.0, 0.0, math.inf), (0.7, 2.0))
    assert est["df"] == pytest.approx(welch_df(terms), rel=1e-12)
    assert est["diff_se"] ** 2 == pytest.approx(sum(v for v, _ in terms), rel=1e-12)
    assert est["diff_var_interference"] == 0.7


def test_the_shared_term_is_not_divided_by_the_days() -> None:
    """Pooled over ``k`` days, the interference is part of the shared term (never ``/k``), as the
    verdict's pooling of rounds carries it (`combine_estimates`: the shared terms perfectly
    correlated): ``k`` alike rounds' pooled variance is the plan's pooled terms' sum."""
    for k in (2, 5, 40):
        terms = pooled_terms(k, FLEET, OWN, (0.0, 0.0, math.inf), (0.9, 3.0))
        assert terms[1][0] == pytest.approx(FLEET[0] + 0.9)  # the shared: whole at any k
        assert terms[0][0] == pytest.approx(0.5 / k)
        one = {"diff": 1.0, "diff_se": math.sqrt(FLEET[0] + 0.9 + 0.5), "base": BASE, "base_se": 0.5,
               "diff_var_shared": FLEET[0] + 0.9, "base_var_shared": 0.0, "twin_diff": 1.0,
               "df": welch_df(pooled_terms(1, FLEET, OWN, (0.0, 0.0, math.inf), (0.9, 3.0)))}  # fmt: skip
        pooled = combine_estimates([{**one, "day": float(d)} for d in range(k)])
        assert pooled["diff_se"] ** 2 == pytest.approx(sum(v for v, _ in terms), rel=1e-9)
        assert pooled["df"] == pytest.approx(welch_df(terms), rel=1e-9)
    # and the days' interval never narrows below the interference's own width
    lo, hi = verdict_interval(10_000, 0.0, BASE, FLEET, OWN, (0.0, 0.0, math.inf), (0.0, 0.0, 0.0), 0.90,
                              Interference(var=0.9, df=3.0), t_ref=False)  # fmt: skip
    assert hi - lo > 2 * 1.6448 * math.sqrt(0.9) / BASE


def test_a_large_interference_term_means_more_days_or_none() -> None:
    """The days to decide: with members that disagree on the interference the same plan needs
    more days, and none when the term alone reaches the margin; a mean interference that puts the
    no-interference estimate across the margin also leaves no number of days."""
    point, allowed = 0.0, 0.05
    without = pooled_days_to_decide(point, allowed, BASE, FLEET, OWN, DAY, 0.90, base_var=BASE_VAR)
    small = pooled_days_to_decide(point, allowed, BASE, FLEET, OWN, DAY, 0.90, base_var=BASE_VAR,
                                  interference=Interference(var=0.2, df=2.0))  # fmt: skip
    large = pooled_days_to_decide(point, allowed, BASE, FLEET, OWN, DAY, 0.90, base_var=BASE_VAR,
                                  interference=Interference(var=1.0, df=2.0))  # fmt: skip
    shifted = pooled_days_to_decide(point, allowed, BASE, FLEET, OWN, DAY, 0.90, base_var=BASE_VAR,
                                    interference=Interference(shift=-0.06 * BASE))  # worse by 6 % without it
    assert without is not None and small is not None and small > without
    assert large is None and shifted is None
    assert pooled_days_to_decide(point, allowed, BASE, FLEET, OWN, DAY, 0.90, base_var=BASE_VAR,
                                 interference=NO_INTERFERENCE) == without


def _member_series(agents: list[str], spread: float, seed: int) -> list[dict[tuple[str, str], pd.DataFrame]]:
    """Three members' per-tick replays (24 ticks) of the full switch and of a canary whose
    candidate arm is ``g00``-``g03``: the members agree on the full switch and disagree on the
    canary's candidate arm by ``spread`` (KPI units) per member (an offset on every group would
    cancel between the arms)."""
    rng = np.random.default_rng(seed)
    fb = rng.normal(10.0, 1.0, len(agents))
    fc = fb + 0.4
    out = []
    for m in range(3):
        can = np.where(np.arange(len(agents)) < 4, fc + spread * (m - 1), fb)
        out.append({(p, "kpi.x"): pd.DataFrame(np.repeat(v[:, None], 24, axis=1), index=agents)
                    for p, v in (("candidate", fc), ("baseline", fb), ("canary", can))})  # fmt: skip
    return out


def test_a_plan_whose_members_disagree_expects_a_wider_interval_and_more_days() -> None:
    """`_expected_option` on one slice with the twin's interference read from members that
    disagree (`PlannedInterference`, as `plan_canary` builds it): a wider expected interval than
    with members that agree, and more canary days (or none)."""
    from edgetwin.loop.plan import PlanBudget, _expected_option
    from edgetwin.loop.plan_interference import PlannedInterference

    agents = [f"g{i:02d}" for i in range(40)]
    cand_arm, ctrl_arm = agents[:4], agents[4:8]
    rng = np.random.default_rng(0)
    fb = rng.normal(10.0, 1.0, 40)
    preds = pd.DataFrame({("candidate", "kpi.x"): fb + 0.4, ("baseline", "kpi.x"): fb}, index=agents)
    preds.columns = pd.MultiIndex.from_tuples(list(preds.columns))
    check = SimpleNamespace(change=0.0, better="lower", allowed_change=0.05, worsening_interval=[0.0, 0.1],
                            interval=[-0.1, 0.1], abstain_reason=lambda _m: "straddles")  # fmt: skip
    decision = SimpleNamespace(max_out_of_support=0.2)
    kdefs = {"x": SimpleNamespace(stat="mean", weight=None, column="kpi.x")}
    got = {}
    for spread in (0.0, 0.5):
        itf = PlannedInterference.from_series(_member_series(agents, spread, 1), (cand_arm, ctrl_arm), 0.5, 4, [4.0],
                                              {"kpi.x": 1.0})  # fmt: skip
        got[spread] = _expected_option(decision, {"x": check}, kdefs, preds, {("kpi.x", 4.0): 0.3}, PlanBudget(), 40, 8,
                                       4.0, "random", {"kpi.x": (0.01, 0.01, 5.0)}, 8, interference=itf)[3][0]  # fmt: skip
        term = itf.term("kpi.x", 8, 4.0)
        assert term.var == pytest.approx((1 + 1 / 3) * spread**2, abs=1e-12) and term.df == 2.0
    agree, disagree = got[0.0], got[0.5]
    assert disagree.expected[1] - disagree.expected[0] > agree.expected[1] - agree.expected[0]
    assert agree.days is not None and (disagree.days is None or disagree.days > agree.days)
    assert disagree.interference_sd > 0 == agree.interference_sd


def test_the_docs_say_the_plan_carries_the_term() -> None:
    """docs/canary.md's sentences on the plan's interference term name what the planner calls, and
    those calls are there: `verdict_interval` in the option's interval, `planned_interference` in
    `plan_canary` (which replays the largest slice the budget allows: `replayed_arms` of ``max_n``),
    the verdict's `interference_var` (its `member_interference_draws` and `interference_spread`) on
    the option's own groups, and the days' count holding the term fixed."""
    import inspect
    from pathlib import Path

    from edgetwin.loop import plan as plan_mod
    from edgetwin.loop import plan_expected, plan_interference, ppi
    from edgetwin.loop.plan_interference import PlannedInterference, planned_interference, replayed_arms

    text = " ".join((Path(__file__).resolve().parents[1] / "docs" / "canary.md").read_text().split())
    for claim in ("Both expected variances also carry the twin's interference term, as the verdict's do "
                  "(`verdict_interval`)", "on members − 1 degrees of freedom; and the expected interval is the hull "
                  "of that estimate and the one that assumes no interference",
                  "`planned_interference` replays the largest slice the budget allows, drawn as the plan draws its "
                  "slice, and each slice size reads the term on its number of that replay's candidate groups and of "
                  "the fleet's other groups, averaged over 8 draws of them)",
                  "(`pooled_days_to_decide`): the fleet's and the twin's interference terms held fixed"):  # fmt: skip
        assert claim in text, claim
    assert "verdict_interval(" in inspect.getsource(plan_mod._expected_option)
    assert "planned_interference(" in inspect.getsource(plan_mod.plan_canary)
    assert "max_n" in inspect.getsource(plan_mod.plan_canary).split("planned_interference(")[1].split(")")[0]
    assert "replayed_arms(" in inspect.getsource(planned_interference)
    term = inspect.getsource(PlannedInterference.term)  # the verdict's functions: one implementation
    assert "member_interference_draws(" in term and "interference_spread(" in term
    assert "interference_spread(" in inspect.getsource(ppi.interference_var)
    assert "member_interference_draws(" in inspect.getsource(ppi.member_interference)
    assert "self.draws(k)" in inspect.getsource(PlannedInterference.term) and plan_interference.DRAWS == 8
    assert "verdict_interval(" in inspect.getsource(plan_expected.pooled_days_to_decide)
    # the draw is `_draw_slice`'s for the largest size
    agents = [f"a{i:03d}" for i in range(50)]
    cand, ctrl = replayed_arms(agents, 10, 0.5, 3, 1)
    rng = np.random.default_rng([3, 1, 0xCA])
    assert sorted(cand + ctrl) == sorted(str(a) for a in rng.choice(np.array(agents, dtype=object), 10, replace=False))
    assert len(cand) == len(ctrl) == 5


def test_the_verdicts_term_by_draws_is_the_verdicts_term_per_draw() -> None:
    """`member_interference_draws` (the plan reads several arms at once) gives, draw by draw, the
    numbers `member_interference` and `interference_var` give the verdict, and those are the
    verdict's formula before the split (each member's ``mean_cand(f_c − f^canary) −
    mean_ctrl(f_b − f^canary)`` and ``−mean_ctrl(f_b − f^canary)``, spread ``(1 + 1/M)·var``),
    bit for bit."""
    from edgetwin.loop.ppi import (
        interference_spread,
        interference_var,
        member_interference,
        member_interference_draws,
    )

    rng = np.random.default_rng(11)
    groups = [f"g{i:02d}" for i in range(30)]
    frames = []
    for _ in range(3):
        f = pd.DataFrame({(p, "kpi.x"): rng.normal(5.0, 1.0, 30) for p in ("cand", "base", "can")}, index=groups)
        f.columns = pd.MultiIndex.from_tuples(list(f.columns))
        frames.append(f.sample(frac=1.0, random_state=1))  # rows in another order: reindexed by ``groups``
    arms = [(rng.choice(30, 4, replace=False), rng.choice(30, 6, replace=False)) for _ in range(5)]
    i_d, j_d = member_interference_draws(frames, arms, groups, "kpi.x", "cand", "base", "can")
    for a, (ic, ib) in enumerate(arms):
        sub = [groups[i] for i in ic] + [groups[i] for i in ib]
        is_cand = np.array([True] * len(ic) + [False] * len(ib))
        i_m, j_m = member_interference(frames, is_cand, sub, "kpi.x", "cand", "base", "can")
        old_i, old_j = [], []
        for pr in frames:
            at = pr.reindex(sub)
            d_c = (at[("cand", "kpi.x")] - at[("can", "kpi.x")]).to_numpy()[is_cand]
            d_b = (at[("base", "kpi.x")] - at[("can", "kpi.x")]).to_numpy()[~is_cand]
            old_i.append(float(np.mean(d_c) - np.mean(d_b)))
            old_j.append(float(-np.mean(d_b)))
        assert list(i_m) == old_i == list(i_d[:, a]) and list(j_m) == old_j == list(j_d[:, a])
        k = 1.0 + 1.0 / 3
        want = (k * float(np.var(old_i, ddof=1)), k * float(np.var(old_j, ddof=1)))
        assert interference_var(frames, is_cand, sub, "kpi.x", "cand", "base", "can") == want
        assert interference_spread(i_d[:, a], j_d[:, a]) == want
