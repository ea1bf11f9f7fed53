"""Prediction-powered verdict: valid when the twin is biased, where the twin alone is not."""

import numpy as np
import pytest

from edgetwin.contract.errors import InputError
from edgetwin.loop.ppi import ppi_mean_difference, ppi_verdict
from edgetwin.policies.gate import Guard


def _world(rng, n=200, true_effect=0.04, bias=0.06):
    """Groups with their own level; the twin predicts each group's level well but gets the
    candidate's effect wrong by ``bias`` (in KPI units)."""
    level = rng.gamma(4.0, 0.05, n)  # ~0.2 on average, groups differ a lot
    y_base = level + rng.normal(0, 0.02, n)
    y_cand = level + true_effect + rng.normal(0, 0.02, n)
    f_base = level + rng.normal(0, 0.01, n)
    f_cand = level + true_effect + bias + rng.normal(0, 0.01, n)
    return y_cand, y_base, f_cand, f_base


def test_ppi_interval_covers_the_truth_when_the_twin_is_biased_and_the_twin_alone_does_not():
    true_effect, bias = 0.04, 0.06
    covered_ppi = covered_twin = 0
    reps = 300
    for r in range(reps):
        rng = np.random.default_rng(r)
        y_c, y_b, f_c, f_b = _world(rng, true_effect=true_effect, bias=bias)
        truth = float(np.mean(y_c) - np.mean(y_b))  # the candidate on the whole fleet
        slice_ = rng.choice(len(y_c), 20, replace=False)  # a random 10 % slice, half per arm
        cand, ctrl = slice_[:10], slice_[10:]
        e = ppi_mean_difference(f_c, f_b, y_c[cand], f_c[cand], y_b[ctrl], f_b[ctrl])
        half = 1.645 * e["diff_se"]
        covered_ppi += abs(e["diff"] - truth) <= half
        twin_se = np.std(f_c - f_b, ddof=1) / np.sqrt(len(f_c))
        covered_twin += abs(e["twin_diff"] - truth) <= 1.645 * twin_se
    assert covered_ppi / reps >= 0.85  # nominal 90 %
    assert covered_twin / reps <= 0.05  # the twin alone is confidently wrong


def test_ppi_narrower_than_canary_alone_when_the_twin_is_good():
    rng = np.random.default_rng(0)
    y_c, y_b, f_c, f_b = _world(rng, bias=0.0)
    idx = rng.choice(len(y_c), 20, replace=False)
    cand, ctrl = idx[:10], idx[10:]
    e = ppi_mean_difference(f_c, f_b, y_c[cand], f_c[cand], y_b[ctrl], f_b[ctrl])
    canary_se = np.sqrt(np.var(y_c[cand], ddof=1) / 10 + np.var(y_b[ctrl], ddof=1) / 10)
    assert e["diff_se"] < 0.5 * canary_se


def test_ppi_verdict_refuses_a_measured_regression_and_promotes_a_neutral_one():
    rng = np.random.default_rng(1)
    y_c, y_b, f_c, f_b = _world(rng, n=400, true_effect=0.05, bias=-0.05)  # twin says neutral
    idx = rng.choice(400, 80, replace=False)
    cand, ctrl = idx[:40], idx[40:]
    e = ppi_mean_difference(f_c, f_b, y_c[cand], f_c[cand], y_b[ctrl], f_b[ctrl])
    e.update(n_fleet=400, n_candidate=40, n_control=40)
    verdict, checks = ppi_verdict({"kpi.x": e}, [Guard("kpi.x", 0.05)], {"kpi.x": "lower"})
    assert verdict == "refuse" and checks[0].verdict == "regress"  # +25 % measured, margin 5 %
    y_c, y_b, f_c, f_b = _world(rng, n=400, true_effect=0.0, bias=0.05)  # twin says +25 %: biased
    e = ppi_mean_difference(f_c, f_b, y_c[cand], f_c[cand], y_b[ctrl], f_b[ctrl])
    e.update(n_fleet=400, n_candidate=40, n_control=40)
    verdict, _ = ppi_verdict({"kpi.x": e}, [Guard("kpi.x", 0.25)], {"kpi.x": "lower"})
    assert verdict == "promote"


def test_ppi_needs_two_groups_per_arm():
    with pytest.raises(InputError):
        ppi_mean_difference(np.ones(5), np.ones(5), np.ones(1), np.ones(1), np.ones(3), np.ones(3))


# ------------------------------------------------------------------ the rectifier against the twin's canary
def _interference(rng, n=300, slice_effect=-0.02, fleet_effect=0.04, bias=0.01):
    """A candidate that helps the few groups that run it (``slice_effect``) and congests shared
    sites when every group does (``fleet_effect``). The twin knows the interference (its
    ``f^canary`` and ``f^full`` differ as the truth does) and is off by ``bias`` on every
    candidate group, in both configurations (its error transports)."""
    level = rng.gamma(4.0, 0.05, n)
    y_base = level + rng.normal(0, 0.02, n)
    y_full = level + fleet_effect + rng.normal(0, 0.02, n)  # every group on the candidate
    y_slice = level + slice_effect + rng.normal(0, 0.02, n)  # a treated group in the canary
    f_base = level + rng.normal(0, 0.01, n)
    f_full = level + fleet_effect + bias + rng.normal(0, 0.01, n)
    f_slice = level + slice_effect + bias + rng.normal(0, 0.01, n)
    return y_base, y_full, y_slice, f_base, f_full, f_slice


def _frames(f_full, f_base, f_canary, y, is_c):
    """`ppi_estimates`' inputs: the twin's predictions per group and the canary's measurements."""
    import pandas as pd

    idx = [f"g{i:03d}" for i in range(len(f_full))]
    preds = pd.DataFrame({("candidate", "kpi.x"): f_full, ("baseline", "kpi.x"): f_base,
                          ("canary", "kpi.x"): f_canary}, index=idx)  # fmt: skip
    preds.columns = pd.MultiIndex.from_tuples(list(preds.columns))
    sl = np.flatnonzero(~np.isnan(y))
    measured = pd.DataFrame({"kpi.x": y[sl], "arm": np.where(is_c[sl], "candidate", "control")},
                            index=[idx[i] for i in sl])  # fmt: skip
    return preds, measured


def test_with_interference_the_rectifier_against_the_twin_s_canary_gets_the_fleet_s_change_and_the_old_one_flips_it():
    from edgetwin.loop.ppi import LOCAL, ppi_estimates

    reps, covered, old_wrong, new_right, hull_promotes = 200, 0, 0, 0, 0
    for r in range(reps):
        rng = np.random.default_rng(100 + r)
        y_b, y_full, y_slice, f_b, f_full, f_slice = _interference(rng)
        truth = float(np.mean(y_full) - np.mean(y_b))  # +0.04 (+20 %): the fleet's congestion
        sl = rng.choice(len(y_b), 30, replace=False)
        cand, ctrl = sl[:15], sl[15:]
        y = np.full(len(y_b), np.nan)
        y[cand], y[ctrl] = y_slice[cand], y_b[ctrl]  # what the canary measured
        is_c = np.zeros(len(y_b), bool)
        is_c[cand] = True
        f_canary = np.where(is_c, f_slice, f_b)  # the twin's replay of the canary's assignment
        preds, measured = _frames(f_full, f_b, f_canary, y, is_c)
        new = ppi_estimates(preds, measured, {"kpi.x": "lower"}, "candidate", "baseline", canary="canary")["kpi.x"]
        old = ppi_estimates(preds, measured, {"kpi.x": "lower"}, "candidate", "baseline")["kpi.x"]
        covered += abs(new["diff"] - truth) <= 1.645 * new["diff_se"]
        transported = {k: v for k, v in new.items() if not k.startswith(LOCAL)}
        v_new, _ = ppi_verdict({"kpi.x": transported}, [Guard("kpi.x", 0.05)], {"kpi.x": "lower"})
        v_old, _ = ppi_verdict({"kpi.x": old}, [Guard("kpi.x", 0.05)], {"kpi.x": "lower"})
        v_hull, _ = ppi_verdict({"kpi.x": new}, [Guard("kpi.x", 0.05)], {"kpi.x": "lower"})
        new_right += v_new == "refuse"
        old_wrong += v_old == "promote"
        hull_promotes += v_hull == "promote"
        assert old["diff"] < 0 < new["diff"]  # the old rectifier corrects the congestion away: wrong sign
        assert new[f"{LOCAL}diff"] == old["diff"]  # the no-interference estimate kept beside it is the old one
    assert covered / reps >= 0.85  # nominal 90 %
    assert new_right / reps >= 0.9 and old_wrong / reps >= 0.9
    # the verdict on the hull (does the candidate pass whether or not the interference is real?)
    # never promotes what congests the fleet: where the two estimates disagree it abstains
    assert hull_promotes == 0


def test_without_interference_the_twin_s_canary_changes_nothing():
    from edgetwin.loop.ppi import LOCAL, ppi_estimates

    rng = np.random.default_rng(7)
    y_b, y_full, _, f_b, f_full, _ = _interference(rng, slice_effect=0.04, fleet_effect=0.04)
    sl = rng.choice(len(y_b), 30, replace=False)
    is_c = np.zeros(len(y_b), bool)
    is_c[sl[:15]] = True
    y = np.full(len(y_b), np.nan)
    y[sl[:15]], y[sl[15:]] = y_full[sl[:15]], y_b[sl[15:]]
    preds, measured = _frames(f_full, f_b, np.where(is_c, f_full, f_b), y, is_c)
    new = ppi_estimates(preds, measured, {"kpi.x": "lower"}, "candidate", "baseline", canary="canary")["kpi.x"]
    old = ppi_estimates(preds, measured, {"kpi.x": "lower"}, "candidate", "baseline")["kpi.x"]
    assert {k: v for k, v in new.items() if not k.startswith(LOCAL)} == old
    assert all(new[f"{LOCAL}{k}"] == old[k] for k in ("diff", "diff_se", "rel_lo", "rel_hi"))  # the hull is the interval


def test_the_members_disagreement_on_the_interference_widens_the_interval_and_nothing_without_interference():

    from edgetwin.loop.ppi import interference_var, ppi_estimates

    rng = np.random.default_rng(3)
    y_b, _, y_slice, f_b, f_full, f_slice = _interference(rng)
    sl = rng.choice(len(y_b), 30, replace=False)
    is_c = np.zeros(len(y_b), bool)
    is_c[sl[:15]] = True
    y = np.full(len(y_b), np.nan)
    y[sl[:15]], y[sl[15:]] = y_slice[sl[:15]], y_b[sl[15:]]
    members = []
    for shift in (-0.02, 0.0, 0.02):  # three members: the same canary prediction, the full switch's congestion differs
        pr, measured = _frames(f_full + shift, f_b, np.where(is_c, f_slice, f_b), y, is_c)
        members.append(pr)
    mean = sum(members[1:], members[0]) / 3
    groups = list(measured.index)
    is_arm = (measured["arm"] == "candidate").to_numpy()
    v_diff, v_base = interference_var(members, is_arm, groups, "kpi.x", "candidate", "baseline", "canary")
    assert v_diff == pytest.approx(0.02**2 * (1 + 1 / 3)) and v_base == pytest.approx(0.0, abs=1e-15)
    plain = ppi_estimates(mean, measured, {"kpi.x": "lower"}, "candidate", "baseline", canary="canary")["kpi.x"]
    wide = ppi_estimates(mean, measured, {"kpi.x": "lower"}, "candidate", "baseline", canary="canary",
                         member_predictions=members)["kpi.x"]  # fmt: skip
    assert wide["diff"] == plain["diff"] and wide["diff_se"] ** 2 == pytest.approx(plain["diff_se"] ** 2 + v_diff)
    # no interference: every member's canary prediction is its full switch's on the arms: no widening
    same = [_frames(f_full + s, f_b + s, np.where(is_c, f_full + s, f_b + s), y, is_c)[0] for s in (-0.02, 0.0, 0.02)]
    assert interference_var(same, is_arm, groups, "kpi.x", "candidate", "baseline", "canary") == pytest.approx((0.0, 0.0), abs=1e-15)


def test_pooled_rounds_keep_both_ends_and_the_verdict_needs_both() -> None:
    """Rounds pooled by `combine_estimates` keep the no-interference estimate (``local:*``) beside the
    transporting one, and `ppi_verdict` passes a KPI only when both ends pass it: a transporting
    estimate that says *ok* while the no-interference one straddles is an abstention, and the
    interval reported is the hull."""
    from edgetwin.loop.ppi import LOCAL, combine_estimates, finish_estimate

    def est(diff: float, local_diff: float) -> dict[str, float]:
        e = finish_estimate(diff, 0.01**2, 1.0, 0.001**2)
        loc = finish_estimate(local_diff, 0.01**2, 1.0, 0.001**2)
        e.update({f"{LOCAL}{k}": loc[k] for k in ("diff", "diff_se", "base", "base_se", "rel", "rel_lo", "rel_hi")})
        e.update(twin_diff=0.0, twin_rel=0.0, n_fleet=60.0, n_candidate=3.0, n_control=3.0)
        return e

    agree = combine_estimates([est(-0.20, -0.18), est(-0.22, -0.21)])  # lower is better: both clearly better
    split = combine_estimates([est(-0.20, 0.04), est(-0.22, 0.06)])  # no interference: +5 %, at the margin
    assert f"{LOCAL}rel_lo" in agree and abs(agree[f"{LOCAL}diff"] + 0.195) < 1e-9
    g, better = [Guard("kpi.x", 0.05)], {"kpi.x": "lower"}
    assert ppi_verdict({"kpi.x": agree}, g, better)[0] == "promote"
    v, checks = ppi_verdict({"kpi.x": split}, g, better)
    assert v == "abstain" and checks[0].verdict == "straddle"
    assert checks[0].interval[0] == split["rel_lo"] and checks[0].interval[1] == split[f"{LOCAL}rel_hi"]
    only_transport = {k: x for k, x in split.items() if not k.startswith(LOCAL)}
    assert ppi_verdict({"kpi.x": only_transport}, g, better)[0] == "promote"


# ------------------------------------------------------------------ issue 48 item 2: small samples
def _small_canary_coverage(reps: int, seed: int) -> tuple[float, float]:
    """Coverage of the fleet-wide change by the 90 % PPI interval at the demo's arm sizes (4
    candidate, 6 control groups of a 100-group fleet; arms with unequal spreads), with the t
    reference (`welch_df`) and with the normal one the verdict used before."""
    from scipy import stats

    rng = np.random.default_rng(seed)
    t_hits = z_hits = 0
    for _ in range(reps):
        f_b = rng.gamma(4.0, 0.05, 100)
        f_c = f_b + 0.02 + rng.normal(0, 0.005, 100)
        bias_c, bias_b = 0.03, -0.01  # the twin is wrong on both arms, by different amounts
        cand, ctrl = np.split(rng.choice(100, 10, replace=False), [4])
        y_c = f_c[cand] + bias_c + rng.normal(0, 0.04, 4)
        y_b = f_b[ctrl] + bias_b + rng.normal(0, 0.01, 6)
        truth = float(np.mean(f_c - f_b)) + bias_c - bias_b  # the twin's fleet term is what it predicts
        e = ppi_mean_difference(f_c, f_b, y_c, f_c[cand], y_b, f_b[ctrl])
        half_t = (e["rel_hi"] - e["rel_lo"]) / 2 * abs(e["base"])  # back to KPI units (base_se is tiny)
        t_hits += abs(e["diff"] - truth) <= half_t
        z_hits += abs(e["diff"] - truth) <= stats.norm.ppf(0.95) * e["diff_se"]
    return t_hits / reps, z_hits / reps


def test_the_t_interval_covers_at_the_demos_arm_sizes_where_the_normal_one_does_not() -> None:
    t_cov, z_cov = _small_canary_coverage(3000, seed=48)
    assert 0.87 <= t_cov <= 0.96  # nominal 90 %, Monte-Carlo se ~0.55 pp
    assert z_cov < t_cov - 0.02 and z_cov < 0.87  # the normal reference under-covers with 4 and 6 groups


def test_welch_df_and_the_t_reference() -> None:
    from edgetwin.loop.ppi import finish_estimate, welch_df

    assert welch_df([(1.0, 3.0)]) == pytest.approx(3.0)
    assert welch_df([(1.0, 3.0), (1.0, 5.0)]) == pytest.approx(4.0 / (1 / 3 + 1 / 5))
    assert welch_df([(1.0, float("inf"))]) == float("inf")
    z = finish_estimate(0.0, 1.0, 100.0, 0.0)
    t = finish_estimate(0.0, 1.0, 100.0, 0.0, df=4.0)
    assert t["rel_hi"] > z["rel_hi"] * 1.25  # t_{0.95, 4} = 2.13 vs 1.645


def test_pooled_rounds_do_not_shrink_their_shared_terms_and_looks_spend_alpha() -> None:
    from edgetwin.loop.ppi import combine_estimates, finish_estimate, look_level

    def rnd(diff: float) -> dict[str, float]:
        e = finish_estimate(diff, 0.02**2, 1.0, 0.001**2, df=20.0)
        # the fleet and interference terms (shared by rounds) are 3/4 of the variance
        e.update(diff_var_shared=0.75 * 0.02**2, base_var_shared=0.0, twin_diff=0.0, twin_rel=0.0)
        return e

    one, two = combine_estimates([rnd(0.0)]), combine_estimates([rnd(0.0), rnd(0.0)])
    naive = 0.02 / np.sqrt(2)  # as if the rounds were independent
    assert two["diff_se"] > naive * 1.2 and two["diff_se"] < one["diff_se"]
    assert two["diff_se"] == pytest.approx(np.sqrt(0.75 * 0.02**2 + 0.25 * 0.02**2 / 2))
    assert look_level(0.9, 3) == pytest.approx(1 - 0.1 / 3) and look_level(0.9, 1) == pytest.approx(0.9)
    wide = combine_estimates([rnd(0.0)], look_level(0.9, 3))
    assert wide["rel_hi"] > one["rel_hi"] and wide["level"] == pytest.approx(1 - 0.1 / 3)


def test_one_cuped_slope_pooled_within_arms() -> None:
    from edgetwin.edge.canary_guard import cuped_slope

    rng = np.random.default_rng(0)
    x_c, x_b = rng.normal(0, 1, 4), rng.normal(0, 1, 6)
    y_c, y_b = 5.0 + 2.0 * x_c, 1.0 + 2.0 * x_b  # the arms differ by the effect, the slope is 2
    assert cuped_slope([x_c, x_b], [y_c, y_b]) == pytest.approx(2.0)
    assert cuped_slope([x_c[:1], x_b[:1]], [y_c[:1], y_b[:1]]) == 0.0  # too few groups: no adjustment
    assert cuped_slope([np.ones(4), np.ones(6)], [y_c, y_b]) == 0.0  # no spread in x


def test_the_day_to_day_variance_widens_the_interval_and_undecided_says_how_many_days() -> None:
    from types import SimpleNamespace

    from edgetwin.loop.rounds import days_needed

    rng = np.random.default_rng(1)
    f_b = rng.gamma(4.0, 0.05, 100)
    f_c = f_b + 0.01
    args = (f_c, f_b, f_c[:4] + rng.normal(0, 0.01, 4), f_c[:4], f_b[4:10] + rng.normal(0, 0.01, 6), f_b[4:10])
    day = ppi_mean_difference(*args, day_var=(0.02**2, 0.0), day_df=5.0)
    one = ppi_mean_difference(*args)
    assert day["diff_se"] > one["diff_se"] and day["diff_var_day"] == 0.02**2 and day["day_var"] == 0.02**2
    assert day["diff_var_shared"] == pytest.approx(one["diff_var_shared"])  # the day term is its own, not shared

    def check(change: float, lo: float, hi: float) -> SimpleNamespace:
        return SimpleNamespace(kpi="kpi.x", verdict="straddle", better="lower", change=change,
                               allowed_change=0.05, worsening_interval=[lo, hi])  # fmt: skip

    # point -0.05, margin +0.05: half-width 0.2 must shrink to 0.1, so 4x the days: 3 more
    assert "run 3 more day(s)" in days_needed([check(-0.05, -0.25, 0.15)], days=1)
    assert "sits on its margin" in days_needed([check(0.05, -0.1, 0.2)], days=1)
    assert "more than 365" in days_needed([check(0.049, -0.5, 0.6)], days=1)
