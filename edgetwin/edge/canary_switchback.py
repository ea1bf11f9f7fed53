"""A site-level switchback's schedule, as a site serves it: which arm a site is on at a tick.

A switchback (`edgetwin.loop.switchback` plans and judges it) puts *every* group of its sites on
the same policy at a time, alternating in randomized blocks longer than the carryover. The edge
runtime must follow the blocks, and the loop must judge by the same blocks, so the schedule lives
here, in the lowest layer that needs it (the loop imports it from here; nothing is duplicated):

- `draw_assignment`: the blocks' arms from the seed alone (exactly balanced, ``"paired"`` or
  ``"complete"``); every block's assignment probability is 1/2 (`ASSIGNMENT_PROBABILITY`).
- `block_of`, `switchback_assignment`, `is_burn_in`, `block_index`: pure functions of
  ``(schedule, tick)``. A *schedule* is anything with ``start_tick``, ``block_ticks``,
  ``carryover_ticks``, ``n_blocks`` and ``assignment`` (`Schedule`): a `SwitchbackDesign` at the
  edge, a `edgetwin.loop.switchback.SwitchbackPlan` in the loop.
- `SwitchbackDesign`: what a signed canary command carries (`edgetwin.edge.canary_command`): the
  sites, the blocks, the burn-in, the seed, the scheme and the assignment. It is checked on
  receipt: an assignment that is not its seed's draw (changed after the draw), a layout that does
  not make a switchback, is refused with one line (`InputError`), never served.
- `SwitchbackRouter`: the canary router of a switchback (the `edgetwin.edge.canary_slice.SliceRouter`
  interface, plus the tick): a row of the switchback's sites is on the ``candidate`` arm in the
  candidate's blocks and on ``control`` (the current policy) in the others; rows of other sites,
  and every row outside the blocks (before the first: the pre-period; after the last) are on the
  current policy (``fleet`` in a served decision).

The clock is the run's tick: the ``t`` a decision request names (the key the system's outcome
report joins on, `edgetwin.edge.canary_join`), counted from the run's first tick.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

import numpy as np

from edgetwin.contract.errors import InputError

__all__ = [
    "ASSIGNMENT_PROBABILITY",
    "CANDIDATE",
    "CURRENT",
    "SCHEMES",
    "Schedule",
    "SwitchbackDesign",
    "SwitchbackRouter",
    "block_index",
    "block_of",
    "check_assignment",
    "draw_assignment",
    "is_burn_in",
    "switchback_assignment",
]

#: the arms as a switchback's plan names them: the candidate, and the current policy
CANDIDATE, CURRENT = "candidate", "current"
#: how blocks are randomized (`draw_assignment`)
SCHEMES = ("paired", "complete")
#: the probability of each block's arm under both schemes (half the blocks on each policy)
ASSIGNMENT_PROBABILITY = 0.5


def draw_assignment(n_blocks: int, seed: int, scheme: str = "paired") -> tuple[int, ...]:
    """``n_blocks`` arms (1 = candidate), exactly half of each, from ``seed`` alone.

    ``"paired"``: a fair coin per pair of consecutive blocks says which of the two is on the
    candidate; ``"complete"``: a uniformly random half of the blocks. Each block's propensity is
    1/2 under both."""
    if scheme not in SCHEMES:
        raise InputError(
            f"unknown switchback scheme {scheme!r}; expected one of {', '.join(SCHEMES)}", "scheme"
        )
    if n_blocks < 4 or n_blocks % 2:
        raise InputError(f"a switchback needs an even number of blocks >= 4, got {n_blocks}", "n_blocks")
    rng = np.random.default_rng([int(seed), 0x5B, SCHEMES.index(scheme)])
    if scheme == "paired":
        first = rng.random(n_blocks // 2) < 0.5
        out = np.empty(n_blocks, dtype=np.int64)
        out[0::2], out[1::2] = first, ~first
    else:
        out = rng.permutation(np.repeat([1, 0], n_blocks // 2))
    return tuple(int(v) for v in out)


def check_assignment(n_blocks: int, seed: int, scheme: str, given: Sequence[int]) -> tuple[int, ...]:
    """The seed's draw (`draw_assignment`); ``given`` (when not empty) must be exactly it.

    Why refuse rather than serve the given one: the randomization is what makes the blocks'
    difference an unbiased estimate, and the verdict's reference set is the seed's draws; an
    assignment picked by hand (or changed in transit) is neither.

    Raises:
        InputError: ``where="assignment"`` when ``given`` is not the draw (naming the first block
            that differs), or a layout `draw_assignment` refuses."""
    drawn = draw_assignment(int(n_blocks), int(seed), scheme)
    try:
        got = tuple(int(v) for v in given)
    except (TypeError, ValueError):
        raise InputError("the switchback's assignment must be a list of 0/1 per block", "assignment") from None
    if got and got != drawn:
        if len(got) != len(drawn):
            why = f"{len(got)} blocks assigned, the design has {len(drawn)}"
        else:
            k = next(i for i, (a, b) in enumerate(zip(got, drawn, strict=True)) if a != b)
            why = f"block {k} is {got[k]}, seed {int(seed)} draws {drawn[k]}"
        raise InputError(f"the switchback's assignment is not the one its seed draws ({why}): a changed design",
                         "assignment")  # fmt: skip
    return drawn


class Schedule(Protocol):
    """What the schedule's functions read (a `SwitchbackDesign`, or the loop's `SwitchbackPlan`)."""

    @property
    def start_tick(self) -> int: ...

    @property
    def block_ticks(self) -> int: ...

    @property
    def carryover_ticks(self) -> int: ...

    @property
    def n_blocks(self) -> int: ...

    @property
    def assignment(self) -> tuple[int, ...]: ...


def block_of(plan: Schedule, tick: int) -> int | None:
    """The block a switchback tick falls in (None: before the first or after the last block)."""
    k = (int(tick) - int(plan.start_tick)) // int(plan.block_ticks)
    return k if int(tick) >= int(plan.start_tick) and k < int(plan.n_blocks) else None


def switchback_assignment(plan: Schedule, tick: int) -> str:
    """The arm the plan's sites serve at ``tick`` of the switchback's clock: `CANDIDATE` or
    `CURRENT` (every tick outside the blocks). Deterministic from the plan (its seed)."""
    k = block_of(plan, tick)
    return CANDIDATE if k is not None and plan.assignment[k] == 1 else CURRENT


def is_burn_in(plan: Schedule, tick: int) -> bool:
    """Whether ``tick`` is one of its block's first ``carryover_ticks`` ticks (not judged)."""
    return block_of(plan, tick) is not None and (int(tick) - int(plan.start_tick)) % int(
        plan.block_ticks
    ) < int(plan.carryover_ticks)


def block_index(plan: Schedule, ticks: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """`block_of` and "judged" (in a block and not `is_burn_in`) for an array of ticks.

    Returns:
        ``(block, judged)``: ``(N,)`` int64 block (-1 outside the blocks) and ``(N,)`` bool."""
    rel = np.asarray(ticks, dtype=np.int64) - int(plan.start_tick)
    block = rel // int(plan.block_ticks)
    inside = (rel >= 0) & (block < int(plan.n_blocks))
    judged = inside & (rel % int(plan.block_ticks) >= int(plan.carryover_ticks))
    return np.where(inside, block, -1), judged


@dataclasses.dataclass(frozen=True)
class SwitchbackDesign:
    """A switchback as a site runs it (the ``switchback`` field of a signed ``canary_start``).

    Attributes:
        sites: the sites that switch together (every group of them).
        block_ticks: ticks per block; carryover_ticks: the first ticks of each block, served but
            not judged (``0 <= carryover_ticks < block_ticks``).
        n_blocks: blocks (even, >= 4). seed, scheme: draw ``assignment`` (`draw_assignment`).
        start_tick: the run's tick of block 0's start (the ticks before it: the pre-period, every
            group on the current policy).
        assignment: per block, 1 = candidate; must be the seed's draw (`check_assignment`); empty:
            drawn here.
    """

    sites: tuple[str, ...]
    block_ticks: int
    carryover_ticks: int
    n_blocks: int
    seed: int = 0
    scheme: str = "paired"
    start_tick: int = 0
    assignment: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "sites", tuple(str(s) for s in self.sites))
        if not self.sites:
            raise InputError("a switchback needs at least one site", "switchback sites")
        if not (int(self.block_ticks) >= 1 and 0 <= int(self.carryover_ticks) < int(self.block_ticks)):
            raise InputError(f"a switchback needs 0 <= carryover_ticks < block_ticks, got {self.carryover_ticks} and "
                             f"{self.block_ticks}", "block_ticks")  # fmt: skip
        if int(self.start_tick) < 0:
            raise InputError(f"a switchback's start_tick must be >= 0, got {self.start_tick}", "start_tick")
        drawn = check_assignment(int(self.n_blocks), int(self.seed), str(self.scheme), self.assignment)
        object.__setattr__(self, "assignment", drawn)

    @property
    def ticks(self) -> int:
        """Ticks from the first block's start to the last block's end."""
        return int(self.n_blocks) * int(self.block_ticks)

    @property
    def judged_ticks_per_block(self) -> int:
        return int(self.block_ticks) - int(self.carryover_ticks)

    def to_dict(self) -> dict[str, Any]:
        return {"sites": list(self.sites), "block_ticks": int(self.block_ticks),
                "carryover_ticks": int(self.carryover_ticks), "n_blocks": int(self.n_blocks), "seed": int(self.seed),
                "scheme": str(self.scheme), "start_tick": int(self.start_tick),
                "assignment": [int(v) for v in self.assignment]}  # fmt: skip

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> SwitchbackDesign:
        """Raises `InputError` (one line) on a payload that does not make a switchback."""
        if not isinstance(d, Mapping):
            raise InputError("a switchback must be an object", "switchback")
        try:
            sites, assignment = d["sites"], d.get("assignment", [])
            if not isinstance(sites, list | tuple) or not isinstance(assignment, list | tuple):
                raise TypeError("sites and assignment must be lists")
            return cls(tuple(str(s) for s in sites), int(d["block_ticks"]), int(d["carryover_ticks"]),
                       int(d["n_blocks"]), int(d.get("seed", 0)), str(d.get("scheme", "paired")),
                       int(d.get("start_tick", 0)), tuple(assignment))  # fmt: skip
        except InputError:
            raise
        except (KeyError, TypeError, ValueError) as e:
            raise InputError(f"not a switchback design ({type(e).__name__}: {e})", "switchback") from None

    @classmethod
    def from_plan(cls, plan: Any) -> SwitchbackDesign:
        """The design of a `edgetwin.loop.switchback.SwitchbackPlan` (or any object with its fields)."""
        return cls(tuple(plan.sites), int(plan.block_ticks), int(plan.carryover_ticks), int(plan.n_blocks),
                   int(plan.seed), str(plan.scheme), int(plan.start_tick), tuple(plan.assignment))  # fmt: skip


class SwitchbackRouter:
    """The arms of a switchback, by site and tick (the `SliceRouter` interface, plus the tick).

    A row of the design's sites is on ``candidate`` at a tick of a candidate block, on ``control``
    at any other tick; rows of other sites are on ``fleet``. (A served decision outside the blocks
    says ``fleet``: `edgetwin.edge.runtime_canary.CanaryRouting.decide_for`.) ``tick`` is the tick
    used when `arms` is not given one: the tick whose rows the canary is recording (a report is one
    tick's rows), so that a caller that knows only the rows (``/metrics``) labels them as served.

    Args:
        design: the `SwitchbackDesign`; candidate, current: the two policies' ids (registry versions).
    """

    def __init__(self, design: SwitchbackDesign, candidate: str, current: str) -> None:
        if candidate == current:
            raise InputError(f"the candidate {candidate!r} is the current policy", where="canary")
        self.design = design
        self.candidate, self.current = candidate, current
        self._sites = frozenset(design.sites)
        self.tick: int | None = None

    def in_sites(self, sites: Sequence[str]) -> np.ndarray:
        """``(N,)`` True for rows of the switchback's sites."""
        return np.array([str(s) in self._sites for s in sites], dtype=bool)

    def arms(
        self, agents: Sequence[str], sites: Sequence[str] | None = None, scenarios: Sequence[str] | None = None,
        t: int | np.ndarray | None = None,
    ) -> np.ndarray:  # fmt: skip
        """``(N,)`` arm names for N rows at tick ``t`` (a scalar, or one per row; default `tick`)."""
        if sites is None or len(sites) != len(agents):
            raise InputError(f"a switchback routes by site: {len(agents)} agents but "
                             f"{'no' if sites is None else len(sites)} sites", "canary")  # fmt: skip
        t = self.tick if t is None else t
        ticks = np.broadcast_to(np.asarray(-1 if t is None else t, dtype=np.int64), (len(agents),))
        block, _ = block_index(self.design, ticks)
        assign = np.asarray(self.design.assignment, dtype=np.int64)
        on = (block >= 0) & (assign[np.maximum(block, 0)] == 1)
        inside = self.in_sites(sites)
        return np.where(inside & on, "candidate", np.where(inside, "control", "fleet")).astype(object)

    def assignment_propensity(self, arms: np.ndarray) -> np.ndarray:
        """(N,) the probability of each row's arm: `ASSIGNMENT_PROBABILITY` on the switchback's two
        arms (its block's), 1 outside."""
        return np.where(np.isin(arms, ("candidate", "control")), ASSIGNMENT_PROBABILITY, 1.0).astype(np.float64)

    def policy_ids(self, arms: np.ndarray) -> np.ndarray:
        """(N,) which policy serves each row: the candidate's id on the candidate arm, else the current's."""
        return np.where(arms == "candidate", self.candidate, self.current).astype(object)
