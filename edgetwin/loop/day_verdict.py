"""A canary day's verdict: the rounds pooled at a look, and after a stop.

`edgetwin.loop.rounds.canary_loop` judges its canary days here (`_pooled_verdict`: the completed
days pooled at one look's level; `days_needed`: what would decide the open KPIs), and so do
``edgetwin canary verdict`` (`edgetwin.loop.evidence.judge_canary`) and the closed-loop levers
benchmark when a stop ended the canary (`stopped_verdict`).

**A day a stop cut short gives no verdict** (`stopped_verdict`, the one place this rule is made:
the loop, ``edgetwin canary verdict`` and the levers benchmark call it). The verdict is about the
fleet-wide effect averaged over whole days (the day-to-day term is a whole day's), and the hours
before a stop are not such a day: they are its first hours (time of day) ending in the stretch the
stop fired on, at a time the data chose, which the alpha spending does not cover. So when the guard
or the edge's loss budget (any stop before the day's planned ticks) cuts a canary day short, every
KPI other than the guard's is judged only on the completed canary days before it — pooled as any
look is, at the level of the look the stop takes the place of — and with no completed day it stays
open, the result saying why. The loop keeps the stopped day's estimates in its `LoopRound` for the
record; ``edgetwin canary verdict`` shows them as ``open``. (Measured: judged on the ticks it ran,
the closed-loop benchmark's 5,000-group guard stop of least-loaded on day 1 put three of its other
KPIs on the wrong side of the 20-day truth, docs/benchmarks/closed_loop, "What the fleet sizes say".)
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = [
    "STOPPED_BY", "Stop", "bound_note", "days_needed", "guard_kpis", "more_days", "stopped_kpi_verdicts", "stopped_verdict",
    "unbounded_towards_margin",
]


#: what stopped a canary, by `edgetwin.edge.canary.STOP_REASONS` (the result's wording)
STOPPED_BY = {"guard": "guard", "budget": "loss budget", "operator": "operator", "link": "failed log shipping",
              "runtime": "runtime's end", "swapped": "current policy's change"}  # fmt: skip


@dataclass(frozen=True)
class Stop:
    """How a canary day ended, as the stopped-day rule (module docstring) reads it.

    ``reason``: a `edgetwin.edge.canary.STOP_REASONS` entry, or ``"short log"`` when only the log
    says the day was cut short (it holds fewer ticks than the plan's day, no stop recorded);
    ``ran``: ticks the candidate was served after the pre-period; ``planned``: the day's ticks
    (`edgetwin.edge.canary.CanaryConfig.ticks`); ``guard``: the KPIs the guard stopped it on;
    ``alpha``: the guard's error level (for the reason)."""

    reason: str
    ran: int
    planned: int
    guard: tuple[str, ...] = ()
    alpha: float = 0.05

    @property
    def short(self) -> bool:
        """A stop cut the day short: it ended before its planned ticks, other than by completing."""
        return self.reason != "completed" and int(self.ran) < int(self.planned)

    @property
    def decides(self) -> bool:
        """The stopped-day rule, not the day's own intervals, judges it (`stopped_verdict` is not None)."""
        return self.reason == "guard" or self.short

    def by(self) -> str:
        """Who stopped it, for the reason ("the canary's loss budget")."""
        if self.reason == "short log":
            return (f"a stop the log does not name (it holds {self.ran} of the plan's {self.planned} tick(s) after the "
                    "pre-period)")  # fmt: skip
        return f"the canary's {STOPPED_BY.get(self.reason, self.reason + ' stop')}"


def guard_kpis(guard_stop: Any) -> tuple[str, ...]:
    """The KPI a `edgetwin.edge.canary_guard.GuardStop` (or its dict) names, as `Stop.guard`."""
    kpi = guard_stop.get("kpi") if isinstance(guard_stop, Mapping) else getattr(guard_stop, "kpi", None)
    return (str(kpi),) if kpi else ()


def stopped_verdict(
    stop: Stop, per_round: list[dict[str, dict[str, float]]], n_looks: int, plan: Any,
    day_var: Mapping[str, Any] | None,
) -> tuple[str, list[Any], list[dict[str, Any]], str, int] | None:
    """The verdict of a canary that a stop ended (the module docstring's rule, in this one place:
    the loop, ``edgetwin canary verdict`` and the levers benchmark call it): the guard's (refused;
    its other KPIs on the completed days before, `_guard_verdict`) or any stop that cut the day short
    (the completed days before it only, `_stopped_day_verdict`); None when the day ran its course
    (judged as usual). ``per_round``: the completed days' estimates (never a day cut short; a
    guard-stopped day that ran all its ticks is complete); ``plan`` is read only when it holds one."""
    if stop.reason == "guard":
        return _guard_verdict(stop, per_round, n_looks, plan, day_var)
    if stop.short:
        return _stopped_day_verdict(stop.by(), per_round, n_looks, plan, day_var, max(1, int(stop.ran)))
    return None


def stopped_kpi_verdicts(stop: Stop, kpis: Sequence[str], judged: Sequence[Mapping[str, Any]]) -> dict[str, tuple[str, str]]:
    """Per KPI of a stopped canary, ``(verdict, by)``: ``("regress", "guard")`` for the guard's KPI;
    the verdict of the completed days where `stopped_verdict` judged it (``judged``: its checks,
    ``"interval"``); else ``("open", "stop")`` — the hours before the stop decide nothing."""
    got = {str(c["kpi"]): str(c["verdict"]) for c in judged}
    return {k: ("regress", "guard") if k in stop.guard else (got[k], "interval") if k in got else ("open", "stop")
            for k in kpis}  # fmt: skip


def _stopped_day_verdict(
    what: str, per_round: list[dict[str, dict[str, float]]], n_looks: int, plan: Any,
    day_var: Mapping[str, Any] | None, ran: int,
) -> tuple[str, list[Any], list[dict[str, Any]], str, int]:
    """The verdict after a canary day that ``what`` (e.g. "the canary's loss budget") stopped after
    ``ran`` ticks: the completed days before it (``per_round``, which never holds a stopped day)
    pooled at one look's level (`_pooled_verdict`: the stop takes the place of the next planned
    look and spends its alpha), or, with no completed day, open (abstain) saying why.

    Why not the stopped day's ticks: the module docstring ("A day a stop cut short gives no
    verdict"). The completed days' estimates are not chosen by the stop: it fired on the stopped day's data,
    and each day is a fresh random slice of another day's fleet."""
    why = "the hours before a stop are not the day the verdict is about"
    if not per_round:
        return ("abstain", [], [], f"undecided: judged on no day: {what} stopped the first day after {ran} tick(s); {why}",
                0)  # fmt: skip
    verdict, ests, checks, reason, n_days = _pooled_verdict(per_round, n_looks, plan, day_var)
    return (verdict, ests, checks, f"judged on the {n_days} completed day(s) before the one {what} stopped after {ran} "
            f"tick(s) ({why}): {reason}", n_days)  # fmt: skip


def _guard_verdict(
    stop: Stop, per_round: list[dict[str, dict[str, float]]], n_looks: int, plan: Any,
    day_var: Mapping[str, Any] | None,
) -> tuple[str, list[Any], list[dict[str, Any]], str, int]:
    """A canary the guard stopped: refuse (the guard's always-valid test saw its KPI regress beyond
    its margin); the guard's KPI keeps the guard's ``regress`` (each question is answered once).

    Every other guarded KPI is judged only on the completed canary days before the stopped one
    (``per_round`` holds no stopped day; `_stopped_day_verdict`, pooled at the level of the look the
    stop takes the place of), and with no completed day stays open, the reason saying why (why not
    on the ticks it ran: the module docstring). A stop after the day's planned ticks (not
    ``stop.short``): ``per_round`` then holds that whole day."""
    gk = ", ".join(stop.guard)
    reason = f"the canary's guard stopped it: {gk or '?'} regressed beyond its margin (always-valid, alpha {stop.alpha})"
    ran = max(1, int(stop.ran))
    if not per_round:
        why = (f"judged on no day: the guard stopped the first day after {ran} tick(s); the hours before a stop are not "
               "the day the verdict is about") if stop.short else "nothing measured"  # fmt: skip
        return "refuse", [], [], f"{reason}; every other KPI open ({why})", 0
    if stop.short:
        _, ests, checks, other, n_days = _stopped_day_verdict("the guard", per_round, n_looks, plan, day_var, ran)
    else:
        _, ests, checks, other, n_days = _pooled_verdict(per_round, n_looks, plan, day_var)
        other = f"on its {n_days} whole day(s): {other}"
    for c in checks:
        if c["kpi"] in stop.guard:
            c["verdict"], c["by"] = "regress", "guard"
    return "refuse", ests, checks, f"{reason}; every other KPI {other}", n_days


def _pooled_verdict(
    per_round: list[dict[str, dict[str, float]]], n_looks: int, plan: Any,
    day_var: Mapping[str, Any] | None,
) -> tuple[str, list[Any], list[dict[str, Any]], str, int]:
    """The rounds so far pooled (`edgetwin.loop.ppi.combine_estimates`) at one look's level (each of
    ``n_looks`` spends its share of alpha, `look_level`) and judged against the plan's margins:
    (verdict, per-KPI estimates, their checks with expected and realised widths, the reason, days)."""
    from edgetwin.loop.ppi import LEVEL, combine_estimates, look_level, ppi_verdict, width_terms

    pooled = {k: combine_estimates([pr[k] for pr in per_round], look_level(LEVEL, n_looks)) for k in per_round[-1]}
    verdict, ests = ppi_verdict(pooled, list(plan.margins))
    expected = {pk.column: pk.expected for pk in plan.kpis}
    checks = [{**e.to_dict(), "realised_width": e.interval[1] - e.interval[0],
               "expected_width": (lambda x: x[1] - x[0] if x else float("nan"))(expected.get(e.kpi)),
               "day_to_day": bool(day_var and e.kpi in day_var),
               "terms": {**width_terms([pr[e.kpi] for pr in per_round]), "df": float(pooled[e.kpi]["df"]),
                         "level": float(pooled[e.kpi]["level"]), "transport_rel": float(pooled[e.kpi]["rel"]),
                         "local_rel": float(pooled[e.kpi].get("local:rel", pooled[e.kpi]["rel"]))}}
              for e in ests]  # fmt: skip
    reason = "; ".join(
        f"{e.kpi} {100 * e.change:+.1f}% [{100 * e.interval[0]:+.1f}%, {100 * e.interval[1]:+.1f}%] vs margin "
        f"{100 * e.allowed_change:g}% ({e.verdict})" for e in ests
    )
    if not day_var:
        reason += " (about the canary's day only: no other days to estimate the day-to-day variance from)"
    n_days = len({e["day"] for pr in per_round for e in pr.values()})
    reason += bound_note(per_round, n_days)
    if verdict == "abstain":
        reason = f"undecided: {days_needed(ests, n_days)}; {reason}"
    return verdict, list(ests), checks, reason, n_days


def bound_note(per_round: Sequence[Mapping[str, Mapping[str, float]]], n_days: int) -> str:
    """What the operator is told when one canary day's interval carries the first look's bound on the
    change's day-to-day spread (`edgetwin.loop.day_bound.unrevealed_day_bound`: larger than the
    twin's calibrated term, ``diff_var_day_revealed``) for some KPI, else ``""``: the width is then
    not the canary's measurement but what one day cannot measure, and only more days narrow it."""
    if n_days != 1:
        return ""
    kpis = sorted({k for pr in per_round for k, e in pr.items()
                   if float(e.get("diff_var_day", 0.0)) > float(e.get("diff_var_day_revealed", float("inf")))})  # fmt: skip
    if not kpis:
        return ""
    return (f" (one canary day: {', '.join(kpis)} carry a bound on how much the change may move from day to day, which "
            "the logs of the current policy cannot reveal; canaries on more days measure it)")


def _gap_and_half(c: Any) -> tuple[float, float]:
    """A straddling check's distance from its point estimate to its margin, and its interval's
    reach from the point towards the margin (the side that must clear it; the intervals of interval
    division are not symmetric). ``half`` is inf where that side is unbounded."""
    lo, hi = (float(v) for v in c.worsening_interval)
    point = (-1.0 if c.better == "higher" else 1.0) * float(c.change)
    allowed = float(c.allowed_change)
    if point <= allowed:
        return allowed - point, hi - point
    return point - allowed, point - lo


def unbounded_towards_margin(c: Any) -> bool:
    """Whether a straddling check's interval is unbounded on the side that must clear its margin (its
    baseline level's interval reaches 0, `edgetwin.contract.relative_change`): more days may bound
    it, unlike a point estimate on its margin, so an extension is not futile for it."""
    gap, half = _gap_and_half(c)
    return gap > 1e-9 and not math.isfinite(half)


def more_days(checks: Sequence[Any], days: int) -> int | None:
    """More canary days the straddling checks need at least (`days_needed`'s N; 0 when none
    straddles), or None when no count can be given for one: its point estimate sits on its margin (no
    number of days decides it), or the side of its interval that must clear the margin is unbounded (a
    baseline level that may be 0, `edgetwin.contract.relative_change`: more days may bound it, but
    this interval cannot say how many; `unbounded_towards_margin` tells the two apart)."""
    worst = 0
    for c in checks:
        if getattr(c, "verdict", "") != "straddle":
            continue
        gap, half = _gap_and_half(c)
        if not (gap > 1e-9 and math.isfinite(half)):
            return None
        worst = max(worst, math.ceil(days * ((half / gap) ** 2 - 1.0)))
    return worst


def days_needed(checks: Sequence[Any], days: int, cap: int = 365) -> str:
    """What would decide the straddling checks: "run N more days" of canaries like these.

    For each straddling check, the gap between its point estimate and its margin, and the reach of
    its interval from the point towards the margin; each more canary day (a fresh random slice on
    another day) adds an independent measurement, so the reach shrinks as ``sqrt(days / (days + N))``
    (an approximation: the fleet and interference terms do not shrink, so N is a lower bound). A
    point estimate on the margin, or an N over ``cap``, cannot be decided by more days of this
    design; for an interval unbounded towards its margin no count can be read (it says so)."""
    worst = more_days(checks, days)
    if worst is None:
        c = next(c for c in checks if getattr(c, "verdict", "") == "straddle" and more_days([c], days) is None)
        if unbounded_towards_margin(c):
            return (f"{c.kpi}'s interval is unbounded towards its margin: its baseline level's interval reaches 0 at "
                    "this evidence (a relative change over a level that may be 0 has no bound); more days narrow the "
                    "level's interval, but how many would decide it cannot be read from this one")  # fmt: skip
        return f"{c.kpi}'s estimate sits on its margin: more days of this canary will not decide it"
    if worst > cap:
        return f"more than {cap} more days of this canary would be needed: accept the abstention or widen the slice"
    return f"run {max(worst, 1)} more day(s) of this canary (the pooled interval must shrink to clear the margin)"
