"""The gate's checks and verdict: what a paired what-if says about each guarded KPI.

A KPI *regresses* when the candidate is worse than the incumbent by more than
``max_regression · |incumbent| + min_delta``, in the direction the KPI is better; `decide` turns a
`WhatIfResult` into one `GuardCheck` per guarded KPI and scenario (``ok``, ``regress``,
``straddle``, ``unsupported``, ``no_evidence``, ``below_level``) and a `GateDecision` (promote,
refuse or abstain), and `gate_markdown` says it in words.

Split from `edgetwin.policies.gate` (issue 46) by concern: this module judges a what-if result
and needs no policy, registry or replay; `edgetwin.policies.gate` resolves the policies, runs the
replay (`run_gate`) and records a promotion (`promote`), and re-exports every name here, so
callers keep importing them from the gate.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from edgetwin.contract.errors import InputError
from edgetwin.contract.margins import DEFAULT_MARGIN, KPIMargin
from edgetwin.twin.intervals import LEVEL
from edgetwin.twin.whatif import NOMINAL, KpiDef, WhatIfResult

#: The gate's guard is the one KPI-margin type (`edgetwin.contract.margins.KPIMargin`); ``Guard`` is
#: its name here, kept for the callers that import it from the gate.
Guard = KPIMargin


def parse_guards(items: Sequence[str]) -> list[KPIMargin]:
    """Guards from ``--max-regression`` values; a KPI given twice is an error."""
    guards = [KPIMargin.parse_relative(s) for s in items]
    names = [g.kpi for g in guards]
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise InputError(f"KPI(s) {dup} given twice", "--max-regression")
    return guards


@dataclass
class GuardCheck:
    """One guarded KPI under one scenario, and what the twin can vouch for about it.

    ``interval`` is the calibrated 90 % interval of the relative change (candidate vs baseline,
    `edgetwin.twin.intervals`); ``worsening_interval`` the same signed so that positive is worse;
    ``allowed_change`` the margin as a relative worsening. ``verdict``: ``"ok"`` (the whole
    interval within the margin), ``"regress"`` (the whole interval beyond it), ``"straddle"`` (the
    interval straddles the margin: the twin cannot tell) or ``"unsupported"`` (more than the gate's
    ``max_out_of_support`` of the agent-steps behind it lie outside the logs' support).
    """

    scenario: str
    kpi: str
    better: str
    baseline: float
    candidate: float
    change: float
    change_ci: list[float]
    worsening: float
    allowed: float
    max_regression: float
    min_delta: float
    out_of_support: float
    flagged: bool
    breached: bool
    interval: list[float] = field(default_factory=list)
    worsening_interval: list[float] = field(default_factory=list)
    allowed_change: float = float("nan")
    verdict: str = "ok"
    #: the level the interval attains (`edgetwin.twin.intervals.attained_level` of the independent
    #: calibration episodes behind it), not the level asked for
    level: float = LEVEL
    #: ``verdict == "no_evidence"``: why the twin's number cannot back a verdict; ``"below_level"``:
    #: what would reach the level asked
    note: str = ""

    def margin_text(self) -> str:
        return f"margin {100 * self.max_regression:g}%" + (f" + {self.min_delta:g}" if self.min_delta else "")

    def interval_text(self) -> str:
        lo, hi = self.interval if self.interval else self.change_ci
        return f"{level_text(self.level)} interval of the change [{100 * lo:+.1f}%, {100 * hi:+.1f}%]"

    def describe(self) -> str:
        rel = f"{100 * self.change:+.1f}%" if math.isfinite(self.change) else "n/a"
        word = "rose" if self.candidate > self.baseline else "fell"
        flag = " (rests on states outside the logs' support)" if self.flagged else ""
        return (
            f"{self.kpi} {word} {rel} under scenario {self.scenario!r}: {self.baseline:.4g} -> {self.candidate:.4g} "
            f"({self.better} is better; {self.margin_text()}, {self.interval_text()}){flag}"
        )

    def abstain_reason(self, max_out_of_support: float) -> str:
        """Why the twin cannot vouch for this check (``straddle`` / ``unsupported`` /
        ``no_evidence`` only)."""
        if self.verdict in ("no_evidence", "below_level"):
            return f"{self.kpi} under {self.scenario!r}: {self.note}"
        if self.verdict == "unsupported":
            return (
                f"{self.kpi} under {self.scenario!r}: {100 * self.out_of_support:.0f}% of the candidate's agent-steps "
                f"lie outside the logs' support (threshold {100 * max_out_of_support:.0f}%)"
            )
        lo, hi = self.interval if self.interval else self.change_ci
        unbounded = (
            " (unbounded: the twin's calibrated error does not bound the change's size, as where its baseline "
            "lies within that error of 0; `edgetwin.twin.intervals`, \"The score\")"
            if math.isinf(lo) or math.isinf(hi) else ""
        )  # fmt: skip
        return (
            f"{self.kpi} under {self.scenario!r}: the {self.interval_text()}{unbounded} straddles the "
            f"{self.margin_text()} ({self.better} is better; point estimate {100 * self.change:+.1f}%)"
        )


def level_text(level: float) -> str:
    """``0.9`` -> ``"90%"``, ``0.8`` -> ``"80%"``, ``2/3`` -> ``"67%"``."""
    return f"{100 * level:.0f}%"


#: Check verdicts on which the twin cannot vouch (the gate abstains on them); ``below_level``: the
#: interval would decide, but its independent calibration episodes support less than the level asked
UNCERTAIN = ("straddle", "unsupported", "no_evidence", "below_level")


def episodes_needed(level: float) -> int:
    """The fewest independent calibration episodes whose conformal rank reaches ``level``
    (`edgetwin.twin.intervals.attained_level`): 9 for 90 %, 1 for 50 %. Counted, not
    ``ceil(level / (1 - level))``, which floating point makes 10 at 0.9."""
    from edgetwin.twin.intervals import attained_level

    n = 1
    while attained_level(n, level) < level - 1e-12:
        n += 1
    return n


def parse_level(text: str | float | None) -> float | None:
    """``--level``: ``"50%"``, ``"0.5"`` or a float in (0, LEVEL]; None for the default (the twin's
    nominal level). Above the twin's nominal level is refused: its intervals are computed at it."""
    if text is None:
        return None
    raw = str(text).strip()
    try:
        v = float(raw[:-1]) / 100.0 if raw.endswith("%") else float(raw)
    except ValueError:
        raise InputError(f"expected a level such as 50% or 0.5, got {raw!r}", "--level") from None
    if not (math.isfinite(v) and 0.0 < v <= LEVEL + 1e-12):
        raise InputError(
            f"expected a level in (0, {level_text(LEVEL)}] (the twin's intervals are {level_text(LEVEL)}), got {raw!r}",
            "--level",
        )
    return v


#: Verdicts of the gate and their exit codes (0 ok / 1 failed / 3 abstained).
VERDICTS = {"promote": 0, "refuse": 1, "abstain": 3}
#: Default share of a check's agent-steps outside the logs' support above which the gate abstains.
MAX_OUT_OF_SUPPORT = 0.25


@dataclass
class GateDecision:
    """The gate's verdict with every check and the what-if result behind it.

    ``verdict``: ``"promote"`` (every check ``ok``), ``"refuse"`` (some KPI regresses beyond its
    margin with its whole interval, or, with ``refuse_out_of_support``, rests on unsupported
    states) or ``"abstain"`` (no confident regression, but some check straddles its margin or
    lies outside the logs' support). ``drivers`` are the checks that decided it.
    """

    passed: bool
    checks: list[GuardCheck]
    result: WhatIfResult
    candidate: str
    baseline: str
    refused_out_of_support: list[GuardCheck] = field(default_factory=list)
    verdict: str = "promote"
    max_out_of_support: float = MAX_OUT_OF_SUPPORT
    #: the level the verdict must hold at (the twin's nominal level unless the operator asked for
    #: a lower one with ``--level``); a check below it abstains (``below_level``)
    level_requested: float = LEVEL

    @property
    def exit_code(self) -> int:
        return VERDICTS[self.verdict]

    @property
    def failures(self) -> list[GuardCheck]:
        return [c for c in self.checks if c.breached]

    @property
    def abstentions(self) -> list[GuardCheck]:
        return [c for c in self.checks if c.verdict in UNCERTAIN and c not in self.refused_out_of_support]

    @property
    def level(self) -> float:
        """The level the verdict holds at: the lowest attained level of its checks."""
        return min((c.level for c in self.checks), default=0.0)

    @property
    def drivers(self) -> list[GuardCheck]:
        """The checks behind the verdict: the regressions when refused, the uncertain ones when
        abstaining, every check when promoted."""
        if self.verdict == "refuse":
            return self.failures + [c for c in self.refused_out_of_support if c not in self.failures]
        if self.verdict == "abstain":
            return self.abstentions
        return list(self.checks)

    def reason(self) -> str:
        head = f"{self.candidate} vs {self.baseline}: "
        if self.verdict == "promote":
            return head + (
                f"no guarded KPI regressed beyond its margin, with {level_text(self.level)} confidence "
                f"({len(self.checks)} checks{self._level_note()})"
            )
        if self.verdict == "abstain":
            return head + "the twin cannot tell: " + "; ".join(
                c.abstain_reason(self.max_out_of_support) for c in self.abstentions
            )
        parts = [c.describe() for c in self.failures]
        parts += [
            f"{c.kpi} under {c.scenario!r} rests on states outside the logs' support" for c in self.refused_out_of_support
        ]
        return head + "; ".join(parts)

    def _level_note(self) -> str:
        cal = self.result.calibration
        if cal is None or self.level >= cal.level - 1e-12:
            return ""
        n = min((cal.n_support(c.kpi) for c in self.checks), default=0)
        return (
            f"; {level_text(self.level_requested)} was asked with --level, {n} independent calibration episode(s) "
            f"support at most {level_text(self.level)}; {episodes_needed(cal.level)} are needed for {level_text(cal.level)}"
        )

    def to_dict(self) -> dict[str, Any]:
        cal = self.result.calibration
        return {
            "verdict": self.verdict,
            "level": self.level,
            "level_requested": self.level_requested,
            "exit_code": self.exit_code,
            "passed": self.passed,
            "candidate": self.candidate,
            "baseline": self.baseline,
            "reason": self.reason(),
            "drivers": [
                {
                    "kpi": c.kpi,
                    "scenario": c.scenario,
                    "verdict": c.verdict,
                    "change": c.change,
                    "interval": c.interval,
                    "margin": c.allowed_change,
                    "out_of_support": c.out_of_support,
                    "level": c.level,
                    "note": c.note,
                }
                for c in self.drivers
            ],
            "failures": [c.describe() for c in self.failures],
            "abstentions": [c.abstain_reason(self.max_out_of_support) for c in self.abstentions],
            "max_out_of_support": self.max_out_of_support,
            "interval_method": self.result.interval_method,
            "calibrated": cal is not None,
            "checks": [asdict(c) for c in self.checks],
        }


def resolve_guards(
    kpis: Sequence[KpiDef], guards: Sequence[KPIMargin] | None, default_margin: float = DEFAULT_MARGIN
) -> list[tuple[KPIMargin, KpiDef]]:
    """The guarded KPIs: the given ones (each must have a direction, which the margin takes from the
    KPI's definition), else every KPI with a direction at its declared margin (the spec's ``margin``,
    `KpiDef.margin`), or ``default_margin``."""
    by_name = {k.name: k for k in kpis}
    if guards:
        out = []
        for g in guards:
            if g.kpi not in by_name:
                raise InputError(
                    f"unknown KPI {g.kpi!r}; the what-if computes {sorted(by_name)}", "--max-regression"
                )
            k = by_name[g.kpi]
            if k.better is None:
                raise InputError(
                    f"KPI {g.kpi!r} has no direction; give it better = 'higher' or 'lower' in a KPI file (--kpis)",
                    "--max-regression",
                )
            out.append((g.with_direction(k.better), k))
        return out
    out = [(KPIMargin(k.name, default_margin if k.margin is None else k.margin).with_direction(k.better), k)
           for k in kpis if k.better is not None]  # fmt: skip
    if not out:
        raise InputError(
            f"nothing to guard: none of the KPIs {sorted(by_name)} has a direction; give --max-regression KPI=FRACTION "
            "for a KPI with one, or better = 'higher' / 'lower' in a KPI file (--kpis); a gate with no guarded KPI "
            "would promote anything",
            "--max-regression",
        )
    return out


def evidence_problem(result: WhatIfResult, kpi: str, compared: Mapping[str, Any]) -> str | None:
    """Why the twin's number about ``kpi`` cannot back a verdict, or None.

    No calibration on held-out logs (the plain bootstrap covers the twin's mean, not the real
    system's); the KPI's calibration scores dropped or infinite (`Calibration.problem`); or both
    policies predicted exactly 0 (the twin shows no effect it could measure, and a relative change
    of 0 vs 0 is no evidence of none).
    """
    if float(compared["baseline"]) == 0.0 and float(compared["candidate"]) == 0.0:
        return f"both policies predict {kpi} as exactly 0: the twin measures nothing to compare"
    cal = result.calibration
    if cal is None:
        return (
            "the intervals are the plain bootstrap, not calibrated on held-out logs (they cover the twin's "
            "mean, not the real system's); replay a recent log the twin was not fitted on"
        )
    return cal.problem(kpi)


def check_verdict(
    worsening_interval: Sequence[float], allowed_change: float, out_of_support: float, max_out_of_support: float
) -> str:
    """One check's verdict from the signed (positive = worse) interval of the relative change.

    An interval unbounded on one side still decides by its other side: a relative change over a
    baseline the calibration places within its error of 0 (`edgetwin.twin.intervals`, "The score")
    has an unknown size but, where the effect's sign is known, a valid bound on the other side
    (``[+0.3, +inf]``: worse by more than 30 % of any real baseline, whatever it is). NaN bounds and
    an unbounded margin (a zero baseline) decide nothing."""
    lo, hi = float(worsening_interval[0]), float(worsening_interval[1])
    if out_of_support > max_out_of_support:
        return "unsupported"
    if math.isnan(lo) or math.isnan(hi) or not math.isfinite(allowed_change):
        return "straddle"
    if lo > allowed_change + 1e-12:
        return "regress"
    if hi <= allowed_change + 1e-12:
        return "ok"
    return "straddle"


def decide(
    result: WhatIfResult,
    guards: Sequence[KPIMargin] | None = None,
    default_margin: float = DEFAULT_MARGIN,
    refuse_out_of_support: bool = False,
    max_out_of_support: float = MAX_OUT_OF_SUPPORT,
    level: float | None = None,
) -> GateDecision:
    """Check every guarded KPI under every scenario of a what-if run with a baseline and a candidate.

    A KPI *regresses* when the whole calibrated 90 % interval of its relative change is worse than
    ``max_regression + min_delta / |baseline|``; it is *ok* when the whole interval is within it.
    Any regression refuses; else any check that straddles its margin or whose share of
    out-of-support agent-steps exceeds ``max_out_of_support`` makes the gate abstain (with
    ``refuse_out_of_support``, the latter refuses instead).

    No verdict below the level asked (DESIGN.md, "Trust"): ``level`` (default: the calibration's
    nominal level, 90 %) is what every check must hold at. A check that would decide (``ok`` or
    ``regress``) on fewer independent calibration episodes than that level needs becomes
    ``below_level`` and the gate abstains, naming how many more independent held-out days (or a
    canary) would reach it; a lower level only when the operator asks for it (``--level``).
    """
    if result.baseline is None or result.candidate is None:
        raise ValueError("the gate needs a what-if run with a baseline and a candidate")
    if not 0.0 <= max_out_of_support <= 1.0:
        raise InputError(f"expected a share in [0, 1], got {max_out_of_support}", "--max-out-of-support")
    asked = (LEVEL if result.calibration is None else result.calibration.level) if level is None else float(level)
    checks = []
    for sc in result.scenarios:
        for g, k in resolve_guards(result.kpis, guards, default_margin):
            c = result.compare(sc.name, k.name)
            worse = float(c["worsening_abs"])
            allowed = g.allowed(c["baseline"])
            sign = -1.0 if g.higher_is_better else 1.0
            lo, hi = c["change_interval"]
            w_int = sorted([sign * lo, sign * hi])
            allowed_change = g.allowed_change(c["baseline"])
            verdict = check_verdict(w_int, allowed_change, float(c["out_of_support"]), max_out_of_support)
            note = evidence_problem(result, k.name, c) or ""
            if note and verdict in ("ok", "straddle"):  # a confident regression still refuses
                verdict = "no_evidence"
            cal = result.calibration
            level = LEVEL if cal is None else min(cal.level, cal.attained(k.name))
            if verdict in ("ok", "regress") and level < asked - 1e-12 and cal is not None:
                note = _below_level_note(verdict, cal.n_support(k.name), level, asked)
                verdict = "below_level"
            checks.append(
                GuardCheck(
                    scenario=sc.name,
                    kpi=k.name,
                    better=str(k.better),
                    baseline=c["baseline"],
                    candidate=c["candidate"],
                    change=c["change"],
                    change_ci=list(c["change_ci"]),
                    worsening=worse,
                    allowed=allowed,
                    max_regression=g.max_regression,
                    min_delta=g.min_delta,
                    out_of_support=c["out_of_support"],
                    flagged=c["flagged"],
                    breached=verdict == "regress",
                    interval=[float(lo), float(hi)],
                    worsening_interval=w_int,
                    allowed_change=allowed_change,
                    verdict=verdict,
                    level=level,
                    note=note,
                )
            )
    oos = [c for c in checks if c.verdict == "unsupported"] if refuse_out_of_support else []
    if any(c.breached for c in checks) or oos:
        verdict = "refuse"
    elif any(c.verdict in UNCERTAIN for c in checks):
        verdict = "abstain"
    else:
        verdict = "promote"
    return GateDecision(
        verdict == "promote", checks, result, result.candidate, result.baseline, oos, verdict, max_out_of_support,
        asked,
    )


def _below_level_note(would: str, n: int, attained: float, asked: float) -> str:
    """What a check that would be ``would`` at its attained level needs to reach the level asked."""
    need = episodes_needed(asked)
    return (
        f"the interval would say {would!r}, but {n} independent calibration episode(s) support at most "
        f"{level_text(attained)} and {level_text(asked)} was asked: {need} are needed ({need - n} more independent "
        f"days of a held-out log), or a canary (edgetwin canary plan, promote --canary); a lower level only if you "
        f"ask for it (--level {level_text(attained)})"
    )


def kpi_metrics(result: WhatIfResult, policy: str, scenario: str = NOMINAL.name) -> dict[str, float]:
    """A policy's KPI means under one scenario, finite ones only (registry metadata)."""
    out = {}
    for k in result.kpis:
        v = float(np.nanmean(result.cell(policy, scenario).values[k.name]))
        if math.isfinite(v):
            out[k.name] = v
    return out


def gate_markdown(decision: GateDecision, promoted: str | None = None) -> str:
    """The verdict as Markdown (placed at the top of the promotion report)."""
    head = {"promote": "PASSED", "refuse": "REFUSED", "abstain": "ABSTAINED"}[decision.verdict]
    lines = [f"**Promotion gate: {head}** — {decision.candidate} vs {decision.baseline}.", ""]
    if promoted:
        lines += [promoted, ""]
    if decision.verdict == "refuse":
        lines += [f"- {c.describe()}" for c in decision.failures]
        lines += [
            f"- {c.kpi} under {c.scenario!r}: rests on unsupported states"
            for c in decision.refused_out_of_support
        ]
    elif decision.verdict == "abstain":
        lines.append("The twin cannot vouch for the candidate; nothing regressed with confidence, but:")
        lines += [f"- {c.abstain_reason(decision.max_out_of_support)}" for c in decision.abstentions]
    else:
        guarded = sorted({c.kpi for c in decision.checks})
        lines.append(
            f"No guarded KPI regressed beyond its margin, with {level_text(decision.level)} confidence "
            f"(guarded: {', '.join(guarded) or 'none'}{decision._level_note()})."
        )
    lines += ["", f"Intervals: {decision.result.interval_method}."]
    return "\n".join(lines)
