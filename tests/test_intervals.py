"""Calibrated intervals: coverage on a toy where the truth is known, and the conformal rank."""

from __future__ import annotations

import math

import numpy as np
import pytest

from edgetwin.twin.intervals import (
    Calibration,
    calibration_from_arrays,
    change_interval,
    conformal_quantile,
    interval,
    kpi_scale,
)


def test_conformal_quantile_rank_and_small_samples() -> None:
    # n = 19 scores 1..19: the ceil(20 * 0.9) = 18th smallest
    q, exact = conformal_quantile(np.arange(1.0, 20.0), 0.9)
    assert q == 18.0 and exact
    # too few scores for the finite-sample rank: the largest, flagged as not exact
    q, exact = conformal_quantile([0.1, 0.3, 0.2], 0.9)
    assert q == 0.3 and not exact
    q, exact = conformal_quantile([float("nan")], 0.9)
    assert math.isnan(q) and not exact


def _toy_twin(rng: np.random.Generator, truth: float, members: int = 5, reps: int = 4) -> np.ndarray:
    """A biased twin: every member is off by a shared relative bias (what the bootstrap cannot see)
    plus its own small error, and each replicate adds noise."""
    bias = rng.normal(0.0, 0.15)
    member = rng.normal(0.0, 0.02, size=(members, 1))
    noise = rng.normal(0.0, 0.02, size=(members, reps))
    return truth * (1.0 + bias + member + noise)


def test_calibrated_interval_covers_the_truth_on_a_toy_where_the_bootstrap_does_not() -> None:
    """Calibrated as production calibrates (`calibration_from_arrays`, what `calibrate` and the
    what-if run call): the replayed held-out episodes' ``(M, R)`` values, replicates cycling over
    the episodes, each replicate's *ensemble mean* scored against the logged KPI."""
    rng = np.random.default_rng(0)
    # 100 episodes: the replicates of one episode share its bias, so the quantile rests on ~100
    # independent draws; with 40 the coverage given one calibration spreads by ±5 points (0.84-0.95
    # over seeds 0-5), with 100 it is 0.89-0.97
    n_eps, reps = 100, 4
    truths = rng.uniform(5.0, 50.0, n_eps)
    runs = [_toy_twin(rng, t, reps=reps) for t in truths]  # (members, reps) per episode
    # replicate r replays episode r % n_eps (seed-major), as run_whatif lays them out
    values = np.stack([runs[r % n_eps][:, r // n_eps] for r in range(n_eps * reps)], axis=1)
    cal = calibration_from_arrays({"kpi": values}, {"kpi": truths})
    # the ensemble's answer per *episode* (its replicates averaged: they share its bias, so they are
    # one independent sample, not four): what is scored
    centre = np.array([values[:, e::n_eps].mean() for e in range(n_eps)])
    # floored at the KPI's scale (`kpi_scale` of the per-(member, episode) answers): the levels here
    # span 5-50, so the smaller ones are below it and read in its units (issue 44's score)
    per_member = np.stack([values[:, e::n_eps].mean(axis=1) for e in range(n_eps)], axis=1)
    s = kpi_scale(per_member)
    assert cal.scale["kpi"] == pytest.approx(s) and cal.score == "floored"
    assert sorted(cal.scores["kpi"]) == pytest.approx(sorted(np.abs(truths - centre) / np.maximum(centre, s)))
    assert len(cal.scores["kpi"]) == n_eps and cal.n_independent["kpi"] == n_eps and cal.exact["kpi"]
    covered = plain = 0
    trials = 300
    for i in range(trials):
        truth = rng.uniform(5.0, 50.0)
        v = _toy_twin(rng, truth)
        lo, hi = interval(v, cal, "kpi", seed=i)
        covered += lo <= truth <= hi
        lo0, hi0 = interval(v, None, "kpi", seed=i)
        plain += lo0 <= truth <= hi0
    assert covered / trials >= 0.85  # the calibrated interval is valid
    assert plain / trials < 0.5  # the plain bootstrap covers the twin's mean, not the truth
    assert cal.width("unknown") == 0.0


def test_change_interval_widens_by_both_numbers_error() -> None:
    cal = Calibration(quantile={"k": 0.1}, method="relative")
    lo, hi = change_interval((-0.02, 0.02), candidate=110.0, baseline=100.0, calibration=cal, kpi="k")
    w = 0.1 * math.hypot(110.0, 100.0) / 100.0
    assert lo == pytest.approx(-0.02 - w) and hi == pytest.approx(0.02 + w)
    # hybrid (the default): the relative error applied to the change, plus q_norm x the members' spread
    hyb = Calibration(quantile={"k": 0.1}, quantile_norm={"k": 2.0})
    va = np.array([[110.0, 110.0], [114.0, 114.0]])  # two members: changes +10 % and +14 %
    vb = np.full((2, 2), 100.0)
    lo, hi = change_interval((0.10, 0.14), va, vb, hyb, "k")
    w = 0.1 * 0.12 + 2.0 * np.std([0.10, 0.14], ddof=1)
    assert lo == pytest.approx(0.10 - w) and hi == pytest.approx(0.14 + w)
    assert change_interval((-0.02, 0.02), 110.0, 100.0, None, "k") == (-0.02, 0.02)
    assert change_interval((-0.02, 0.02), 110.0, 0.0, cal, "k") == (-0.02, 0.02)
    back = Calibration.from_dict(cal.to_dict())
    assert back.width("k") == pytest.approx(0.1)


@pytest.fixture(scope="module")
def small() -> dict:
    import torch

    from edgetwin.emulator.cluster import ClusterConfig
    from edgetwin.emulator.logs import generate_logs
    from edgetwin.twin.twin import Twin

    torch.set_num_threads(1)
    cfg = ClusterConfig(n_agents=24, steps=10)
    log, spec = generate_logs(cfg, episodes=3, policy="random", seed=11)
    twin = Twin.fit(log, spec, members=2, seed=0, progress=False, population_model="empirical", response_model="bc",
                    bc_epochs=4)  # fmt: skip
    held, _ = generate_logs(cfg, episodes=4, policy="random", seed=12)
    return {"twin": twin, "held": held}


def test_calibration_scores_the_ensemble_against_the_logged_kpis(small: dict) -> None:
    from edgetwin.twin.calibration import calibration_from_result
    from edgetwin.twin.whatif import builtin_policy, run_whatif

    twin, held = small["twin"], small["held"]
    res = run_whatif(twin, [builtin_policy("logged", twin)], [], episodes=4, seeds=1, log=held, progress=False)
    # replaying the log's own actions calibrates the run by default
    assert res.calibration is not None and "return" in res.calibration.quantile
    cal = calibration_from_result(res)
    v = res.cell("logged", "nominal").values["return"]
    y = res.logged_kpis["return"]
    centre = v.mean(axis=0)
    # the floored score: the error over max(|ŷ|, s), s the KPI's scale over the (member, episode) answers
    manual = np.sort(np.abs(y - centre) / np.maximum(np.abs(centre), kpi_scale(v)))
    assert sorted(cal.scores["return"]) == pytest.approx(list(manual))
    assert cal.quantile["return"] == pytest.approx(manual[-1])  # 4 scores: too few for the rank, the largest
    assert not cal.exact["return"]
    s = res.summary("logged", "nominal", "return")
    lo, hi = s["interval"]
    plain = interval(v, None, "return", seed=0)
    assert lo <= plain[0] and hi >= plain[1] and lo <= s["mean"] <= hi  # the bootstrap's, widened


def test_held_out_coverage_is_cross_fitted(small: dict) -> None:
    from edgetwin.twin.calibration import held_out_coverage

    cov = held_out_coverage(small["twin"], small["held"], episodes=4, seeds=1)
    assert cov["episodes"] == 4 and 0.0 <= cov["coverage"] <= 1.0 and 0.0 <= cov["coverage_plain"] <= 1.0
    # cross-fitted: in each fold the calibration and test episodes are disjoint, and every episode
    # is tested exactly once
    episodes = set(small["held"]["episode"].astype(str).unique())
    tested: list[str] = []
    for fold in cov["folds"]:
        assert not set(fold["calibrate"]) & set(fold["test"]), fold
        assert set(fold["calibrate"]) | set(fold["test"]) == episodes and fold["calibrate"]
        tested += fold["test"]
    assert sorted(tested) == sorted(episodes)
    assert set(cov["per_kpi"]) >= {"return"}
    # calibrated intervals contain the plain bootstrap ones: they cover at least as often
    assert cov["coverage"] >= cov["coverage_plain"]


def test_cross_fitting_keeps_an_episode_out_of_its_own_calibration() -> None:
    """An episode whose logged KPI is far off every member's answer: calibrated on the other
    episodes it is not covered; were it in its own calibration (folds that are not disjoint), its
    own score would widen its interval to cover it. The check `held_out_coverage` relies on."""
    from edgetwin.twin.calibration import cross_fitted_hits, two_folds

    rng = np.random.default_rng(5)
    n_eps, members, reps = 6, 3, 12
    truth = rng.uniform(10.0, 20.0, n_eps)
    truth[3] *= 50.0  # the outlier
    ep_of_rep = np.arange(reps) % n_eps
    base = np.where(np.arange(n_eps) == 3, truth / 50.0, truth)
    values = base[ep_of_rep] * (1.0 + rng.normal(0.0, 0.05, (members, reps)))
    folds = two_folds(n_eps)
    for cal, test in folds:
        assert not set(cal) & set(test)
    assert sorted(np.concatenate([t for _, t in folds]).tolist()) == list(range(n_eps))
    hits, _ = cross_fitted_hits(values, truth, ep_of_rep, "kpi", folds)
    tested = np.concatenate([t for _, t in folds])
    assert not hits[int(np.flatnonzero(tested == 3)[0])]  # the outlier, calibrated without itself
    leaky = [(np.arange(n_eps), np.arange(n_eps))]
    hits_leaky, _ = cross_fitted_hits(values, truth, ep_of_rep, "kpi", leaky)
    assert hits_leaky[3]  # ... and covered by its own score: what disjoint folds prevent
