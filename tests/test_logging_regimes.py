"""Logs a real operator has: several schedulers one after the other, and randomized trials, every
row with its ``policy`` and ``propensity``."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.stats import norm

from edgetwin.contract.errors import InputError
from edgetwin.contract.policy import FunctionPolicy, NoisyPolicy, RandomPolicy, act_logged
from edgetwin.contract.spec import Feature, TwinSpec
from edgetwin.contract.validate import validate_log
from edgetwin.emulator.cluster import ClusterConfig
from edgetwin.emulator.logs import Regime, generate_logs

SMALL = ClusterConfig(n_agents=30, steps=6)


def test_noisy_policy_density_is_the_clipped_gaussian() -> None:
    spec = TwinSpec((Feature("state.x"), Feature("action.a", low=0.0, high=1.0)))
    pol = NoisyPolicy(FunctionPolicy(lambda o: np.full((len(o), 1), 0.95)), spec, 0.1, seed=0)
    a, p = pol.act_logged(np.zeros((4000, 1)))
    inside = a[:, 0] < 1.0
    assert np.allclose(p[inside], norm.pdf(a[inside, 0], 0.95, 0.1))
    # the tail clipped onto the bound is a point mass of P(noise > 0.05)
    assert np.allclose(p[~inside], norm.sf(0.5)) and abs((~inside).mean() - norm.sf(0.5)) < 0.03
    # the same draws as act() (so logs written before propensities existed are unchanged)
    again = NoisyPolicy(FunctionPolicy(lambda o: np.full((len(o), 1), 0.95)), spec, 0.1, seed=0)
    assert np.array_equal(again.act(np.zeros((4000, 1))), a)


def test_propensity_of_uniform_and_deterministic_policies() -> None:
    spec = TwinSpec((Feature("state.x"), Feature("action.a", low=0.0, high=4.0), Feature("action.b", "binary")))
    _, p = act_logged(RandomPolicy(spec, 0), np.zeros((5, 1)), spec)
    assert np.allclose(p, 1 / 4 * 1 / 2)
    _, p = act_logged(FunctionPolicy(lambda o: np.zeros((len(o), 2))), np.zeros((5, 1)), spec)
    assert np.isnan(p).all()  # deterministic over a continuous action: no density
    discrete = TwinSpec((Feature("state.x"), Feature("action.b", "binary")))
    _, p = act_logged(FunctionPolicy(lambda o: np.zeros((len(o), 1))), np.zeros((5, 1)), discrete)
    assert np.allclose(p, 1.0)


def test_regimes_and_a_randomized_trial_are_logged_with_their_policy() -> None:
    regimes = [
        Regime("heuristic", 2, noise=0.1),
        Regime("random", 1, name="v2"),
        Regime("heuristic", 2, noise=0.1, arms={"arm-random": "random", "arm-heuristic": "heuristic"}, arm_share=0.4),
    ]
    log, spec = generate_logs(SMALL, regimes=regimes, seed=5)
    by_ep = log.groupby("episode")["policy"].unique()
    assert list(by_ep[0]) == ["heuristic+noise0.1"] and list(by_ep[2]) == ["v2"]
    for e in (3, 4):
        day = log[log["episode"] == e]
        assert set(day["policy"]) == {"heuristic+noise0.1", "arm-random", "arm-heuristic"}
        # an agent keeps its arm all day; about 40 % of them are in the trial
        assert (day.groupby("agent")["policy"].nunique() == 1).all()
        share = (day.groupby("agent")["policy"].first() != "heuristic+noise0.1").mean()
        assert 0.15 < share < 0.65
    prop = log.groupby("policy")["propensity"]
    assert prop.apply(lambda p: p.isna().all())["arm-heuristic"]  # deterministic: unknown
    low, high = spec.bounds("action")
    assert np.allclose(prop.first()[["v2", "arm-random"]], 1 / np.prod(high - low))
    assert (log.loc[log["policy"] == "heuristic+noise0.1", "propensity"] > 0).all()
    report = validate_log(log, spec)
    assert report.usable and report.n_quarantined == 0
    assert report.policies == ("arm-heuristic", "arm-random", "heuristic+noise0.1", "v2")
    # the same seed gives the same log; the trial's draw depends on the seed
    again, _ = generate_logs(SMALL, regimes=regimes, seed=5)
    assert again.equals(log)
    other, _ = generate_logs(SMALL, regimes=regimes, seed=6)
    assert not other["policy"].equals(log["policy"])


def test_bad_regimes_are_input_errors() -> None:
    with pytest.raises(InputError, match="days"):
        generate_logs(SMALL, regimes=[Regime("heuristic", 0)])
    with pytest.raises(InputError, match="arm_share"):
        generate_logs(SMALL, regimes=[Regime("heuristic", 1, arms={"x": "random"}, arm_share=0.0)])
    with pytest.raises(InputError, match="at least one"):
        generate_logs(SMALL, regimes=[])
