"""Tests of the generic platform policies in `edgetwin.contract.policy`."""

from __future__ import annotations

import numpy as np
import pytest

from edgetwin.contract.policy import FunctionPolicy, NoisyPolicy, RandomPolicy, RegimePolicy
from edgetwin.contract.spec import Feature, TwinSpec


def _spec() -> TwinSpec:
    return TwinSpec(
        features=[
            Feature("profile.size", "continuous"),
            Feature("action.share", "continuous", low=0.0, high=1.0),
            Feature("action.price", "continuous", low=0.0, high=2.0),
        ]
    )


def test_random_policy_stays_in_bounds_and_is_seeded() -> None:
    spec = _spec()
    obs = np.zeros((500, 1))
    a = RandomPolicy(spec, seed=3).act(obs)
    assert a.shape == (500, 2)
    assert (a >= [0.0, 0.0]).all() and (a <= [1.0, 2.0]).all()
    np.testing.assert_array_equal(a, RandomPolicy(spec, seed=3).act(obs))


def test_noisy_policy_is_centred_on_its_base_clipped_and_seeded() -> None:
    spec = _spec()
    base = FunctionPolicy(lambda o: np.tile([0.5, 1.0], (len(o), 1)))
    obs = np.zeros((20_000, 1))
    a = NoisyPolicy(base, spec, scale=0.1, seed=7).act(obs)
    assert (a >= [0.0, 0.0]).all() and (a <= [1.0, 2.0]).all()
    # noise sd = scale x bound width: 0.1 on [0, 1], 0.2 on [0, 2]; far from the bounds, so barely clipped
    np.testing.assert_allclose(a.mean(axis=0), [0.5, 1.0], atol=0.01)
    np.testing.assert_allclose(a.std(axis=0), [0.1, 0.2], rtol=0.05)
    np.testing.assert_array_equal(a, NoisyPolicy(base, spec, scale=0.1, seed=7).act(obs))
    assert not np.array_equal(a, NoisyPolicy(base, spec, scale=0.1, seed=8).act(obs))
    np.testing.assert_array_equal(NoisyPolicy(base, spec, scale=0.0).act(obs[:5]), base.act(obs[:5]))
    with pytest.raises(ValueError, match="scale"):
        NoisyPolicy(base, spec, scale=-1.0)


def test_regime_policy_moves_everyone_the_same_way_within_a_regime_and_covers_the_bounds() -> None:
    spec = TwinSpec(features=[*_spec().features, Feature("action.tier", "discrete", low=0, high=9,
                                                         values=tuple(float(v) for v in range(10)))])
    obs = np.zeros((200, 1))
    pol = RegimePolicy(spec, seed=5, every=4, width=0.3)
    ticks = np.stack([pol.act(obs) for _ in range(400)])  # (tick, agent, action)
    assert ((ticks[..., :2] >= [0.0, 0.0]) & (ticks[..., :2] <= [1.0, 2.0])).all()
    regimes = ticks.reshape(100, 4 * 200, 3)  # 100 regimes of 4 ticks
    # within a regime: a box of 0.3 x the range, and 3 of the 10 discrete values
    spans = regimes[..., :2].max(axis=1) - regimes[..., :2].min(axis=1)
    assert (spans <= [0.3 + 1e-12, 0.6 + 1e-12]).all() and (spans > [0.28, 0.56]).all()
    assert all(len(np.unique(r[:, 2])) == 3 for r in regimes)
    # across regimes the whole range is used, and the population's mean action moves far more than
    # under uniform actions (whose mean over 200 agents has sd ~0.02 on [0, 1])
    assert ticks[..., 0].min() < 0.05 and ticks[..., 0].max() > 0.95
    assert set(np.unique(ticks[..., 2])) == set(range(10))
    assert ticks[..., 0].mean(axis=1).std() > 0.15
    assert ticks[..., 0].mean(axis=1).std() > 5 * np.stack([RandomPolicy(spec, 1).act(obs) for _ in range(400)])[
        ..., 0].mean(axis=1).std()
    again = RegimePolicy(spec, seed=5, every=4, width=0.3)
    np.testing.assert_array_equal(ticks[:9], np.stack([again.act(obs) for _ in range(9)]))
    with pytest.raises(ValueError, match="every"):
        RegimePolicy(spec, every=0)
    with pytest.raises(ValueError, match="width"):
        RegimePolicy(spec, width=0.0)
