"""Prediction-powered verdict: valid when the twin is biased, where the twin alone is not."""

import numpy as np
import pytest

from edgetwin.contract.errors import InputError
from edgetwin.policies.gate import Guard
from edgetwin.policies.ppi import ppi_mean_difference, ppi_verdict


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
