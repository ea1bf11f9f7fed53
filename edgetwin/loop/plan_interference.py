"""The twin's interference at plan time: the term the verdict's interval carries for it, foreseen.

The prediction-powered verdict (`edgetwin.loop.ppi`) rectifies the twin's prediction of the
canary's own configuration (``f^canary``: the candidate arm on the candidate, every other group on
the baseline) and transports the twin's predicted difference between that configuration and the
full switch (the interference) to the fleet. No canary measures that difference, so the verdict's
interval carries the twin members' spread over it (`edgetwin.loop.ppi.interference_var`, on
members − 1 degrees of freedom), a term shared by every canary day, and it decides on the hull of
that estimate and the one that assumes no interference. A plan that leaves both out expects an
interval narrower than the verdict's for a reason it could foresee (issue 48).

Here the plan replays what the verdict will replay (`edgetwin.loop.verdict.canary_verdict`): each
member on its own world seed, the full switch to either policy and a canary assignment, and reads
the interference with the verdict's own functions (`edgetwin.loop.ppi.interference_var`,
`edgetwin.loop.ppi.member_interference`) over the window a canary of ``h`` hours is judged on
(after ``pre_ticks``).

**The approximation.** The verdict reads the canary's actual arms; the plan weighs every slice
size before it draws one, and a replay per size would cost one replay per member per size (the
closed loop's 1,000-group fleet: 49 sizes). So the plan replays one canary: the largest slice the
budget allows, drawn as the plan draws its slice (`edgetwin.loop.plan._draw_slice`'s seeded draw,
the same groups when the plan chooses that size), split at random into arms of the plan's shares;
a slice of ``n`` groups reads the interference on ``n_c`` groups of that candidate arm and ``n_b``
of the fleet's other groups (every one on the baseline in the replay, as a control arm is), averaged
over `DRAWS` random draws of them (`PlannedInterference.draws`: the verdict's term moves a lot with
which groups land in the arms, and the plan wants its expectation). What this gets wrong: a smaller
slice congests the shared sites slightly less than the replayed one, so its own interference is
slightly larger; the spread over members, what the interval carries, is read on the option's own
number of groups; and at the largest size every draw has the one replayed candidate arm.

Units: variances in KPI units squared, shifts in KPI units; per-member frames are
`edgetwin.loop.ppi.twin_group_predictions`-shaped (one row per group, ``(policy, column)`` columns).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from edgetwin.loop.plan_expected import Interference

#: the policy names of the replays (`edgetwin.loop.ppi.ppi_estimates`' ``candidate``, ``baseline``, ``canary``)
CANDIDATE, BASELINE, CANARY = "candidate", "baseline", "canary"
#: draws of the arms a slice's term is averaged over (`PlannedInterference.draws`)
DRAWS = 8


def member_replays(
    twin: Any, candidate: Any, baseline: Any, log: pd.DataFrame, columns: Sequence[str], *, seed: int,
    members: Sequence[int] | None,
) -> tuple[pd.DataFrame, list[dict[tuple[str, str], pd.DataFrame]]]:
    """The twin's full-switch replays, member by member: ``(preds, per_member)``.

    ``per_member[i]``: `edgetwin.loop.ppi.twin_group_series` of member ``members[i]`` alone
    (``(policy, column)`` -> agents × ticks); ``preds``: every member's mean over the whole episode,
    the plan's per-group predictions (`edgetwin.loop.ppi.twin_group_predictions` over all members:
    the same replays, the same world seeds per member, in the same order, and the same pandas means,
    so the same numbers; tests/test_interf16_real_plan.py checks it). Why member by member:
    the interference's spread needs each member's replay, and replaying the full switch again for
    it would double the plan's replays."""
    from edgetwin.loop.twin_series import twin_group_series

    mem = list(members) if members is not None else list(range(int(twin.n_members)))
    pols = {CANDIDATE: candidate, BASELINE: baseline}
    per_member = [twin_group_series(twin, pols, log, columns, episodes=1, seed=seed, members=[m]) for m in mem]
    cols = {}
    for key in per_member[0]:
        f = pd.concat([s[key] for s in per_member]).groupby(level=0).mean().sort_index()
        cols[key] = f.iloc[:, 0:f.shape[1]].mean(axis=1)
    preds = pd.DataFrame(cols)
    preds.columns = pd.MultiIndex.from_tuples(list(cols))
    return preds, per_member


def slice_groups(agents: Sequence[str], n: int, seed: int, round_no: int) -> tuple[str, ...]:
    """A canary slice's ``n`` groups: a seeded uniform draw from the fleet ``agents`` (sorted ids),
    by ``(seed, round_no)``. The plan's draw (`edgetwin.loop.plan._draw_slice` calls it), kept here,
    below the plan, because the interference replay of the largest slice (`replayed_arms`) must hold
    the groups the plan chooses when it takes that size: one draw in one place."""
    rng = np.random.default_rng([seed, round_no, 0xCA])
    return tuple(sorted(str(a) for a in rng.choice(np.array(list(agents), dtype=object), n, replace=False)))


def replayed_arms(agents: Sequence[str], n_max: int, treat_share: float, seed: int, round_no: int) -> tuple[
        list[str], list[str]]:
    """The replayed canary's arms ``(candidate, control)``: ``n_max`` groups drawn as
    `edgetwin.loop.plan._draw_slice` draws a slice of that size (seeded by ``seed`` and
    ``round_no``), in a seeded random order, the first ``round(treat_share·n_max)`` (at least 2) on
    the candidate. A slice of ``n`` groups reads the first ``n_c`` and ``n_b`` of each
    (`PlannedInterference.term`)."""
    chosen = list(slice_groups(agents, n_max, seed, round_no))
    order = [chosen[i] for i in np.random.default_rng([seed, round_no, 0x1F]).permutation(len(chosen))]
    n_c = max(2, int(round(treat_share * n_max)))
    return order[:n_c], order[n_c:]


def window_means(series: dict[tuple[str, str], pd.DataFrame], pre_ticks: int, hours: float) -> pd.DataFrame:
    """One member's replays (``(policy, column)`` -> agents × ticks) as per-group means over the
    ticks a canary of ``hours`` is judged on, ``[pre_ticks, pre_ticks + 4·hours)``
    (`edgetwin.loop.verdict.canary_verdict`'s window): a `twin_group_predictions`-shaped frame."""
    lo = int(pre_ticks)
    hi = lo + max(1, int(round(float(hours) * 4)))
    cols = {key: f.iloc[:, lo:hi].mean(axis=1) for key, f in series.items()}
    df = pd.DataFrame(cols)
    df.columns = pd.MultiIndex.from_tuples(list(cols))
    return df


@dataclass
class PlannedInterference:
    """The twin's interference for every option a plan weighs, from one canary replay per member.

    Attributes:
        frames: per canary duration (hours), per member, the replays' per-group means over its
            window (`window_means`: `CANDIDATE`, `BASELINE` and `CANARY` columns per KPI column).
            Window means, not the per-tick series: at 5,000 groups the series of every member and
            policy would be held for the whole plan.
        arms: the replayed canary's ``(candidate, control)`` group ids (`replayed_arms`).
        treat_share: the candidate's share of a slice (`edgetwin.loop.plan.PlanBudget`).
        level_sign: per column, the sign of the fleet's baseline level (``preds``' mean), which
            `Interference.base_shift` is signed towards.
        sizes: the slice sizes the plan weighs (`term` reads them all at a column's first call).
    """

    frames: dict[float, list[pd.DataFrame]]
    arms: tuple[list[str], list[str]]
    treat_share: float
    level_sign: dict[str, float]
    sizes: tuple[int, ...] = ()
    _terms: dict[tuple[str, int, float], Interference] = field(default_factory=dict, init=False, repr=False)

    @classmethod
    def from_series(cls, series: Sequence[dict[tuple[str, str], pd.DataFrame]], arms: tuple[list[str], list[str]],
                    treat_share: float, pre_ticks: int, hours: Sequence[float],
                    level_sign: dict[str, float]) -> PlannedInterference:
        """From each member's per-tick replays (``(policy, column)`` -> agents × ticks), over the
        windows of the canary durations ``hours``."""
        frames = {float(h): [window_means(s, pre_ticks, h) for s in series] for h in hours}
        return cls(frames, arms, float(treat_share), dict(level_sign))

    def draws(self, n: int) -> list[tuple[list[str], list[str]]]:
        """`DRAWS` seeded draws of a slice of ``n`` groups' arms ``(candidate, control)`` that the
        replay can be read on: ``n_c = max(2, round(treat_share·n))`` of the replayed candidate arm
        (all of it at the largest size) and ``n_b = max(2, n − n_c)`` of the fleet's other groups
        (each on the baseline in the replay, as the canary's control arm is: a uniform draw of
        them), as `edgetwin.loop.plan.kpi_terms` counts the arms. Several draws, because with few
        members and few groups per arm the verdict's term moves a lot with which groups land in
        the arms (the demo's 2-member twin, 5 + 5 groups: energy's term from 0.01 % to 58 % of the
        level over four draws of the slice), and the plan wants what it is expected to be."""
        n_c = max(2, int(round(self.treat_share * n)))
        n_b = max(2, int(n) - n_c)
        treated = np.array(sorted(self.arms[0]), dtype=object)
        index = next(iter(self.frames.values()))[0].index if self.frames else []
        pool = np.array(sorted(set(map(str, index)) - set(self.arms[0])), dtype=object)
        rng = np.random.default_rng([int(n), 0x1F7])
        return [([str(a) for a in rng.choice(treated, min(n_c, len(treated)), replace=False)],
                 [str(a) for a in rng.choice(pool, min(n_b, len(pool)), replace=False)])
                for _ in range(DRAWS)]  # fmt: skip

    def term(self, column: str, n: int, hours: float) -> Interference:
        """The interference term of ``column`` for a slice of ``n`` groups for ``hours``: the
        verdict's (`edgetwin.loop.ppi.interference_spread` of `edgetwin.loop.ppi.member_interference_draws`,
        which `edgetwin.loop.ppi.interference_var` is for one draw) on each of `draws` arms,
        averaged (the expected term over the arms' draw), members − 1 degrees of freedom (at least
        1, as the verdict's)."""
        key = (column, int(n), float(hours))
        if key not in self._terms:  # every size of `sizes` at once: one reindex per member (column, hours)
            from edgetwin.loop.ppi import interference_spread, member_interference_draws

            frames = self.frames[float(hours)]
            groups = [str(a) for a in frames[0].index]
            pos = {a: i for i, a in enumerate(groups)}
            ns = sorted({int(n), *self.sizes})
            arms = [(np.array([pos[a] for a in c], dtype=np.intp), np.array([pos[a] for a in b], dtype=np.intp))
                    for k in ns for c, b in self.draws(k)]  # fmt: skip
            i_d, j_d = member_interference_draws(frames, arms, groups, column, CANDIDATE, BASELINE, CANARY)
            for s, k in enumerate(ns):
                got = [(*interference_spread(i_d[:, a], j_d[:, a]), float(np.mean(i_d[:, a])), float(np.mean(j_d[:, a])))
                       for a in range(s * DRAWS, (s + 1) * DRAWS)]  # fmt: skip
                v_i, v_j, shift, base_shift = (float(v) for v in np.mean(np.array(got), axis=0))
                self._terms[(column, k, float(hours))] = Interference(
                    v_i, v_j, float(max(len(frames) - 1, 1)), shift, float(self.level_sign.get(column, 1.0)) * base_shift
                )  # fmt: skip
        return self._terms[key]


def planned_interference(
    twin: Any, log: pd.DataFrame, candidate: Any, baseline: Any, columns: Sequence[str],
    per_member: Sequence[dict[tuple[str, str], pd.DataFrame]], preds: pd.DataFrame, agents: Sequence[str],
    n_max: int, treat_share: float, *, hours: Sequence[float], pre_ticks: int, seed: int, round_no: int,
    members: Sequence[int] | None,
) -> PlannedInterference:
    """The plan's `PlannedInterference`: each member's replay of a canary assignment
    (`edgetwin.loop.ppi.CanaryAssignment`: `replayed_arms`' candidate arm on ``candidate``, every
    other group of the fleet on ``baseline``), on the world seeds of its full-switch replays
    ``per_member`` (`member_replays`), as the verdict replays them. ``preds``: the plan's per-group
    predictions (the sign of each column's baseline level); ``agents``: the fleet; ``n_max``: the
    largest slice the budget allows (the sizes weighed: even, from 4, as `edgetwin.loop.plan.plan_canary`
    weighs them); ``hours``: the canary durations weighed. Costs one replay per
    member; holds only window means (`PlannedInterference.frames`)."""
    from edgetwin.loop.ppi import CanaryAssignment
    from edgetwin.loop.twin_series import twin_group_series

    mem = list(members) if members is not None else list(range(int(twin.n_members)))
    arms = replayed_arms(agents, n_max, treat_share, seed, round_no)
    assignment = {CANARY: CanaryAssignment(candidate, baseline, frozenset(arms[0]))}
    frames: dict[float, list[pd.DataFrame]] = {float(h): [] for h in hours}
    for m, full in zip(mem, per_member, strict=True):
        got = twin_group_series(twin, assignment, log, columns, episodes=1, seed=seed, members=[m])
        for h in frames:
            frames[h].append(window_means({**full, **got}, pre_ticks, h))
    signs = {}
    for c in columns:
        level = float(np.mean(preds[(BASELINE, c)].to_numpy(dtype=np.float64)))
        signs[c] = -1.0 if math.isfinite(level) and level < 0 else 1.0
    return PlannedInterference(frames, arms, float(treat_share), signs, tuple(range(4, int(n_max) + 1, 2)))


__all__ = ["BASELINE", "CANARY", "CANDIDATE", "DRAWS", "PlannedInterference", "member_replays", "planned_interference",
           "replayed_arms", "slice_groups", "window_means"]
