"""The policies a what-if compares (`PolicySpec`): built-in ones (``logging``, ``logged``, ``random``)
and fixed ones, each built per world seed, member and scenario.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from edgetwin.contract.errors import InputError
from edgetwin.contract.policy import PlatformPolicy, RandomPolicy

__all__ = ["BUILTIN_POLICIES", "PolicyFactory", "PolicySpec", "RoutedPolicy", "builtin_policy", "fixed_policy", "routed_policy"]

#: Built-in policy names the engine resolves itself (others: `edgetwin.policies.gate.resolve_policy`).
BUILTIN_POLICIES = ("logging", "logged", "random")


#: Builds the policy for one episode: ``(seed, member, scenario ids (N,)) -> PlatformPolicy``.
PolicyFactory = Callable[[int, int, np.ndarray], PlatformPolicy]


@dataclass
class PolicySpec:
    """A policy under test: its name in reports and how to build it per episode.

    ``factory`` is None for the built-in ``"logged"`` (replay the log's actions). ``shared``: the
    factory returns one object for every episode (`fixed_policy`), which may keep state between
    episodes; its episodes are then run in one sequence, never split across workers.
    """

    name: str
    factory: PolicyFactory | None
    shared: bool = False


def builtin_policy(name: str, twin: Any) -> PolicySpec:
    """``"random"`` (uniform in the action bounds), ``"logging"`` (the twin's clone of the logging
    policy, sampling its spread, per scenario, from the acting member) or ``"logged"``."""
    if name == "random":
        return PolicySpec(name, lambda seed, member, scen: RandomPolicy(twin.spec, seed=seed))
    if name == "logging":
        from edgetwin.imitation.baselines import ClonedPlatformPolicy

        def clone(seed: int, member: int, scen: np.ndarray) -> PlatformPolicy:
            engines = twin.members[member].engines
            return ClonedPlatformPolicy(twin.layout, engines, scenario=scen, stochastic=True, seed=seed)

        return PolicySpec(name, clone)
    if name == "logged":
        return PolicySpec(name, None)
    raise InputError(f"unknown built-in policy {name!r}; expected one of {BUILTIN_POLICIES}", "--policy")


def fixed_policy(name: str, policy: PlatformPolicy) -> PolicySpec:
    """A policy object used as is in every episode (its ``reset()`` is called per episode)."""

    def same(seed: int, member: int, scen: np.ndarray) -> PlatformPolicy:
        if hasattr(policy, "reset"):
            policy.reset()
        return policy

    return PolicySpec(name, same, shared=True)


class RoutedPolicy:
    """Two policies sharing one fleet: rows ``mask`` are acted by ``treated``, the others by ``rest``.

    The twin's replay of a canary (`routed_policy`). Each policy sees only its own rows, always
    the same ones in the same order (``mask`` is fixed for the episode), so a policy that keeps
    per-row state (a recurrent policy's memory, a shield's migration history, keyed by row
    index) keeps it for the rows it acts on, as it would serving that slice alone. When both
    are the same object, it acts on every row at once (two calls on two subsets would mix one
    object's per-row state).

    Args:
        treated, rest: `PlatformPolicy` s. mask: ``(N,)`` bool, True where ``treated`` acts.
    """

    def __init__(self, treated: PlatformPolicy, rest: PlatformPolicy, mask: np.ndarray) -> None:
        self.treated, self.rest = treated, rest
        self.mask = np.asarray(mask, dtype=bool).copy()

    def act(self, obs: np.ndarray) -> np.ndarray:
        """``(N, A)`` actions for ``(N, O)`` observations, N = ``len(mask)``."""
        obs = np.asarray(obs)
        if len(obs) != len(self.mask):
            raise ValueError(f"a routed policy for {len(self.mask)} rows was given {len(obs)} observations")
        if self.treated is self.rest:
            return np.asarray(self.treated.act(obs), dtype=np.float64)
        out: np.ndarray | None = None
        for rows, pol in ((self.mask, self.treated), (~self.mask, self.rest)):
            if not rows.any():
                continue
            a = np.asarray(pol.act(obs[rows]), dtype=np.float64).reshape(int(rows.sum()), -1)
            if out is None:
                out = np.empty((len(obs), a.shape[1]), dtype=np.float64)
            out[rows] = a
        assert out is not None  # len(obs) == len(mask) >= 1 rows, each on one side
        return out


def routed_policy(name: str, treated: PolicySpec, rest: PolicySpec, mask: np.ndarray) -> PolicySpec:
    """A `PolicySpec` whose episode puts rows ``mask`` (``(N,)`` bool, in the episode's agent
    order: a replayed log's ``LoggedEpisode.agents``) on ``treated`` and the rest on ``rest``:
    a canary's actual assignment, as the twin replays it (`edgetwin.loop.ppi`).

    Each side is built by its own factory on its own rows' scenario ids; a side with no row is not
    built. Neither side may be ``logged`` (a replay of logged actions has no policy to route)."""
    if treated.factory is None or rest.factory is None:
        raise InputError("a routed policy needs two policies, not the log's own actions ('logged')", "--policy")
    m = np.asarray(mask, dtype=bool).copy()
    ft, fr = treated.factory, rest.factory

    def build(seed: int, member: int, scen: np.ndarray) -> PlatformPolicy:
        if len(scen) != len(m):
            raise ValueError(f"a routed policy for {len(m)} rows was built for {len(scen)} agents")
        if m.all():
            return ft(seed, member, scen)
        if not m.any():
            return fr(seed, member, scen)
        return RoutedPolicy(ft(seed, member, scen[m]), fr(seed, member, scen[~m]), m)

    return PolicySpec(name, build, shared=treated.shared or rest.shared)
