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
(shorter windows: noisier group means, larger residuals). So the expected interval after a canary
of ``n`` groups for ``h`` hours is the twin's current point estimate ± z·se(n, h).

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
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from edgetwin.contract.errors import InputError
from edgetwin.contract.margins import KPIMargin

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
            (0.005 = 0.5 %); KPIs not named are capped by share and hours only.
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


# ------------------------------------------------------------------------------------ the plan
@dataclass(frozen=True)
class PlanSlice:
    """The slice, in the shape `edgetwin.edge.canary.CanaryConfig.from_plan` reads."""

    agents: tuple[str, ...] = ()
    sites: tuple[str, ...] = ()
    scenarios: tuple[str, ...] = ()
    treat_share: float = 0.5
    seed: int = 0


@dataclass
class PlannedKPI:
    """One deciding KPI: where it stands, what the canary should make of it, and its worst case.

    Attributes:
        kpi: the gate's KPI name; column: the log column the canary measures (``return`` -> ``reward``).
        reason: the gate's abstention reason. now: the gate's 90 % interval of the relative change.
        expected: the interval the twin expects after the canary (PPI). margin: relative worsening allowed.
        decides: ``expected`` lies wholly on one side of the margin.
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
    #: canary days of this size whose pooled interval is expected to decide (1 when one does; None
    #: when the twin's point estimate sits on the margin, where no number of days decides)
    days: int | None = 1


def _days_text(days: int | None) -> str:
    if days is None:
        return "may not decide: the twin's estimate sits on the margin"
    return f"may not decide: about {days} day(s) of such canaries would"


def days_to_decide(point_worsening: float, half_width: float, allowed: float) -> int | None:
    """Canary days of one size whose pooled interval is expected to clear the margin: the interval's
    half-width shrinks as ``1/sqrt(days)`` with independent days, so ``ceil((half / gap)²)`` with
    ``gap`` the distance of the point estimate from the margin (a lower bound: the terms rounds
    share do not shrink). None when the point sits on the margin."""
    gap = abs(float(point_worsening) - float(allowed))
    if not (gap > 1e-9 and math.isfinite(half_width)):
        return None
    return max(1, math.ceil((float(half_width) / gap) ** 2 - 1e-9))


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

    @property
    def agent_steps(self) -> int:
        """Agent-steps the candidate arm is expected to serve (15-minute ticks)."""
        return int(round(self.slice.treat_share * self.n_groups * self.hours * 4))

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["agent_steps"] = self.agent_steps
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
                          float(sl.get("treat_share", 0.5)), int(sl.get("seed", 0))),
                float(d["hours"]), tuple(KPIMargin(**m) for m in d["margins"]),
                [PlannedKPI(**k) for k in d["kpis"]], int(d["n_groups"]), int(d["fleet_groups"]),
                float(d["share"]), dict(d["budget"]), bool(d["decides"]), list(d["why"]), int(d.get("seed", 0)),
                int(d.get("round", 1)), {str(k): float(v) for k, v in dict(d.get("loss_budget") or {}).items()},
                {str(k): float(v) for k, v in dict(d.get("loss_levels") or {}).items()},
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
            f"{self.fleet_groups} service groups ({100 * self.share:.1f}%, half on the candidate) for {self.hours:g} h",
        ]
        for k in self.kpis:
            lo, hi = k.now
            elo, ehi = k.expected
            lines.append(
                f"  {k.kpi}: now [{100 * lo:+.1f}%, {100 * hi:+.1f}%], expected after [{100 * elo:+.1f}%, "
                f"{100 * ehi:+.1f}%] vs margin {100 * k.margin:g}% ({'decides' if k.decides else _days_text(k.days)}); "
                f"worst case on the slice {100 * k.worst_on_slice:+.1f}% -> fleet {100 * k.fleet_loss:.2f}%"
                + (f" (budget {100 * k.budget:g}%)" if k.budget is not None else "")
            )
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
    pre_ticks: int = 4,
) -> dict[tuple[str, float], float]:
    """Per column and window length: the standard deviation over groups of the twin's per-group
    error for the logged actions on the log's last episode over the ticks a canary of that length
    would judge (after ``pre_ticks``), less each group's own pre-tick level (the covariate the
    verdict uses, `edgetwin.loop.ppi`): what ``var(y − f)`` will be."""
    from edgetwin.loop.ppi import twin_group_series
    from edgetwin.twin.whatif import builtin_policy

    logged = builtin_policy("logged", twin)
    last = log[log["episode"] == log["episode"].iloc[-1]]
    series = twin_group_series(twin, {"logged": logged}, last, columns, episodes=1, seed=seed, members=members)
    out = {}
    for c in columns:
        f = series[("logged", c)]  # agents x T
        y = last.pivot_table(index="agent", columns="t", values=c, aggfunc="mean")
        y = y.reindex(index=f.index)
        ts = sorted(y.columns)
        x = y.loc[:, ts[:pre_ticks]].mean(axis=1).to_numpy() if pre_ticks > 0 else None
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
    return out


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

    Raises:
        InputError: a ``max_loss`` KPI that is not guarded, nothing to plan (no guarded KPI a
            canary can measure), a budget that allows fewer than 4 groups.
    """
    from edgetwin.loop.ppi import twin_group_predictions

    budget = budget or PlanBudget()
    kdefs = {k.name: k for k in decision.result.kpis}
    guarded = {c.kpi for c in decision.checks}
    unknown = sorted(set(budget.max_loss) - guarded)
    if unknown:
        raise InputError(f"unknown KPI(s) {unknown} in the loss budget; the gate guards {sorted(guarded)}", "--max-loss")
    from edgetwin.twin.whatif import NOMINAL

    deciding = [c for c in decision.checks if c.verdict in ("straddle", "unsupported")] or list(decision.checks)
    why: list[str] = []
    nominal = [c for c in deciding if c.scenario == NOMINAL.name]
    for c in deciding:
        if c.scenario != NOMINAL.name:
            why.append(f"{c.kpi} under {c.scenario!r}: a canary sees nominal traffic only; the twin alone judges it")
    # one KPI can abstain under several scenarios: the nominal check is what a canary can settle
    checks: dict[str, Any] = {}
    for c in nominal:
        col = _kpi_column(kdefs[c.kpi])
        if col is None:
            why.append(f"{c.kpi}: a {kdefs[c.kpi].stat} is not a mean over groups; the canary's guard still watches it")
            continue
        checks.setdefault(c.kpi, c)
    if not checks:
        raise InputError("nothing for a canary to settle: no abstaining nominal check of a per-group mean KPI", "plan")
    # every guarded KPI with a column is guarded by the canary, not only the deciding ones
    margins: list[KPIMargin] = []
    loss_budget: dict[str, float] = {}
    for kpi, cap in budget.max_loss.items():  # by the column the canary measures (the tightest when two share one)
        col = _kpi_column(kdefs[kpi]) if kpi in kdefs else None
        if col is not None:
            loss_budget[col] = min(cap, loss_budget.get(col, cap))
    for c in decision.checks:
        col = _kpi_column(kdefs[c.kpi])
        if c.scenario == NOMINAL.name and col is not None and col not in {m.kpi for m in margins}:
            margins.append(KPIMargin(col, c.max_regression, c.min_delta, kdefs[c.kpi].better == "higher"))

    # the fleet: the service groups of the log's last episode (the most recent day's population)
    last_day = log[log["episode"] == log["episode"].iloc[-1]]
    agents = sorted(pd.unique(last_day["agent"].astype(str)))
    n_fleet = len(agents)
    loss_levels = {}
    for col in loss_budget:
        lvl = float(last_day[col].mean()) if col in last_day.columns else float("nan")
        if math.isfinite(lvl) and lvl != 0:
            loss_levels[col] = lvl
    if episode_hours is None:
        steps = int(log.groupby("episode")["t"].nunique().max())
        episode_hours = steps / 4.0
    max_h = min(budget.hours, episode_hours - pre_ticks / 4.0)
    hours_opts = sorted({h for h in HOURS_GRID if h <= max_h + 1e-9} | ({max_h} if max_h >= 0.25 else set()))
    if not hours_opts:
        raise InputError(f"the budget's {budget.hours:g} h leave no canary tick after {pre_ticks} pre-ticks", "--hours")
    max_n = int(math.floor(budget.max_share * n_fleet + 1e-9))
    if max_n < 4:
        raise InputError(
            f"{100 * budget.max_share:g}% of {n_fleet} service groups is {max_n}; a canary needs >= 4 (2 per arm)",
            "--max-share",
        )
    columns = sorted({_kpi_column(kdefs[k]) or k for k in checks})
    preds = twin_group_predictions(
        twin, {"candidate": candidate, "baseline": baseline}, log, columns, episodes=1, seed=seed, members=members
    )
    resid = _residual_spread(twin, log, columns, hours_opts, seed, members, pre_ticks)
    from edgetwin.loop.ppi import t_quantile, welch_df

    def option(n: int, h: float) -> tuple[bool, float, float, list[PlannedKPI]]:
        n_c = max(2, int(round(budget.treat_share * n)))
        n_b = max(2, n - n_c)
        planned, all_decide, max_frac, width = [], True, 0.0, 0.0
        for kpi, c in checks.items():
            col = _kpi_column(kdefs[kpi]) or kpi
            fc, fb = preds[("candidate", col)].to_numpy(), preds[("baseline", col)].to_numpy()
            base = abs(float(np.mean(fb))) or 1.0
            s_r = resid[(col, h)]
            terms = [(float(np.var(fc - fb, ddof=1)) / len(fc), len(fc) - 1), (s_r**2 / n_c, n_c - 1),
                     (s_r**2 / n_b, n_b - 1)]  # fmt: skip
            se = math.sqrt(sum(v for v, _ in terms)) / base
            q = t_quantile(LEVEL, welch_df(terms))  # the verdict's own reference (`edgetwin.loop.ppi`)
            point = float(c.change)
            exp = [point - q * se, point + q * se]
            sign = -1.0 if c.better == "higher" else 1.0
            wlo, whi = sorted((sign * exp[0], sign * exp[1]))
            decides = whi <= c.allowed_change or wlo > c.allowed_change
            worst = float(c.worsening_interval[1]) if c.worsening_interval else float("inf")
            fleet_loss = max(0.0, worst) * n_c / n_fleet
            cap = budget.max_loss.get(kpi)
            if cap is not None:
                max_frac = max(max_frac, fleet_loss / cap)
            all_decide &= decides
            width += (exp[1] - exp[0])
            days = 1 if decides else days_to_decide(sign * point, q * se, c.allowed_change)
            planned.append(PlannedKPI(kpi, col, c.better, c.abstain_reason(decision.max_out_of_support),
                                      list(c.interval), exp, c.allowed_change, decides, worst, fleet_loss, cap,
                                      days))  # fmt: skip
        return all_decide, max_frac, width, planned

    options = []
    for n in range(4, max_n + 1, 2):
        for h in hours_opts:
            ok, frac, width, planned = option(n, h)
            if frac > 1.0 + 1e-12:
                continue  # over the loss budget
            risk = sum(p.fleet_loss for p in planned)
            options.append((ok, risk, n * h, width, n, h, planned))
    if not options:
        raise InputError(
            "no canary of >= 4 groups fits the loss budget: the twin's worst case is too large; raise --max-loss "
            "or accept the abstention", "--max-loss",
        )  # fmt: skip
    deciding_opts = [o for o in options if o[0]]
    if deciding_opts:
        best = min(deciding_opts, key=lambda o: (o[1], o[2], o[4]))
        why.append("the cheapest slice (least worst-case loss, then fewest group-hours) whose expected interval decides")
    else:
        best = min(options, key=lambda o: (-o[4], -o[5]))
        why.append("no slice within the budget is expected to decide: the largest the budget allows (most groups, "
                   "longest), the most evidence for the risk the operator accepts")
    _, _, _, _, n, h, planned = best
    for c in checks.values():
        if c.verdict == "unsupported":
            why.append(f"{c.kpi}: {100 * c.out_of_support:.0f}% of the candidate's agent-steps lie outside the logs' "
                       "support; the canary measures it where the twin cannot")  # fmt: skip
        else:
            why.append(f"{c.kpi}: the twin's interval straddles its margin; the canary rectifies the twin's error")
    why.append("groups drawn uniformly at random from the fleet (seeded): the prediction-powered verdict is valid "
               "for the fleet only from a random slice")  # fmt: skip
    rng = np.random.default_rng([seed, round_no, 0xCA])
    chosen = tuple(sorted(str(a) for a in rng.choice(np.array(agents, dtype=object), n, replace=False)))
    return CanaryPlan(
        candidate=str(decision.candidate), baseline=str(decision.baseline),
        slice=PlanSlice(chosen, (), (), budget.treat_share, seed * 1000 + round_no),
        hours=float(h), margins=tuple(margins), kpis=planned, n_groups=n, fleet_groups=n_fleet,
        share=n / n_fleet, budget={"max_share": budget.max_share, "max_loss": dict(budget.max_loss),
                                   "hours": budget.hours, "treat_share": budget.treat_share},
        decides=bool(best[0]), why=why, seed=seed, round=round_no, loss_budget=loss_budget,
        loss_levels=loss_levels,
    )  # fmt: skip


__all__ = [
    "days_to_decide",
    "HOURS_GRID",
    "CanaryPlan",
    "PlanBudget",
    "PlanSlice",
    "PlannedKPI",
    "budget_from_flags",
    "parse_max_loss",
    "parse_share",
    "plan_canary",
]
