"""Heuristic scheduling baselines (seed 001: RR, SJF, LJF, Tetris, Random; seed 002: lowest carbon).

They act on per-agent observations like every other policy, and learn nothing. What they need to
know about a system (which action column is the placement and what values mean which target, which
observation column is a target's utilisation or carbon intensity, which is a job's size) is given
by a :class:`SchedulingView` at construction, in the spec's column names: nothing here knows a
particular system. Other action columns are held at ``view.defaults`` (else the middle of their
bounds), so that baselines differ only in where and in what order work goes.

* :class:`RoundRobin`: targets in turn, across agents and calls.
* :class:`LeastLoaded`: the target with the lowest utilisation.
* :class:`BestFit` (Tetris-like bin packing): the fullest target that still fits the job's demand.
* :class:`ShortestJobFirst` / :class:`LongestJobFirst`: agents in order of job size share the
  ``allocation`` budget (first come, first served in that order); placement is least-loaded.
* :class:`GreedyLowestCarbon`: the lowest-carbon target whose utilisation is below ``max_util``.
* :class:`UniformRandom`: uniform actions (the logging policy of seed 004), exportable.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from edgetwin.contract.errors import InputError
from edgetwin.contract.policy import RandomPolicy
from edgetwin.contract.spec import TwinSpec


@dataclass(frozen=True)
class Target:
    """One place work can go: the placement action's value for it, its load and carbon.

    ``load`` (utilisation in [0, 1]) and ``carbon`` (gCO2/kWh) are observation columns or constants.
    """

    value: float
    load: str | float | None = None
    carbon: str | float | None = None


@dataclass(frozen=True)
class SchedulingView:
    """Where heuristics find what they need, in the spec's column names.

    Attributes:
        placement: the action column that chooses a target.
        targets: the targets, with the placement value that selects each.
        size: observation column with a job's size (e.g. mean task seconds) for SJF/LJF.
        demand: observation column with a job's resource demand as a fraction of one target's
            capacity, times ``demand_scale``, for best fit.
        allocation: a continuous action column shared under a budget (SJF/LJF).
        allocation_budget: the average allocation per agent that the budget allows.
        defaults: values of the other action columns (default: the middle of their bounds).
        max_util: a target above this utilisation counts as full (lowest-carbon, best fit).
    """

    placement: str
    targets: tuple[Target, ...]
    size: str | None = None
    demand: str | None = None
    demand_scale: float = 1.0
    allocation: str | None = None
    allocation_budget: float | None = None
    defaults: Mapping[str, float] = field(default_factory=dict)
    max_util: float = 0.9

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> SchedulingView:
        d = dict(d)
        d["targets"] = tuple(Target(**t) if isinstance(t, Mapping) else t for t in d["targets"])
        return cls(**d)


class Heuristic(ABC):
    """Base: resolves the view's columns against the spec; ``act(obs (N, O)) -> (N, A)``."""

    name = "heuristic"

    def __init__(self, spec: TwinSpec, view: SchedulingView | Mapping[str, Any]) -> None:
        self.spec = spec
        self.view = view if isinstance(view, SchedulingView) else SchedulingView.from_dict(view)
        obs_cols, act_cols = spec.observation_columns, spec.action_columns
        v = self.view

        def obs_idx(c: str, what: str) -> int:
            if c not in obs_cols:
                raise InputError(f"{self.name}: {what} {c!r} is not an observation column", "heuristic")
            return obs_cols.index(c)

        if v.placement not in act_cols:
            raise InputError(f"{self.name}: placement {v.placement!r} is not an action column", "heuristic")
        if not v.targets:
            raise InputError(f"{self.name}: the view needs at least one target", "heuristic")
        self._place = act_cols.index(v.placement)
        self._size = None if v.size is None else obs_idx(v.size, "size")
        self._demand = None if v.demand is None else obs_idx(v.demand, "demand")
        self._alloc = None
        if v.allocation is not None:
            if v.allocation not in act_cols:
                raise InputError(
                    f"{self.name}: allocation {v.allocation!r} is not an action column", "heuristic"
                )
            self._alloc = act_cols.index(v.allocation)
        self._cols = {"load": [], "carbon": []}  # type: dict[str, list[int | float | None]]
        for t in v.targets:
            for key in ("load", "carbon"):
                ref = getattr(t, key)
                self._cols[key].append(obs_idx(ref, key) if isinstance(ref, str) else ref)
        low, high = spec.bounds("action")
        low = np.where(np.isfinite(low), low, 0.0)
        high = np.where(np.isfinite(high), high, 1.0)
        self.low, self.high = low, high
        self.base = (low + high) / 2.0
        for c, val in v.defaults.items():
            if c not in act_cols:
                raise InputError(
                    f"{self.name}: default for {c!r}, which is not an action column", "heuristic"
                )
            self.base[act_cols.index(c)] = float(val)

    def to_config(self) -> dict[str, Any]:
        return {"view": self.view.to_dict()}

    def _per_target(self, obs: np.ndarray, key: str, missing: float) -> np.ndarray:
        """(N, K) values of ``key`` per target (a column, a constant, or ``missing``)."""
        n = obs.shape[0]
        out = np.empty((n, len(self.view.targets)))
        for k, ref in enumerate(self._cols[key]):
            out[:, k] = missing if ref is None else (obs[:, ref] if isinstance(ref, int) else float(ref))
        return out

    def loads(self, obs: np.ndarray) -> np.ndarray:
        return self._per_target(obs, "load", 0.0)

    @abstractmethod
    def choose(self, obs: np.ndarray) -> np.ndarray:
        """(N,) index of the target for each agent."""

    def act(self, obs: np.ndarray) -> np.ndarray:
        obs = np.atleast_2d(np.asarray(obs, dtype=np.float64))
        a = np.tile(self.base, (obs.shape[0], 1))
        values = np.array([t.value for t in self.view.targets])
        a[:, self._place] = values[self.choose(obs)]
        return a


class RoundRobin(Heuristic):
    """Targets in turn: agent i at call c goes to target ``(i + c) mod K``."""

    name = "round_robin"

    def __init__(self, spec: TwinSpec, view: SchedulingView | Mapping[str, Any]) -> None:
        super().__init__(spec, view)
        self._calls = 0

    def choose(self, obs: np.ndarray) -> np.ndarray:
        k = len(self.view.targets)
        idx = (np.arange(obs.shape[0]) + self._calls) % k
        self._calls += 1
        return idx


class LeastLoaded(Heuristic):
    """The target with the lowest utilisation (ties: the first)."""

    name = "least_loaded"

    def choose(self, obs: np.ndarray) -> np.ndarray:
        return np.argmin(self.loads(obs), axis=1)


class BestFit(Heuristic):
    """Tetris-like bin packing: the fullest target whose free capacity still holds the demand."""

    name = "best_fit"

    def choose(self, obs: np.ndarray) -> np.ndarray:
        loads = self.loads(obs)
        free = self.view.max_util - loads
        demand = (
            np.zeros(obs.shape[0]) if self._demand is None else obs[:, self._demand] * self.view.demand_scale
        )
        slack = free - demand[:, None]
        fits = slack >= 0
        best = np.argmin(np.where(fits, slack, np.inf), axis=1)
        return np.where(fits.any(axis=1), best, np.argmin(loads, axis=1))


class _OrderedByLength(LeastLoaded):
    """Agents ordered by job size share the allocation budget; placement is least-loaded."""

    descending = False

    def act(self, obs: np.ndarray) -> np.ndarray:
        a = super().act(obs)
        if self._alloc is None or self._size is None:
            raise InputError(f"{self.name} needs the view's 'size' and 'allocation' columns", "heuristic")
        n, j = obs.shape[0], self._alloc
        per_agent = self.view.allocation_budget if self.view.allocation_budget is not None else self.base[j]
        budget = per_agent * n
        order = np.argsort(obs[:, self._size], kind="stable")
        if self.descending:
            order = order[::-1]
        # in order, each agent gets the most it may have until the budget runs out, then the least
        grant = np.full(n, self.low[j])
        left = budget - self.low[j] * n
        for i in order:
            extra = min(self.high[j] - self.low[j], max(left, 0.0))
            grant[i] += extra
            left -= extra
        a[:, j] = grant
        return a


class ShortestJobFirst(_OrderedByLength):
    name = "sjf"
    descending = False


class LongestJobFirst(_OrderedByLength):
    name = "ljf"
    descending = True


class GreedyLowestCarbon(Heuristic):
    """The lowest-carbon target below ``max_util``; if all are full, the least loaded."""

    name = "lowest_carbon"

    def choose(self, obs: np.ndarray) -> np.ndarray:
        loads = self.loads(obs)
        carbon = self._per_target(obs, "carbon", np.inf)
        ok = loads < self.view.max_util
        best = np.argmin(np.where(ok, carbon, np.inf), axis=1)
        return np.where(ok.any(axis=1), best, np.argmin(loads, axis=1))


class UniformRandom:
    """Uniform random actions in the spec's bounds (seed 004's logging policy), exportable."""

    name = "random"

    def __init__(self, spec: TwinSpec, seed: int = 0) -> None:
        self.spec = spec
        self.seed = int(seed)
        self._impl = RandomPolicy(spec, seed=self.seed)

    def act(self, obs: np.ndarray) -> np.ndarray:
        return self._impl.act(np.atleast_2d(obs))

    def to_config(self) -> dict[str, Any]:
        return {"seed": self.seed}


HEURISTICS: dict[str, type[Heuristic]] = {
    c.name: c
    for c in (RoundRobin, LeastLoaded, BestFit, ShortestJobFirst, LongestJobFirst, GreedyLowestCarbon)
}


def make_heuristic(name: str, spec: TwinSpec, view: SchedulingView | None = None, seed: int = 0) -> Any:
    """A baseline by name: ``random`` or one of :data:`HEURISTICS` (those need a view)."""
    if name == "random":
        return UniformRandom(spec, seed=seed)
    if name not in HEURISTICS:
        raise InputError(
            f"unknown heuristic {name!r}; expected random or one of {sorted(HEURISTICS)}", "--policy"
        )
    if view is None:
        raise InputError(f"heuristic {name!r} needs a SchedulingView naming its columns", "--policy")
    return HEURISTICS[name](spec, view)


def names() -> Sequence[str]:
    return ["random", *HEURISTICS]
