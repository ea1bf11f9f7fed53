"""A canary plan from the gate's abstention: which service groups, how many hours, within a budget.

When the gate abstains (`edgetwin.policies.gate`), some guarded KPIs' intervals straddle their
margins or rest on states outside the logs' support. New evidence comes from serving the candidate
to a slice of the fleet (`edgetwin.edge.canary`) and judging the fleet-wide change by
prediction-powered inference (`edgetwin.loop.ppi`): the twin's per-group predictions over the
fleet, rectified by the canary's measurements on the slice. This module decides the slice and its
duration.

**What a canary would tell.** The PPI interval's variance is
``var_N(f_c − f_b)/N + var(y − f)/n_c + var(y − f)/n_b`` (`edgetwin.loop.ppi`). Before the
canary, ``f`` comes from the twin (candidate and baseline replayed on the recent log's groups) and
the residual spread ``var(y − f)`` is measured where it can be: the twin's per-group error for the
*logged* actions on the recent log, averaged over the same ``h``-hour window the canary would run
(shorter windows: noisier group means, larger residuals). The relative interval divides that
change by the baseline level, which the verdict estimates too (``mean_N(f_b) + mean_ctrl(y − f)``,
variance ``var_N(f_b)/N + var(y − f)/n_b`` plus its day-to-day term): so the expected interval after a
canary of ``n`` groups for ``h`` hours is the verdict's own construction
(`edgetwin.loop.ppi.finish_estimate`: the effect's interval over every baseline level the
baseline's interval allows) applied to the twin's point estimate and these expected variances
(`edgetwin.loop.plan_expected`), unbounded on a side where the baseline's expected interval reaches 0.
Both variances also carry the twin's interference term, as the verdict's do: the members' spread
over the interference they transport from the canary's configuration to the full switch
(`edgetwin.loop.ppi.interference_var`, read on the twin's replay of a planned slice,
`edgetwin.loop.plan_interference`), a term every canary day shares; and the expected interval is the
hull of that estimate and the one that assumes no interference, the interval the verdict judges
(`edgetwin.loop.ppi.ppi_verdict`).

**Risk.** The twin's pessimistic loss: the upper end of the guarded KPI's worsening interval (the
gate's, relative to the baseline), borne by the candidate arm's ``treat_share · n`` groups of the
fleet's ``N``: ``worst_on_slice`` is that relative worsening on the slice, ``fleet_loss =
treat_share · n / N · max(0, worst)`` the fleet-wide relative worsening the canary may cause at
worst. The operator's budget caps it per KPI (``max_loss``), with ``max_share`` of the service
groups and ``hours``.

**Which option.** Over ``n`` (even numbers of groups up to the budget) and ``h`` (1, 2, 3, 6, 12,
24 hours up to the budget and one episode), the cheapest option (least fleet loss, then fewest
group-hours) whose expected interval decides every deciding KPI (lies wholly on one side of its
margin); when none does, the largest option the budget allows (most groups, then longest: the most
evidence for the risk the operator accepts), and the plan says it may not decide. The residual
spread is taken after the same pre-tick covariate adjustment the verdict makes (`edgetwin.loop.ppi`).

**Which groups.** Drawn uniformly at random (seeded) from the fleet: the PPI rectifier is unbiased
for the fleet only when the slice is a random sample of it, so the plan does not pick the groups
the twin knows least about (that would need inverse-probability weights; not done). The reasons why
(the out-of-support or straddling checks) are in ``why``.

**Which design.** Within the slice, the arms are either split by fair coins (``random``) or in
matched pairs (``matched_pairs``): the slice's groups paired by the twin's predicted effect and
their pre-period level, one of each pair on the candidate (`matched_pairs`, realised through the
edge's keyed-hash router by `pair_split_seed`, so at most `MAX_PAIRS` pairs), and the verdict
analyses them as pairs (`edgetwin.loop.ppi.ppi_mean_difference`'s ``paired``). Pairing narrows the
interval when paired groups respond alike and widens it when they do not (fewer degrees of
freedom); so by default (``design="auto"``) each size and duration takes the design whose expected
interval (the residual spread of the twin's error within such pairs, `_paired_spread`) is
narrower, and the plan records both expected widths (``expected_width``; the loop's rounds record
the realised ones). Site-level switchbacks are not planned here.

**How many days.** The verdict is about the change averaged over the days the decision lives with;
given the day-to-day variance (``day_var``), one day's expected interval carries the term the
verdict's first look carries (the bound on what the logs cannot reveal included), and each KPI's
``days`` says how many canary days of this size would decide it by the verdict's own pooling
(`pooled_days_to_decide`: the fleet's term never shrinks, the arms' shrink as ``1/days``, the day
term is `edgetwin.loop.day_bound.pooled_day_term`'s with the days' between-day variance taken to be
the part the twin reveals, the baseline level's error pools as the verdict pools it,
`edgetwin.loop.plan_expected.pooled_base_var`, and the interference's terms are never divided by the
days), at the level of the extension's looks (``max_days``). A candidate that
is not hurting is then extended day by day (`edgetwin.loop.rounds.canary_loop`'s ``days``).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from edgetwin.contract.errors import InputError
from edgetwin.contract.margins import KPIMargin
from edgetwin.loop.plan_expected import (
    NO_INTERFERENCE,
    BaseVar,
    days_to_decide,
    expected_interval,
    interval_decides,
    pooled_base_var,
    pooled_days_to_decide,
    pooled_terms,
    verdict_interval,
    worsening,
)
from edgetwin.loop.plan_interference import slice_groups

if TYPE_CHECKING:
    from edgetwin.loop.plan_interference import PlannedInterference

#: candidate canary durations, hours
HOURS_GRID = (1.0, 2.0, 3.0, 6.0, 12.0, 24.0)
LEVEL = 0.90

_LOSS_RE = re.compile(r"^\s*(?P<kpi>[^=\s]+)\s*=\s*(?P<v>[+-]?\d+(?:\.\d*)?|[+-]?\.\d+)\s*(?P<pct>%?)\s*$")
_SHARE_RE = re.compile(r"^\s*(?P<v>[+-]?\d+(?:\.\d*)?|[+-]?\.\d+)\s*(?P<pct>%?)\s*$")


# ------------------------------------------------------------------------------------ budget
def parse_share(text: str | float, where: str = "--max-share") -> float:
    """``"10%"`` or ``0.1`` -> 0.1; must be in (0, 1]."""
    if isinstance(text, int | float):
        v = float(text)
    else:
        m = _SHARE_RE.match(str(text))
        if m is None:
            raise InputError(f"expected a share like 10% or 0.1, got {text!r}", where)
        v = float(m["v"]) / (100.0 if m["pct"] else 1.0)
    if not (math.isfinite(v) and 0.0 < v <= 1.0):
        raise InputError(f"the share must be in (0%, 100%], got {text!r}", where)
    return v


def parse_max_loss(items: Sequence[str]) -> dict[str, float]:
    """``["kpi.slo_violation=0.5%", ...]`` -> ``{kpi: 0.005}``; each > 0, each KPI once."""
    out: dict[str, float] = {}
    for s in items:
        m = _LOSS_RE.match(s)
        if m is None:
            raise InputError(f"expected KPI=P% or KPI=FRACTION, got {s!r}", "--max-loss")
        v = float(m["v"]) / (100.0 if m["pct"] else 1.0)
        if not (math.isfinite(v) and v > 0):
            raise InputError(f"{m['kpi']}: the loss budget must be > 0, got {m['v']}{m['pct']}", "--max-loss")
        if m["kpi"] in out:
            raise InputError(f"KPI {m['kpi']!r} given twice", "--max-loss")
        out[m["kpi"]] = v
    return out


@dataclass(frozen=True)
class PlanBudget:
    """What the operator allows a canary.

    Attributes:
        max_share: at most this share of the fleet's service groups in the slice (0 < s <= 1).
        max_loss: KPI -> the largest fleet-wide relative worsening the canary may cause at worst
            (0.005 = 0.5 %); KPIs not named are capped by share and hours only. Only a KPI of one
            positive sign can be capped so (`check_loss_budget_signs`: relative to a level near 0
            or of either sign, a share means nothing).
        hours: at most this many hours (in the system's time).
        treat_share: the candidate's share of the slice's groups (the rest is the control arm).
    """

    max_share: float = 0.10
    max_loss: Mapping[str, float] = field(default_factory=dict)
    hours: float = 24.0
    treat_share: float = 0.5

    def __post_init__(self) -> None:
        parse_share(self.max_share)
        if not (math.isfinite(self.hours) and self.hours > 0):
            raise InputError(f"the canary's hours must be > 0, got {self.hours}", "--hours")
        if not (0.0 < self.treat_share < 1.0):
            raise InputError(f"treat_share must be in (0, 1), got {self.treat_share}", "--treat-share")
        for k, v in self.max_loss.items():
            if not (math.isfinite(v) and v > 0):
                raise InputError(f"{k}: the loss budget must be > 0, got {v}", "--max-loss")


def budget_from_flags(max_share: str | float, max_loss: Sequence[str] | None, hours: float) -> PlanBudget:
    """The operator's `PlanBudget` from command-line values (`InputError` naming the flag)."""
    share = parse_share(max_share)
    if not (hours > 0 and math.isfinite(hours)):  # also NaN
        raise InputError(f"expected hours > 0, got {hours}", "--hours")
    return PlanBudget(max_share=share, max_loss=parse_max_loss(max_loss or []), hours=hours)


def check_loss_budget_signs(max_loss: Mapping[str, float], kdefs: Mapping[str, Any], log: pd.DataFrame) -> None:
    """Refuse a relative loss budget on a KPI that is not a quantity of one positive sign.

    ``max_loss`` caps a *relative* worsening: ``fleet_loss`` (a share of the fleet's level) and the
    edge's loss-budget stop (`edgetwin.loop.rounds._realised_loss`) divide by the fleet's baseline.
    That ratio has a meaning only when the quantity has one sign and a positive level: for a KPI
    whose logged values take both signs (e.g. a reward that is a weighted sum of gains and
    penalties) the fleet mean can sit near zero or cross it, and "2 % worse" becomes an arbitrary
    absolute amount — the same unit error as a relative interval on a KPI near 0. So no threshold
    is tuned here: the rule is about sign only. A KPI is refused when its column's logged values
    (the whole recent log) take both signs, or when the fleet's baseline (its mean over the log's
    last episode, the groups a canary is drawn from) is ≤ 0. KPIs without a column in the log are
    left alone (nothing to tell their sign by).

    Args:
        max_loss: KPI name -> relative cap (`PlanBudget.max_loss`).
        kdefs: KPI name -> `edgetwin.twin.whatif.kpis.KpiDef` (its ``column``).
        log: the recent log, one row per (episode, tick, agent).

    Raises:
        InputError: naming ``--max-loss`` and the KPI, with the sign and fleet mean that rule it out.
    """
    if not max_loss or "episode" not in log.columns:
        return
    last_day = log[log["episode"] == log["episode"].iloc[-1]]
    for kpi in max_loss:
        kdef = kdefs.get(kpi)
        col = None if kdef is None else str(kdef.column)
        if col is None or col not in log.columns:
            continue
        values = pd.to_numeric(log[col], errors="coerce").to_numpy(dtype=float)
        values = values[np.isfinite(values)]
        if values.size == 0:
            continue
        level = float(np.nanmean(pd.to_numeric(last_day[col], errors="coerce").to_numpy(dtype=float)))
        lo, hi = float(values.min()), float(values.max())
        name = kpi if col == kpi else f"{kpi} ({col})"
        if lo < 0.0 < hi:
            raise InputError(
                f"{name} takes both signs in the log (from {lo:.3g} to {hi:.3g}, fleet mean {level:.3g}); a relative "
                "loss budget needs a quantity of one sign — cap the KPIs it is made of", "--max-loss",
            )  # fmt: skip
        if not level > 0.0:  # also NaN
            raise InputError(
                f"{name}'s fleet mean is {level:.3g} (≤ 0); a relative loss budget needs a positive level — cap a "
                "quantity of one positive sign", "--max-loss",
            )  # fmt: skip


# ------------------------------------------------------------------------------------ the plan
@dataclass(frozen=True)
class PlanSlice:
    """The slice, in the shape `edgetwin.edge.canary.CanaryConfig.from_plan` reads."""

    agents: tuple[str, ...] = ()
    sites: tuple[str, ...] = ()
    scenarios: tuple[str, ...] = ()
    treat_share: float = 0.5
    seed: int = 0
    #: ``"random"`` or ``"matched_pairs"`` (`plan_canary`'s ``design``); ``pairs``: the matched
    #: pairs, each split between the arms by ``seed`` (`pair_split_seed`), which the verdict
    #: analyses as pairs (`edgetwin.loop.verdict.canary_verdict`)
    design: str = "random"
    pairs: tuple[tuple[str, str], ...] = ()


@dataclass
class PlannedKPI:
    """One deciding KPI: where it stands, what the canary should make of it, and its worst case.

    Attributes:
        kpi: the gate's KPI name; column: the log column the canary measures (``return`` -> ``reward``).
        reason: the gate's abstention reason. now: the gate's 90 % interval of the relative change.
        expected: the interval the twin expects after the canary (PPI, the verdict's interval
            division: an end is ``±inf`` where the baseline level's expected interval reaches 0).
            margin: relative worsening allowed.
        decides: ``expected`` decides by the verdict's rule (`interval_decides`: wholly within the
            margin, or wholly beyond it by its bounded side).
        worst_on_slice: the twin's pessimistic relative worsening on the candidate arm's groups.
        fleet_loss: that, times the candidate arm's share of the fleet (0 when the worst case improves).
        budget: the operator's ``max_loss`` for it (None: none given).
    """

    kpi: str
    column: str
    better: str
    reason: str
    now: list[float]
    expected: list[float]
    margin: float
    decides: bool
    worst_on_slice: float
    fleet_loss: float
    budget: float | None
    #: canary days of this size after which the verdict's pooled interval is expected to decide
    #: (`pooled_days_to_decide`: a look's day within the extension's days, else the fewest beyond; 1
    #: when one day's does at the first look's level; None when no number of days is expected to:
    #: the twin's point estimate sits on the margin, the term days do not shrink reaches it, or it
    #: would take more than a year)
    days: int | None = 1
    #: the twin's relative change the expected interval is built around (the gate's point estimate;
    #: NaN in a plan written before it was recorded: the expected interval's midpoint is used then)
    point: float = float("nan")
    #: the twin's interference the expected interval carries, relative to the baseline level
    #: (`edgetwin.loop.plan_expected.Interference`): ``interference_shift``, the members' mean (what
    #: the transporting estimate adds to the no-interference one), ``interference_sd``, the square
    #: root of the members' spread term; 0 in a plan written before they were recorded
    interference_shift: float = 0.0
    interference_sd: float = 0.0

    @property
    def unbounded(self) -> bool:
        """The expected interval has an infinite end (the baseline level may be 0 within it)."""
        return any(math.isinf(float(v)) for v in self.expected)


#: what `CanaryPlan.describe` says of an expected interval with an infinite end (printed ``±inf%``, as
#: the verdict prints a realised one)
_UNBOUNDED = " (unbounded: the baseline level's expected interval reaches 0)"


def _days_text(days: int | None) -> str:
    if days is None:
        return ("may not decide: no number of such canary days is expected to (the twin's estimate sits on the "
                "margin, the terms days do not shrink reach it, or it would take over a year)")
    return f"may not decide: about {days} day(s) of such canaries would"



@dataclass
class CanaryPlan:
    """Which groups get the candidate, for how long, and what that should tell.

    JSON-serialisable (`to_dict` / `from_dict`); `edgetwin.edge.canary.CanaryConfig.from_plan`
    reads ``slice``, ``hours`` and ``margins``.
    """

    candidate: str
    baseline: str
    slice: PlanSlice
    hours: float
    margins: tuple[KPIMargin, ...]
    kpis: list[PlannedKPI]
    n_groups: int
    fleet_groups: int
    share: float
    budget: dict[str, Any]
    decides: bool
    why: list[str]
    seed: int = 0
    round: int = 1
    #: the loss budget by log column (`PlanBudget.max_loss` of every guarded KPI a canary measures):
    #: `edgetwin.edge.canary.CanaryConfig.from_plan` makes it the canary's ``max_loss``, so the edge
    #: stops a canary whose measured loss would pass it, whatever the twin expected
    loss_budget: dict[str, float] = field(default_factory=dict)
    #: the fleet's level of each budgeted column under the current policy (its mean on the log's
    #: last day): what a relative loss is relative to, at the edge as in the plan
    loss_levels: dict[str, float] = field(default_factory=dict)
    #: the summed expected width of the deciding KPIs' intervals under each design the planner
    #: weighed for the chosen size and duration (the rounds record the realised widths)
    expected_width: dict[str, float] = field(default_factory=dict)

    @property
    def agent_steps(self) -> int:
        """Agent-steps the candidate arm is expected to serve (15-minute ticks)."""
        return int(round(self.slice.treat_share * self.n_groups * self.hours * 4))

    @property
    def days(self) -> int | None:
        """Canary days of this size the decision is expected to need, as the twin sees it now: where
        some KPI is expected to regress, the fewest days by which one of those decides (one
        regression refuses); else the most days any KPI needs (a promotion needs every KPI ok).
        None when no number of days is expected to decide."""
        def regresses(k: PlannedKPI) -> bool:  # the twin's point (an unbounded interval has no midpoint)
            mid = k.point if math.isfinite(k.point) else (k.expected[0] + k.expected[1]) / 2.0
            return (-mid if k.better == "higher" else mid) > k.margin

        bad = [k.days for k in self.kpis if regresses(k) and k.days is not None]
        if bad:
            return min(bad)
        got = [k.days for k in self.kpis]
        return None if not got or any(d is None for d in got) else max(d for d in got if d is not None)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["agent_steps"] = self.agent_steps
        d["days"] = self.days
        return d

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=1, default=float)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> CanaryPlan:
        try:
            sl = d["slice"]
            return cls(
                d["candidate"], d["baseline"],
                PlanSlice(tuple(sl.get("agents", ())), tuple(sl.get("sites", ())), tuple(sl.get("scenarios", ())),
                          float(sl.get("treat_share", 0.5)), int(sl.get("seed", 0)), str(sl.get("design", "random")),
                          tuple((str(a), str(b)) for a, b in sl.get("pairs", ()))),
                float(d["hours"]), tuple(KPIMargin(**m) for m in d["margins"]),
                [PlannedKPI(**k) for k in d["kpis"]], int(d["n_groups"]), int(d["fleet_groups"]),
                float(d["share"]), dict(d["budget"]), bool(d["decides"]), list(d["why"]), int(d.get("seed", 0)),
                int(d.get("round", 1)), {str(k): float(v) for k, v in dict(d.get("loss_budget") or {}).items()},
                {str(k): float(v) for k, v in dict(d.get("loss_levels") or {}).items()},
                {str(k): float(v) for k, v in dict(d.get("expected_width") or {}).items()},
            )  # fmt: skip
        except (KeyError, TypeError, ValueError) as e:
            raise InputError(f"not a canary plan ({type(e).__name__}: {e})", "plan") from None

    @classmethod
    def load(cls, path: str | Path) -> CanaryPlan:
        p = Path(path)
        if not p.is_file():
            raise InputError("canary plan not found", str(p))
        try:
            return cls.from_dict(json.loads(p.read_text()))
        except ValueError as e:
            raise InputError(f"not JSON ({e})", str(p)) from None

    def describe(self) -> str:
        lines = [
            f"canary plan (round {self.round}): {self.candidate} vs {self.baseline} on {self.n_groups} of "
            f"{self.fleet_groups} service groups ({100 * self.share:.1f}%, half on the candidate"
            + (", in matched pairs" if self.slice.design == "matched_pairs" else "") + f") for {self.hours:g} h",
        ]
        for k in self.kpis:
            lo, hi = k.now
            elo, ehi = k.expected
            lines.append(
                f"  {k.kpi}: now [{100 * lo:+.1f}%, {100 * hi:+.1f}%], expected after [{100 * elo:+.1f}%, "
                f"{100 * ehi:+.1f}%]{_UNBOUNDED if k.unbounded else ''} vs margin {100 * k.margin:g}% "
                f"({'decides' if k.decides else _days_text(k.days)}); "
                f"worst case on the slice {100 * k.worst_on_slice:+.1f}% -> fleet {100 * k.fleet_loss:.2f}%"
                + (f" (budget {100 * k.budget:g}%)" if k.budget is not None else "")
            )
        days = self.days
        if not self.decides:
            lines.append(f"  days: {'no number of canary days of this size is expected to decide' if days is None else f'about {days} canary day(s) of this size are expected to decide'}")
        lines += [f"  why: {w}" for w in self.why]
        return "\n".join(lines)


# ------------------------------------------------------------------------------------ planning
def _kpi_column(kdef: Any) -> str | None:
    """The per-step log column whose per-group mean a canary measures for this KPI (None: a KPI a
    per-group mean cannot estimate, e.g. a quantile)."""
    if kdef.stat in ("mean", "sum") and kdef.weight is None:
        return str(kdef.column)
    return None


def _residual_spread(
    twin: Any, log: pd.DataFrame, columns: Sequence[str], hours: Sequence[float], seed: int, members: Any,
    pre_ticks: int = 4, preds: pd.DataFrame | None = None,
) -> tuple[dict[tuple[str, float], float], Any, dict[str, float]]:
    """Per column and window length: the standard deviation over groups of the twin's per-group
    error for the logged actions on the log's last episode over the ticks a canary of that length
    would judge (after ``pre_ticks``), less each group's own pre-tick level (the covariate the
    verdict uses, `edgetwin.loop.ppi`): what ``var(y − f)`` will be.

    Returns ``(spread, paired, pre)``: ``spread[(column, hours)]``; ``paired(n)``, the same per
    (column, hours) for a matched-pair slice of ``n`` groups (`_paired_spread`: the residuals of
    groups paired by the twin's predicted effect in ``preds`` and the pre-period); ``pre``: each
    group's pre-period level of the first column (the pairing covariate)."""
    from edgetwin.loop.ppi import twin_group_series
    from edgetwin.twin.whatif import builtin_policy

    logged = builtin_policy("logged", twin)
    last = log[log["episode"] == log["episode"].iloc[-1]]
    series = twin_group_series(twin, {"logged": logged}, last, columns, episodes=1, seed=seed, members=members)
    out: dict[tuple[str, float], float] = {}
    resid: dict[tuple[str, float], tuple[np.ndarray, np.ndarray]] = {}
    pre: dict[str, float] = {}
    for c in columns:
        f = series[("logged", c)]  # agents x T
        y = last.pivot_table(index="agent", columns="t", values=c, aggfunc="mean")
        y = y.reindex(index=f.index)
        ts = sorted(y.columns)
        x = y.loc[:, ts[:pre_ticks]].mean(axis=1).to_numpy() if pre_ticks > 0 else None
        if x is not None and not pre:
            pre = {str(a): float(v) for a, v in zip(f.index, x, strict=True)}
        eff = np.zeros(len(f.index))
        if preds is not None and ("candidate", c) in preds.columns:
            eff = (preds[("candidate", c)] - preds[("baseline", c)]).reindex(f.index).to_numpy(np.float64)
        for h in hours:
            n_t = max(1, int(round(h * 4)))
            yw = y.loc[:, ts[pre_ticks:pre_ticks + n_t]].mean(axis=1).to_numpy()
            fw = f.iloc[:, pre_ticks:pre_ticks + n_t].mean(axis=1).to_numpy()
            r = yw - fw
            ok = np.isfinite(r) & (np.isfinite(x) if x is not None else True)
            r = r[ok]
            if x is not None and ok.sum() > 2:
                xc = x[ok] - x[ok].mean()
                sxx = float(xc @ xc)
                if sxx > 0:
                    r = r - float(xc @ (r - r.mean())) / sxx * xc
            out[(c, h)] = float(np.std(r, ddof=1)) if len(r) > 1 else float("inf")
            e, xv = eff[ok], (x[ok] if x is not None else np.zeros(len(r)))
            score = sum((v - np.nanmean(v)) / (np.nanstd(v) or 1.0) for v in (np.nan_to_num(e), xv))
            resid[(c, h)] = (r, np.asarray(score, dtype=np.float64))

    def paired(n: int) -> dict[tuple[str, float], float]:
        rng = np.random.default_rng([seed, n, 0xA1])
        return {k: _paired_spread(r, sc, n, rng) for k, (r, sc) in resid.items()}

    return out, paired, pre


#: the designs `plan_canary` chooses among (``design="auto"``) by the interval the twin expects
DESIGNS = ("random", "matched_pairs")
#: the most pairs a matched-pair slice may have: the edge's router assigns arms by a keyed hash of
#: (seed, group) (`edgetwin.edge.canary_slice.SliceRouter`), so a pair-splitting assignment is found
#: by trying seeds (`pair_split_seed`), each splitting every pair with probability 2^-pairs
MAX_PAIRS = 12


def matched_pairs(agents: Sequence[str], effect: Mapping[str, float], pre: Mapping[str, float]) -> list[tuple[str, str]]:
    """The slice's groups paired by the twin's predicted effect and their pre-period level.

    Each group's score is the sum of its two standardised covariates (``effect``: the twin's
    per-group ``f_c − f_b``; ``pre``: the group's own level before the canary); the groups sorted by
    score are paired neighbour to neighbour (Imai, King and Nall 2009's matched-pair design: the
    randomization happens within pairs, so each arm gets one of every two alike groups). An odd
    group out is left unpaired (the planner's slices are even). Missing or non-finite covariates
    count as the mean (0 after standardising)."""

    def z(m: Mapping[str, float]) -> np.ndarray:
        v = np.array([float(m.get(a, np.nan)) for a in agents], dtype=np.float64)
        ok = np.isfinite(v)
        if ok.sum() < 2 or float(np.std(v[ok])) == 0.0:
            return np.zeros(len(agents))
        return np.where(ok, (v - np.mean(v[ok])) / np.std(v[ok]), 0.0)

    score = z(effect) + z(pre)
    order = [agents[i] for i in np.lexsort((np.array(agents, dtype=object).astype(str), score))]
    return [(order[i], order[i + 1]) for i in range(0, len(order) - 1, 2)]


def pair_split_seed(pairs: Sequence[tuple[str, str]], seed: int, tries: int = 1 << 20) -> int | None:
    """The first assignment seed from ``seed`` whose keyed-hash arms (treat share 0.5) put exactly
    one group of every pair on the candidate; None when ``tries`` seeds find none.

    Why a seed search: the edge assigns arms by a keyed hash of (seed, group), not from a list
    (`edgetwin.edge.canary_slice.SliceRouter`). Each seed gives independent fair coins, so among the
    seeds that split every pair each of the ``2^pairs`` pair-splitting assignments is equally likely:
    the first one found is a uniform draw of the matched-pair randomization, and each group's
    propensity stays 1/2 (what the router logs)."""
    from edgetwin.edge.canary_slice import _uniform

    for k in range(int(tries)):
        s = int(seed) + k
        if all((_uniform(s, a) < 0.5) != (_uniform(s, b) < 0.5) for a, b in pairs):
            return s
    return None


def _paired_spread(r: np.ndarray, score: np.ndarray, n: int, rng: np.random.Generator, draws: int = 8) -> float:
    """The per-group residual spread a matched-pair slice of ``n`` groups would see: random slices of
    ``n`` of the groups (``r``: residuals, ``score``: the pairing score), paired by score within the
    slice, ``sqrt(mean var(r_a − r_b) / 2)`` (so that it replaces `_residual_spread`'s per-group
    spread in the two-arm variance ``4 s² / n``)."""
    vs = []
    for _ in range(draws):
        idx = rng.choice(len(r), size=min(n, len(r)), replace=False)
        idx = idx[np.argsort(score[idx], kind="stable")]
        d = r[idx[0:len(idx) - 1:2]] - r[idx[1:len(idx):2]]
        if len(d) > 1:
            vs.append(float(np.var(d, ddof=1)) / 2.0)
    return math.sqrt(float(np.mean(vs))) if vs else float("inf")


def _deciding_checks(decision: Any, kdefs: Mapping[str, Any], budget: PlanBudget) -> tuple[
        dict[str, Any], list[str], list[KPIMargin], dict[str, float]]:
    """What the canary must settle and guard: the abstaining nominal checks of per-group-mean KPIs
    (by KPI), the reasons the others are left to the twin (``why``), the margins of every guarded
    KPI a canary measures, and the loss budget by log column."""
    from edgetwin.twin.whatif import NOMINAL

    guarded = {c.kpi for c in decision.checks}
    unknown = sorted(set(budget.max_loss) - guarded)
    if unknown:
        raise InputError(f"unknown KPI(s) {unknown} in the loss budget; the gate guards {sorted(guarded)}", "--max-loss")
    deciding = [c for c in decision.checks if c.verdict in ("straddle", "unsupported")] or list(decision.checks)
    why: list[str] = []
    for c in deciding:
        if c.scenario != NOMINAL.name:
            why.append(f"{c.kpi} under {c.scenario!r}: a canary sees nominal traffic only; the twin alone judges it")
    # one KPI can abstain under several scenarios: the nominal check is what a canary can settle
    checks: dict[str, Any] = {}
    for c in (c for c in deciding if c.scenario == NOMINAL.name):
        if _kpi_column(kdefs[c.kpi]) is None:
            why.append(f"{c.kpi}: a {kdefs[c.kpi].stat} is not a mean over groups; the canary's guard still watches it")
            continue
        checks.setdefault(c.kpi, c)
    if not checks:
        raise InputError("nothing for a canary to settle: no abstaining nominal check of a per-group mean KPI", "plan")
    loss_budget: dict[str, float] = {}
    for kpi, cap in budget.max_loss.items():  # by the column the canary measures (the tightest when two share one)
        col = _kpi_column(kdefs[kpi]) if kpi in kdefs else None
        if col is not None:
            loss_budget[col] = min(cap, loss_budget.get(col, cap))
    # every guarded KPI with a column is guarded by the canary, not only the deciding ones
    margins: list[KPIMargin] = []
    for c in decision.checks:
        col = _kpi_column(kdefs[c.kpi])
        if c.scenario == NOMINAL.name and col is not None and col not in {m.kpi for m in margins}:
            margins.append(KPIMargin(col, c.max_regression, c.min_delta, kdefs[c.kpi].better == "higher"))
    return checks, why, margins, loss_budget


def _options_space(log: pd.DataFrame, budget: PlanBudget, episode_hours: float | None, pre_ticks: int) -> tuple[
        list[str], list[float], int]:
    """The fleet (the groups of the log's last episode), the hours a canary may run, and the most
    groups the share allows (`InputError` naming the flag when no canary fits)."""
    last_day = log[log["episode"] == log["episode"].iloc[-1]]
    agents = sorted(pd.unique(last_day["agent"].astype(str)))
    if episode_hours is None:
        episode_hours = int(log.groupby("episode")["t"].nunique().max()) / 4.0
    max_h = min(budget.hours, episode_hours - pre_ticks / 4.0)
    hours_opts = sorted({h for h in HOURS_GRID if h <= max_h + 1e-9} | ({max_h} if max_h >= 0.25 else set()))
    if not hours_opts:
        raise InputError(f"the budget's {budget.hours:g} h leave no canary tick after {pre_ticks} pre-ticks", "--hours")
    max_n = int(math.floor(budget.max_share * len(agents) + 1e-9))
    if max_n < 4:
        raise InputError(
            f"{100 * budget.max_share:g}% of {len(agents)} service groups is {max_n}; a canary needs >= 4 (2 per arm)",
            "--max-share",
        )
    return agents, hours_opts, max_n


def kpi_terms(
    preds: pd.DataFrame, spread: Mapping[tuple[str, float], float], col: str, n: int, h: float, design: str,
    treat_share: float, day_var: Mapping[str, tuple[float, float, float]] | None,
) -> tuple[float, tuple[float, float], list[tuple[float, float]], tuple[float, float, float]]:
    """One KPI column's expected one-day terms for a canary of ``n`` groups for ``h`` hours under
    ``design``: ``(base, fleet, own, day)`` with ``base`` the twin's baseline level over the fleet
    (KPI units; what the relative interval divides by), ``fleet = (var_N(f_c − f_b)/N, N − 1)``,
    ``own`` the arms' rectifier terms ``(s²/n_arm, n_arm − 1)`` (a matched-pair rectifier's one term on
    ``n/2 − 1``), and ``day = (first, revealed, df)``: the day term the verdict carries at its first
    look (`edgetwin.loop.ppi.day_term`: the larger of the twin's calibrated replay and the bound on
    what the level cannot reveal, `edgetwin.loop.verdict.calibrated_day_variance`), the part of it
    the logs reveal (`edgetwin.loop.day_bound.revealed_day_variance`) and its degrees of freedom.
    Variances in KPI units squared; the plan's interval (`_expected_option`) and its day count
    (`pooled_days_to_decide`) both read them."""
    from edgetwin.loop.day_bound import revealed_day_variance
    from edgetwin.loop.ppi import day_term

    n_c = max(2, int(round(treat_share * n)))
    n_b = max(2, n - n_c)
    fc, fb = preds[("candidate", col)].to_numpy(), preds[("baseline", col)].to_numpy()
    base = abs(float(np.mean(fb))) or 1.0
    s_r = spread[(col, h)]
    own = ([(s_r**2 * (1.0 / n_c + 1.0 / n_b), float(n // 2 - 1))] if design == "matched_pairs"
           else [(s_r**2 / n_c, float(n_c - 1)), (s_r**2 / n_b, float(n_b - 1))])  # fmt: skip
    dv = day_term(day_var, col)
    fleet = (float(np.var(fc - fb, ddof=1)) / len(fc), float(len(fc) - 1))
    return base, fleet, own, (dv[0], revealed_day_variance(day_var, col), dv[2])


def baseline_var_terms(
    preds: pd.DataFrame, spread: Mapping[tuple[str, float], float], col: str, n: int, h: float,
    treat_share: float, day_var: Mapping[str, tuple[float, float, float]] | None,
) -> BaseVar:
    """The one-day variance terms ``(shared, own, day)`` (KPI units squared) of the baseline level
    the verdict divides the change by (``μ̂_b = mean_N(f_b) + mean_ctrl(y − f)``,
    `edgetwin.loop.ppi.ppi_mean_difference`), for a canary of ``n`` groups for ``h`` hours:
    ``shared = var_N(f_b)/N`` (its ``base_var_shared``: the twin's baseline predictions over the
    fleet, ``preds[("baseline", col)]``, ``(N,)``; the verdict's shared term also holds the twin's
    interference spread over the baseline level, which `edgetwin.loop.plan_expected.verdict_interval`
    adds from `edgetwin.loop.plan_interference`, as it adds the change's), ``own = s²/n_b`` (its ``base_var_own``: the
    control arm's rectifier over its ``n_b`` groups, with ``s`` the *unpaired* per-group residual
    spread ``spread[(col, h)]`` (`_residual_spread`), because the baseline level is the control
    arm's mean under either design, pairs or not) and ``day`` the baseline level's day-to-day
    variance (its ``base_var_day``: `edgetwin.loop.ppi.day_term`'s second entry, 0 without
    ``day_var``). Why: `edgetwin.loop.ppi.finish_estimate` divides the change by every baseline
    level within ``q·sqrt(shared + own + day)`` of it; a plan that divides by the twin's level as if
    known promises an interval the verdict cannot give (issue 48). `pooled_base_var` pools them over
    days, for the interval (`_expected_option`) and the day count (`pooled_days_to_decide`) alike."""
    from edgetwin.loop.ppi import day_term

    n_b = max(2, n - max(2, int(round(treat_share * n))))
    fb = preds[("baseline", col)].to_numpy(dtype=np.float64)
    shared = float(np.var(fb, ddof=1)) / len(fb) if len(fb) > 1 else float("inf")
    return shared, float(spread[(col, h)]) ** 2 / n_b, day_term(day_var, col)[1]


def _expected_option(
    decision: Any, checks: Mapping[str, Any], kdefs: Mapping[str, Any], preds: pd.DataFrame,
    spread: Mapping[tuple[str, float], float], budget: PlanBudget, n_fleet: int, n: int, h: float, design: str,
    day_var: Mapping[str, tuple[float, float, float]] | None = None, max_days: int = 1, count_days: bool = True,
    base_spread: Mapping[tuple[str, float], float] | None = None, interference: PlannedInterference | None = None,
) -> tuple[bool, float, float, list[PlannedKPI]]:
    """What a canary of ``n`` groups for ``h`` hours under ``design`` is expected to tell: whether
    every KPI's expected interval decides, the largest share of a KPI's loss budget it may spend,
    the summed expected width, and the `PlannedKPI` s. ``spread``: per (column, hours), the
    per-group residual spread the design's rectifier will see (`_residual_spread`, or its paired
    counterpart); a matched-pair rectifier has ``n/2 − 1`` degrees of freedom, a random one Welch's.
    ``day_var``: per column, the day-to-day variance of the change (`day_to_day_variance`), a term of
    one day's interval that only more days shrink; ``max_days``: the extension's days, whose looks
    (`edgetwin.loop.ppi.look_days`) set the level at which ``days`` (of `PlannedKPI`) is reckoned.
    ``count_days`` False: ``days`` left None (`plan_canary` weighs every option without them, which
    do not enter the choice, and counts them for the chosen option only: each count searches up to a
    year of days). ``base_spread``: the unpaired spread the baseline level's rectifier sees
    (`baseline_var_terms`; None: ``spread``, the random design's). ``interference``: the twin's
    interference per (column, groups, hours) (`edgetwin.loop.plan_interference.PlannedInterference`;
    None: none, and no hull).

    Each KPI's expected interval is the verdict's construction on the expected terms
    (`verdict_interval`: the change's interval divided by every baseline level the baseline's
    interval allows, `expected_interval`, with the twin's interference term in both variances and
    the hull with the no-interference estimate, as `edgetwin.loop.ppi.ppi_verdict` judges), so it is
    unbounded on a side where the baseline's expected interval reaches 0, and ``decides`` is the
    verdict's rule (`interval_decides`). The summed width is infinite when
    some KPI's interval is unbounded (`plan_canary` ranks designs by `_width_rank`, finite)."""
    from edgetwin.loop.ppi import look_days, look_level

    n_c = max(2, int(round(budget.treat_share * n)))
    planned, all_decide, max_frac, width = [], True, 0.0, 0.0
    for kpi, c in checks.items():
        col = _kpi_column(kdefs[kpi]) or kpi
        base, fleet_term, own, day = kpi_terms(preds, spread, col, n, h, design, budget.treat_share, day_var)
        base_var = baseline_var_terms(preds, spread if base_spread is None else base_spread, col, n, h,
                                      budget.treat_share, day_var)  # fmt: skip
        point = float(c.change)
        itf = interference.term(col, n, h) if interference is not None else NO_INTERFERENCE
        # the verdict's own interval division, reference, interference term and hull (`edgetwin.loop.ppi`)
        exp = list(verdict_interval(1, point, base, fleet_term, own, day, base_var, LEVEL, itf))
        sign = -1.0 if c.better == "higher" else 1.0
        decides = interval_decides(worsening(exp, c.better), c.allowed_change)
        worst = float(c.worsening_interval[1]) if c.worsening_interval else float("inf")
        fleet_loss = max(0.0, worst) * n_c / n_fleet
        cap = budget.max_loss.get(kpi)
        if cap is not None:
            max_frac = max(max_frac, fleet_loss / cap)
        all_decide &= decides
        width += exp[1] - exp[0]
        # over an extension's looks, each at its share of alpha (`look_level`), by the verdict's pooling
        days = (pooled_days_to_decide(sign * point, c.allowed_change, base, fleet_term, own, day,
                                      look_level(LEVEL, len(look_days(max_days))), look_days(max_days),
                                      base_var=base_var, interference=replace(itf, shift=sign * itf.shift))
                if count_days else None)  # fmt: skip
        planned.append(PlannedKPI(kpi, col, c.better, c.abstain_reason(decision.max_out_of_support), list(c.interval),
                                  exp, c.allowed_change, decides, worst, fleet_loss, cap, days, point,
                                  itf.shift / base, math.sqrt(max(itf.var, 0.0)) / base))  # fmt: skip
    return all_decide, max_frac, width, planned


def _width_rank(planned: Sequence[PlannedKPI]) -> tuple[int, float]:
    """How `plan_canary` ranks designs at one size and duration, narrowest first, finite where the
    summed width is not: the number of KPIs whose expected interval is unbounded (or NaN), then the
    summed width of the bounded ones. Where no KPI is unbounded it orders as the summed width does."""
    widths = [float(k.expected[1]) - float(k.expected[0]) for k in planned]
    return sum(not math.isfinite(w) for w in widths), float(sum(w for w in widths if math.isfinite(w)))


def _choose(options: list[tuple[Any, ...]], why: list[str]) -> tuple[Any, ...]:
    """The cheapest deciding option (least worst-case loss, then fewest group-hours, then fewest
    groups), else the largest the budget allows (most groups, then longest); ``why`` says which."""
    if not options:
        raise InputError(
            "no canary of >= 4 groups fits the loss budget: the twin's worst case is too large; raise --max-loss "
            "or accept the abstention", "--max-loss",
        )  # fmt: skip
    deciding_opts = [o for o in options if o[0]]
    if deciding_opts:
        why.append("the cheapest slice (least worst-case loss, then fewest group-hours) whose expected interval decides")
        return min(deciding_opts, key=lambda o: (o[1], o[2], o[4]))
    why.append("no slice within the budget is expected to decide: the largest the budget allows (most groups, "
               "longest), the most evidence for the risk the operator accepts")  # fmt: skip
    return min(options, key=lambda o: (-o[4], -o[5]))


def plan_canary(
    decision: Any,
    twin: Any,
    log: pd.DataFrame,
    candidate: Any,
    baseline: Any,
    budget: PlanBudget | None = None,
    *,
    seed: int = 0,
    members: Sequence[int] | None = None,
    episode_hours: float | None = None,
    pre_ticks: int = 4,
    round_no: int = 1,
    design: str = "auto",
    day_var: Mapping[str, tuple[float, float, float]] | None = None,
    max_days: int = 1,
) -> CanaryPlan:
    """The canary plan for an abstaining `edgetwin.policies.gate.GateDecision`.

    Args:
        decision: the gate's decision (its checks, KPIs and intervals).
        twin: the twin the gate replayed in; log: the recent log it replayed (the groups of its last episode are the fleet).
        candidate, baseline: the `PolicySpec` s the gate compared.
        budget: the operator's `PlanBudget` (default: 10 % of the groups, 24 h, no loss cap).
        seed: draws the slice's groups (same seed, same plan).
        members: ensemble members for the per-group predictions (default: all).
        episode_hours: the longest canary the system allows (default: the log's episode length).
        pre_ticks: ticks on the current policy before the candidate (`CanaryConfig.pre_ticks`).
        round_no: which round of `edgetwin promote --canary` this is (reported).
        design: ``"random"`` (the slice's groups split by fair coins, re-randomized to balance),
            ``"matched_pairs"`` (paired by the twin's predicted effect and their pre-period,
            randomized within pairs: `matched_pairs`; at most `MAX_PAIRS` pairs and a half
            share), or ``"auto"``: at each slice size and duration, the design whose expected
            interval is narrower (the plan records both widths in ``expected_width``).
        day_var: per KPI column, ``(var of the change, var of the baseline, days − 1)`` from day to
            day (`edgetwin.loop.verdict.day_to_day_variance`): the verdict is about the change
            averaged over the days the decision lives with, so one day's expected interval carries
            it, and each KPI's ``days`` (and the plan's ``days``) says how many canary days of
            this size are expected to decide by the verdict's pooling (`pooled_days_to_decide`;
            only more days shrink it). A `edgetwin.loop.verdict.DayVariance` also says which
            part of it the logs reveal (the rest is the first look's bound, which the verdict
            pools as one day's evidence). None: not counted.
        max_days: the extension's most days (`edgetwin.loop.rounds.canary_loop`'s ``max_days``):
            ``days`` is reckoned at the level of its looks.

    Raises:
        InputError: a ``max_loss`` KPI that is not guarded or not of one positive sign
            (`check_loss_budget_signs`), nothing to plan (no guarded KPI a
            canary can measure), a budget that allows fewer than 4 groups, an unknown design.
    """
    from edgetwin.loop.plan_interference import member_replays, planned_interference

    if design not in ("auto", *DESIGNS):
        raise InputError(f"unknown canary design {design!r}; expected auto, {', '.join(DESIGNS)}", "design")
    budget = budget or PlanBudget()
    kdefs = {k.name: k for k in decision.result.kpis}
    checks, why, margins, loss_budget = _deciding_checks(decision, kdefs, budget)
    check_loss_budget_signs(budget.max_loss, kdefs, log)
    agents, hours_opts, max_n = _options_space(log, budget, episode_hours, pre_ticks)
    n_fleet = len(agents)
    last_day = log[log["episode"] == log["episode"].iloc[-1]]
    loss_levels = {c: float(last_day[c].mean()) for c in loss_budget if c in last_day.columns
                   and math.isfinite(float(last_day[c].mean())) and float(last_day[c].mean()) != 0}  # fmt: skip
    columns = sorted({_kpi_column(kdefs[k]) or k for k in checks})
    preds, per_member = member_replays(twin, candidate, baseline, log, columns, seed=seed, members=members)
    interference = planned_interference(twin, log, candidate, baseline, columns, per_member, preds, agents, max_n,
                                        budget.treat_share, hours=hours_opts, pre_ticks=pre_ticks, seed=seed,
                                        round_no=round_no, members=members)  # fmt: skip
    del per_member  # the per-tick series: only their window means are kept (`PlannedInterference.frames`)
    spread, paired, pre = _residual_spread(twin, log, columns, hours_opts, seed, members, pre_ticks, preds=preds)
    pairable = budget.treat_share == 0.5
    options = []
    for n in range(4, max_n + 1, 2):
        designs = [d for d in DESIGNS if design in ("auto", d)
                   and (d == "random" or (pairable and n // 2 <= MAX_PAIRS))]  # fmt: skip
        by_design = {d: spread if d == "random" else paired(n) for d in designs}
        for h in hours_opts:
            got = {d: _expected_option(decision, checks, kdefs, preds, by_design[d], budget, n_fleet, n, h, d,
                                       day_var, max_days, count_days=False, base_spread=spread,
                                       interference=interference)
                   for d in designs}  # fmt: skip
            if not got:
                continue
            d = min(got, key=lambda k: _width_rank(got[k][3]))  # the narrowest expected interval here
            ok, frac, width, planned = got[d]
            if frac > 1.0 + 1e-12:
                continue  # over the loss budget
            options.append((ok, sum(p.fleet_loss for p in planned), n * h, width, n, h, planned, d,
                            {k: v[2] for k, v in got.items()}))  # fmt: skip
    if design == "matched_pairs" and not options:
        raise InputError(f"a matched-pair canary needs a half share and at most {MAX_PAIRS} pairs", "design")
    best = _choose(options, why)
    _, _, _, _, n, h, _, d, _ = best  # the chosen option's days (`PlannedKPI.days`), counted once
    counted = _expected_option(decision, checks, kdefs, preds, spread if d == "random" else paired(n), budget, n_fleet,
                               n, h, d, day_var, max_days, base_spread=spread, interference=interference)[3]  # fmt: skip
    best = (*best[:6], counted, *best[7:])
    return _draw_slice(decision, best, checks, why, agents, preds, pre, budget, margins, loss_budget, loss_levels,
                       seed, round_no)


def _draw_slice(
    decision: Any, best: tuple[Any, ...], checks: Mapping[str, Any], why: list[str], agents: list[str],
    preds: pd.DataFrame, pre: Mapping[str, float], budget: PlanBudget, margins: list[KPIMargin],
    loss_budget: dict[str, float], loss_levels: dict[str, float], seed: int, round_no: int,
) -> CanaryPlan:
    """The chosen option's groups: a seeded uniform draw from the fleet (the prediction-powered
    verdict is valid for the fleet only from a random slice), paired and given a pair-splitting
    assignment seed under the matched-pair design (`matched_pairs`, `pair_split_seed`)."""
    ok, _, _, _, n, h, planned, design, widths = best
    for c in checks.values():
        if c.verdict == "unsupported":
            why.append(f"{c.kpi}: {100 * c.out_of_support:.0f}% of the candidate's agent-steps lie outside the logs' "
                       "support; the canary measures it where the twin cannot")  # fmt: skip
        else:
            why.append(f"{c.kpi}: the twin's interval straddles its margin; the canary rectifies the twin's error")
    why.append("groups drawn uniformly at random from the fleet (seeded): the prediction-powered verdict is valid "
               "for the fleet only from a random slice")  # fmt: skip
    chosen = slice_groups(agents, n, seed, round_no)
    slice_seed, pairs = seed * 1000 + round_no, tuple[tuple[str, str], ...]()
    if design == "matched_pairs":
        col = planned[0].column
        eff = (preds[("candidate", col)] - preds[("baseline", col)]).to_dict()
        pr = tuple(matched_pairs(list(chosen), {str(k): float(v) for k, v in eff.items()}, pre))
        found = pair_split_seed(pr, slice_seed)
        if found is None:
            design = "random"
            why.append("no assignment seed splits every pair: the slice is randomized without pairs")
        else:
            slice_seed, pairs = found, pr
            why.append(f"matched pairs (by the twin's predicted {col} effect and the pre-period), one of each pair on "
                       f"the candidate: expected width {widths['matched_pairs']:.3g} vs "
                       f"{widths.get('random', float('nan')):.3g} for a random split (summed over the deciding KPIs)")
    return CanaryPlan(
        candidate=str(decision.candidate), baseline=str(decision.baseline),
        slice=PlanSlice(chosen, (), (), budget.treat_share, slice_seed, design, pairs),
        hours=float(h), margins=tuple(margins), kpis=planned, n_groups=n, fleet_groups=len(agents),
        share=n / len(agents), budget={"max_share": budget.max_share, "max_loss": dict(budget.max_loss),
                                       "hours": budget.hours, "treat_share": budget.treat_share},
        decides=bool(ok), why=why, seed=seed, round=round_no, loss_budget=loss_budget, loss_levels=loss_levels,
        expected_width={k: float(v) for k, v in widths.items()},
    )  # fmt: skip


__all__ = [
    "DESIGNS",
    "MAX_PAIRS",
    "days_to_decide",
    "baseline_var_terms",
    "expected_interval",
    "interval_decides",
    "kpi_terms",
    "pooled_base_var",
    "pooled_days_to_decide",
    "pooled_terms",
    "matched_pairs",
    "pair_split_seed",
    "HOURS_GRID",
    "CanaryPlan",
    "PlanBudget",
    "PlanSlice",
    "PlannedKPI",
    "budget_from_flags",
    "check_loss_budget_signs",
    "parse_max_loss",
    "parse_share",
    "plan_canary",
    "slice_groups",
]
