"""The safety shield: projection, masks, wrappers; a property test that nothing infeasible passes."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays
from stable_baselines3.common.vec_env import DummyVecEnv

from edgetwin.contract.errors import InputError
from edgetwin.contract.spec import Feature, TwinSpec
from edgetwin.policies.shield import (
    Budget,
    MigrationCap,
    Residency,
    Shield,
    ShieldConfig,
    ShieldVecEnvWrapper,
    ShieldWrapper,
    SLOGuard,
    violations,
)

SPEC = TwinSpec(
    features=(
        Feature("profile.tag", kind="discrete", values=(0, 1)),
        Feature("state.demand", low=0.0, high=2.0),
        Feature("state.site", kind="discrete", values=(0, 1)),
        Feature("state.placement", kind="discrete", values=(0, 1, 2)),
        Feature("state.capacity", low=0.0, high=10.0),
        Feature("action.cpu", low=0.0, high=4.0),
        Feature("action.offload", low=0.0, high=1.0),
        Feature("action.node", kind="discrete", values=(0, 1, 2)),
    ),
    step_seconds=20.0,
)
CONFIG = ShieldConfig(
    budgets=[
        Budget("capacity", {"action.cpu": 1.0}, limit_column="state.capacity", group_by="state.site"),
        Budget("energy", {"action.cpu": 30.0, "action.offload": 5.0}, limit=400.0, per_row_offset=10.0),
    ],
    guards=[
        SLOGuard("action.cpu", "state.demand", margin=0.15),
        SLOGuard("action.offload", "state.demand", margin=0.10, kind="offload", capacity=1.0),
    ],
    migration=[MigrationCap("action.node", current="state.placement", max_moves=2, window_s=60.0)],
    residency=[Residency("action.node", "profile.tag", {1.0: (0.0, 1.0)})],
)


def _obs(rng: np.random.Generator, n: int) -> np.ndarray:
    return np.column_stack(
        [
            rng.integers(0, 2, n),
            rng.uniform(0, 2, n),
            rng.integers(0, 2, n),
            rng.integers(0, 3, n),
            rng.uniform(0, 10, n),
        ]
    ).astype(float)


def test_projection_by_hand() -> None:
    spec = TwinSpec(features=(Feature("state.d", low=0, high=10), Feature("action.a", low=0, high=5)))
    shield = Shield(spec, ShieldConfig(budgets=[Budget("cap", {"action.a": 1.0}, limit=4.0)]))
    # Euclidean projection of (3, 3, -1) onto {0<=a<=5, sum<=4}: subtract λ=1 -> (2, 2, 0)
    out = shield.project(np.zeros((3, 1)), np.array([[3.0], [3.0], [-1.0]]))
    np.testing.assert_allclose(out[:, 0], [2.0, 2.0, 0.0], atol=1e-9)
    # an SLO guard of 10 % on demand 1 raises 0.2 to 1.1
    guard = Shield(spec, ShieldConfig(guards=[SLOGuard("action.a", "state.d", margin=0.1)]))
    assert guard.project(np.array([[1.0]]), np.array([[0.2]]))[0, 0] == pytest.approx(1.1)


def test_guard_yields_to_budget_and_is_counted() -> None:
    spec = TwinSpec(features=(Feature("state.d", low=0, high=10), Feature("action.a", low=0, high=5)))
    cfg = ShieldConfig(
        budgets=[Budget("cap", {"action.a": 1.0}, limit=2.0)], guards=[SLOGuard("action.a", "state.d")]
    )
    shield = Shield(spec, cfg)
    out = shield.project(np.array([[2.0], [2.0]]), np.array([[0.0], [0.0]]))  # guards want 2.2 each
    assert out.sum() == pytest.approx(2.0) and out[0, 0] == pytest.approx(out[1, 0])
    assert shield.stats["guard_relaxed"] == 1


def test_migration_cap_and_residency_masks() -> None:
    shield = Shield(SPEC, CONFIG)
    obs = np.array([[0, 0.1, 0, 0, 10.0], [1, 0.1, 0, 0, 10.0]])
    want = np.array([[0.5, 0.5, 2.0], [0.5, 0.5, 2.0]])
    out = shield.project(obs, want)
    assert out[0, 2] == 2.0 and out[1, 2] == 1.0  # tag 1 may not use node 2: nearest allowed is 1
    masks = shield.action_masks(obs)
    np.testing.assert_array_equal(masks, [[True, True, True], [True, True, False]])
    # agent 0 moves twice within a minute (20 s steps): the third move is blocked
    shield.reset()
    moves = []
    for t in range(4):
        cur = float(t % 2)
        o = np.array([[0, 0.1, 0, cur, 10.0]])
        moves.append(shield.project(o, np.array([[0.5, 0.5, 1.0 - cur]]))[0, 2] != cur)
    assert moves == [True, True, False, True]  # 4th step: the first move left the 60 s window
    assert shield.stats["migrations_blocked"] == 1


def test_bad_config_names_the_column() -> None:
    with pytest.raises(InputError, match="action.nope"):
        Shield(SPEC, ShieldConfig(budgets=[Budget("cap", {"action.nope": 1.0}, limit=1.0)]))
    with pytest.raises(InputError, match="must be discrete"):
        Shield(SPEC, ShieldConfig(migration=[MigrationCap("action.cpu")]))
    with pytest.raises(InputError, match="margin"):
        Shield(SPEC, ShieldConfig(guards=[SLOGuard("action.cpu", "state.demand", margin=1.5)]))
    assert ShieldConfig.from_dict(CONFIG.to_dict()) == CONFIG


@settings(max_examples=150, deadline=None)
@given(
    seed=st.integers(0, 2**31 - 1),
    n=st.integers(1, 12),
    steps=st.integers(1, 5),
    scale=st.floats(0.1, 100.0),
    nan=st.booleans(),
)
def test_no_infeasible_action_passes(seed: int, n: int, steps: int, scale: float, nan: bool) -> None:
    rng = np.random.default_rng(seed)
    shield = Shield(SPEC, CONFIG)
    for _ in range(steps):
        obs = _obs(rng, n)
        proposed = rng.normal(0, scale, size=(n, 3))
        if nan:
            proposed[rng.integers(0, n), rng.integers(0, 3)] = np.nan
        before = violations(shield, obs, shield.project(obs, proposed, advance=False))
        assert before == []
        safe = shield.project(obs, proposed)
        assert np.isfinite(safe).all()
        # guards hold wherever the budgets leave room for them
        if shield.stats["guard_relaxed"] == 0:
            lo = shield.lower_bounds(obs)
            assert (safe[:, :2] >= lo[:, :2] - 1e-9).all()


@settings(max_examples=60, deadline=None)
@given(actions=arrays(np.float64, (6, 3), elements=st.floats(-1e6, 1e6)))
def test_projection_is_idempotent(actions: np.ndarray) -> None:
    shield = Shield(
        SPEC, ShieldConfig(budgets=CONFIG.budgets, guards=CONFIG.guards, residency=CONFIG.residency)
    )
    obs = _obs(np.random.default_rng(0), 6)
    once = shield.project(obs, actions)
    np.testing.assert_allclose(shield.project(obs, once), once, atol=1e-6)


class _AgentEnv(gym.Env):
    """One agent: obs is SPEC's observation, reward 0; records the actions it receives."""

    def __init__(self, seed: int) -> None:
        self.observation_space = gym.spaces.Box(-np.inf, np.inf, (5,), np.float64)
        self.action_space = gym.spaces.Box(np.array([0, 0, 0.0]), np.array([4, 1, 2.0]), dtype=np.float64)
        self.rng = np.random.default_rng(seed)
        self.received: list[np.ndarray] = []

    def reset(self, *, seed=None, options=None):  # type: ignore[no-untyped-def]
        return _obs(self.rng, 1)[0], {}

    def step(self, action):  # type: ignore[no-untyped-def]
        self.received.append(np.asarray(action))
        return _obs(self.rng, 1)[0], 0.0, False, False, {}


def test_wrappers_apply_the_shield() -> None:
    env = ShieldWrapper(_AgentEnv(0), Shield(SPEC, CONFIG))
    obs, _ = env.reset(seed=0)
    _, _, _, _, info = env.step(np.array([9.0, 9.0, 2.0]))
    assert info["shield"]["changed"]
    assert env.action_masks().shape == (3,)
    venv = ShieldVecEnvWrapper(
        DummyVecEnv([lambda i=i: _AgentEnv(i) for i in range(4)]), Shield(SPEC, CONFIG)
    )
    obs = venv.reset()
    venv.step(np.full((4, 3), 4.0))
    got = np.array([e.received[-1] for e in venv.venv.envs])
    assert violations(Shield(SPEC, CONFIG), obs, got) == []
