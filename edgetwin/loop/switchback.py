"""Site-level switchbacks: a site (or a set of sites) alternates between the current policy and the
candidate in randomized blocks longer than the carryover, so that the canary measures the
candidate under the load it causes itself.

**Why.** A group-split canary serves the candidate to a slice of service groups while everyone else
keeps the current policy: the candidate arm shares its edge sites with a fleet that has not
switched, so it never sees the congestion a full switch would cause (interference), and the
control arm shares the sites with the candidate arm (contamination). Where the twin predicts that a
slice would not see the fleet's congestion, the prediction-powered verdict has to trust the twin's
interference (`edgetwin.loop.ppi`). A switchback puts *every* group of its sites on the same arm at
a time, so each block measures the policy under the load the policy itself makes: the canary itself
measures interference (Bojinov, Simchi-Levi and Zhao 2023, "Design and analysis of switchback
experiments", Management Science 69(7)).

**Design** (`SwitchbackPlan`). The switchback's clock starts at ``start_tick`` (the ticks before it
are on the current policy: a pre-period) and runs ``n_blocks`` blocks of ``block_ticks`` ticks each;
block ``k`` serves the candidate when ``assignment[k] == 1``. The assignment is drawn from
``seed`` alone (`draw_assignment`), exactly balanced (half the blocks on each policy), under one of
two schemes: ``"paired"`` (blocks ``2p`` and ``2p+1`` are a pair and a fair coin says which of the
two gets the candidate: a crossover in time that cancels the slow diurnal trend within each pair)
or ``"complete"`` (half of all blocks on the candidate, uniformly). Each block's propensity is 1/2
either way. All sites of a plan follow one assignment: sites that share a cloud region interfere
with each other, so they switch together. The schedule (`draw_assignment`, `block_of`,
`switchback_assignment`, `is_burn_in`) lives in `edgetwin.edge.canary_switchback`, the lowest layer
that needs it: a running ``edgetwin serve`` follows `switchback_assignment(plan, tick)` there
(`judge_switchback` judges its collected log), and this module imports it.

**Carryover.** The outcome at tick ``t`` may depend on the policies of ticks ``t−m .. t`` (the
paper's carryover of order ``m``: backlogs drain, clients' latency memory fades). A block must be
longer than ``m``, and the first ``m`` ticks of each block (``carryover_ticks``) are burned in:
they are not judged. The paper's Horvitz-Thompson estimator weights a tick by the probability that
its whole carryover window ``t−m .. t`` sat on one arm; for a tick in a block's first ``m`` ticks
that is 1/4 (both this block and the one before on the same arm) and its indicator is 0 after a
switch. We drop those ticks in every block, after a switch or not, so that the judged ticks are
fixed by the design rather than by the draw and every judged tick has propensity 1/2: the estimand
is the paper's ``m``-carryover effect (``Y_t(candidate for m+1 ticks) − Y_t(current for m+1
ticks)``) averaged over the judged ticks.

**Estimate** (`estimate_switchback`). Per block, the mean over its judged ticks of the per-tick mean
of the KPI over the sites' agent-steps (`block_outcomes`). The Horvitz-Thompson estimator over
blocks, ``(1/K) Σ_k [u_k Ȳ_k / ½ − (1 − u_k) Ȳ_k / ½]``, equals the difference of the arms' block
means because exactly half the blocks are on each arm. Its conservative variance is Neyman's (the
paper's finite-population CLT bound: the variance of the blocks' effects, which no experiment
observes, is dropped, so the interval is wide, never narrow): ``s_c²/n_c + s_b²/n_b`` under the
complete scheme, ``s_d²/P`` of the ``P`` pair differences under the paired one. The relative change
divides by the current policy's block mean (interval division, the effect's interval over the
block mean's, `edgetwin.loop.ppi.finish_estimate`, as every other design's verdict does).

**Reference: t, not normal, by default.** A day of one-hour blocks is 24 blocks, 12 pairs: far from
the paper's asymptotics. The interval uses Student's t with ``P − 1`` degrees of freedom (paired)
or Welch-Satterthwaite's (complete), the reference the other designs' verdicts use. The
alternative, a randomization interval over the plan's own assignment set (``method=
"randomization"``: the multiplicative sharp null ``Y_k(candidate) = (1 + ρ) Y_k(current)`` inverted
over ``ρ``), is exact when that null holds, but (a) the null of one constant effect in every block
is false where the effect follows the time of day, and (b) with ``P`` pairs its smallest two-sided
p-value is ``2^(1−P)``, so below 5 pairs a 90 % randomization interval is the whole line. It is
kept as a check, not the default.

**What it does not measure.** The plan's sites are not a random draw of the fleet: the switchback
estimates the effect on *those sites* when they switch whole. The fleet-wide effect is that only
where the sites are like the fleet; a verdict about the fleet needs the twin to transport it (the
rectifier of `edgetwin.loop.ppi` with the switchback's sites as the measured slice; not done here).
Nor does one day's switchback measure the effect on other days: its interval is about its own day.
Measured on the emulated cluster (docs/benchmarks/switchback, 200 days per cell): edge-waw's
switchback covers its day's effect at the stated level (88.0-93.5 % of A/A and regressing runs at 90 %),
with intervals a third to a half as wide as a group-split canary's of the same share × hours (the
canary alone, without the twin: a site's per-tick mean averages its groups, and each pair of
adjacent blocks cancels the time of day, where the split's arms differ by which groups they drew);
under congestion, where a group split of an edge-hogging candidate estimates −5 % SLO violations
against the fleet's +11 % (covering it in 42 % of runs), the switchback estimates +11 % on its
site. It loses on the fleet (it covers the fleet's truth in 40 % of those runs: edge-waw's effect
is not the fleet's), on the multi-day truth, and on a heavy-tailed KPI under congestion (task time:
86 % coverage of its day).

**Expected width** (`plan_switchback`). The planner simulates the switchback in the twin: the
recent log's last episode replayed day after day (`SwitchbackPolicy` inside
`edgetwin.twin.whatif.engine.run_episode`), each simulation with its own world seed and its own
assignment, estimated by `estimate_switchback` exactly as the canary's log will be; the plan records
the median width over ``sims`` simulations per KPI, and the twin's own effect on the sites.

**On the emulated cluster** (`run_switchback_on_cluster`): the emulator steps every group each tick
with the actions of `SwitchbackPolicy`, a composite policy that switches by tick (it counts its
calls: one per tick) and routes each row by its site; nothing was added to the emulator.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from edgetwin.contract.errors import InputError
from edgetwin.edge.canary_switchback import (
    CANDIDATE,
    CURRENT,
    SCHEMES,
    SwitchbackDesign,
    block_index,
    block_of,
    draw_assignment,
    is_burn_in,
    switchback_assignment,
)

#: the interval's level (the verdict's)
LEVEL = 0.90
#: estimation methods (`estimate_switchback`)
METHODS = ("t", "randomization")
#: the most assignments a randomization interval enumerates (more: a seeded sample of them)
MAX_ENUMERATED = 4096


# ------------------------------------------------------------------------------------ the design
@dataclass(frozen=True)
class SwitchbackPlan(SwitchbackDesign):
    """A site-level switchback: which sites, how the blocks run, and what it is expected to tell.

    The layout and assignment are its `edgetwin.edge.canary_switchback.SwitchbackDesign` (the
    schedule the sites follow; checked there); the plan adds the day, the tick and what the twin
    expects.

    Attributes:
        sites: the sites that switch (every agent of them, together).
        block_ticks: ticks per block; carryover_ticks: the first ticks of each block, not judged
            (``0 <= carryover_ticks < block_ticks``).
        n_blocks: blocks (even, >= 4). seed: draws ``assignment``. scheme: `SCHEMES`.
        start_tick: the switchback clock's first tick of block 0 (ticks before it: current policy).
        episode_ticks: ticks per episode (day) of the log, to number a multi-day switchback's ticks.
        tick_seconds: seconds per tick.
        assignment: per block, 1 = candidate (drawn from ``seed`` when empty; refused when it is
            not that draw: a tampered plan).
        expected_width: per KPI column, the median width of the relative interval over the twin's
            simulations (`plan_switchback`); twin_change: the twin's relative change on the sites
            (all of them switched); twin_interference: per KPI, the twin's fleet-wide relative change
            under a full switch less the one its slice of the same share would measure (the
            congestion a group-split canary would miss: the reason to switch back, `plan_switchback`);
            fleet_loss: per KPI, the gate's worst relative worsening × the sites' share × 1/2 (half
            the blocks on the candidate), as `edgetwin.loop.plan` counts a canary's risk.
        site_share: the sites' share of the fleet's service groups (the budget's share; 0: not known).
        candidate, baseline: names (reported). level: the interval's level.
    """

    episode_ticks: int = 96
    tick_seconds: float = 900.0
    expected_width: dict[str, float] = field(default_factory=dict)
    twin_change: dict[str, float] = field(default_factory=dict)
    twin_interference: dict[str, float] = field(default_factory=dict)
    fleet_loss: dict[str, float] = field(default_factory=dict)
    site_share: float = 0.0
    candidate: str = CANDIDATE
    baseline: str = CURRENT
    level: float = LEVEL

    def __post_init__(self) -> None:
        super().__post_init__()  # the design: sites, blocks, burn-in, start tick, the seed's assignment
        if int(self.episode_ticks) < 1 or not self.tick_seconds > 0:
            raise InputError("episode_ticks must be >= 1 and tick_seconds > 0", "plan")
        if not 0.0 < float(self.level) < 1.0:
            raise InputError(f"the level must be in (0, 1), got {self.level}", "--level")

    @property
    def hours(self) -> float:
        return self.ticks * float(self.tick_seconds) / 3600.0

    @property
    def expected_width_sum(self) -> float:
        """The expected widths summed over the KPIs: what `edgetwin.loop.plan.CanaryPlan.expected_width`
        records per design (the summed width of the deciding KPIs), to weigh the switchback against them."""
        return float(sum(self.expected_width.values()))

    @property
    def judged_ticks(self) -> int:
        """Ticks the estimate uses (every block less its burn-in)."""
        return int(self.n_blocks) * (int(self.block_ticks) - int(self.carryover_ticks))

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["sites"], d["assignment"] = list(self.sites), list(self.assignment)
        d["hours"] = self.hours
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> SwitchbackPlan:
        try:
            return cls(
                tuple(d["sites"]), int(d["block_ticks"]), int(d["carryover_ticks"]), int(d["n_blocks"]),
                seed=int(d.get("seed", 0)), scheme=str(d.get("scheme", "paired")), start_tick=int(d.get("start_tick", 0)),
                assignment=tuple(int(v) for v in d.get("assignment", ())),
                episode_ticks=int(d.get("episode_ticks", 96)), tick_seconds=float(d.get("tick_seconds", 900.0)),
                expected_width={str(k): float(v) for k, v in dict(d.get("expected_width") or {}).items()},
                twin_change={str(k): float(v) for k, v in dict(d.get("twin_change") or {}).items()},
                twin_interference={str(k): float(v) for k, v in dict(d.get("twin_interference") or {}).items()},
                fleet_loss={str(k): float(v) for k, v in dict(d.get("fleet_loss") or {}).items()},
                site_share=float(d.get("site_share", 0.0)), candidate=str(d.get("candidate", CANDIDATE)),
                baseline=str(d.get("baseline", CURRENT)), level=float(d.get("level", LEVEL)),
            )  # fmt: skip
        except InputError:
            raise
        except (KeyError, TypeError, ValueError) as e:
            raise InputError(f"not a switchback plan ({type(e).__name__}: {e})", "plan") from None


# ------------------------------------------------------------------------------------ the composite policy
class SwitchbackPolicy:
    """Serves a switchback: rows of the plan's sites get the arm of the current tick, every other
    row the current policy.

    The tick is counted from the calls: `act` is called once per tick (the emulated cluster's step,
    the twin's `run_episode`), starting at ``first_tick`` of the switchback's clock. Both policies
    act on every row each tick and each row takes its arm's action, so a policy that keeps per-row
    state (a recurrent memory, a shield's history) sees every row every tick, whichever arm served.

    Args:
        current, candidate: `PlatformPolicy` s (``act(obs (N, O)) -> (N, A)``).
        plan: the switchback. row_sites: ``(N,)`` each row's site name, in row order.
        first_tick: the switchback tick of the first call (a later day: ``day × episode_ticks``).
    """

    def __init__(self, current: Any, candidate: Any, plan: SwitchbackPlan, row_sites: Sequence[str] | np.ndarray,
                 first_tick: int = 0) -> None:  # fmt: skip
        self.current, self.candidate, self.plan = current, candidate, plan
        self.in_sites = np.isin(np.asarray(row_sites).astype(str), np.array(plan.sites, dtype=str))
        self.tick = int(first_tick)

    def arm_mask(self, tick: int) -> np.ndarray:
        """``(N,)`` True where the candidate serves at ``tick``."""
        on = switchback_assignment(self.plan, tick) == CANDIDATE
        return self.in_sites & on

    def act(self, obs: np.ndarray) -> np.ndarray:
        obs = np.asarray(obs)
        if len(obs) != len(self.in_sites):
            raise ValueError(
                f"a switchback policy for {len(self.in_sites)} rows was given {len(obs)} observations"
            )
        mask = self.arm_mask(self.tick)
        a_cur = np.asarray(self.current.act(obs), dtype=np.float64).reshape(len(obs), -1)
        a_cand = np.asarray(self.candidate.act(obs), dtype=np.float64).reshape(len(obs), -1)
        self.tick += 1
        return np.where(mask[:, None], a_cand, a_cur)


# ------------------------------------------------------------------------------------ estimation
def switchback_ticks(rows: pd.DataFrame, plan: SwitchbackPlan) -> np.ndarray:
    """Each row's tick on the switchback's clock: the ``tick`` column when the log has one, else
    ``t`` plus ``episode_ticks`` times the episode's position (episodes in order of appearance)."""
    if "tick" in rows.columns:
        return rows["tick"].to_numpy(np.int64)
    if "t" not in rows.columns:
        raise InputError("the switchback log needs a 't' (or 'tick') column", "t")
    if "episode" not in rows.columns:
        return rows["t"].to_numpy(np.int64)
    order = {e: i for i, e in enumerate(pd.unique(rows["episode"]))}
    day = rows["episode"].map(order).to_numpy(np.int64)
    return day * int(plan.episode_ticks) + rows["t"].to_numpy(np.int64)


def block_outcomes(rows: pd.DataFrame, plan: SwitchbackPlan, kpis: Sequence[str], complete: bool = True) -> pd.DataFrame:
    """Per block, the mean over its judged ticks (burn-in dropped) of each KPI's per-tick mean over
    the plan's sites' rows.

    Rows of other sites are ignored. When the log says which arm served a row (``arm``: `CANDIDATE`,
    or `CURRENT` / ``control`` as the edge writes it), a judged row whose arm is not the plan's is
    refused: the log is not this switchback's.

    Returns:
        index the block (0..n_blocks-1), columns ``kpis`` plus ``arm`` (1 = candidate) and ``ticks``
        (judged ticks seen); a block with no judged tick is refused (`InputError`), or with
        ``complete=False`` (a log a stop cut short) kept with ``ticks`` 0 and NaN KPIs.
    """
    missing = [k for k in kpis if k not in rows.columns]
    if missing:
        raise InputError(f"the switchback log has no column(s) {missing}", "log")
    if "site" not in rows.columns:
        raise InputError("the switchback log needs a 'site' column", "site")
    at = rows[rows["site"].astype(str).isin(plan.sites)]
    ticks = switchback_ticks(at, plan)
    block, judged = block_index(plan, ticks)
    at = at.loc[judged, list(kpis) + (["arm"] if "arm" in at.columns else [])].assign(
        _tick=ticks[judged], _block=block[judged]
    )
    assign = np.asarray(plan.assignment)
    if "arm" in at.columns:
        want = np.where(assign[at["_block"].to_numpy()] == 1, CANDIDATE, CURRENT)
        # the edge names the current policy's arm ``control`` (`edgetwin.edge.canary_switchback`)
        served = at["arm"].astype(str).replace({"control": CURRENT}).to_numpy()
        bad = served != want
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            raise InputError(f"row of tick {int(at['_tick'].iloc[i])} was served by {at['arm'].iloc[i]!r}, the plan says "
                             f"{want[i]!r}: not this switchback's log", "arm")  # fmt: skip
    per_tick = at.groupby(["_block", "_tick"])[list(kpis)].mean()
    out = per_tick.groupby(level="_block").mean().reindex(range(int(plan.n_blocks)))
    out["ticks"] = (
        per_tick.groupby(level="_block").size().reindex(range(int(plan.n_blocks))).fillna(0).astype(int)
    )
    empty = out.index[out["ticks"] == 0].tolist()
    if empty and complete:
        raise InputError(
            f"block(s) {empty} of the switchback have no judged tick of sites {list(plan.sites)}", "log"
        )
    out["arm"] = assign
    out.index.name = "block"
    return out


@dataclass
class SwitchbackEstimate:
    """One KPI's switchback estimate (candidate − current on the plan's sites).

    Attributes:
        kpi: the column. change, interval: relative change and its ``level`` interval (fractions).
        diff, diff_se: the difference in the KPI's units and its conservative standard error.
        baseline: the current policy's block mean. df: the t reference's degrees of freedom.
        n_blocks: blocks; n_pairs: pairs (paired scheme; 0 otherwise). method: `METHODS`.
        terms: `edgetwin.loop.ppi.finish_estimate`'s dict (``diff``, ``diff_se``, ``base``,
            ``base_se``, ``rel``, ``rel_lo``, ``rel_hi``, ``df``, ``level``; the randomization
            interval in ``rel_lo``/``rel_hi`` under that method) with ``twin_rel``, ``twin_diff``,
            ``n_fleet`` (0), ``n_candidate``, ``n_control`` (blocks): what
            `edgetwin.loop.ppi.ppi_verdict` and `edgetwin.loop.ppi.combine_estimates` read, so
            ``ppi_verdict({kpi: est.terms}, margins)`` decides on a switchback.
    """

    kpi: str
    change: float
    interval: list[float]
    diff: float
    diff_se: float
    baseline: float
    df: float
    level: float
    n_blocks: int
    n_pairs: int
    method: str
    terms: dict[str, float] = field(default_factory=dict)

    @property
    def width(self) -> float:
        return float(self.interval[1] - self.interval[0])

    def covers(self, value: float) -> bool:
        return bool(self.interval[0] <= value <= self.interval[1])

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _t_terms(y: np.ndarray, u: np.ndarray, scheme: str, level: float) -> dict[str, float]:
    """The Horvitz-Thompson estimate over blocks (= the difference of the arms' block means, half
    the blocks on each) with Neyman's conservative variance, on a t reference."""
    from edgetwin.loop.ppi import finish_estimate, welch_df

    yc, yb = y[u == 1], y[u == 0]
    base, base_var = float(yb.mean()), float(np.var(yb, ddof=1)) / len(yb)
    if scheme == "paired":
        d = y[0::2] - y[1::2]
        d = np.where(u[0::2] == 1, d, -d)  # candidate − current within each pair
        diff, diff_var, df = float(d.mean()), float(np.var(d, ddof=1)) / len(d), float(len(d) - 1)
    else:
        vc, vb = float(np.var(yc, ddof=1)) / len(yc), float(np.var(yb, ddof=1)) / len(yb)
        diff, diff_var = float(yc.mean() - yb.mean()), vc + vb
        df = welch_df([(vc, len(yc) - 1), (vb, len(yb) - 1)])
    return finish_estimate(diff, diff_var, base, base_var, level, df=df)


def _assignment_set(plan: SwitchbackPlan) -> np.ndarray:
    """Every assignment the plan's scheme could have drawn (``(A, K)``), or a seeded sample of
    `MAX_ENUMERATED` of them, the plan's own first."""
    k, p = int(plan.n_blocks), int(plan.n_blocks) // 2
    rng = np.random.default_rng([int(plan.seed), 0x5C])
    if plan.scheme == "paired":
        if 2**p <= MAX_ENUMERATED:
            first = np.array(list(itertools.product([1, 0], repeat=p)), dtype=np.int64)
        else:
            first = (rng.random((MAX_ENUMERATED, p)) < 0.5).astype(np.int64)
        out = np.empty((len(first), k), dtype=np.int64)
        out[:, 0::2], out[:, 1::2] = first, 1 - first
    elif math.comb(k, p) <= MAX_ENUMERATED:
        out = np.zeros((math.comb(k, p), k), dtype=np.int64)
        for i, on in enumerate(itertools.combinations(range(k), p)):
            out[i, list(on)] = 1
    else:
        out = np.stack([rng.permutation(np.repeat([1, 0], p)) for _ in range(MAX_ENUMERATED)])
    return np.vstack([np.asarray(plan.assignment)[None, :], out])


def randomization_interval(y: np.ndarray, plan: SwitchbackPlan, level: float, grid: int = 801) -> list[float]:
    """The randomization interval of the relative change under the multiplicative sharp null
    ``Y_k(candidate) = (1 + ρ)·Y_k(current)`` for every block: the ``ρ`` whose two-sided p-value
    over the plan's assignment set (`_assignment_set`) exceeds ``1 − level``, the statistic the
    difference of the arms' means of the imputed current-policy outcomes. ``±inf`` where the set
    of accepted ``ρ`` reaches the grid's end (e.g. too few pairs for the level)."""
    u = np.asarray(plan.assignment)
    sets = _assignment_set(plan)
    base = float(y[u == 0].mean())
    naive = float(y[u == 1].mean()) / base - 1.0 if base else 0.0
    span = max(2.0, 20.0 * abs(naive))
    rhos = np.linspace(max(-0.999, naive - span), naive + span, grid)
    z = y[None, :] / (1.0 + rhos[:, None] * u[None, :])  # imputed current-policy outcomes, (R, K)
    n1 = sets.sum(axis=1)
    stat = (z @ sets.T) / n1 - (z @ (1 - sets).T) / (sets.shape[1] - n1)  # (R, A)
    p = (np.abs(stat) >= np.abs(stat[:, :1]) - 1e-12).mean(axis=1)
    ok = p > 1.0 - level
    if not ok.any():
        return [float("nan"), float("nan")]
    lo, hi = int(np.argmax(ok)), int(len(ok) - 1 - np.argmax(ok[::-1]))
    return [float(rhos[lo]) if lo > 0 else -math.inf, float(rhos[hi]) if hi < len(rhos) - 1 else math.inf]


def estimate_switchback(
    data: pd.DataFrame,
    plan: SwitchbackPlan,
    kpis: Sequence[str] | None = None,
    *,
    level: float | None = None,
    method: str = "t",
) -> dict[str, SwitchbackEstimate]:
    """Each KPI's relative change, candidate vs current on the plan's sites, and its interval.

    Args:
        data: the switchback's log rows (``site``, ``t`` and ``episode`` or ``tick``, the KPI
            columns, optionally ``arm``), or `block_outcomes` ' table (it has a ``ticks`` column).
        plan: the switchback. kpis: columns (default: every ``kpi.*`` column of the log).
        level: the interval's level (default: the plan's).
        method: ``"t"`` (Neyman's conservative variance on a t reference; the default, the module
            docstring says why) or ``"randomization"`` (the interval by inverting the
            randomization test over the plan's assignment set; ``diff``/``diff_se`` stay the t's).
    """
    if method not in METHODS:
        raise InputError(f"unknown method {method!r}; expected one of {', '.join(METHODS)}", "method")
    level = float(plan.level if level is None else level)
    if kpis is None:
        kpis = [c for c in data.columns if str(c).startswith("kpi.")]
    if not kpis:
        raise InputError("no KPI to estimate", "kpis")
    blocks = data if "ticks" in data.columns and "arm" in data.columns else block_outcomes(data, plan, kpis)
    u = blocks["arm"].to_numpy(np.int64)
    if not np.array_equal(u, np.asarray(plan.assignment)):
        raise InputError("the blocks' arms are not the plan's assignment", "arm")
    out: dict[str, SwitchbackEstimate] = {}
    for k in kpis:
        y = blocks[k].to_numpy(np.float64)
        if not np.isfinite(y).all():
            raise InputError(f"{k}: a block has no finite value", k)
        terms = _t_terms(y, u, plan.scheme, level)
        interval = [terms["rel_lo"], terms["rel_hi"]]
        if method == "randomization":
            interval = randomization_interval(y, plan, level)
            terms["rel_lo"], terms["rel_hi"] = interval
        # what `edgetwin.loop.ppi.ppi_verdict` reads besides: no fleet term; the blocks behind each arm;
        # the twin's own change on the sites where the plan recorded it
        twin_rel = float(plan.twin_change.get(k, float("nan")))
        terms.update(twin_rel=twin_rel, twin_diff=twin_rel * abs(terms["base"]), n_fleet=0.0,
                     n_candidate=float(u.sum()), n_control=float(len(u) - u.sum()))  # fmt: skip
        out[k] = SwitchbackEstimate(
            k, float(terms["rel"]), [float(v) for v in interval], float(terms["diff"]), float(terms["diff_se"]),
            float(terms["base"]), float(terms["df"]), level, int(plan.n_blocks),
            int(plan.n_blocks) // 2 if plan.scheme == "paired" else 0, method, dict(terms),
        )  # fmt: skip
    return out


# ------------------------------------------------------------------------------------ the verdict
def judge_switchback(
    canary_log: pd.DataFrame,
    plan: SwitchbackPlan,
    margins: Sequence[Any],
    *,
    candidate_version: str | None = None,
    level: float | None = None,
    status: Mapping[str, Any] | None = None,
) -> tuple[str, list[Any], str, dict[str, SwitchbackEstimate]]:
    """The verdict of a switchback from its collected log (`edgetwin canary verdict --design
    switchback`): `estimate_switchback` per guarded KPI (its t interval over the blocks), judged by
    `edgetwin.loop.ppi.ppi_verdict` against ``margins`` exactly as a group split's estimates are —
    or, when a stop cut it short, by the loop's stopped-day rule, as a group split's canary is.

    **A switchback a stop cut short gives no verdict but the guard's.** Its day is its plan's
    ``n_blocks × block_ticks`` ticks from ``start_tick``: when a site of the plan holds fewer of
    them (a log short of them) or ``status`` (``edgetwin canary status RUN --json``) names a stop,
    `edgetwin.loop.evidence.canary_stop` reads it and `edgetwin.loop.evidence.judge_stopped` judges
    it (`edgetwin.loop.day_verdict.stopped_verdict`): a guard stop refuses on the guard's KPI, by the
    guard; every other KPI, and every KPI after any other stop, stays open. Why the blocks it ran
    are not a day: `edgetwin.loop.day_verdict`'s module docstring, and for a switchback besides: the
    blocks that ran cover only the first part of the plan's cycle (its pairs cancel the time of day
    within a pair, not across the day), the stop was chosen by those very pairs (the guard fired on
    them), and the t reference over ``P`` pairs holds for pairs fixed by the design, not by a
    stopping rule. A switchback log is one run: no completed day before it.

    The log is what the sites shipped (`edgetwin canary collect`): rows of the plan's sites with
    ``site``, ``t`` (the run's tick) or ``tick``, ``policy`` (the registry version that decided),
    ``arm`` (``candidate`` / ``control`` inside the blocks) and the guarded KPI columns. A judged
    row served by another arm than the plan's block says the log is not this switchback's
    (`block_outcomes` refuses it); a row of the candidate arm naming another policy than
    ``candidate_version`` (default: the one version on that arm) likewise.

    What it is about: the effect on the plan's sites when they switch whole, on the run's own
    days (the module docstring: not the fleet, not other days).

    Returns:
        ``(verdict, checks, reason, estimates)``: ``promote`` / ``refuse`` / ``undecided`` (the
        gate's abstain), the `edgetwin.loop.ppi.PPIEstimate` s, one line per KPI, and the
        `SwitchbackEstimate` s.

    Raises:
        InputError: a log that is not this switchback's, or lacks a guarded KPI (``--canary-log``).
    """
    from edgetwin.loop.ppi import ppi_verdict

    where = "--canary-log"
    need = [c for c in ("site", "policy", *(m.kpi for m in margins)) if c not in canary_log.columns]
    if need:
        raise InputError(f"the switchback log has no column(s) {need}", where)
    if "tick" not in canary_log.columns and "t" not in canary_log.columns:
        raise InputError("the switchback log needs a 't' (or 'tick') column", where)
    at = canary_log[canary_log["site"].astype(str).isin(plan.sites)]
    if "arm" in at.columns:
        served = at.loc[at["arm"].astype(str) == CANDIDATE, "policy"].astype(str)
        versions = sorted(set(served))
        want = candidate_version or (versions[0] if len(versions) == 1 else None)
        if want is None or set(versions) - {want}:
            raise InputError(f"the candidate arm's rows name policies {versions}"
                             + (f", not {candidate_version!r}" if candidate_version else "; name one with --candidate-version"),
                             where)  # fmt: skip
    else:
        want = candidate_version or ""
    kpis = [m.kpi for m in margins]
    stop = _switchback_stop(at, plan, status, want)
    try:
        blocks = block_outcomes(at, plan, kpis, complete=not stop.decides)
        est = estimate_switchback(blocks, plan, kpis, level=level) if (blocks["ticks"] > 0).all() else {}
    except InputError as e:
        raise InputError(e.message, where) from None
    if stop.decides:
        from types import SimpleNamespace

        from edgetwin.loop.evidence import judge_stopped

        whole = f"a switchback that runs its whole plan of {plan.n_blocks} blocks"
        return (*judge_stopped(stop, {k: e.terms for k, e in est.items()}, SimpleNamespace(margins=list(margins),
                kpis=()), None, whole), est)  # fmt: skip
    verdict, checks = ppi_verdict({k: e.terms for k, e in est.items()}, list(margins))
    reason = "; ".join(f"{c.kpi} {100 * c.change:+.1f}% [{100 * c.interval[0]:+.1f}%, {100 * c.interval[1]:+.1f}%] vs "
                       f"margin {100 * c.allowed_change:g}% ({c.verdict}; {est[c.kpi].n_blocks} blocks)" for c in checks)  # fmt: skip
    return ("undecided" if verdict == "abstain" else verdict), checks, reason, est


def _switchback_stop(at: pd.DataFrame, plan: SwitchbackPlan, status: Mapping[str, Any] | None, candidate: str) -> Any:
    """How the switchback's day ended (`edgetwin.loop.evidence.canary_stop` on its clock: its plan's
    ticks from ``start_tick``, at every site of the plan; rows after its last block are not its)."""
    from edgetwin.loop.evidence import canary_stop

    ticks = switchback_ticks(at, plan)
    clock = pd.DataFrame({"t": ticks, "site": at["site"].astype(str).to_numpy()})[ticks < plan.start_tick + plan.ticks]
    return canary_stop(clock, int(plan.start_tick), int(plan.ticks), status, candidate, sites=plan.sites)


# ------------------------------------------------------------------------------------ the emulated cluster
def run_on_cluster(config: Any, make_policy: Any, *, days: int, seed: int) -> pd.DataFrame:
    """Run the emulated cluster (`edgetwin.emulator.cluster.EdgeCluster`) for ``days`` episodes,
    each tick's actions from ``make_policy(cluster, day)`` (built after each day's reset: an
    object with ``act(obs)`` and ``arm_mask(tick) -> (N,) bool``, e.g. `SwitchbackPolicy`).

    Returns:
        one row per (day, t, agent): ``episode`` (the day), ``t``, ``tick`` (``day × steps + t``),
        ``agent``, ``site``, ``arm`` (`CANDIDATE` / `CURRENT`), ``response.*``, ``kpi.*``, ``reward``.
    """
    from edgetwin.emulator.cluster import KPI_NAMES, RESPONSE_NAMES, EdgeCluster

    cluster = EdgeCluster(config)
    frames = []
    for d in range(int(days)):
        obs = cluster.reset(seed=int(np.random.default_rng([int(seed), d, 0x5D]).integers(2**31)),
                            day=float(cluster.config.start_day + cluster.config.drift_days + d))  # fmt: skip
        pol = make_policy(cluster, d)
        sites = np.asarray(cluster.site_names, dtype=object)[cluster.home]
        cols: dict[str, list[np.ndarray]] = {"arm": [], "resp": [], "kpi": [], "reward": []}
        for t in range(cluster.steps):
            cols["arm"].append(np.asarray(pol.arm_mask(d * cluster.steps + t)))
            obs, reward, _, info = cluster.step(pol.act(obs))
            cols["resp"].append(info["responses"])
            cols["kpi"].append(info["kpis"])
            cols["reward"].append(reward)
        n, steps = cluster.n, cluster.steps
        frame = pd.DataFrame({
            "episode": d, "t": np.repeat(np.arange(steps), n), "tick": d * steps + np.repeat(np.arange(steps), n),
            "agent": np.tile(cluster.agent_ids, steps), "site": np.tile(sites, steps),
            "arm": np.where(np.concatenate(cols["arm"]), CANDIDATE, CURRENT),
        })  # fmt: skip
        resp, kpi = np.concatenate(cols["resp"]), np.concatenate(cols["kpi"])
        for j, name in enumerate(RESPONSE_NAMES):
            frame[f"response.{name}"] = resp[:, j]
        for j, name in enumerate(KPI_NAMES):
            frame[f"kpi.{name}"] = kpi[:, j]
        frame["reward"] = np.concatenate(cols["reward"])
        frames.append(frame)
    return pd.concat(frames, ignore_index=True)


def run_switchback_on_cluster(config: Any, current: Any, candidate: Any, plan: SwitchbackPlan, *, seed: int,
                              days: int | None = None) -> pd.DataFrame:  # fmt: skip
    """The switchback ``plan`` on the emulated cluster: its sites' groups served by `SwitchbackPolicy`
    (the switchback's tick 0 is the first day's tick 0), every other group by ``current``; as many
    days as the plan's blocks need (or ``days``). Rows as `run_on_cluster` 's."""
    steps = int(getattr(config, "steps", plan.episode_ticks))
    if steps != int(plan.episode_ticks):
        raise InputError(
            f"the plan counts {plan.episode_ticks} ticks a day, the cluster runs {steps}", "episode_ticks"
        )
    need = math.ceil((int(plan.start_tick) + plan.ticks) / steps)

    def make(cluster: Any, day: int) -> SwitchbackPolicy:
        sites = np.asarray(cluster.site_names, dtype=object)[cluster.home]
        return SwitchbackPolicy(current, candidate, plan, sites, first_tick=day * steps)

    return run_on_cluster(config, make, days=int(days or need), seed=seed)


# ------------------------------------------------------------------------------------ planning in the twin
def _twin_day(
    twin: Any,
    ep: Any,
    policy: Any,
    kdefs: Sequence[Any],
    kpis: Sequence[str],
    wseed: int,
    member: int,
    first_tick: int,
    stochastic: bool = True,
) -> pd.DataFrame:
    """One replayed day of the recent log's episode ``ep`` in the twin under ``policy`` (a
    `PolicySpec`), as log rows (``tick``, ``site``, the KPI columns)."""
    from edgetwin.twin.whatif import NOMINAL
    from edgetwin.twin.whatif.engine import run_episode

    out = run_episode(
        twin, policy, NOMINAL, kdefs, seed=wseed, member=member, logged=ep, stochastic=stochastic
    )
    src = out.source if out.source is not None else np.arange(len(ep.agents))
    sites = np.asarray(ep.site_names, dtype=object)[np.asarray(ep.site)[src]]
    steps, n = out.series[kpis[0]].shape
    frame = pd.DataFrame(
        {
            "tick": first_tick + np.repeat(np.arange(steps), n),
            "site": np.tile(sites, steps),
            "row": np.tile(src, steps),
        }
    )
    for k in kpis:
        frame[k] = np.asarray(out.series[k], dtype=np.float64).reshape(-1)
    return frame


def _switchback_spec(current: Any, candidate: Any, plan: SwitchbackPlan, ep: Any, first_tick: int) -> Any:
    """The `PolicySpec` of the switchback for one replayed episode (its rows' sites in row order)."""
    from edgetwin.twin.whatif import PolicySpec

    sites = np.asarray(ep.site_names, dtype=object)[np.asarray(ep.site)]

    def build(seed: int, member: int, scen: np.ndarray) -> SwitchbackPolicy:
        return SwitchbackPolicy(current.factory(seed, member, scen), candidate.factory(seed, member, scen), plan,
                                sites, first_tick=first_tick)  # fmt: skip

    return PolicySpec("switchback", build)


#: a switch has settled once every later tick differs from the policy's own steady run by at most
#: this share of the steady effect (`twin_carryover`)
SETTLED = 0.15


class _SwitchAt:
    """Every row on ``before`` until tick ``at``, on ``after`` from it on: a step of the policy
    (both act every tick, as in `SwitchbackPolicy`)."""

    def __init__(self, before: Any, after: Any, at: int) -> None:
        self.before, self.after, self.at, self.tick = before, after, int(at), 0

    def act(self, obs: np.ndarray) -> np.ndarray:
        a, b = self.before.act(obs), self.after.act(obs)
        self.tick += 1
        return np.asarray(a if self.tick <= self.at else b, dtype=np.float64)


def twin_carryover(
    twin: Any,
    log: pd.DataFrame,
    candidate: Any,
    baseline: Any,
    kpis: Sequence[str],
    *,
    seed: int = 0,
    members: Sequence[int] | None = None,
    sims: int = 2,
) -> int:
    """The carryover, in ticks, that the twin predicts: the recent log's last episode replayed
    with the policy switched mid-episode (baseline to candidate, and back), against the same world
    on either policy throughout, with the twin's mean responses (no sampled noise, so that the
    switched and the steady run differ by the carryover alone); the carryover is the first lag after which every later tick of the
    switched run is within `SETTLED` of the steady effect of the run it switched to (the largest
    over KPIs and both directions, averaged over ``sims`` world seeds × members). KPIs whose
    steady effect is within twice its standard error over the ticks are skipped (0 when all are:
    no effect, nothing to carry over); half an episode when it never settles."""
    from edgetwin.twin.whatif import PolicySpec
    from edgetwin.twin.whatif.kpis import KpiDef
    from edgetwin.twin.whatif.replay import logged_episodes

    ep = logged_episodes(log, twin, max_episodes=1)[0]
    at = int(ep.steps) // 2
    kdefs = [KpiDef(k, k, "mean") for k in kpis]
    mem = list(members) if members is not None else list(range(twin.n_members))

    def step(before: Any, after: Any) -> Any:
        return PolicySpec(
            "switch", lambda sd, m, sc: _SwitchAt(before.factory(sd, m, sc), after.factory(sd, m, sc), at)
        )

    pols = {
        "on": candidate,
        "off": baseline,
        "up": step(baseline, candidate),
        "down": step(candidate, baseline),
    }
    devs: dict[tuple[str, str], list[np.ndarray]] = {}
    for i in range(int(sims)):
        for m in mem:
            wseed = int(np.random.default_rng([seed, i, m, 0xCC]).integers(2**31))
            runs = {n: _twin_day(twin, ep, p, kdefs, kpis, wseed, m, 0, stochastic=False).groupby("tick")[list(kpis)]
                    .mean() for n, p in pols.items()}  # fmt: skip
            for k in kpis:
                gap = (runs["on"][k] - runs["off"][k]).to_numpy()[at:]
                effect = float(gap.mean())
                if not abs(effect) > 2.0 * float(np.std(gap, ddof=1)) / math.sqrt(len(gap)):
                    continue  # no steady effect to carry over (within the ticks' own spread)
                for switched, steady in (("up", "on"), ("down", "off")):
                    dev = np.abs((runs[switched][k] - runs[steady][k]).to_numpy()[at:]) / abs(effect)
                    devs.setdefault((k, switched), []).append(dev)
    if not devs:
        return 0
    profile = np.max([np.mean(v, axis=0) for v in devs.values()], axis=0)  # by lag after the switch
    over = np.flatnonzero(profile > SETTLED)
    return int(over[-1] + 1) if len(over) else 0


def plan_switchback(
    decision: Any,
    twin: Any,
    log: pd.DataFrame,
    candidate: Any,
    baseline: Any,
    budget: Any = None,
    *,
    sites: Sequence[str] | None = None,
    kpis: Sequence[str] | None = None,
    seed: int = 0,
    members: Sequence[int] | None = None,
    pre_ticks: int = 4,
    block_ticks: int | None = None,
    carryover_ticks: int | None = None,
    scheme: str = "paired",
    sims: int = 4,
) -> SwitchbackPlan:
    """A switchback plan whose expected interval width comes from simulating it in the twin.

    Args:
        decision: the gate's abstaining decision (its deciding per-group-mean KPIs are judged, as
            `edgetwin.loop.plan.plan_canary` judges them); None with ``kpis`` given.
        twin, log: the twin and the recent log (its last episode is replayed, day after day).
        candidate, baseline: `PolicySpec` s (not ``logged``).
        budget: a `edgetwin.loop.plan.PlanBudget`: the switchback spends the same share × hours as
            a group-split canary (its sites' share of the groups × its hours <= ``max_share × hours``).
        sites: the sites that switch (default: the site with the fewest groups: the least exposure).
        seed: draws the assignment (the simulations draw their own). members: ensemble members.
        pre_ticks: current-policy ticks before the first block.
        carryover_ticks: ticks burned in per block (default: the twin's, `twin_carryover`).
        block_ticks: ticks per block (default: twice the carryover, at least 2: half of each block
            judged). scheme: `SCHEMES`. sims: twin simulations behind the expected width.

    Raises:
        InputError: unknown sites, a budget that does not buy 4 blocks (of the twin's carryover's
            length, by default), a worst case over the loss budget, a loss budget on a KPI not of one
            positive sign (`edgetwin.loop.plan.check_loss_budget_signs`), a ``logged`` policy.
    """
    from edgetwin.loop.plan import PlanBudget, _deciding_checks, _kpi_column, check_loss_budget_signs
    from edgetwin.twin.whatif.replay import logged_episodes

    budget = budget or PlanBudget()
    kdefs_all: dict[str, Any] = {}
    checks: Mapping[str, Any] = {}
    if decision is not None:
        kdefs_all = {k.name: k for k in decision.result.kpis}
        checks = _deciding_checks(decision, kdefs_all, budget)[0]
        check_loss_budget_signs(budget.max_loss, kdefs_all, log)  # the caps below are relative, as a canary's
        kpis = sorted({_kpi_column(kdefs_all[k]) or k for k in checks})
    if not kpis:
        raise InputError("give the gate's decision or the KPI columns to judge", "kpis")
    if candidate.factory is None or baseline.factory is None:
        raise InputError("a switchback needs two policies, not the log's own actions ('logged')", "--policy")
    last = log[log["episode"] == log["episode"].iloc[-1]]
    per_site = last.groupby(last["site"].astype(str))["agent"].nunique()
    chosen = tuple(sites) if sites else (str(per_site.idxmin()),)
    unknown = sorted(set(chosen) - set(per_site.index))
    if unknown:
        raise InputError(f"unknown site(s) {unknown}; the log's sites are {sorted(per_site.index)}", "--site")
    share = float(per_site[list(chosen)].sum()) / float(per_site.sum())
    if carryover_ticks is None:
        carryover_ticks = twin_carryover(twin, log, candidate, baseline, kpis, seed=seed, members=members)
    if block_ticks is None:
        block_ticks = max(2, 2 * int(carryover_ticks))
    ep = logged_episodes(log, twin, max_episodes=1)[0]
    steps = int(ep.steps)
    tph = 3600.0 / float(twin.spec.step_seconds)
    n_blocks = int(budget.max_share * budget.hours / share * tph // block_ticks) // 2 * 2
    if n_blocks < 4:
        raise InputError(f"{100 * budget.max_share:g}% x {budget.hours:g} h buys {n_blocks} blocks of {block_ticks} "
                         f"ticks on sites {list(chosen)} ({100 * share:.0f}% of the groups, carryover {carryover_ticks} ticks); a "
                         "switchback needs >= 4",
                         "--max-share")  # fmt: skip
    losses: dict[str, float] = {}
    if decision is not None:  # the risk, counted as a canary's: the worst case on the candidate's share
        for c in checks.values():
            col = _kpi_column(kdefs_all[c.kpi]) or c.kpi
            worst = float(c.worsening_interval[1]) if c.worsening_interval else float("inf")
            losses[col] = max(losses.get(col, 0.0), max(0.0, worst) * share / 2.0)
            cap = budget.max_loss.get(c.kpi)
            if cap is not None and losses[col] > cap:
                raise InputError(f"{c.kpi}: a switchback of sites {list(chosen)} risks {100 * losses[col]:.2f}% of the "
                                 f"fleet at the twin's worst case, over the {100 * cap:g}% budget", "--max-loss")  # fmt: skip
    common = dict(sites=chosen, block_ticks=block_ticks, carryover_ticks=carryover_ticks, n_blocks=n_blocks,
                  scheme=scheme, start_tick=pre_ticks, episode_ticks=steps, tick_seconds=float(twin.spec.step_seconds),
                  site_share=share, candidate=candidate.name, baseline=baseline.name, fleet_loss=losses)  # fmt: skip
    sim = _simulate(twin, ep, candidate, baseline, SwitchbackPlan(seed=seed, **common), kpis, seed, members,  # type: ignore[arg-type]
                    sims, budget.max_share)  # fmt: skip
    return SwitchbackPlan(seed=int(seed), **sim, **common)  # type: ignore[arg-type]


def _simulate(
    twin: Any,
    ep: Any,
    candidate: Any,
    baseline: Any,
    plan: SwitchbackPlan,
    kpis: Sequence[str],
    seed: int,
    members: Sequence[int] | None,
    sims: int,
    slice_share: float,
) -> dict[str, dict[str, float]]:
    """``sims`` switchbacks like ``plan`` in the twin (each its own world seeds and assignment),
    estimated as the canary's log will be: the median interval width per KPI; and on each one's
    first day, the twin's effect on the sites (every group on each policy) and its interference
    (the fleet's full-switch change less the change on a random ``slice_share`` of the groups
    with the others on the baseline, the canary's configuration)."""
    from edgetwin.twin.whatif import routed_policy
    from edgetwin.twin.whatif.kpis import KpiDef

    kdefs = [KpiDef(k, k, "mean") for k in kpis]
    mem = list(members) if members is not None else list(range(twin.n_members))
    steps = int(plan.episode_ticks)
    days = math.ceil((plan.start_tick + plan.ticks) / steps)
    out: dict[str, dict[str, list[float]]] = {
        w: {k: [] for k in kpis} for w in ("width", "change", "interference")
    }
    for i in range(int(sims)):
        sim_plan = SwitchbackPlan.from_dict({**plan.to_dict(), "assignment": [],
                                             "seed": int(np.random.default_rng([seed, i, 0x5E]).integers(2**31))})  # fmt: skip
        frames, runs = [], {}
        for d in range(days):
            m = mem[(i + d) % len(mem)]
            wseed = int(np.random.default_rng([seed, i, d, m]).integers(2**31))
            spec = _switchback_spec(baseline, candidate, sim_plan, ep, d * steps)
            frames.append(_twin_day(twin, ep, spec, kdefs, kpis, wseed, m, d * steps))
            if d == 0:  # same world: every group on one policy, and a slice on the candidate
                mask = np.random.default_rng([seed, i, 0x5F]).random(len(ep.agents)) < slice_share
                pols = {
                    CANDIDATE: candidate,
                    CURRENT: baseline,
                    "slice": routed_policy("slice", candidate, baseline, mask),
                }
                runs = {
                    name: _twin_day(twin, ep, pol, kdefs, kpis, wseed, m, 0) for name, pol in pols.items()
                }
        est = estimate_switchback(pd.concat(frames, ignore_index=True), sim_plan, kpis)
        on_slice = runs["slice"]["row"].isin(np.flatnonzero(mask))
        for k in kpis:
            out["width"][k].append(est[k].width)
            at = {a: runs[a].loc[runs[a]["site"].isin(plan.sites), k].mean() for a in (CANDIDATE, CURRENT)}
            out["change"][k].append(_relative(at[CANDIDATE], at[CURRENT]))
            fleet = _relative(runs[CANDIDATE][k].mean(), runs[CURRENT][k].mean())
            sl = _relative(runs["slice"].loc[on_slice, k].mean(), runs["slice"].loc[~on_slice, k].mean())
            out["interference"][k].append(fleet - sl)
    return {
        "expected_width": {k: float(np.median(v)) for k, v in out["width"].items()},
        "twin_change": {k: _finite_mean(v) for k, v in out["change"].items()},
        "twin_interference": {k: _finite_mean(v) for k, v in out["interference"].items()},
    }


def _finite_mean(values: Sequence[float]) -> float:
    """The mean of the finite values (NaN when none is: e.g. a slice of the whole fleet has no
    groups off it, so no interference to compare)."""
    v = np.asarray(values, dtype=np.float64)
    return float(v[np.isfinite(v)].mean()) if np.isfinite(v).any() else float("nan")


def _relative(c: float, b: float) -> float:
    """``(c − b) / |b|`` (NaN when ``b`` is 0 or missing)."""
    return float((c - b) / abs(b)) if b and math.isfinite(b) else float("nan")


__all__ = [
    "CANDIDATE",
    "CURRENT",
    "METHODS",
    "SCHEMES",
    "SwitchbackEstimate",
    "SwitchbackPlan",
    "SwitchbackPolicy",
    "block_of",
    "block_outcomes",
    "draw_assignment",
    "estimate_switchback",
    "is_burn_in",
    "judge_switchback",
    "plan_switchback",
    "randomization_interval",
    "run_on_cluster",
    "run_switchback_on_cluster",
    "switchback_assignment",
    "switchback_ticks",
    "twin_carryover",
]


def weigh_against_canary(switchback: SwitchbackPlan, plan: Any, margins: Mapping[str, float] | None = None) -> list[str]:
    """What the planner says of a switchback beside the group-split canary ``plan`` (an
    `edgetwin.loop.plan.CanaryPlan`) of the same share × hours: one line per point, for the plan's
    reasons and `edgetwin canary plan --switchback-site`.

    The two expected widths are the same kind of number (the deciding KPIs' relative-interval widths,
    summed) but not about the same thing: the canary's interval is about the fleet over the days the
    decision lives with (it carries the fleet and day-to-day terms), the switchback's about its own
    sites on its day. So the narrower interval is named, and the switchback is recommended only
    where the twin predicts interference a group split would miss (``twin_interference`` beyond
    half the KPI's margin: ``margins`` per column, by default the plan's own, else 5 %): there the split's control arm
    shares the candidate's congestion and its interval is about the wrong effect. A running
    ``edgetwin serve`` follows the switchback's blocks when ``edgetwin canary start --design switchback``
    sends it (`edgetwin.edge.canary_switchback`); `run_switchback_on_cluster` runs one on the emulated
    cluster directly.
    """
    design = getattr(plan.slice, "design", "random")
    if margins is None:
        margins = {m.kpi: float(m.max_regression) for m in getattr(plan, "margins", ())}
    canary_w = float(plan.expected_width.get(design, float("nan")))
    sb_w = switchback.expected_width_sum
    lines = [f"a switchback of site(s) {', '.join(switchback.sites)} ({switchback.n_blocks} blocks of "
             f"{switchback.block_ticks} ticks, {switchback.carryover_ticks} burned in) expects a summed width of "
             f"{sb_w:.3g} against {canary_w:.3g} for the {design} group split; the switchback's is about its "
             "sites on its day, the split's about the fleet over the days the decision lives with"]  # fmt: skip
    crowded = {k: v for k, v in switchback.twin_interference.items()
               if math.isfinite(v) and abs(v) > 0.5 * float(margins.get(k, 0.05))}  # fmt: skip
    if crowded:
        worst = max(crowded, key=lambda k: abs(crowded[k]))
        lines.append(f"the twin predicts interference a group split would miss ({worst}: {100 * crowded[worst]:+.1f} % "
                     "of the fleet under a full switch beyond what the slice sees): prefer the switchback")  # fmt: skip
    else:
        lines.append("the twin predicts no interference beyond half a margin: the group split's fleet-wide "
                     "interval is the one to run")  # fmt: skip
    return lines

