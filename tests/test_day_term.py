"""The verdict's day-to-day term (issue 48): the twin's replayed day spread calibrated by the logs'
observed spread of the baseline level, the rounds' own between-day variance once canaries ran on
several days (random-effects pooling, checked against statsmodels), and the plan and the verdict
reading the same term."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest


def _days(rng: np.random.Generator, n: int, shock_sd: float, level: float = 10.0, effect: float = 0.1,
          twin_sd: float = 0.05) -> tuple[np.ndarray, np.ndarray, np.ndarray, float]:
    """``n`` days of one KPI: a common multiplicative day shock (sd ``shock_sd``) that the logs show
    and the twin's replay does not; the twin's replay varies only by its own noise (sd
    ``twin_sd``), its change proportional to its level. Returns the twin's changes, the twin's
    levels, the logged levels (``(n, 1)`` each) and the true variance of the daily change."""
    shock = rng.normal(0.0, shock_sd, n)
    observed = level * (1.0 + shock) + rng.normal(0.0, twin_sd, n)
    twin_lvl = level + rng.normal(0.0, twin_sd, n)
    twin_chg = effect * twin_lvl + rng.normal(0.0, effect * twin_sd * 0.1, n)
    true_var = (effect * level * shock_sd) ** 2 + (effect * twin_sd) ** 2
    return twin_chg[:, None], twin_lvl[:, None], observed[:, None], true_var


def test_a_common_day_shock_the_twin_misses_is_recovered_from_the_logs() -> None:
    from edgetwin.loop.verdict import calibrated_day_variance

    rng = np.random.default_rng(3)
    chg, lvl, obs, true_var = _days(rng, 60, shock_sd=0.10)
    dv = calibrated_day_variance(chg, lvl, obs, ["k"])
    got, revealed = dv["k"], dv.revealed["k"]
    twin_only = float(np.var(chg[:, 0], ddof=1))
    assert twin_only < true_var / 50  # the replay alone understates it by far more than sampling error
    # 60 days: the variance's sampling error is about sqrt(2/59) = 18 %; 3 of them either way
    assert 0.45 * true_var < revealed < 1.55 * true_var
    assert got[0] >= revealed  # the first look carries the larger of it and the unrevealed bound
    assert got[2] == 59.0
    assert got[1] == pytest.approx(float(np.var(obs[:, 0], ddof=1)))


def test_without_day_shocks_the_term_is_the_twins() -> None:
    """The twin replays the days as the logs saw them: no inflation. Logs less variable than the
    replay (noise at 5 degrees of freedom): the twin's term is kept, never lowered."""
    from edgetwin.loop.verdict import calibrated_day_variance

    rng = np.random.default_rng(4)
    chg, lvl, _, _ = _days(rng, 6, shock_sd=0.0)
    same = calibrated_day_variance(chg, lvl, lvl, ["k"]).revealed["k"]
    assert same == pytest.approx(float(np.var(chg[:, 0], ddof=1)))
    calmer = lvl.mean() + 0.2 * (lvl - lvl.mean())
    kept = calibrated_day_variance(chg, lvl, calmer, ["k"]).revealed["k"]
    assert kept == pytest.approx(float(np.var(chg[:, 0], ddof=1)))
    # over many 6-day logs drawn like the twin's replay, the median inflation is about 1
    factors = []
    for _ in range(300):
        c, v, _, _ = _days(rng, 6, shock_sd=0.0)
        o = 10.0 + rng.normal(0.0, 0.05, (6, 1))
        factors.append(calibrated_day_variance(c, v, o, ["k"]).revealed["k"] / float(np.var(c[:, 0], ddof=1)))
    assert 1.0 <= float(np.median(factors)) < 1.3


def test_paule_mandel_matches_statsmodels() -> None:
    sm = pytest.importorskip("statsmodels.stats.meta_analysis")
    from edgetwin.loop.ppi import paule_mandel_tau2

    for y, v in (([0.1, 0.3, -0.2, 0.5], [0.01, 0.02, 0.015, 0.03]),
                 ([1.0, 1.1], [0.5, 0.4]),  # homogeneous: 0
                 ([0.02, -0.04, 0.09, 0.01, 0.12, -0.03, 0.05, 0.0], [4e-4, 9e-4, 5e-4, 6e-4, 1e-3, 3e-4, 7e-4, 8e-4])):  # fmt: skip
        want = sm.combine_effects(np.array(y), np.array(v), method_re="pm").tau2
        assert paule_mandel_tau2(y, v) == pytest.approx(want, rel=1e-4, abs=1e-12)  # statsmodels iterates to its own tolerance


def _round(day: int, diff: float, own: float, shared: float = 0.0, dayv: float = 0.0, df: float = 1e9) -> dict[str, float]:
    from edgetwin.loop.ppi import finish_estimate

    e = finish_estimate(diff, own + shared + dayv, 1.0, 1e-10, df=df)
    e.update(diff_var_shared=shared, diff_var_day=dayv, base_var_shared=0.0, base_var_day=0.0, day_df=5.0,
             twin_diff=0.0, twin_rel=0.0, day=float(day))  # fmt: skip
    return e


def test_rounds_on_several_days_pool_as_random_effects() -> None:
    """One round a day, no shared terms, the twin's day term below the rounds' own: the between-day
    variance is statsmodels' random-effects (Paule-Mandel) ``tau²``, and the pooled estimate is the
    days' plain mean (design weights, issue 48) with variance ``Σ (v_i + tau²) / k²``; the pooling
    before (``weighting="inverse_variance"``) is statsmodels' random-effects estimate and error."""
    sm = pytest.importorskip("statsmodels.stats.meta_analysis")
    from edgetwin.loop.ppi import combine_estimates

    y = [0.02, -0.04, 0.09, 0.01, 0.12, -0.03]
    v = [4e-4, 9e-4, 5e-4, 6e-4, 1e-3, 3e-4]
    res = sm.combine_effects(np.array(y), np.array(v), method_re="pm")
    rounds = [_round(d, a, b, dayv=1e-6) for d, (a, b) in enumerate(zip(y, v, strict=True))]
    got = combine_estimates(rounds)
    assert got["day_var_rounds"] == pytest.approx(res.tau2, rel=1e-6)
    assert got["diff"] == pytest.approx(float(np.mean(y)), rel=1e-12)
    assert got["diff_se"] == pytest.approx(float(np.sqrt(np.sum(np.array(v) + res.tau2))) / len(y), rel=1e-6)
    assert 5.0 <= got["df"] < 1e6  # the day term's k - 1 enters the t reference
    iv = combine_estimates(rounds, weighting="inverse_variance")
    assert iv["diff"] == pytest.approx(res.mean_effect_re, rel=1e-6)
    assert iv["diff_se"] == pytest.approx(res.sd_eff_w_re, rel=1e-6)
    # with the twin's day term the larger, it is kept (and the estimate is not random-effects')
    big = combine_estimates([_round(d, a, b, dayv=0.01) for d, (a, b) in enumerate(zip(y, v, strict=True))])
    assert big["diff_se"] > got["diff_se"] and big["day_var_twin"] == pytest.approx(0.01)


def test_the_rounds_day_term_restores_coverage_when_the_twin_understates_it() -> None:
    """8 canary days whose true change moves from day to day (sd 0.03) around 0, each measured
    with its own noise (sd 0.01) and a shared term, the twin's day term 100x too small: the pooled
    90 % interval covers the multi-day change about 90 % of the time with the rounds' term, far
    less with the twin's alone (the interval of the closed loop before this change)."""
    from edgetwin.loop import ppi

    rng = np.random.default_rng(7)
    runs, hit_re, hit_twin = 400, 0, 0
    for _ in range(runs):
        days = rng.normal(0.0, 0.03, 8)
        rounds = [_round(d, days[d] + rng.normal(0, 0.01), 0.01**2, shared=0.002**2, dayv=(0.003) ** 2, df=40.0)
                  for d in range(8)]  # fmt: skip
        a = ppi.combine_estimates(rounds, 0.9)
        hit_re += a["rel_lo"] <= 0.0 <= a["rel_hi"]
        terms = ppi._pool_terms(rounds, "diff")  # the twin's day term alone (the pooling before this change)
        tw = ppi.finish_estimate(terms[0], terms[1], 1.0, 1e-10, 0.9, df=40.0)
        hit_twin += tw["rel_lo"] <= 0.0 <= tw["rel_hi"]
    assert hit_re / runs >= 0.86
    assert hit_twin / runs < 0.6


def test_the_plan_and_the_verdict_carry_the_same_day_term(monkeypatch: pytest.MonkeyPatch) -> None:
    """Both read `edgetwin.loop.ppi.day_term`: the plan's expected interval and the verdict's
    estimate carry exactly the term it returns (patched here to a known value)."""
    import edgetwin.loop.ppi as ppi
    from edgetwin.loop.plan import PlanBudget, _expected_option

    rng = np.random.default_rng(0)
    agents = [f"g{i:02d}" for i in range(40)]
    fb = rng.normal(10.0, 1.0, 40)
    fc = fb + rng.normal(0.5, 0.2, 40)
    preds = pd.DataFrame({("candidate", "kpi.x"): fc, ("baseline", "kpi.x"): fb}, index=agents)
    preds.columns = pd.MultiIndex.from_tuples(list(preds.columns))
    seen: list[object] = []

    def patched(day_var: object, column: str) -> tuple[float, float, float]:
        seen.append(day_var)
        return (0.3, 0.2, 5.0)

    monkeypatch.setattr(ppi, "day_term", patched)
    day_var = {"kpi.x": (1e-9, 1e-9, 99.0)}
    check = SimpleNamespace(change=0.05, better="lower", allowed_change=0.05, worsening_interval=[0.0, 0.1],
                            interval=[0.0, 0.1], abstain_reason=lambda _m: "straddles")  # fmt: skip
    decision = SimpleNamespace(max_out_of_support=0.2)
    kdefs = {"x": SimpleNamespace(stat="mean", weight=None, column="kpi.x")}
    _, _, _, planned = _expected_option(decision, {"x": check}, kdefs, preds, {("kpi.x", 8.0): 1.0}, PlanBudget(),
                                        40, 8, 8.0, "random", day_var)  # fmt: skip
    n_c = n_b = 4
    terms = [(float(np.var(fc - fb, ddof=1)) / 40, 39), (1.0 / n_c, n_c - 1), (1.0 / n_b, n_b - 1), (0.3, 5.0)]
    # the verdict's interval division (planbase15): the baseline level's day term (0.2) divides too
    base = abs(float(np.mean(fb)))
    want = ppi.finish_estimate(0.05 * base, sum(v for v, _ in terms), base,
                               float(np.var(fb, ddof=1)) / 40 + 1.0 / n_b + 0.2, ppi.LEVEL, df=ppi.welch_df(terms))
    assert planned[0].expected == pytest.approx([want["rel_lo"], want["rel_hi"]], rel=1e-9)

    measured = pd.DataFrame({"arm": ["candidate"] * 4 + ["control"] * 4,
                             "kpi.x": rng.normal(10.0, 1.0, 8)}, index=agents[:8])  # fmt: skip
    est = ppi.ppi_estimates(preds, measured, {"kpi.x": "lower"}, "candidate", "baseline", day_var=day_var)["kpi.x"]
    assert est["diff_var_day"] == pytest.approx(0.3) and est["day_df"] == 5.0
    assert seen == [day_var, day_var, day_var]  # the plan's change and baseline terms (planbase15), the verdict
