"""Tests of the generic platform policies in `edgetwin.twin.policy`."""

from __future__ import annotations

import numpy as np
import pytest

from edgetwin.twin.policy import FunctionPolicy, NoisyPolicy, RandomPolicy
from edgetwin.twin.spec import Feature, TwinSpec


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
