"""A constrained objective for PPO: Lagrangian relaxation with dual ascent on the multipliers.

The operator's margins are constraints, not weights: "revenue may not fall more than 2 %" is a
bound on an expected cost, whatever the reward gains. The standard way to train for that with an
unconstrained learner (PPO-Lagrangian, Ray et al. 2019, "Benchmarking Safe Exploration in Deep RL")
is to maximise ``reward - Σ_k λ_k · cost_k`` and to raise each ``λ_k`` when the rollout's mean
``cost_k`` exceeds its limit ``d_k`` (projected dual ascent ``λ_k ← max(0, λ_k + lr · (mean cost_k - d_k))``).
SB3 has no Lagrangian PPO (sb3-contrib neither): this module is the two small pieces that make
SB3's PPO one, a `VecEnvWrapper` that shapes the reward and a `BaseCallback` that updates the
multipliers from each rollout. Costs come from each step's ``info`` (``info[key]`` for each
constraint's key), so any env that reports its per-step KPI costs can be constrained.

Not yet wired into `TrainConfig` (issue 44 item 3): wrap the VecEnv and pass the callback to PPO.learn.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from stable_baselines3.common.callbacks import BaseCallback
from stable_baselines3.common.vec_env import VecEnv, VecEnvWrapper

__all__ = ["Constraint", "LagrangeMultipliers", "LagrangianReward", "DualAscentCallback"]


@dataclass(frozen=True)
class Constraint:
    """``E[cost] <= limit`` on the per-step cost ``info[key]`` (units of that cost)."""

    key: str
    limit: float


@dataclass
class LagrangeMultipliers:
    """One multiplier per constraint, ``λ >= 0``, updated by projected dual ascent.

    Attributes:
        constraints: what is bounded.
        lr: the dual step size (multiplier units per unit of violation).
        values: ``(K,)`` current multipliers.
        history: the multipliers after every update (for reports and tests).
    """

    constraints: Sequence[Constraint]
    lr: float = 0.05
    values: np.ndarray = field(default_factory=lambda: np.zeros(0))
    history: list[np.ndarray] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not len(self.values):
            self.values = np.zeros(len(self.constraints))

    def update(self, mean_costs: np.ndarray) -> np.ndarray:
        """``λ ← max(0, λ + lr · (mean cost - limit))`` with ``mean_costs`` ``(K,)`` from a rollout."""
        limits = np.array([c.limit for c in self.constraints], dtype=np.float64)
        self.values = np.maximum(0.0, self.values + self.lr * (np.asarray(mean_costs, np.float64) - limits))
        self.history.append(self.values.copy())
        return self.values


class LagrangianReward(VecEnvWrapper):
    """Replaces each step's reward by ``reward - Σ_k λ_k · info[key_k]`` and accumulates the costs
    of the current rollout for `DualAscentCallback`."""

    def __init__(self, venv: VecEnv, multipliers: LagrangeMultipliers) -> None:
        super().__init__(venv)
        self.multipliers = multipliers
        self._costs: list[np.ndarray] = []

    def reset(self) -> Any:
        return self.venv.reset()

    def step_wait(self) -> Any:
        obs, reward, done, infos = self.venv.step_wait()
        costs = np.array([[float(info.get(c.key, 0.0)) for c in self.multipliers.constraints] for info in infos])
        self._costs.append(costs)
        shaped = np.asarray(reward, np.float64) - costs @ self.multipliers.values
        return obs, shaped.astype(np.float32), done, infos

    def pop_mean_costs(self) -> np.ndarray:
        """``(K,)`` mean cost per step since the last call (then forgets them)."""
        if not self._costs:
            return np.array([c.limit for c in self.multipliers.constraints], dtype=np.float64)
        out = np.concatenate(self._costs).mean(axis=0)
        self._costs = []
        return out


class DualAscentCallback(BaseCallback):
    """After every rollout, one dual-ascent step of the multipliers on that rollout's mean costs."""

    def __init__(self, wrapper: LagrangianReward, verbose: int = 0) -> None:
        super().__init__(verbose)
        self.wrapper = wrapper

    def _on_step(self) -> bool:
        return True

    def _on_rollout_end(self) -> None:
        costs = self.wrapper.pop_mean_costs()
        lam = self.wrapper.multipliers.update(costs)
        for c, v, m in zip(self.wrapper.multipliers.constraints, lam, costs, strict=True):
            self.logger.record(f"lagrangian/lambda_{c.key}", float(v))
            self.logger.record(f"lagrangian/cost_{c.key}", float(m))
