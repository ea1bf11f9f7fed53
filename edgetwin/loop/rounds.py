"""The loop: gate → canary plan → canary at the edge → `Twin.update` → prediction-powered verdict.

When the gate abstains (the twin cannot tell), `canary_loop` asks the system: each round plans a
canary from the gate's reasons (`edgetwin.loop.plan`), serves the candidate to that
slice through an edge runtime (`edgetwin.loop.fleet.canary_on_cluster`: the emulated
cluster stands for the real system), re-decides with the twin's fleet-wide predictions rectified by
the canary's measurements (`edgetwin.loop.ppi`), and updates the twin with the canary's rows
(`Twin.update`) for the next round — until a verdict or the budget (rounds; each round within the
plan's share × hours × loss budget) is spent.

**Validity across rounds.** A round's rectifier is computed with the twin *before* that round's
canary (the twin never saw those rows), and rounds are pooled with weights fixed by the design
(every day alike, a day's rounds by their planned agent-steps: `edgetwin.loop.ppi.design_weights`,
never by the rounds' estimated variances), so the updated twin narrows later rounds without
biasing any. A canary the guard stopped (a guarded KPI's regression beyond its margin is certain,
always-valid) refuses at once (`_guard_verdict`).

**A day a stop cut short gives no verdict**: the rule and why are `edgetwin.loop.day_verdict`'s
(`stopped_verdict`, the one place it is made: the loop, ``edgetwin canary verdict`` and the
levers benchmark call it). The stopped day's estimates are kept in its `LoopRound` for the record.

**The fleet.** ``fleet_log`` is the fleet's log on the current policy for the day the canaries run
(its last episode's service groups are the fleet; on the emulated cluster it is
``generate_logs(cluster, 1, current, seed=fleet_seed)``, whose population is the one
``canary_on_cluster(..., seed=fleet_seed)`` serves). A canary log whose groups are not the fleet's,
or whose columns are not the twin's, is refused (`check_canary_log`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import pandas as pd

from edgetwin.contract.errors import InputError
from edgetwin.loop.day_verdict import (
    Stop,
    _pooled_verdict,
    days_needed,
    guard_kpis,
    more_days,
    stopped_kpi_verdicts,
    stopped_verdict,
    unbounded_towards_margin,
)
from edgetwin.loop.ppi import EXPOSURE
from edgetwin.loop.verdict import canary_verdict

if TYPE_CHECKING:  # typed seams (issue 46): the loop names the types it drives, imported for mypy only
    from edgetwin.loop.plan import CanaryPlan, PlanBudget
    from edgetwin.policies.gate import GateDecision
    from edgetwin.twin.twin import Twin
    from edgetwin.twin.whatif import PolicySpec


@dataclass
class LoopRound:
    """One round: its plan, what the canary did, what the twin learned, and the verdict after it.

    ``realised_loss``: per KPI column, what the canary cost the fleet (`_realised_loss`: the
    candidate arm's relative worsening against the control arm net of their pre-canary levels,
    times the candidate arm's share of the fleet and the share of the planned hours it ran);
    ``over_budget``: KPIs whose realised loss exceeded the plan's loss budget. The edge stops a
    canary (``budget``) before one more tick would pass it (`edgetwin.edge.canary.CanaryConfig.max_loss`).
    """

    round: int
    plan: dict[str, Any]
    stop_reason: str
    canary_rows: int
    candidate_agent_steps: int
    estimates: dict[str, dict[str, float]]
    verdict: str
    checks: list[dict[str, Any]]
    realised_loss: dict[str, float] = field(default_factory=dict)
    over_budget: list[str] = field(default_factory=list)
    twin_updated: bool = False
    #: judged at this round (a look of `edgetwin.loop.ppi.look_days`); an extension day between
    #: looks is only pooled into the next look
    look: bool = True

    def describe(self) -> str:
        p = self.plan
        parts = [f"round {self.round}: {p['n_groups']} of {p['fleet_groups']} groups for {p['hours']:g} h "
                 f"({self.candidate_agent_steps} candidate agent-steps; canary {self.stop_reason}) -> {self.verdict}"]  # fmt: skip
        for c in self.checks:
            lo, hi = c["interval"]
            parts.append(f"  {c['kpi']}: {100 * c['change']:+.1f}% [{100 * lo:+.1f}%, {100 * hi:+.1f}%] "
                         f"(twin alone {100 * c['twin_change']:+.1f}%; margin {100 * c['allowed_change']:g}%) "
                         f"-> {c['verdict']}")  # fmt: skip
        return "\n".join(parts)


@dataclass
class LoopResult:
    """What the loop decided. ``verdict``: promote / refuse / abstain; ``gate``: the twin-alone
    verdict it started from; ``twin``: the last (updated) twin."""

    verdict: str
    reason: str
    gate: dict[str, Any]
    rounds: list[LoopRound]
    twin: Twin | None = None

    @property
    def agent_steps(self) -> int:
        return sum(r.candidate_agent_steps for r in self.rounds)

    def to_dict(self) -> dict[str, Any]:
        from dataclasses import asdict

        return {
            "verdict": self.verdict, "reason": self.reason, "gate": self.gate,
            "rounds": [asdict(r) for r in self.rounds], "canary_agent_steps": self.agent_steps,
        }  # fmt: skip

    def describe(self) -> str:
        return "\n".join([f"twin alone: {self.gate['verdict']}"] + [r.describe() for r in self.rounds]
                         + [f"verdict: {self.verdict}: {self.reason}"])  # fmt: skip


def canary_loop(
    twin: Twin,
    fleet_log: pd.DataFrame,
    candidate: Any,
    current: Any,
    cluster: Any,
    *,
    candidate_spec: PolicySpec,
    baseline_spec: PolicySpec,
    budget: PlanBudget | None = None,
    guards: Sequence[Any] | None = None,
    max_rounds: int = 3,
    seed: int = 0,
    fleet_seed: int = 0,
    old_logs: Sequence[Any] | None = None,
    update_options: dict[str, Any] | None = None,
    members: Sequence[int] | None = None,
    gate_episodes: int = 1,
    decision: GateDecision | None = None,
    log: Callable[[str], Any] = print,
    on_canary: Callable[[int, CanaryPlan, Any], Any] | None = None,
    fleet_control: bool = False,
    other_days: Sequence[pd.DataFrame] | None = None,
    days: Callable[[int], tuple[pd.DataFrame, int]] | None = None,
    max_days: int = 1,
    cuped: str = "pooled",
) -> LoopResult:
    """Plan → canary → update → verdict, until a verdict or ``max_rounds``.

    Args:
        twin, fleet_log: the twin; the fleet's log on the current policy (module docstring).
        candidate, current: what the edge serves (policy directories or objects with ``act``);
            cluster: the emulated cluster's `ClusterConfig`; candidate_spec, baseline_spec: the
            same two policies as the twin runs them (`PolicySpec`).
        budget: the operator's `PlanBudget` per round; guards: the gate's (default: every KPI with a
            direction at 5 %); max_rounds: rounds at most; seed: plans, updates, predictions;
            fleet_seed: the seed ``fleet_log``'s population was drawn with.
        old_logs: the twin's training data (`Twin.update` needs it; None: no update);
            update_options: passed to `Twin.update` (e.g. ``epochs``, ``max_steps``).
        decision: the gate's abstaining `GateDecision` to start from (default: run on ``fleet_log``),
            so that the verdict is not shopped for by re-running the gate on other traffic.
        fleet_control: judge against every group not on the candidate (`canary_verdict`'s ``fleet_rows``).
        cuped: the verdict's pre-period slope, ``"pooled"`` or ``"per_arm"`` (`canary_verdict`'s ``cuped``:
            Lin 2013's per-arm slope, for the very unequal arms of ``fleet_control``).
        on_canary: ``on_canary(round, plan, canary_result)`` after each round's canary (a benchmark).
        other_days: logs of other days (default: ``old_logs``) whose replay in the twin gives the
            day-to-day variance of the change (`edgetwin.loop.verdict.day_to_day_variance`): the
            verdict is about the change averaged over the days the decision lives with (None and
            no ``old_logs``: about the canary's day, and the result says so).
        days: the extension's days: ``days(d)`` returns the fleet's log on the current policy for
            canary day ``d`` (1, 2, …; day 0 is ``fleet_log``) and its population's seed; round ``r``
            runs on day ``r − 1`` (a fresh random slice, `redraw`), up to ``max_days`` rounds
            (``max_rounds`` unused). None: every round on ``fleet_log``'s day.
        max_days: with ``days``, the most canary days for a candidate that is not hurting
            (`hurting`), judged at `edgetwin.loop.ppi.look_days` (1, 2, 4, …) at ``(1 − 90 %) /
            looks`` of alpha each, rounds pooled by `edgetwin.loop.ppi.combine_estimates` (fleet and
            interference terms correlated, the day-to-day term independent across days only).

    Without ``days`` each round is a look at ``(1 − 90 %) / max_rounds`` of alpha. An undecided
    result says how many more days would clear the margin (`days_needed`); an extension stops when
    no open KPI can decide in the days left. A later round without a plan ends the loop (abstain,
    saying why); a first round's raises (`InputError`).
    """
    from edgetwin.edge.canary import CanaryConfig
    from edgetwin.loop.fleet import canary_on_cluster
    from edgetwin.loop.plan import CanaryPlan as CanaryPlanT
    from edgetwin.loop.plan import plan_canary
    from edgetwin.loop.ppi import look_days
    from edgetwin.policies.gate import run_gate

    if decision is None:
        decision = run_gate(twin, candidate_spec, baseline_spec, log=fleet_log, guards=guards,
                            episodes=gate_episodes, seed=seed, members=members)  # fmt: skip
    gate = {"verdict": decision.verdict, "reason": decision.reason()}
    if decision.verdict != "abstain":
        return LoopResult(decision.verdict, "the twin alone decides: " + decision.reason(), gate, [], twin)
    log(f"    the twin cannot tell: {decision.reason()}")
    rounds: list[LoopRound] = []
    per_round: list[dict[str, dict[str, float]]] = []
    est: dict[str, dict[str, float]]
    checks: list[dict[str, Any]]
    verdict, reason = "abstain", decision.reason()
    all_logs = list(old_logs) if old_logs is not None else None
    days_src = list(other_days) if other_days is not None else list(all_logs or [])
    version = candidate_version_name(candidate_spec.name)  # the ``policy`` of its rows in the canary log
    n_rounds = max(1, int(max_days)) if days is not None else max_rounds
    looks = set(look_days(n_rounds)) if days is not None else set(range(1, max_rounds + 1))
    day_log, day_seed = fleet_log, fleet_seed
    day_var = decision_day_variance(twin, decision, days_src, candidate_spec, baseline_spec, seed)
    for r in range(1, n_rounds + 1):
        if days is not None and r > 1:
            day_log, day_seed = days(r - 1)
        try:  # an extension day: the first day's plan on a fresh slice of this day's fleet
            plan = (redraw(CanaryPlanT.from_dict(rounds[0].plan), day_log, seed, r) if days is not None and rounds
                    else plan_canary(decision, twin, day_log, candidate_spec, baseline_spec, budget, seed=seed,
                                     members=members, round_no=r, day_var=day_var, max_days=n_rounds if days else 1))
        except InputError as e:
            if r == 1:
                raise
            reason = f"{reason}; no round {r}: {e}"
            log(f"    no canary plan for round {r}: {e}")
            break
        plan = balanced(plan)
        log("    " + plan.describe().replace("\n", "\n    "))
        cfg = CanaryConfig.from_plan(plan, version, spec=twin.spec)
        res = canary_on_cluster(cluster, current, candidate, cfg, seed=day_seed, episode=f"canary-{seed}-{r}")
        if on_canary is not None:
            on_canary(r, plan, res)
        c_rows = res.log[(res.log["policy"].astype(str) == version) & (res.log["t"] >= cfg.pre_ticks)]
        # the ticks a stopped canary ran (the twin's window the same): its estimates are for the record
        ran = max(1, min(cfg.ticks, int(res.ticks) - int(cfg.pre_ticks)))
        est = _round_estimates(twin, day_log, res, plan, candidate_spec, baseline_spec, version, day_var, cfg.pre_ticks,
                               ran, seed, members, fleet_control, float(r - 1 if days is not None else 0), cuped)  # fmt: skip
        # a day a stop cut short is not a day: its estimates are kept for the record, never pooled
        ended = Stop(res.stop_reason, int(res.ticks) - int(cfg.pre_ticks), cfg.ticks, guard_kpis(res.guard_stop), cfg.alpha)
        if est and not ended.short:
            per_round.append(est)
        loss, over = _realised_loss(res.log, plan, cfg.pre_ticks, cfg.ticks, version)
        stopped = stopped_verdict(ended, per_round, len(looks), plan, day_var)
        if stopped is not None:  # a guard stop or a day cut short: the completed days before it only
            verdict, ests, checks, reason, n_days = stopped
        else:
            hurt = hurting(res.stop_reason, over) if days is not None else None
            if r not in looks and hurt is None:  # an extension day between looks: pooled at the next look
                rounds.append(LoopRound(r, plan.to_dict(), res.stop_reason, len(res.log), len(c_rows), est,
                                        "abstain", [], loss, over, look=False))  # fmt: skip
                log("    " + rounds[-1].describe().replace("\n", "\n    "))
                continue
            # each look spends its share of alpha (`look_level`), so that stopping at whichever look
            # decides keeps the level over the loop; a candidate that hurts is not extended, and its
            # last day is judged now in place of the next planned look (whose alpha it spends)
            verdict, ests, checks, reason, n_days = _pooled_verdict(per_round, len(looks), plan, day_var)
        rounds.append(LoopRound(r, plan.to_dict(), res.stop_reason, len(res.log), len(c_rows), est, verdict, checks,
                                loss, over))  # fmt: skip
        log("    " + rounds[-1].describe().replace("\n", "\n    "))
        if verdict != "abstain" or r == n_rounds:
            break
        if days is not None:
            stop = _not_extended(res.stop_reason, over, ests, n_days, r, n_rounds)
            if stop is not None:
                reason = stop.format(reason=reason)
                break
        if all_logs is not None:
            twin = twin.update(res.log, all_logs, seed=seed + r, **(update_options or {}))
            all_logs.append(res.log)
            rounds[-1].twin_updated = True
        if days is None:  # the next round is planned again (an extension keeps its first day's plan)
            decision = run_gate(twin, candidate_spec, baseline_spec, log=fleet_log, guards=guards,
                                episodes=gate_episodes, seed=seed, members=members)  # fmt: skip
    return LoopResult(verdict, reason, gate, rounds, twin)


def _round_estimates(
    twin: Twin, day_log: pd.DataFrame, res: Any, plan: CanaryPlan, candidate: PolicySpec, baseline: PolicySpec,
    version: str, day_var: Mapping[str, Any], pre_ticks: int, ran: int, seed: int, members: Sequence[int] | None,
    fleet_control: bool, day: float, cuped: str = "pooled",
) -> dict[str, dict[str, float]]:
    """One canary's per-KPI estimates (`canary_verdict`) on the ``ran`` ticks after its pre-period,
    stamped with the index of the ``day`` it ran on (its day-to-day term is its own) and its planned
    exposure (``exposure``: the plan's candidate agent-steps, its weight among its day's rounds). A canary the
    guard stopped before both arms had a measured tick has none (``{}``): the guard's refusal stands
    alone; any other canary's failure to estimate is raised."""
    try:
        est = canary_verdict(twin, day_log, res.log, plan, candidate, baseline, candidate_version=version,
                             day_var=day_var, pre_ticks=pre_ticks, ticks=ran, seed=seed, members=members,
                             fleet_rows=res.fleet_log if fleet_control else None, cuped=cuped)  # fmt: skip
    except (InputError, ValueError, KeyError):
        if res.stop_reason != "guard":
            raise
        return {}
    for one in est.values():
        one["day"] = one["local:day"] = day
        one[EXPOSURE] = float(plan.agent_steps)  # planned, before the outcomes: its pooling weight in its day
    return est


def _not_extended(stop_reason: str, over: Any, ests: Sequence[Any], n_days: int, r: int, n_rounds: int) -> str | None:
    """Why an extended canary stops after day ``r`` (a template with ``{reason}``), or None: a
    candidate that hurts is not extended; futility when no open KPI can decide in the days left (an
    interval unbounded towards its margin, over a baseline level that may be 0, may still: more days
    narrow that level's interval, so it does not count as futile)."""
    hurt = hurting(stop_reason, over)
    if hurt is not None:
        return f"{{reason}}; not extended past day {r}: {hurt}"
    open_ = [e for e in ests if e.verdict == "straddle"]
    more = [more_days([e], n_days) for e in open_]
    if not any(unbounded_towards_margin(e) for e in open_) and all(m is None or m > n_rounds - r for m in more):
        return f"stopped at day {r} of {n_rounds}: {{reason}}"
    return None


def redraw(plan: CanaryPlan, day_log: pd.DataFrame, seed: int, round_no: int) -> CanaryPlan:
    """An extension day's plan: the first day's size, hours, margins and budgets on a fresh seeded
    uniform draw of that day's fleet (the groups of ``day_log``'s last episode), split by fair coins
    (`balanced`). The slice is redrawn, not kept, so that each day's rectifier is an independent
    random sample of that day's fleet (the pooling treats the days' own terms as independent); the
    size is not re-planned, which would need the twin's replay of every day (the plan's ``days``
    already says how many such days the decision needs)."""
    from dataclasses import replace

    import numpy as np

    from edgetwin.loop.plan import PlanSlice

    last = day_log[day_log["episode"] == day_log["episode"].iloc[-1]]
    agents = sorted(last["agent"].astype(str).unique())
    n = min(int(plan.n_groups), len(agents))
    rng = np.random.default_rng([seed, round_no, 0xCA])
    chosen = tuple(sorted(str(a) for a in rng.choice(np.array(agents, dtype=object), n, replace=False)))
    sl = PlanSlice(chosen, (), (), plan.slice.treat_share, seed * 1000 + round_no, "random", ())
    return balanced(replace(plan, slice=sl, n_groups=n, fleet_groups=len(agents), share=n / len(agents),
                            round=round_no, why=[*plan.why, f"extension day {round_no}: the first day's plan on a "
                                                 "fresh random slice of this day's fleet"]))  # fmt: skip


def decision_day_variance(twin: Twin, decision: GateDecision, days_src: Sequence[pd.DataFrame], candidate: PolicySpec,
                  baseline: PolicySpec, seed: int) -> dict[str, tuple[float, float, float]]:
    """The day-to-day variance of every guarded per-group-mean KPI column (`guarded_day_variance`),
    once, with the twin the loop starts from: the plan reckons its days with it and every round's
    verdict carries it."""
    from edgetwin.loop.plan import _kpi_column
    from edgetwin.loop.verdict import guarded_day_variance

    kdefs = {k.name: k for k in decision.result.kpis}
    cols = [_kpi_column(kdefs[ch.kpi]) for ch in decision.checks if ch.kpi in kdefs]
    return guarded_day_variance(twin, [c for c in cols if c], days_src, candidate, baseline, seed)


def candidate_version_name(name: str) -> str:
    """The registry version the emulated site publishes the candidate under, i.e. the ``policy`` of
    its rows in the canary log: the candidate's own name as a version token (``[A-Za-z0-9_.-]``),
    never the arm label, and never ``current`` (the version the control arm is served)."""
    import re

    v = re.sub(r"[^A-Za-z0-9_.-]+", "-", str(name)).strip("-.") or "policy"
    return v + "-next" if v == "current" else v


def hurting(stop_reason: str, over_budget: Sequence[str]) -> str | None:
    """Why a canary day says the candidate is hurting (so it is not extended), or None.

    Extension is for a candidate that is not hurting: its day ran its hours (``completed``: the
    guard silent, the edge's loss-budget stop not reached, nobody stopped it) and its realised loss
    stayed within the plan's budget on every KPI. Anything else ends the extension."""
    if stop_reason != "completed":
        return f"the canary stopped ({stop_reason})"
    if over_budget:
        return f"its realised loss passed the budget on {', '.join(over_budget)}"
    return None


def balanced(plan: CanaryPlan, tries: int = 10_000) -> CanaryPlan:
    """The plan with its slice's assignment seed moved to the first one (from the plan's) whose
    keyed-hash arms (`edgetwin.edge.canary_slice.SliceRouter`) split its groups as evenly as
    ``treat_share`` asks (within one group).

    Re-randomization (Morgan & Rubin 2012): with a handful of groups, independent coin flips often
    leave one arm with one group, and neither arm's rectifier can be estimated; drawing the
    assignment uniformly among the balanced ones keeps it random (each group equally likely on
    each arm), so the prediction-powered estimate stays unbiased."""
    from dataclasses import replace

    from edgetwin.edge.canary_slice import CanarySlice, SliceRouter

    sl = plan.slice
    want = sl.treat_share * len(sl.agents)
    for k in range(tries):
        seed = int(sl.seed) + k
        router = SliceRouter(CanarySlice(tuple(sl.agents), (), sl.treat_share, seed), "next", "current")
        n_c = int(sum(router.arm(a) == "candidate" for a in sl.agents))
        if abs(n_c - want) <= 1.0 and n_c >= 2 and len(sl.agents) - n_c >= 2:
            return replace(plan, slice=replace(sl, seed=seed))
    return plan


def _realised_loss(
    canary_log: pd.DataFrame, plan: CanaryPlan, pre_ticks: int, planned_ticks: int | None = None,
    candidate: str | None = None,
) -> tuple[dict[str, float], list[str]]:
    """Per KPI column: what the canary cost the fleet (`edgetwin.edge.canary.fleet_loss` of the
    arms' difference in differences relative to the plan's ``loss_levels``, `arm_worsening`, over
    the ticks it ran against the
    ``planned_ticks``, default the plan's hours), the measure the edge's loss-budget stop uses;
    and the KPIs whose loss exceeded the plan's budget (``loss_budget`` by column; a plan without
    one: its deciding KPIs' ``budget``), by the gate's KPI names where the plan has them.
    ``candidate``: the candidate's version in the log's ``policy`` column (default: the versions
    its rows after the pre-period hold and its pre-period rows do not)."""
    from edgetwin.edge.canary import arm_worsening, fleet_loss

    rows = canary_log[canary_log["t"] >= pre_ticks]
    pre = canary_log[canary_log["t"] < pre_ticks]
    pol = rows["policy"].astype(str)
    if candidate is None:  # the version(s) served after the pre-period that none of it was served
        new = set(pol) - set(pre["policy"].astype(str)) if len(pre) else {str(plan.candidate)}
        cand_groups = set(rows.loc[pol.isin(new), "agent"].astype(str))
    else:
        cand_groups = set(rows.loc[pol == candidate, "agent"].astype(str))
    is_c = rows["agent"].astype(str).isin(cand_groups)
    pre_c = pre["agent"].astype(str).isin(cand_groups)
    n_run = int(rows["t"].nunique())
    planned = planned_ticks if planned_ticks is not None else max(1, math.ceil(float(plan.hours) * 4 - 1e-9))
    budget = dict(getattr(plan, "loss_budget", None) or {})
    if not budget:
        budget = {pk.column: pk.budget for pk in plan.kpis if pk.budget is not None}
    names = {pk.column: pk.kpi for pk in plan.kpis}
    levels = dict(getattr(plan, "loss_levels", None) or {})
    out, over = {}, []
    for m in plan.margins:
        k = m.kpi
        w = arm_worsening(float(rows.loc[is_c, k].mean()), float(rows.loc[~is_c, k].mean()),
                          float(pre.loc[pre_c, k].mean()) if len(pre) else float("nan"),
                          float(pre.loc[~pre_c, k].mean()) if len(pre) else float("nan"), m.higher_is_better,
                          levels.get(k))  # fmt: skip
        if not math.isfinite(w):
            continue
        out[k] = fleet_loss(w, len(cand_groups), int(plan.fleet_groups), n_run, planned)
        if k in budget and out[k] > budget[k]:
            over.append(names.get(k, k))
    return out, over


def promote_after_canary(
    registry: Any,
    policy_dir: Any,
    result: LoopResult,
    signer: Any,
    *,
    scope: str = "global",
    expected: str | None = None,
    metadata: dict[str, Any] | None = None,
) -> str:
    """Publish the candidate (signed) and move ``scope``'s pointer to it (compare-and-swap on
    ``expected``) after the loop's verdict was *promote*; the metadata records the canary rounds.

    Raises:
        InputError: the loop's verdict was not promote (nothing is published)."""
    if result.verdict != "promote":
        raise InputError(f"the canary loop's verdict is {result.verdict}, not promote: {result.reason}", "promote --canary")
    import re
    from pathlib import Path

    md = dict(metadata or {})
    if not md.get("name"):
        md["name"] = re.sub(r"[^A-Za-z0-9_.-]+", "-", Path(policy_dir).name).strip("-.") or "policy"
    md["gate"] = {
        "passed": True, "verdict": "promote", "forced": False, "via": "canary", "twin_alone": result.gate,
        "reason": result.reason[:500], "canary_rounds": len(result.rounds), "canary_agent_steps": result.agent_steps,
        "guards": {c["kpi"]: c["allowed_change"] for c in (result.rounds[-1].checks if result.rounds else [])},
    }  # fmt: skip
    version: str = registry.publish(policy_dir, md, signer)
    registry.set_current(scope, version, expected=expected, reason=f"canary verdict: {result.reason}"[:500],
                         kind="promote")  # fmt: skip
    return version


__all__ = [
    "LoopResult", "LoopRound", "Stop", "balanced", "canary_loop", "candidate_version_name", "days_needed",
    "decision_day_variance", "guard_kpis", "hurting", "more_days",
    "promote_after_canary", "stopped_kpi_verdicts", "stopped_verdict",
]
