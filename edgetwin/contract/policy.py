"""What a platform policy is, to every part of edgetwin: something with ``act(obs) -> actions``.

The twin, the emulated cluster, evaluation, what-ifs and the edge runtime all drive policies
through this one protocol, on a batch of per-agent observations ``[profile.*, state.*]``.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import numpy as np

from edgetwin.contract.spec import TwinSpec


@runtime_checkable
class PlatformPolicy(Protocol):
    """A platform (scheduling) policy acting per agent.

    ``act(obs)`` takes ``obs`` of shape ``(N, len(spec.observation_columns))`` and returns actions
    of shape ``(N, len(spec.action_columns))`` in the spec's action bounds.
    """

    def act(self, obs: np.ndarray) -> np.ndarray: ...


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
    """

    def __init__(self, base: PlatformPolicy, spec: TwinSpec, scale: float, seed: int = 0) -> None:
        if not scale >= 0:
            raise ValueError(f"scale must be >= 0, got {scale}")
        self.base, self.scale = base, float(scale)
        self.low, self.high = spec.bounds("action")
        self._width = np.where(np.isfinite(self.high - self.low), self.high - self.low, 2.0)
        self.rng = np.random.default_rng(seed)

    def act(self, obs: np.ndarray) -> np.ndarray:
        a = np.asarray(self.base.act(obs), dtype=np.float64)
        noise = self.scale * self._width * self.rng.standard_normal(a.shape)
        return np.clip(a + noise, self.low, self.high)


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
