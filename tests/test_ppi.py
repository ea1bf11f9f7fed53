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


def test_small_arms_get_a_welch_t_interval_that_covers_at_its_level() -> None:
    """4 candidate and 6 control groups (the demo's canary): the normal reference covered 85 % at a
    stated 90 %; the Welch-Satterthwaite t reference covers the level (a twin biased on both the level
    and the effect, so only the rectifier makes it right)."""
    from scipy import stats

    from edgetwin.loop.ppi import finish_estimate, welch_df

    rng = np.random.default_rng(0)
    n, theta, runs = 100, 0.3, 2000
    hits_t = hits_z = 0
    for _ in range(runs):
        base = rng.normal(1.0, 0.5, n)
        fb, fc = base + 0.2, base + 0.3  # the twin: 0.2 too high, and an effect of 0.1 instead of 0.3
        order = rng.permutation(n)
        c, b = order[:4], order[4:10]
        yc, yb = base[c] + theta + rng.normal(0, 0.3, 4), base[b] + rng.normal(0, 0.3, 6)
        out = ppi_mean_difference(fc, fb, yc, fc[c], yb, fb[b])
        truth = theta / abs(float(np.mean(base)))
        hits_t += out["rel_lo"] <= truth <= out["rel_hi"]
        z = finish_estimate(out["diff"], out["diff_se"] ** 2, out["base"], out["base_se"] ** 2)  # df = inf: normal
        hits_z += z["rel_lo"] <= truth <= z["rel_hi"]
        assert 3.0 < out["df"] < 10.0  # about n_c + n_b - 2, not infinite
    assert hits_t / runs >= 0.88 and hits_z / runs < hits_t / runs
    # the degrees of freedom: two equal terms of 3 and 5 df -> Welch-Satterthwaite's 7.5; a known term adds none
    assert welch_df([(1.0, 3.0), (1.0, 5.0)]) == pytest.approx(4.0 / (1 / 3 + 1 / 5))
    assert welch_df([(1.0, float("inf"))]) == float("inf")
    assert stats.t.ppf(0.95, 5) > 2.0  # what z = 1.645 was standing in for
