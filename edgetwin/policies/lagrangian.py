"""Constrained training: the operator's KPI margins as constraints, enforced by Lagrange multipliers.

The gate, the canary's guard and its verdict refuse a candidate that worsens a guarded KPI beyond
its margin (``better`` / ``margin`` in the spec). A policy trained on a weighted reward may still
buy one KPI with another beyond what the operator accepts; a *constrained* objective says what is
acceptable instead of pricing it:

    maximise  E[reward]   subject to   E[g_k] <= 0 for every guarded KPI k,

    g_k = (value_k - limit_k) / |limit_k|   (lower is better; the sign flips for higher),
    limit_k = baseline_k * (1 +/- margin_k),

where ``baseline_k`` is the KPI's mean under the logging policy (`constraints_from_log`). This is
the Lagrangian relaxation PPO-Lagrangian uses (Ray, Achiam and Amodei 2019, "Benchmarking Safe
Exploration"; Stooke et al. 2020): SB3's PPO maximises ``reward - sum_k lambda_k * g_k`` (the
`LagrangianReward`, a `RewardFn` the twin's VecEnv calls each step), and after every rollout the
multipliers take a projected dual-ascent step on the rollout's mean violation
(`LagrangeMultiplierUpdate`, an SB3 callback): ``lambda_k <- max(0, lambda_k + dual_lr * mean g_k)``.
A satisfied constraint's multiplier decays to 0 and stops shaping the reward; a violated one grows
until the policy gives the KPI back.

Why our own ~100 lines: neither SB3 nor sb3-contrib ships a constrained algorithm (OmniSafe and
safety-gymnasium do, for environments with a ``cost`` signal, on gymnasium 1.x); the pieces SB3 has
— a reward the env computes, a callback at each rollout's end, its logger — are all this needs.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd
from stable_baselines3.common.callbacks import BaseCallback

from edgetwin.contract.errors import InputError
from edgetwin.contract.spec import RewardFn, TwinSpec

__all__ = ["KPIConstraint", "LagrangeMultiplierUpdate", "LagrangianReward", "constraints_from_log"]


@dataclass(frozen=True)
class KPIConstraint:
    """One guarded KPI as a constraint on the per-step mean of its column.

    Attributes:
        column: the step column (``kpi.*`` or ``response.*``), in its own units.
        limit: the worst acceptable per-step mean, in the column's units (not 0).
        higher_is_better: the direction the operator wants.
    """

    column: str
    limit: float
    higher_is_better: bool

    def violation(self, values: np.ndarray) -> np.ndarray:
        """``g`` per row: > 0 on the wrong side of the limit, relative to it (dimensionless)."""
        g = (np.asarray(values, np.float64) - self.limit) / abs(self.limit)
        return -g if self.higher_is_better else g


def constraints_from_log(spec: TwinSpec, log: pd.DataFrame, default_margin: float = 0.05) -> list[KPIConstraint]:
    """A constraint per spec feature with a declared direction: its limit is the log's mean moved
    by the feature's margin (``default_margin`` where it declares none) in the bad direction.

    Raises:
        InputError: the spec declares no direction, or a guarded column's mean in the log is 0 or
            not finite (a relative limit needs a scale; name the column).
    """
    out = []
    for f in spec.features:
        if f.better is None:
            continue
        if f.name not in log.columns:
            raise InputError(f"the log has no column {f.name!r}, which the spec guards", "log")
        base = float(pd.to_numeric(log[f.name], errors="coerce").mean())
        if not np.isfinite(base) or base == 0.0:
            raise InputError(f"{f.name}: its mean in the log is {base}, so a relative limit has no scale", "log")
        m = default_margin if f.margin is None else float(f.margin)
        higher = f.better == "higher"
        worse = -1.0 if higher else 1.0
        out.append(KPIConstraint(f.name, base * (1.0 + worse * m * np.sign(base)), higher))
    if not out:
        raise InputError("the spec declares no KPI direction (better = 'higher' / 'lower'): nothing to constrain", "spec")
    return out


class LagrangianReward:
    """``reward(cols) - sum_k lambda_k * g_k(cols)``, recording each step's mean ``g_k``.

    Args:
        base: the reward being maximised (the spec's, or a `TrainConfig.reward`).
        constraints: the KPIs held at their limits.
        lambdas: initial multipliers (default 0: unconstrained until a constraint is violated).
    """

    def __init__(self, base: RewardFn, constraints: Sequence[KPIConstraint], lambdas: Sequence[float] | None = None) -> None:
        if not constraints:
            raise ValueError("no constraints")
        self.base = base
        self.constraints = tuple(constraints)
        self.lambdas = np.zeros(len(constraints)) if lambdas is None else np.asarray(lambdas, np.float64).copy()
        self._sums = np.zeros(len(constraints))
        self._rows = 0

    def __call__(self, cols: Mapping[str, np.ndarray]) -> np.ndarray:
        g = self._violations(cols)
        self._sums += g.sum(axis=1)
        self._rows += g.shape[1]
        return np.asarray(self.base(cols), np.float64) - self.lambdas @ g

    def _violations(self, cols: Mapping[str, np.ndarray]) -> np.ndarray:
        """``g`` ``(K, N)``: each constraint's violation per row."""
        return np.stack([c.violation(cols[c.column]) for c in self.constraints])

    def scorer(self) -> RewardFn:
        """The same penalised reward at the current multipliers, recording nothing: for a
        validation env, whose steps must not enter the training rollouts' dual update."""

        def score(cols: Mapping[str, np.ndarray]) -> np.ndarray:
            return np.asarray(self.base(cols), np.float64) - self.lambdas @ self._violations(cols)

        return score

    def take_mean_violation(self) -> np.ndarray | None:
        """The mean ``g_k`` over the steps since the last call (None if none), and reset."""
        if self._rows == 0:
            return None
        mean = self._sums / self._rows
        self._sums[:] = 0.0
        self._rows = 0
        return mean


class LagrangeMultiplierUpdate(BaseCallback):
    """After each rollout: ``lambda_k <- max(0, lambda_k + dual_lr * mean g_k)``; logs both.

    Args:
        reward: the `LagrangianReward` the training env calls.
        dual_lr: the dual ascent's step (reward units per unit of relative violation, per rollout).
    """

    def __init__(self, reward: LagrangianReward, dual_lr: float = 0.5, verbose: int = 0) -> None:
        super().__init__(verbose)
        self.reward = reward
        self.dual_lr = float(dual_lr)
        self.history: list[tuple[np.ndarray, np.ndarray]] = []  # (mean g, lambdas after) per rollout

    def _on_step(self) -> bool:
        return True

    def _on_rollout_end(self) -> None:
        g = self.reward.take_mean_violation()
        if g is None:
            return
        self.reward.lambdas = np.maximum(0.0, self.reward.lambdas + self.dual_lr * g)
        self.history.append((g.copy(), self.reward.lambdas.copy()))
        for c, gk, lam in zip(self.reward.constraints, g, self.reward.lambdas, strict=True):
            self.logger.record(f"lagrangian/violation/{c.column}", float(gk))
            self.logger.record(f"lagrangian/lambda/{c.column}", float(lam))
