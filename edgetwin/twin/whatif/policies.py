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

__all__ = ["BUILTIN_POLICIES", "PolicyFactory", "PolicySpec", "builtin_policy", "fixed_policy"]

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
