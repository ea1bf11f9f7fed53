"""The logs' support index: calibrated on unseen episodes, and actions judged in their context."""

from __future__ import annotations

import numpy as np

from edgetwin.twin.support import SupportIndex

P, S, A, AGENTS, T = 6, 3, 2, 40, 30


def _episode(rng: np.random.Generator, policy: str) -> np.ndarray:
    """``(AGENTS * T, P + S + A)`` rows of one day: new agents (profiles), slowly moving states, and
    a scheduler that acts on the context with a little noise in (-1, 1) (``"logging"``) or uniformly at
    random over its whole action box [-2, 2] (``"random"``)."""
    profile = rng.normal(size=(AGENTS, P))
    state = np.cumsum(rng.normal(scale=0.1, size=(T, AGENTS, S)), axis=0)
    ctx = np.concatenate([np.broadcast_to(profile, (T, AGENTS, P)), state], axis=2).reshape(-1, P + S)
    if policy == "logging":
        action = np.tanh(ctx[:, :A] + ctx[:, P : P + A]) + rng.normal(scale=0.05, size=(len(ctx), A))
    else:
        action = rng.uniform(-2.0, 2.0, size=(len(ctx), A))
    return np.concatenate([ctx, action], axis=1)


def test_unseen_logged_days_are_inside_and_unlogged_actions_outside() -> None:
    rng = np.random.default_rng(0)
    days = [_episode(rng, "logging") for _ in range(6)]
    z, groups = np.concatenate(days), np.repeat(np.arange(6), AGENTS * T)
    idx = SupportIndex.fit(z, seed=0, groups=groups, n_action=A)
    new_day = _episode(np.random.default_rng(1), "logging")
    random_day = _episode(np.random.default_rng(1), "random")  # the same agents and states, other actions
    assert idx.outside(new_day).mean() < 0.08  # two 99th percentiles, estimated on 6 days
    assert idx.outside(random_day).mean() > 0.5
    assert np.all(idx.score(random_day) >= 0.0) and idx.outside(z[:10]).dtype == bool
    # the nearest-other-row rule (no episodes given) mistakes an agent's adjacent ticks for support
    # and flags a large share of the logging policy's own unseen day
    assert SupportIndex.fit(z, seed=0).outside(new_day).mean() > 0.2
    # in the joint space (no action block) the many context columns hide the action: random passes
    assert SupportIndex.fit(z, seed=0, groups=groups).outside(random_day).mean() < 0.2


def test_support_index_round_trips_through_arrays() -> None:
    rng = np.random.default_rng(2)
    z = np.concatenate([_episode(rng, "logging") for _ in range(3)])
    idx = SupportIndex.fit(z, seed=0, groups=np.repeat(np.arange(3), AGENTS * T), n_action=A)
    back = SupportIndex.from_arrays(idx.to_arrays())
    probe = _episode(np.random.default_rng(3), "random")
    assert np.array_equal(back.outside(probe), idx.outside(probe))
    assert (back.threshold, back.action_threshold, back.n_action) == (idx.threshold, idx.action_threshold, A)
