"""The promotion gate: replay candidate and incumbent in the twin, promote only if nothing regresses.

Seed 003 §4.3: "a digital-twin replay validates aggregated models against recent traces before
rollout". `run_gate` replays both policies on recent traffic (counterfactual replay of a recent
log: its agents, sites, profiles and first states, the policies' actions, the twin's responses)
and under the configured what-if scenarios, on the same worlds and ensemble members (paired),
and checks every guarded KPI: a KPI *regresses* when the candidate is worse than the incumbent by
more than ``max_regression · |incumbent| + min_delta``, in the direction the KPI is better.

`promote` wraps it with a registry: it reads the scope's current version (the incumbent), runs the
gate, writes the report, and only if the gate passes (or ``force``) publishes the signed artifact
and moves the scope's pointer with compare-and-swap on the version it read, so a promotion that
raced with another fails instead of overwriting it. A refusal raises `GateRefused` (exit 1)
naming each KPI, scenario, margin and interval; an abstention raises `GateAbstained` (exit 3)
with its reason (an interval that straddles the margin, or a candidate whose rollout lies too
much outside the logs' support). Every interval is the twin's calibrated 90 % interval
(`edgetwin.twin.intervals`): a gate that is wrong when it is sure is the worst failure it can
have, so it says so when it cannot tell.

Policies may not import `edgetwin.edge`, so the registry, signer and trust store are duck-typed
(`RegistryLike`): pass `edgetwin.edge.registry.FileRegistry` / ``open_registry(...)``,
`edgetwin.edge.signing.Signer` and `TrustStore`.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
import tempfile
import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import pandas as pd

from edgetwin.contract.errors import GateAbstained, GateRefused, InputError
from edgetwin.twin.intervals import LEVEL
from edgetwin.twin.whatif import (
    BUILTIN_POLICIES,
    NOMINAL,
    KpiDef,
    PolicySpec,
    Scenario,
    WhatIfResult,
    builtin_policy,
    fixed_policy,
    run_whatif,
)

DEFAULT_MARGIN = 0.05


_GUARD_RE = re.compile(
    r"^\s*(?P<name>[^=\s]+)\s*=\s*(?P<rel>[+-]?\d+(?:\.\d*)?|[+-]?\.\d+)\s*(?P<pct>%?)\s*(?::\s*(?P<abs>\d+(?:\.\d*)?|\.\d+)\s*)?$"
)


# ------------------------------------------------------------------------------------ guards
@dataclass(frozen=True)
class Guard:
    """How far a KPI may regress (candidate vs incumbent) before the gate refuses.

    Attributes:
        kpi: a KPI name of the what-if run.
        max_regression: allowed relative worsening, a fraction of ``|incumbent|`` (0.05 = 5 %).
        min_delta: allowed absolute worsening on top, in the KPI's units (keeps near-zero KPIs
            from tripping on noise).
    """

    kpi: str
    max_regression: float = DEFAULT_MARGIN
    min_delta: float = 0.0

    def __post_init__(self) -> None:
        if not (math.isfinite(self.max_regression) and self.max_regression >= 0):
            raise InputError(
                f"margin of {self.kpi!r} must be a number >= 0, got {self.max_regression}", "--max-regression"
            )
        if not (math.isfinite(self.min_delta) and self.min_delta >= 0):
            raise InputError(
                f"absolute margin of {self.kpi!r} must be >= 0, got {self.min_delta}", "--max-regression"
            )

    def allowed(self, baseline: float) -> float:
        """The largest worsening (in the KPI's units) tolerated from ``baseline``."""
        return self.max_regression * abs(baseline) + self.min_delta

    @classmethod
    def parse(cls, text: str) -> Guard:
        """``"kpi.slo_violation=0.05"``, ``"...=5%"`` or ``"...=0.05:0.002"`` (relative[:absolute])."""
        m = _GUARD_RE.match(text)
        if m is None:
            raise InputError(
                f"expected KPI=FRACTION, KPI=P% or KPI=FRACTION:ABSOLUTE, got {text!r}", "--max-regression"
            )
        rel = float(m["rel"]) / (100.0 if m["pct"] else 1.0)
        if rel < 0:
            raise InputError(f"{m['name']}: the margin must be >= 0, got {m['rel']}", "--max-regression")
        return cls(m["name"], rel, float(m["abs"]) if m["abs"] else 0.0)


def parse_guards(items: Sequence[str]) -> list[Guard]:
    """Guards from ``--max-regression`` values; a KPI given twice is an error."""
    guards = [Guard.parse(s) for s in items]
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
    #: ``verdict == "no_evidence"``: why the twin's number cannot back a verdict
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
        if self.verdict in ("no_evidence", "underpowered"):
            return f"{self.kpi} under {self.scenario!r}: {self.note}"
        if self.verdict == "unsupported":
            return (
                f"{self.kpi} under {self.scenario!r}: {100 * self.out_of_support:.0f}% of the candidate's agent-steps "
                f"lie outside the logs' support (threshold {100 * max_out_of_support:.0f}%)"
            )
        return (
            f"{self.kpi} under {self.scenario!r}: the {self.interval_text()} straddles the {self.margin_text()} "
            f"({self.better} is better; point estimate {100 * self.change:+.1f}%)"
        )


def level_text(level: float) -> str:
    """``0.9`` -> ``"90%"``, ``0.8`` -> ``"80%"``, ``2/3`` -> ``"67%"``."""
    return f"{100 * level:.0f}%"


def parse_level(text: str | float, where: str = "--level") -> float:
    """``"90%"``, ``"0.9"`` or ``0.9`` -> 0.9; a level must lie strictly between 0 and 1 (exit 2 otherwise)."""
    raw = str(text).strip()
    try:
        value = float(raw[:-1]) / 100.0 if raw.endswith("%") else float(raw)
    except ValueError:
        raise InputError(f"expected a level such as 90% or 0.9, got {raw!r}", where) from None
    if not 0.0 < value < 1.0:
        raise InputError(f"expected a level strictly between 0 and 1 (0% and 100%), got {raw!r}", where)
    return value


def episodes_needed(level: float) -> int:
    """The fewest independent calibration episodes whose split-conformal quantile attains ``level``
    (`edgetwin.twin.intervals.attained_level`): 9 for 90 %, 4 for 80 %. Counted, not computed as
    ``level / (1 - level)``, whose float rounding says 10 for 90 %."""
    from edgetwin.twin.intervals import attained_level

    n = 1
    while attained_level(n, level) < level - 1e-12:
        n += 1
    return n


#: Check verdicts on which the twin cannot vouch (the gate abstains on them)
UNCERTAIN = ("straddle", "unsupported", "no_evidence", "underpowered")


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
    #: the level the operator asked for (``--level``; the calibration's by default)
    level_asked: float = LEVEL

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
        n = min((cal.n_independent.get(c.kpi, 0) for c in self.checks), default=0)
        return (
            f"; at --level {level_text(self.level_asked)} as asked: {n} independent calibration episode(s) support "
            f"{level_text(self.level)}, {episodes_needed(cal.level)} are needed for {level_text(cal.level)}"
        )

    def to_dict(self) -> dict[str, Any]:
        cal = self.result.calibration
        return {
            "verdict": self.verdict,
            "level": self.level,
            "level_requested": self.level_asked,
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
    kpis: Sequence[KpiDef], guards: Sequence[Guard] | None, default_margin: float = DEFAULT_MARGIN
) -> list[tuple[Guard, KpiDef]]:
    """The guarded KPIs: the given ones (each must have a direction), else every KPI with a
    direction at its declared margin (the spec's ``margin``), or ``default_margin``."""
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
            out.append((g, k))
        return out
    out = [(Guard(k.name, default_margin if k.margin is None else k.margin), k) for k in kpis if k.better is not None]
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
    """One check's verdict from the signed (positive = worse) interval of the relative change."""
    lo, hi = float(worsening_interval[0]), float(worsening_interval[1])
    if out_of_support > max_out_of_support:
        return "unsupported"
    if not (math.isfinite(lo) and math.isfinite(hi) and math.isfinite(allowed_change)):
        return "straddle"
    if lo > allowed_change + 1e-12:
        return "regress"
    if hi <= allowed_change + 1e-12:
        return "ok"
    return "straddle"


def decide(
    result: WhatIfResult,
    guards: Sequence[Guard] | None = None,
    default_margin: float = DEFAULT_MARGIN,
    refuse_out_of_support: bool = False,
    max_out_of_support: float = MAX_OUT_OF_SUPPORT,
    level: float | None = None,
) -> GateDecision:
    """Check every guarded KPI under every scenario of a what-if run with a baseline and a candidate.

    ``level``: the confidence the operator asks for (default: the calibration's, 90 %). A check
    whose interval attains less (too few independent calibration episodes behind it,
    `edgetwin.twin.intervals.attained_level`) decides nothing, whichever side of its margin it lies
    on: it is ``"underpowered"`` and the gate abstains, naming how many more independent episodes
    (or a canary) would reach the level. A lower level is used only when asked for.

    A KPI *regresses* when the whole calibrated 90 % interval of its relative change is worse than
    ``max_regression + min_delta / |baseline|``; it is *ok* when the whole interval is within it.
    Any regression refuses; else any check that straddles its margin or whose share of
    out-of-support agent-steps exceeds ``max_out_of_support`` makes the gate abstain (with
    ``refuse_out_of_support``, the latter refuses instead).
    """
    if result.baseline is None or result.candidate is None:
        raise ValueError("the gate needs a what-if run with a baseline and a candidate")
    if not 0.0 <= max_out_of_support <= 1.0:
        raise InputError(f"expected a share in [0, 1], got {max_out_of_support}", "--max-out-of-support")
    cal = result.calibration
    asked = float(level) if level is not None else (LEVEL if cal is None else float(cal.level))
    if not 0.0 < asked < 1.0:
        raise InputError(f"expected a level in (0, 1), got {asked}", "--level")
    checks = []
    for sc in result.scenarios:
        for g, k in resolve_guards(result.kpis, guards, default_margin):
            c = result.compare(sc.name, k.name)
            worse = float(c["worsening_abs"])
            allowed = g.allowed(c["baseline"])
            sign = -1.0 if k.better == "higher" else 1.0
            lo, hi = c["change_interval"]
            w_int = sorted([sign * lo, sign * hi])
            base = abs(float(c["baseline"]))
            allowed_change = allowed / base if base > 0 else (0.0 if allowed == 0 else math.inf)
            verdict = check_verdict(w_int, allowed_change, float(c["out_of_support"]), max_out_of_support)
            note = evidence_problem(result, k.name, c) or ""
            if note and verdict in ("ok", "straddle"):  # a confident regression still refuses
                verdict = "no_evidence"
            attained = LEVEL if cal is None else min(cal.level, cal.attained(k.name))
            if attained < asked - 1e-12 and verdict in ("ok", "regress", "straddle"):
                n = 0 if cal is None else cal.n_independent.get(k.name, len(cal.scores.get(k.name, [])))
                need = episodes_needed(asked)
                verdict = "underpowered"
                note = (
                    f"{level_text(asked)} was asked, but {n} independent calibration episode(s) support at most "
                    f"{level_text(attained)}: replay {need - n} more recent independent day(s) (--log; {need} are "
                    f"needed for {level_text(asked)}), run a canary (edgetwin canary plan), or decide at "
                    f"--level {math.floor(100 * attained + 1e-9):.0f}% explicitly"
                )
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
                    level=attained,
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
        verdict == "promote", checks, result, result.candidate, result.baseline, oos, verdict, max_out_of_support, asked
    )


# ------------------------------------------------------------------------------------ policies
def load_view(path: str | Path) -> Any:
    """A `SchedulingView` from a TOML/JSON file (``placement``, ``[[targets]]``, ...)."""
    from edgetwin.policies.heuristics import SchedulingView

    path = Path(path)
    if not path.is_file():
        raise InputError("file not found", str(path))
    try:
        doc = (
            json.loads(path.read_text())
            if path.suffix.lower() == ".json"
            else tomllib.loads(path.read_text())
        )
        return SchedulingView.from_dict(doc)
    except (ValueError, TypeError, KeyError) as e:
        raise InputError(f"not a scheduling view ({type(e).__name__}: {e})", str(path)) from None


def resolve_policy(ref: str | Path, twin: Any, view: Any = None, name: str | None = None) -> PolicySpec:
    """A policy for what-ifs from a reference.

    Args:
        ref: an exported policy directory (`load_policy`), a built-in name (``"logging"``: the
            twin's clone of the logging policy; ``"logged"``: the log's own actions, replay only;
            ``"random"``), or ``"heuristic:NAME"`` (`edgetwin.policies.heuristics`, needs ``view``).
        twin: the twin it will act in (its observation/action columns must match).
        view: a `SchedulingView` (or a path to one) for heuristics.
        name: its name in reports (default: the directory name or the reference).

    Raises:
        InputError: not a policy, unknown name, columns that do not match the twin's.
    """
    text = str(ref)
    if text in BUILTIN_POLICIES:
        spec = builtin_policy(text, twin)
        spec.name = name or text
        return spec
    if text.startswith("heuristic:"):
        from edgetwin.policies.heuristics import make_heuristic

        if view is not None and not hasattr(view, "placement"):
            view = load_view(view)
        h = make_heuristic(text.partition(":")[2], twin.spec, view)
        return fixed_policy(name or text, h)
    path = Path(text)
    if path.is_dir():
        from edgetwin.policies.export import check_policy_spec, load_policy

        pol = load_policy(path)
        check_compatible(pol.spec, twin, str(path))
        check_policy_spec(pol, twin.spec, str(path))
        return fixed_policy(name or path.name, pol)
    raise InputError(
        f"not a policy directory, built-in ({', '.join(BUILTIN_POLICIES)}) or heuristic:NAME: {text!r}",
        "--policy",
    )


def check_compatible(spec: Any, twin: Any, where: str) -> None:
    """The policy must act on the twin's observation columns and produce its action columns."""
    for what, a, b in (
        ("observation", spec.observation_columns, twin.spec.observation_columns),
        ("action", spec.action_columns, twin.spec.action_columns),
    ):
        if list(a) != list(b):
            raise InputError(f"the policy's {what} columns {list(a)} are not the twin's {list(b)}", where)


# ------------------------------------------------------------------------------------ the gate
def check_held_out(twin: Any, log: pd.DataFrame | None, episodes: int, calibration: Any = None) -> None:
    """The gate calibrates on held-out traffic: refuse (`InputError`, exit 2) when the episodes it
    would calibrate on, the last ``episodes`` of ``log`` (or those ``calibration`` records), are
    episodes the twin was fitted on (`edgetwin.twin.logdata.overlapping_episodes`): scored on its
    own training data, the twin's error looks smaller than it is, and so do the intervals."""
    from edgetwin.twin.logdata import overlapping_episodes

    meta = getattr(twin, "meta", {}) or {}
    train = set((meta.get("episode_sha256") or {}).values())
    if calibration is not None and getattr(calibration, "episode_sha256", None) and train:
        bad = sorted(n for n, h in calibration.episode_sha256.items() if h in train)
        if bad:
            raise InputError(
                f"the calibration was computed on episode(s) {bad} of the twin's training data; calibrate on a log "
                "the twin was not fitted on",
                "--calibration",
            )
    if calibration is None and log is not None and "episode" in log.columns:
        names = [str(x) for x in pd.unique(log["episode"])][-int(episodes) :]
        bad = overlapping_episodes(meta, log, names, getattr(twin, "spec", None))
        if bad:
            raise InputError(
                f"episode(s) {bad} of the log are the twin's training data; the gate calibrates on them, so give a "
                "recent log the twin was not fitted on",
                "--log",
            )


def run_gate(
    twin: Any,
    candidate: PolicySpec,
    baseline: PolicySpec,
    *,
    log: pd.DataFrame | None,
    scenarios: Sequence[Scenario] = (),
    guards: Sequence[Guard] | None = None,
    default_margin: float = DEFAULT_MARGIN,
    kpis: Sequence[KpiDef] | None = None,
    episodes: int = 4,
    seeds: int = 1,
    seed: int = 0,
    members: Sequence[int] | None = None,
    steps: int | None = None,
    exogenous: Sequence[str] = (),
    refuse_out_of_support: bool = False,
    oos_tolerance: float = 0.05,
    max_out_of_support: float = MAX_OUT_OF_SUPPORT,
    calibration: Any = None,
    progress: bool = False,
    level: float | None = None,
) -> GateDecision:
    """Replay ``candidate`` and ``baseline`` in the twin (recent ``log``, nominal + ``scenarios``)
    and check the guarded KPIs; see the module docstring and `decide`. ``episodes`` recorded
    episodes (the last of the log) are replayed with every member and ``seeds`` noise seeds.

    ``calibration`` (`edgetwin.twin.intervals.Calibration`) widens the intervals by the twin's
    error on held-out logs; by default (with a log) the log's own actions are replayed too and the
    twin is calibrated on them: the recent log is traffic the twin was not fitted on, and its
    logged KPIs are the real system's answer for the logged actions."""
    if candidate.name == baseline.name:
        candidate = PolicySpec(f"{candidate.name} (candidate)", candidate.factory)
    # fail on a bad guard, or none, before the long replay
    from edgetwin.twin.whatif import default_kpis

    lay = twin.layout
    ks = (
        list(kpis)
        if kpis is not None
        else default_kpis(twin.spec, lay.outputs + ([] if lay.predict_reward else ["reward"]))
    )
    resolve_guards(ks, guards, default_margin)
    check_held_out(twin, log, episodes, calibration)
    pols = [baseline, candidate]
    if calibration is None and log is not None and all(p.factory is not None for p in pols):
        logged = builtin_policy("logged", twin)
        while logged.name in (baseline.name, candidate.name):
            logged.name += "_"
        pols.append(logged)
    result = run_whatif(
        twin,
        pols,
        scenarios,
        baseline=baseline.name,
        kpis=kpis,
        episodes=episodes,
        seeds=seeds,
        seed=seed,
        members=members,
        steps=steps,
        log=log,
        exogenous=exogenous,
        oos_tolerance=oos_tolerance,
        progress=progress,
        calibration=calibration,
    )
    return decide(result, guards, default_margin, refuse_out_of_support, max_out_of_support, level)


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


# ------------------------------------------------------------------------------------ promotion
class RegistryLike(Protocol):
    """What `promote` needs of a registry (`edgetwin.edge.registry.PolicyRegistry` has it)."""

    def current(self, scope: str) -> str | None: ...

    def list_versions(self) -> list[str]: ...

    def publish(self, policy_dir: str | Path, metadata: Mapping[str, Any], signer: Any) -> str: ...

    def fetch(self, version: str, dest_dir: str | Path, trust: Any) -> Path: ...

    def set_current(
        self, scope: str, version: str, *, expected: str | None, reason: str = "", kind: str = "promote"
    ) -> Any: ...


@dataclass
class PromotionResult:
    """What `promote` did.

    Attributes:
        promoted: the pointer moved. forced: the gate was overridden (recorded in the metadata).
        version: the candidate's version in the registry (None when refused before publishing).
        previous: what the scope pointed at before (the CAS ``expected``); against: what the
            candidate was compared with. report: the report's files.
    """

    decision: GateDecision
    promoted: bool
    forced: bool
    scope: str
    version: str | None
    previous: str | None
    against: str
    report: dict[str, Path]
    metadata: dict[str, Any]

    def to_dict(self) -> dict[str, Any]:
        return {
            "promoted": self.promoted,
            "forced": self.forced,
            "scope": self.scope,
            "version": self.version,
            "previous": self.previous,
            "against": self.against,
            "gate": self.decision.to_dict(),
            "report": {
                k: str(v) for k, v in self.report.items() if k in ("html", "markdown", "json", "promotion")
            },
        }


_NAME_SAFE = re.compile(r"[^A-Za-z0-9_.-]+")


def _fallback_scopes(scope: str) -> list[str]:
    # the edge runtime serves site -> cluster -> global; a site's cluster is not known here
    return [scope] if scope == "global" else [scope, "global"]


def promote(
    policy: str | Path,
    registry: RegistryLike,
    *,
    twin: Any,
    log: pd.DataFrame,
    signer: Any,
    trust: Any,
    scope: str = "global",
    against: str = "auto",
    scenarios: Sequence[Scenario] = (),
    guards: Sequence[Guard] | None = None,
    default_margin: float = DEFAULT_MARGIN,
    kpis: Sequence[KpiDef] | None = None,
    episodes: int = 4,
    seeds: int = 1,
    seed: int = 0,
    members: Sequence[int] | None = None,
    steps: int | None = None,
    exogenous: Sequence[str] = (),
    refuse_out_of_support: bool = False,
    max_out_of_support: float = MAX_OUT_OF_SUPPORT,
    calibration: Any = None,
    force: bool = False,
    out_dir: str | Path = "promotion-report",
    name: str | None = None,
    metadata: Mapping[str, Any] | None = None,
    view: Any = None,
    progress: bool = False,
    level: float | None = None,
) -> PromotionResult:
    """Gate ``policy`` against the scope's current version and promote it if nothing regresses.

    Args:
        policy: an exported policy directory, or a version already in the registry.
        registry: a `RegistryLike`.
        twin: the twin to replay in; log: recent traffic of the real system (the contract's table).
        signer: signs the published artifact (`edgetwin.edge.signing.Signer`).
        trust: verifies versions fetched from the registry (`TrustStore`).
        scope: ``"global"``, ``"cluster/<c>"`` or ``"site/<s>"``.
        against: ``"auto"`` (the scope's current version; else the global one; else the twin's
            clone of the logging policy), a registry version, a policy directory or a built-in.
        scenarios, guards, default_margin, kpis, episodes, seeds, seed, members, steps, exogenous,
        refuse_out_of_support: see `run_gate`.
        force: promote even if the gate refuses (recorded as ``gate.forced`` in the metadata).
        out_dir: where the report goes.
        name: the policy's name in the registry (default: from metadata or the directory name).
        metadata: base metadata (e.g. `edgetwin.edge.registry.metadata_from_policy_dir`).

    Raises:
        GateRefused: a guarded KPI regressed (``.result`` holds the `PromotionResult`).
        GateAbstained: the twin cannot tell (``.result`` holds the `PromotionResult`); nothing is
            published unless ``force``.
        InputError: bad policy, scope, guard or log. The registry's CAS conflict propagates.
    """
    out = Path(out_dir)
    expected = registry.current(scope)  # read before the long replay: the CAS compares against it
    versions = set(registry.list_versions())
    with tempfile.TemporaryDirectory(prefix="edgetwin-promote-") as tmp:
        cand_path, cand_version, cand_name, candidate = _resolve_candidate(
            policy, registry, versions, Path(tmp), trust=trust, twin=twin, name=name, metadata=metadata
        )
        baseline, against_label, parent = _resolve_baseline(
            against, scope, registry, versions, Path(tmp), trust=trust, twin=twin, view=view
        )
        if baseline.name == candidate.name:
            baseline.name = f"{baseline.name}-baseline"

        decision = run_gate(
            twin, candidate, baseline, log=log, scenarios=scenarios, guards=guards, default_margin=default_margin,
            kpis=kpis, episodes=episodes, seeds=seeds, seed=seed, members=members, steps=steps, exogenous=exogenous,
            refuse_out_of_support=refuse_out_of_support, max_out_of_support=max_out_of_support,
            calibration=calibration, progress=progress, level=level,
        )  # fmt: skip

        files = _write_gate_report(decision, out, candidate.name, against_label, scope, force)
        md = _promotion_metadata(
            decision, metadata, cand_name=cand_name, candidate_label=candidate.name, parent=parent,
            against_label=against_label, scope=scope, force=force,
            report_sha=hashlib.sha256(files["json"].read_bytes()).hexdigest(),
        )  # fmt: skip
        result = PromotionResult(
            decision, False, False, scope, cand_version, expected, against_label, files, md
        )
        files["promotion"] = out / "promotion.json"
        if not decision.passed and not force:
            files["promotion"].write_text(json.dumps(result.to_dict(), indent=1, default=str))
            err: Any = (GateAbstained if decision.verdict == "abstain" else GateRefused)(
                f"{decision.reason()} (report: {files['html']})"
            )
            err.result = result
            raise err
        _publish_and_set_current(result, registry, cand_path, signer, expected=expected, force=force)
        files["promotion"].write_text(json.dumps(result.to_dict(), indent=1, default=str))
        return result


def _resolve_candidate(
    policy: str | Path,
    registry: RegistryLike,
    versions: set[str],
    tmp: Path,
    *,
    trust: Any,
    twin: Any,
    name: str | None,
    metadata: Mapping[str, Any] | None,
) -> tuple[Path, str | None, str, Any]:
    """Step 1 of `promote`: find the candidate (a directory, or a registry version fetched into
    ``tmp``), give it a registry-safe name and load it as a policy.

    Separate because a candidate may already be published (its version is then re-pointed, not
    re-published), which the later publish step must know.

    Returns:
        (its directory, its registry version or None, its sanitised name, the loaded policy).
    """
    cand_path = Path(policy)
    cand_version: str | None = None
    if not cand_path.is_dir():
        if str(policy) in versions:
            cand_version = str(policy)
            cand_path = registry.fetch(cand_version, tmp / "candidate", trust)
        else:
            raise InputError("not a policy directory nor a version in the registry", str(policy))
    cand_name = name or (metadata or {}).get("name") or (cand_version or cand_path.name)
    cand_name = _NAME_SAFE.sub("-", str(cand_name)).strip("-.") or "policy"
    return cand_path, cand_version, cand_name, resolve_policy(cand_path, twin, name=cand_name)


def _resolve_baseline(
    against: str,
    scope: str,
    registry: RegistryLike,
    versions: set[str],
    tmp: Path,
    *,
    trust: Any,
    twin: Any,
    view: Any,
) -> tuple[Any, str, str | None]:
    """Step 2 of `promote`: what the candidate is compared with.

    ``"auto"`` walks the scope's serving fallback (scope, then global) and falls back to the
    twin's clone of the logging policy when nothing is promoted yet; a registry version is
    fetched into ``tmp``; anything else is a directory or a built-in. Separate because the
    choice also fixes the lineage (``parent``) recorded in the published metadata.

    Returns:
        (the baseline policy, its label for the report, the parent version or None).
    """
    parent: str | None = None
    if against == "auto":
        current = next(
            (v for s in _fallback_scopes(scope) if (v := registry.current(s)) is not None), None
        )
        if current is None:
            baseline = resolve_policy("logging", twin, name="logging")
            return baseline, "logging (nothing promoted yet: the twin's clone of the logging policy)", None
        parent = current
        inc = registry.fetch(current, tmp / "incumbent", trust)
        return resolve_policy(inc, twin, name=f"current-{current}"), current, parent
    if against in versions:
        parent = against
        inc = registry.fetch(against, tmp / "incumbent", trust)
        return resolve_policy(inc, twin, name=f"version-{against}"), against, parent
    return resolve_policy(against, twin, view=view), str(against), None


def _write_gate_report(
    decision: GateDecision, out: Path, candidate_label: str, against_label: str, scope: str, force: bool
) -> dict[str, Path]:
    """Step 4 of `promote`: write the report (HTML, Markdown, JSON) with the verdict on top.

    Separate because the report is written whatever the verdict: a refused or abstaining
    candidate leaves the evidence behind, and the JSON's hash is recorded in the metadata.
    """
    from edgetwin.twin.report import markdown_html, write_report

    verdict_md = gate_markdown(decision)
    return write_report(
        decision.result,
        out,
        title=f"Promotion gate: {candidate_label} vs {against_label} ({scope})",
        extra={"gate": decision.to_dict(), "scope": scope, "against": against_label, "forced": force},
        preamble_md=verdict_md,
        preamble_html=markdown_html(verdict_md),
    )


def _promotion_metadata(
    decision: GateDecision,
    metadata: Mapping[str, Any] | None,
    *,
    cand_name: str,
    candidate_label: str,
    parent: str | None,
    against_label: str,
    scope: str,
    force: bool,
    report_sha: str,
) -> dict[str, Any]:
    """Step 5 of `promote`: the registry metadata — the caller's, plus the name, the lineage,
    the candidate's KPI means and the ``gate`` record (verdict, guards, report hash).

    Separate because it is what an auditor reads in the registry: everything the gate decided
    is gathered here in one place.
    """
    md = dict(metadata or {})
    md["name"] = cand_name
    if md.get("parent_version") is None:
        md["parent_version"] = parent
    metrics = dict(md.get("metrics") or {})
    metrics.update(kpi_metrics(decision.result, candidate_label))
    md["metrics"] = metrics
    md["gate"] = {
        "passed": decision.passed,
        "verdict": decision.verdict,
        "forced": bool(force and not decision.passed),
        "against": against_label,
        "scope": scope,
        "failures": [c.describe() for c in decision.failures],
        "abstentions": [c.abstain_reason(decision.max_out_of_support) for c in decision.abstentions],
        "guards": {c.kpi: c.max_regression for c in decision.checks},
        "scenarios": [s.name for s in decision.result.scenarios],
        "report_sha256": report_sha,
    }
    return md


def _publish_and_set_current(
    result: PromotionResult,
    registry: RegistryLike,
    cand_path: Path,
    signer: Any,
    *,
    expected: str | None,
    force: bool,
) -> None:
    """Step 7 of `promote` (the gate passed, or ``force``): publish the candidate unless it is
    already a registry version, then compare-and-set the scope's pointer against ``expected``
    (read before the replay, so a concurrent promotion makes this fail rather than be lost).
    Updates ``result`` in place.
    """
    decision = result.decision
    cand_version = result.version
    if cand_version is None:
        cand_version = registry.publish(cand_path, result.metadata, signer)
    reason = "gate passed" if decision.passed else f"gate overridden (--force, {decision.verdict}): {decision.reason()}"
    registry.set_current(result.scope, cand_version, expected=expected, reason=reason[:500], kind="promote")
    result.version = cand_version
    result.promoted = True
    result.forced = bool(force and not decision.passed)


__all__ = [
    "DEFAULT_MARGIN",
    "MAX_OUT_OF_SUPPORT",
    "VERDICTS",
    "GateAbstained",
    "GateDecision",
    "Guard",
    "GuardCheck",
    "PromotionResult",
    "RegistryLike",
    "decide",
    "gate_markdown",
    "check_held_out",
    "check_verdict",
    "evidence_problem",
    "level_text",
    "kpi_metrics",
    "load_view",
    "parse_guards",
    "promote",
    "resolve_guards",
    "resolve_policy",
    "run_gate",
]
