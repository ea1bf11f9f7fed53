"""Baselines in the same harness as MAIL-MMSG.

* `SupervisedResponseModel`: one-step regression (an MLP, squared error) of the client outputs
  ``(response, kpi, reward?, Δstate?)`` from the same client inputs MAIL sees. With Gaussian
  residual noise it can drive a twin too; it is what the compounding-error benchmark compares to.
* `ClonedPlatformPolicy`: behaviour cloning of the logging platform policy (eq. 7 of seed 004)
  as a `edgetwin.contract.policy.PlatformPolicy` on raw ``[profile.*, state.*]`` observations.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from typing import Any

import numpy as np
from sklearn.exceptions import ConvergenceWarning
from sklearn.neural_network import MLPRegressor
from stable_baselines3.common.policies import ActorCriticPolicy

from edgetwin.imitation.layout import Layout
from edgetwin.imitation.mail import OUTPUT_CLIP, GaussianModel


class SupervisedResponseModel:
    """MLP regression of standardised client outputs, with per-output Gaussian residual noise.

    Args:
        hidden: hidden layer sizes.
        max_iter: Adam epochs (early stopping on a 10 % validation split).
        seed: seeds the initialisation and the split.
    """

    def __init__(self, hidden: tuple[int, ...] = (64, 64), max_iter: int = 200, seed: int = 0) -> None:
        self.reg = MLPRegressor(
            hidden_layer_sizes=hidden,
            max_iter=max_iter,
            early_stopping=True,
            n_iter_no_change=10,
            random_state=seed,
        )
        self.noise_std: np.ndarray = np.zeros(0)

    def fit(self, x: np.ndarray, y: np.ndarray) -> SupervisedResponseModel:
        """Fit on ``x (N, in)`` -> ``y (N, out)`` (standardised units)."""
        y = np.clip(y, -OUTPUT_CLIP, OUTPUT_CLIP)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ConvergenceWarning)
            self.reg.fit(x, y)
        resid = y - self.mean(x)
        self.noise_std = resid.std(axis=0)
        return self

    def mean(self, x: np.ndarray) -> np.ndarray:
        if len(x) == 0:
            return np.zeros((0, len(self.noise_std)), dtype=np.float32)
        return np.asarray(self.reg.predict(x), dtype=np.float32).reshape(len(x), -1)

    @property
    def std(self) -> np.ndarray:
        return self.noise_std

    def to_arrays(self) -> dict[str, np.ndarray]:
        """The fitted model as plain arrays (saved as npz, no pickle); `from_arrays` inverts it."""
        reg = self.reg
        out = {f"coef_{i}": np.asarray(c) for i, c in enumerate(reg.coefs_)}
        out.update({f"intercept_{i}": np.asarray(b) for i, b in enumerate(reg.intercepts_)})
        out["noise_std"] = np.asarray(self.noise_std)
        out["activation"] = np.asarray(str(reg.activation))
        return out

    @classmethod
    def from_arrays(cls, arrays: Mapping[str, np.ndarray]) -> SupervisedResponseModel:
        """The model `to_arrays` wrote: the same weights, so the same predictions.

        Raises:
            KeyError, ValueError: an array is missing, misshapen or names an unknown activation.
        """
        n = sum(1 for k in arrays if k.startswith("coef_"))
        coefs = [np.asarray(arrays[f"coef_{i}"]) for i in range(n)]
        intercepts = [np.asarray(arrays[f"intercept_{i}"]) for i in range(n)]
        if any(a.dtype.kind != "f" for a in (*coefs, *intercepts)):
            raise ValueError("weights must be floating point")
        activation = str(arrays["activation"])
        if activation not in ("identity", "logistic", "tanh", "relu"):
            raise ValueError(f"unknown activation {activation!r}")
        if n < 1 or any(c.ndim != 2 for c in coefs) or any(
            a.shape[1] != b.shape[0] for a, b in zip(coefs, coefs[1:], strict=False)
        ) or any(b.shape != (c.shape[1],) for c, b in zip(coefs, intercepts, strict=True)):
            raise ValueError("inconsistent layer shapes")
        m = cls(tuple(c.shape[1] for c in coefs[:-1]))
        reg = m.reg
        reg.activation = activation
        reg.coefs_, reg.intercepts_ = coefs, intercepts
        reg.n_layers_ = n + 1
        reg.n_outputs_ = coefs[-1].shape[1]
        reg.n_features_in_ = coefs[0].shape[0]
        reg.out_activation_ = "identity"
        m.noise_std = np.asarray(arrays["noise_std"])
        return m

    def sample(self, x: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        mu = self.mean(x)
        return np.clip(mu + self.noise_std * rng.standard_normal(mu.shape), -OUTPUT_CLIP, OUTPUT_CLIP).astype(
            np.float32
        )


class ClonedPlatformPolicy:
    """The behaviour-cloned logging policy of one twin, as a `PlatformPolicy`.

    Args:
        layout: the twin's layout (scalers).
        engines: per scenario id, the cloned engine policy.
        scenario: ``(N,)`` scenario id of each observation row; when None, each row's scenario
            is recognised from its profile by ``scenario_of`` (or scenario 0 without one).
        stochastic: sample from the Gaussian (the logging policy's spread) instead of its mean.
        seed: seeds the sampling.
        scenario_of: a fitted classifier (``predict(z(profile)) -> scenario id``), so that the
            policy works on bare observations, e.g. on the real system, where rows carry no label.
    """

    def __init__(
        self,
        layout: Layout,
        engines: dict[int, ActorCriticPolicy],
        scenario: np.ndarray | None = None,
        stochastic: bool = True,
        seed: int = 0,
        scenario_of: Any = None,
    ) -> None:
        self.layout = layout
        self.scenario_of = scenario_of
        self.engines = {s: GaussianModel(p) for s, p in engines.items()}
        self.scenario = scenario
        self.stochastic = stochastic
        self.rng = np.random.default_rng(seed)

    def act(self, obs: np.ndarray) -> np.ndarray:
        lay = self.layout
        n_p = len(lay.profile)
        x = np.concatenate(
            [lay.scalers["profile"].transform(obs[:, :n_p]), lay.scalers["state"].transform(obs[:, n_p:])],
            axis=1,
        )
        if self.scenario is not None:
            scen = np.asarray(self.scenario, dtype=np.int64)
        elif self.scenario_of is not None and n_p and len(obs):
            scen = np.asarray(self.scenario_of.predict(x[:, :n_p]), dtype=np.int64)
        else:
            scen = np.zeros(len(obs), np.int64)
        za = np.zeros((len(obs), len(lay.action)), np.float32)
        for s in np.unique(scen):
            idx = np.flatnonzero(scen == s)
            m = self.engines[int(s)]
            za[idx] = m.sample(x[idx], self.rng) if self.stochastic else m.mean(x[idx])
        return lay.scalers["action"].inverse(za)
