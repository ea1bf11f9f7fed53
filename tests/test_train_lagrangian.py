"""Lagrangian PPO (edgetwin.policies.lagrangian): the multipliers rise while a constraint is violated,
and the trained policy meets the constraint better than PPO without it (issue 44 item 3)."""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
import pytest
from stable_baselines3 import PPO
from stable_baselines3.common.vec_env import DummyVecEnv

from edgetwin.policies.lagrangian import Constraint, DualAscentCallback, LagrangeMultipliers, LagrangianReward


class _Tradeoff(gym.Env):  # type: ignore[type-arg]
    """Reward = the action a in [0, 1]; cost = a too: the unconstrained optimum a = 1 breaks E[cost] <= 0.3."""

    observation_space = gym.spaces.Box(-1.0, 1.0, (1,), np.float32)
    action_space = gym.spaces.Box(0.0, 1.0, (1,), np.float32)

    def __init__(self) -> None:
        self.t = 0

    def reset(self, *, seed: int | None = None, options: Any = None) -> tuple[np.ndarray, dict]:  # type: ignore[type-arg]
        super().reset(seed=seed)
        self.t = 0
        return np.zeros(1, np.float32), {}

    def step(self, action: np.ndarray) -> tuple[np.ndarray, float, bool, bool, dict]:  # type: ignore[type-arg]
        a = float(np.clip(action[0], 0.0, 1.0))
        self.t += 1
        return np.zeros(1, np.float32), a, False, self.t >= 16, {"cost": a}


def _mean_action(model: PPO) -> float:
    return float(np.clip(model.predict(np.zeros((64, 1), np.float32), deterministic=True)[0], 0, 1).mean())


def test_multipliers_rise_under_violation_and_stay_at_zero_when_met() -> None:
    lam = LagrangeMultipliers([Constraint("a", 0.3), Constraint("b", 0.3)], lr=0.5)
    for _ in range(3):
        lam.update(np.array([0.9, 0.1]))
    assert lam.values[0] > 0.8 and lam.values[1] == 0.0
    assert all(np.diff([h[0] for h in lam.history]) > 0)


@pytest.mark.slow  # two PPO runs of 6k steps: ~20 s on a shared core
def test_lagrangian_ppo_meets_the_constraint_better_than_plain_ppo() -> None:
    hyper = {"n_steps": 256, "batch_size": 64, "learning_rate": 3e-3, "seed": 0, "device": "cpu"}
    plain = PPO("MlpPolicy", DummyVecEnv([_Tradeoff]), **hyper).learn(6000)
    lam = LagrangeMultipliers([Constraint("cost", 0.3)], lr=0.5)
    wrapped = LagrangianReward(DummyVecEnv([_Tradeoff]), lam)
    constrained = PPO("MlpPolicy", wrapped, **hyper).learn(6000, callback=DualAscentCallback(wrapped))
    assert max(h[0] for h in lam.history) > 0.0  # the constraint was violated at first: λ rose
    assert abs(_mean_action(constrained) - 0.3) < abs(_mean_action(plain) - 0.3)
    assert _mean_action(constrained) < _mean_action(plain)
