"""What a platform policy is, to every part of edgetwin: something with ``act(obs) -> actions``.

The twin, the emulated cluster, evaluation, what-ifs and the edge runtime all drive policies
through this one protocol, on a batch of per-agent observations ``[profile.*, state.*]``.
"""

from __future__ import annotations

import copy
from typing import Protocol, runtime_checkable

import numpy as np
from scipy.stats import norm

from edgetwin.contract.spec import TwinSpec


@runtime_checkable
class PlatformPolicy(Protocol):
    """A platform (scheduling) policy acting per agent.

    ``act(obs)`` takes ``obs`` of shape ``(N, len(spec.observation_columns))`` and returns actions
    of shape ``(N, len(spec.action_columns))`` in the spec's action bounds.
    """

    def act(self, obs: np.ndarray) -> np.ndarray: ...


@runtime_checkable
class LoggingPolicy(Protocol):
    """A policy that can say how likely each action it took was (the log's ``propensity`` column).

    ``act_logged(obs)`` acts like ``act(obs)`` and also returns ``(N,)`` the probability (every
    action feature discrete) or density (any continuous one) of each returned action under the
    policy, given ``obs``; NaN where it is not known.
    """

    def act_logged(self, obs: np.ndarray) -> tuple[np.ndarray, np.ndarray]: ...


def act_logged(policy: PlatformPolicy, obs: np.ndarray, spec: TwinSpec) -> tuple[np.ndarray, np.ndarray]:
    """``(actions (N, A), propensity (N,))`` of any policy on ``obs``, for a log.

    A `LoggingPolicy` says its own propensities. Any other policy is taken as deterministic: its
    action has probability 1 when every action feature is discrete; with a continuous one a
    deterministic action has no density, so the propensity is NaN (unknown, as the contract allows).
    """
    if isinstance(policy, LoggingPolicy):
        a, p = policy.act_logged(obs)
        return np.asarray(a, dtype=np.float64), np.asarray(p, dtype=np.float64).reshape(len(a))
    a = np.asarray(policy.act(obs), dtype=np.float64)
    return a, np.full(len(a), 1.0 if spec.discrete_actions() else np.nan)


class RandomPolicy:
    """Uniform actions within the spec's action bounds (the logging policy of seed 004).

    Discrete actions draw from their allowed values; unbounded sides are clipped to ``[-1, 1]``.
    """

    def __init__(self, spec: TwinSpec, seed: int = 0) -> None:
        self.spec = spec
        self.rng = np.random.default_rng(seed)
        low, high = spec.bounds("action")
        self.low = np.where(np.isfinite(low), low, -1.0)
        self.high = np.where(np.isfinite(high), high, 1.0)
        self._values = [f.allowed_values() for f in spec.by_role("action")]

    def act(self, obs: np.ndarray) -> np.ndarray:
        n = obs.shape[0]
        a = self.rng.uniform(self.low, self.high, size=(n, len(self.low)))
        for j, values in enumerate(self._values):
            if values is not None:
                a[:, j] = self.rng.choice(np.asarray(values), size=n)
        return a

    def act_logged(self, obs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Uniform: ``prod_j 1 / width_j`` (continuous) times ``1 / count_j`` (discrete), every row."""
        a = self.act(obs)
        p = 1.0
        for j, values in enumerate(self._values):
            p *= 1.0 / len(values) if values is not None else 1.0 / max(self.high[j] - self.low[j], 1e-12)
        return a, np.full(len(a), p)


class FunctionPolicy:
    """Wraps a plain function ``obs (N, O) -> actions (N, A)`` as a `PlatformPolicy`."""

    def __init__(self, fn, name: str = "function") -> None:  # type: ignore[no-untyped-def]
        self.fn = fn
        self.name = name

    def act(self, obs: np.ndarray) -> np.ndarray:
        return np.asarray(self.fn(obs), dtype=np.float64)


class NoisyPolicy:
    """A base policy plus Gaussian exploration noise, clipped to the spec's action bounds.

    The kind of logging policy a production scheduler with exploration produces: mostly the
    base policy's decisions, with ``scale`` x (bound width) standard deviation around them.
    Unbounded sides are treated as width 2 (like `RandomPolicy`'s ``[-1, 1]``).

    The noise comes from one stream that every ``act`` call advances. A twin replay that reuses the
    same object (`edgetwin.twin.whatif.fixed_policy`) would therefore see different noise on every
    replay, and identical replays would answer differently; `reseeded` gives each replay its own
    stream, a function of the construction seed and the replay's seed only
    (`edgetwin.loop.ppi.replay_spec` builds one per replay).
    """

    def __init__(self, base: PlatformPolicy, spec: TwinSpec, scale: float, seed: int = 0) -> None:
        if not scale >= 0:
            raise ValueError(f"scale must be >= 0, got {scale}")
        self.base, self.scale = base, float(scale)
        self.low, self.high = spec.bounds("action")
        self._width = np.where(np.isfinite(self.high - self.low), self.high - self.low, 2.0)
        self.seed = int(seed)
        self.rng = np.random.default_rng(seed)

    def reseeded(self, seed: int) -> NoisyPolicy:
        """A copy of this policy (its base deep-copied) whose noise stream starts afresh from
        ``(construction seed, seed)``: the same ``seed`` always gives the same draws, whatever this
        object has drawn before."""
        new = copy.copy(self)
        new.base = copy.deepcopy(self.base)
        new.rng = np.random.default_rng([self.seed % 2**63, int(seed) % 2**63])
        return new

    def act(self, obs: np.ndarray) -> np.ndarray:
        return self.act_logged(obs)[0]

    def act_logged(self, obs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The noisy actions and their density given the base policy's action ``m``.

        Per action feature with ``σ = scale x width``: inside the bounds the Gaussian density
        ``φ((a - m) / σ) / σ``; at a bound (where clipping piles up the tail) the tail's probability
        ``Φ((low - m) / σ)`` or ``1 - Φ((high - m) / σ)`` — a density w.r.t. Lebesgue measure inside
        plus a point mass at each bound. The product over features (independent noise). With
        ``scale = 0`` the policy is deterministic: NaN (no density).
        """
        m = np.asarray(self.base.act(obs), dtype=np.float64)
        sigma = self.scale * self._width
        a = np.clip(m + sigma * self.rng.standard_normal(m.shape), self.low, self.high)
        if self.scale == 0:
            return a, np.full(len(a), np.nan)
        at_low, at_high = a <= self.low, a >= self.high
        dens = norm.pdf(a, loc=m, scale=sigma)
        dens = np.where(at_low, norm.cdf((self.low - m) / sigma), dens)
        dens = np.where(at_high, norm.sf((self.high - m) / sigma), dens)
        return a, np.prod(dens, axis=1)


class RegimePolicy(RandomPolicy):
    """Uniform actions in a random sub-box of the action bounds, redrawn every ``every`` calls.

    The logs of a platform whose scheduler configuration changed over time (versions, operators'
    overrides) rather than of a uniformly random one. Each regime is a uniform policy over a box
    of ``width`` x (bound width) per action, placed uniformly where it fits within the bounds (so
    values near a bound are drawn less often than under `RandomPolicy`); discrete actions draw from
    a random subset of ``ceil(width x count)`` of their allowed values. Over many regimes the
    actions cover the bounds, but within one regime every agent is moved
    the same way, so a log shows how site-wide state follows a site-wide change of the actions,
    which a uniform policy (whose mean over a site barely moves) cannot show.

    One call is one tick of the whole population, so ``every`` is a regime's length in ticks.
    Unbounded sides are treated as ``[-1, 1]`` (like `RandomPolicy`).
    """

    def __init__(self, spec: TwinSpec, seed: int = 0, every: int = 8, width: float = 0.3) -> None:
        if int(every) < 1:
            raise ValueError(f"every must be >= 1 tick, got {every}")
        if not 0.0 < width <= 1.0:
            raise ValueError(f"width must be in (0, 1], got {width}")
        super().__init__(spec, seed)
        self.every, self.width = int(every), float(width)
        self._calls = 0
        self._box = (self.low, self.high)
        self._subsets: list[np.ndarray | None] = [None] * len(self._values)

    def _new_regime(self) -> None:
        span = self.width * (self.high - self.low)
        lo = self.rng.uniform(self.low, self.high - span)
        self._box = (lo, lo + span)
        for j, values in enumerate(self._values):
            if values is not None:
                vals = np.asarray(values)
                k = max(1, int(np.ceil(self.width * len(vals))))
                self._subsets[j] = self.rng.choice(vals, size=k, replace=False)

    def act(self, obs: np.ndarray) -> np.ndarray:
        if self._calls % self.every == 0:
            self._new_regime()
        self._calls += 1
        n = obs.shape[0]
        a = self.rng.uniform(*self._box, size=(n, len(self.low)))
        for j, subset in enumerate(self._subsets):
            if subset is not None:
                a[:, j] = self.rng.choice(subset, size=n)
        return a

    def act_logged(self, obs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Uniform over the current regime's box: ``prod_j 1 / span_j`` times ``1 / len(subset_j)``."""
        a = self.act(obs)
        span = self._box[1] - self._box[0]
        p = 1.0
        for j, subset in enumerate(self._subsets):
            p *= 1.0 / len(subset) if subset is not None else 1.0 / max(float(span[j]), 1e-12)
        return a, np.full(len(a), p)
