"""The canary's slice router: which service group is served by which policy during a canary.

A canary plan names a *slice* of the fleet (service groups, whole sites, whole scenarios: a row is
in the slice when any of them names it). Inside the
slice each group is assigned, once and at random, to the **candidate** arm (probability
``treat_share``) or the **control** arm (the current policy); every group outside the slice stays
on the current policy (the **fleet** arm). The control arm is what makes the canary a randomized
trial: it runs at the same time, on the same kind of groups, so the guard compares like with like
(comparing the slice with the rest of the fleet would measure which groups were picked, not the
policy; the plan picks the slice where the twin is least sure, which is never a random one).

The assignment is a pure function of ``(seed, group)`` (a keyed hash, not a draw from a stream),
so it does not depend on the order groups show up in, is the same after a runtime restart, and
needs no state. The probability of the arm a row was served by is its assignment probability
(`SliceRouter.assignment_propensity`); the log's ``propensity`` column is the policy's own
probability of its action, as the log contract defines it (`edgetwin.edge.canary`).
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Iterable, Sequence
from typing import Any, Literal

import numpy as np

from edgetwin.contract.errors import InputError

__all__ = ["ARMS", "Arm", "CanarySlice", "SliceRouter"]

Arm = Literal["candidate", "control", "fleet"]
ARMS: tuple[Arm, ...] = ("candidate", "control", "fleet")


@dataclasses.dataclass(frozen=True)
class CanarySlice:
    """Which service groups take part in a canary.

    Attributes:
        agents: service groups (the log's ``agent`` ids) in the slice.
        sites: sites whose every group is in the slice.
        scenarios: scenarios (the log's ``scenario``) whose every group is in the slice (on the
            emulated cluster the population is new every day, so its group ids do not carry over
            from a log to a canary; its sites and scenarios do).
        treat_share: the share of the slice's groups served the candidate; the rest of the slice
            is the control arm. 1.0 gives no control arm (the guard then cannot judge).
        seed: keys the assignment.
    """

    agents: tuple[str, ...] = ()
    sites: tuple[str, ...] = ()
    treat_share: float = 0.5
    seed: int = 0
    scenarios: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        for f in ("agents", "sites", "scenarios"):
            object.__setattr__(self, f, tuple(str(a) for a in getattr(self, f)))
        if not self.agents and not self.sites and not self.scenarios:
            raise InputError("a canary slice needs service groups, sites or scenarios", where="canary slice")
        if not 0.0 < float(self.treat_share) < 1.0:
            raise InputError(
                f"treat_share must be in (0, 1) (some of the slice must stay on the current policy as the "
                f"control arm), got {self.treat_share}",
                where="canary slice",
            )

    def to_dict(self) -> dict[str, Any]:
        return {"agents": list(self.agents), "sites": list(self.sites), "scenarios": list(self.scenarios),
                "treat_share": self.treat_share, "seed": self.seed}  # fmt: skip

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> CanarySlice:
        return cls(tuple(d.get("agents", ())), tuple(d.get("sites", ())), float(d.get("treat_share", 0.5)),
                   int(d.get("seed", 0)), tuple(d.get("scenarios", ())))  # fmt: skip


def _uniform(seed: int, agent: str) -> float:
    """A uniform number in [0, 1) that depends only on (seed, agent)."""
    h = hashlib.blake2b(f"{int(seed)}\x00{agent}".encode(), digest_size=8).digest()
    return int.from_bytes(h, "little") / 2.0**64


class SliceRouter:
    """Routes each service group to its arm and names the policy that serves it.

    Args:
        slice: the `CanarySlice`.
        candidate: the candidate policy's id (its registry version).
        current: the current policy's id.
    """

    def __init__(self, slice: CanarySlice, candidate: str, current: str) -> None:
        if candidate == current:
            raise InputError(f"the candidate {candidate!r} is the current policy", where="canary")
        self.slice = slice
        self.candidate = candidate
        self.current = current
        self._agents = frozenset(slice.agents)
        self._sites = frozenset(slice.sites)
        self._scenarios = frozenset(slice.scenarios)
        self._cache: dict[tuple[str, str, str], Arm] = {}

    def arm(self, agent: str, site: str = "", scenario: str = "") -> Arm:
        key = (agent, site, scenario)
        a = self._cache.get(key)
        if a is None:
            if agent in self._agents or site in self._sites or scenario in self._scenarios:
                a = "candidate" if _uniform(self.slice.seed, agent) < self.slice.treat_share else "control"
            else:
                a = "fleet"
            self._cache[key] = a
        return a

    def arms(
        self, agents: Sequence[str], sites: Sequence[str] | None = None, scenarios: Sequence[str] | None = None
    ) -> np.ndarray:
        """(N,) arm names for N rows (``sites`` / ``scenarios`` may be omitted when the slice does
        not use them)."""
        sites = [""] * len(agents) if sites is None else sites
        scenarios = [""] * len(agents) if scenarios is None else scenarios
        if len(sites) != len(agents) or len(scenarios) != len(agents):
            raise InputError(f"{len(agents)} agents but {len(sites)} sites, {len(scenarios)} scenarios", "canary")
        return np.array(
            [self.arm(str(a), str(s), str(c)) for a, s, c in zip(agents, sites, scenarios, strict=True)], dtype=object
        )

    def assignment_propensity(self, arms: np.ndarray) -> np.ndarray:
        """(N,) the probability of each row's arm given its group (1 outside the slice)."""
        p = self.slice.treat_share
        return np.where(arms == "candidate", p, np.where(arms == "control", 1.0 - p, 1.0)).astype(np.float64)

    def policy_ids(self, arms: np.ndarray) -> np.ndarray:
        """(N,) which policy serves each row: the candidate's id on the candidate arm, else the current's."""
        return np.where(arms == "candidate", self.candidate, self.current).astype(object)

    def members(self, groups: Iterable[tuple[str, str, str]]) -> dict[Arm, list[str]]:
        """The groups of each arm among ``(agent, site, scenario)`` triples."""
        out: dict[Arm, list[str]] = {a: [] for a in ARMS}
        for agent, site, scenario in groups:
            out[self.arm(agent, site, scenario)].append(agent)
        return out
