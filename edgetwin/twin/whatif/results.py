"""What-if results: a (policy, scenario) `Cell` of KPI samples, their two-level bootstrap intervals
(`bootstrap_ci`) and the table of all cells with paired changes against a baseline (`WhatIfResult`).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from edgetwin.twin.intervals import LEVEL, bootstrap_ci, change_interval, interval
from edgetwin.twin.whatif.kpis import KpiDef
from edgetwin.twin.whatif.scenarios import Scenario

__all__ = ["Cell", "WhatIfResult", "bootstrap_ci"]


@dataclass
class Cell:
    """All episodes of one (policy, scenario): arrays over members ``M`` and replicates ``R``.

    Attributes:
        values: KPI name -> ``(M, R)``; timeline: column -> ``(M, R, T)`` per-step means
            (NaN-padded); oos: ``(M, R)`` and oos_t: ``(M, R, T)`` shares out of support.
    """

    policy: str
    scenario: str
    values: dict[str, np.ndarray]
    timeline: dict[str, np.ndarray]
    oos: np.ndarray
    oos_t: np.ndarray
    #: action column -> `edgetwin.twin.intervals.action_sketch` of every action the policy took in the
    #: cell (all members and replicates): its action shift from the calibration days' actions
    action_quantiles: dict[str, list[float]] = field(default_factory=dict)


@dataclass
class WhatIfResult:
    """Every cell of a what-if run plus what it was run on; see `edgetwin.twin.report` for output.

    Attributes:
        cells: ``(policy, scenario) -> Cell``.
        policies: policy names in order (the baseline first when there is one).
        baseline, candidate: names for comparisons (None when a single policy ran).
        scenarios: in order, the nominal one first.
        kpis: the KPI definitions.
        logged_kpis: replay mode: KPI name -> ``(R,)`` values of the recorded episodes themselves.
        settings: how it was run (seed, episodes, members, mode, ...).
        oos_tolerance: a number is flagged when more than this share of its agent-steps is out of support.
        calibration: an `edgetwin.twin.intervals.Calibration` (the twin's error on held-out logged
            episodes) that widens every 90 % interval; None: plain bootstrap intervals.
    """

    cells: dict[tuple[str, str], Cell]
    policies: list[str]
    baseline: str | None
    candidate: str | None
    scenarios: list[Scenario]
    kpis: list[KpiDef]
    settings: dict[str, Any]
    logged_kpis: dict[str, np.ndarray] = field(default_factory=dict)
    oos_tolerance: float = 0.05
    calibration: Any = None
    #: replay mode with the built-in ``"logged"`` policy: the twin's effect-size errors on the replayed
    #: days (`edgetwin.twin.whatif.effects.ReplayedEffects`), calibrated into the change intervals
    replayed_effects: Any = None
    _memo: dict[tuple[str, ...], dict[str, Any]] = field(default_factory=dict, repr=False, compare=False)

    @property
    def candidates(self) -> list[str]:
        """Every policy compared with the baseline (all but the baseline)."""
        return [] if self.baseline is None else [p for p in self.policies if p != self.baseline]

    def cell(self, policy: str, scenario: str) -> Cell:
        return self.cells[(policy, scenario)]

    def kpi(self, name: str) -> KpiDef:
        for k in self.kpis:
            if k.name == name:
                return k
        raise KeyError(name)

    def calibrate(self, calibration: Any) -> None:
        """Use ``calibration`` (`edgetwin.twin.intervals.Calibration`) for every interval from now on."""
        self.calibration = calibration
        self._memo.clear()

    @property
    def level(self) -> float:
        """The level the intervals attain: the calibration's lowest attained level over its KPIs
        (`edgetwin.twin.intervals.attained_level` of its independent episodes), else the nominal one."""
        cal = self.calibration
        if cal is None:
            return LEVEL
        return min((min(cal.level, cal.attained(k)) for k in cal.quantile), default=cal.level)

    @property
    def interval_label(self) -> str:
        """``"80 % interval"``, or ``"90 % plain bootstrap interval"`` when not calibrated (reports)."""
        if self.calibration is None:
            return f"{100 * LEVEL:.0f} % plain bootstrap interval"
        return f"{100 * self.level:.0f} % interval"

    @property
    def interval_method(self) -> str:
        """How the 90 % intervals are built (for reports)."""
        if self.calibration is None:
            return "90 % two-level bootstrap over members x replicates (not calibrated)"
        # the level score the calibration holds (`edgetwin.twin.intervals.SCORES`): floored at the KPI's
        # spread since issue 44, plain relative in calibrations written before
        err = ("ensemble's relative error" if self.calibration.score == "relative"
               else "ensemble's error relative to max(|level|, the KPI's spread)")  # fmt: skip
        how = {
            "relative": f"widened by the conformal quantile of the {err}",
            "normalized": "ensemble mean ± the conformal multiple of the members' spread (at least the bootstrap)",
            "hybrid": f"levels widened by the conformal quantile of the {err}, changes by that "
            "error applied to the change plus the conformal multiple of the members' spread of the change",
            "replayed": f"levels widened by the conformal quantile of the {err}, changes by that "
            "error applied to the change plus the conformal multiple of the twin's effect-size error per unit of "
            "action moved (replayed held-out days) times how far the two policies move the actions",
        }.get(self.calibration.method, self.calibration.method)
        cal = self.calibration
        text = f"two-level bootstrap over members x replicates, {how} on {cal.source}"
        if cal.effect_note():
            text += f"; {cal.effect_note()}"
        attained = min((cal.attained(k) for k in cal.quantile), default=cal.level)
        if attained < cal.level - 1e-12:
            n = min(cal.n_support(k) for k in cal.quantile)
            return (
                f"{100 * attained:.0f} % intervals ({100 * cal.level:.0f} % asked; {n} independent calibration "
                f"episode(s) support no more): {text}"
            )
        return f"{100 * cal.level:.0f} % intervals: {text}"

    def summary(self, policy: str, scenario: str, kpi: str) -> dict[str, Any]:
        """Mean, 95 % bootstrap CI, calibrated 90 % ``interval``, member spread and support share."""
        key = ("summary", policy, scenario, kpi)
        if key not in self._memo:
            self._memo[key] = self._summary(policy, scenario, kpi)
        return dict(self._memo[key])

    def _summary(self, policy: str, scenario: str, kpi: str) -> dict[str, Any]:
        c = self.cell(policy, scenario)
        v = c.values[kpi]
        lo, hi = bootstrap_ci(v, seed=int(self.settings.get("seed", 0)))
        member_means = np.nanmean(v, axis=1)
        oos = float(np.nanmean(c.oos))
        i_lo, i_hi = interval(v, self.calibration, kpi, seed=int(self.settings.get("seed", 0)))
        return {
            "mean": float(np.nanmean(v)),
            "ci_low": lo,
            "ci_high": hi,
            "interval": [i_lo, i_hi],
            "member_spread": float(np.std(member_means)) if len(member_means) > 1 else 0.0,
            "out_of_support": oos,
            "flagged": bool(oos > self.oos_tolerance),
        }

    def compare(
        self, scenario: str, kpi: str, candidate: str | None = None, baseline: str | None = None
    ) -> dict[str, Any]:
        """Paired relative change of ``candidate`` vs ``baseline`` on one KPI under one scenario.

        ``change`` is ``(candidate - baseline) / |baseline|`` of the means; ``worsening`` the same
        signed so that positive is worse (None when the KPI has no direction).
        """
        cand = candidate or self.candidate
        base = baseline or self.baseline
        if cand is None or base is None:
            raise ValueError("compare needs a candidate and a baseline policy")
        key = ("compare", cand, base, scenario, kpi)
        if key not in self._memo:
            self._memo[key] = self._compare(scenario, kpi, cand, base)
        return dict(self._memo[key])

    def _compare(self, scenario: str, kpi: str, cand: str, base: str) -> dict[str, Any]:
        a, b = self.cell(cand, scenario), self.cell(base, scenario)
        va, vb = a.values[kpi], b.values[kpi]
        k = self.kpi(kpi)

        def rel(ix: np.ndarray) -> float:  # ix: (M, R) stacked [cand, base] resample
            return _rel_change(float(np.nanmean(ix[0])), float(np.nanmean(ix[1])))

        both = np.stack([va, vb])  # (2, M, R): resampled jointly, so the comparison stays paired
        (lo, hi), (lo90, hi90) = _paired_ci(both, rel, seed=int(self.settings.get("seed", 0)), levels=(0.95, LEVEL))
        change = rel(both)
        sign = {"higher": -1.0, "lower": 1.0}.get(k.better or "", 0.0)
        ma, mb = float(np.nanmean(va)), float(np.nanmean(vb))
        oos = max(float(np.nanmean(a.oos)), float(np.nanmean(b.oos)))
        cal = self.calibration
        # per action column, the candidate's and the baseline's shifts from the calibration days' actions
        sa, sb = ({}, {}) if cal is None else (cal.shifts(a.action_quantiles), cal.shifts(b.action_quantiles))
        shift = {c: sa[c] + sb[c] for c in sa if c in sb} if sa and sb else None
        return {
            "scenario": scenario,
            "kpi": kpi,
            "better": k.better,
            "baseline": mb,
            "candidate": ma,
            "delta": ma - mb,
            "change": change,
            "change_ci": [lo, hi],
            "change_interval": list(
                _within_range(change_interval((lo90, hi90), va, vb, cal, kpi, shift), mb, k.low, k.high)
            ),
            "action_shift": float("nan") if shift is None else float(sum(shift.values())),
            "worsening": None if sign == 0.0 else sign * change,
            "worsening_abs": None if sign == 0.0 else sign * (ma - mb),
            "out_of_support": oos,
            "flagged": bool(oos > self.oos_tolerance),
        }

    def to_dict(self) -> dict[str, Any]:
        results = []
        for (pol, scen), _ in self.cells.items():
            results.append(
                {
                    "policy": pol,
                    "scenario": scen,
                    "out_of_support": float(np.nanmean(self.cells[(pol, scen)].oos)),
                    "kpis": {k.name: self.summary(pol, scen, k.name) for k in self.kpis},
                }
            )
        comparisons = []
        for cand in self.candidates:
            for s in self.scenarios:
                for k in self.kpis:
                    comparisons.append(
                        {"candidate_policy": cand, **self.compare(s.name, k.name, candidate=cand)}
                    )
        logged = {}
        for name, v in self.logged_kpis.items():
            lo, hi = bootstrap_ci(v[None, :], seed=int(self.settings.get("seed", 0)))
            logged[name] = {"mean": float(np.nanmean(v)), "ci_low": lo, "ci_high": hi}
        return {
            "settings": self.settings,
            "policies": self.policies,
            "baseline": self.baseline,
            "candidate": self.candidate,
            "scenarios": [s.to_dict() for s in self.scenarios],
            "kpis": [k.to_dict() for k in self.kpis],
            "oos_tolerance": self.oos_tolerance,
            "interval_method": self.interval_method,
            "calibration": None if self.calibration is None else self.calibration.to_dict(),
            "results": results,
            "comparisons": comparisons,
            "logged": logged,
        }


def _rel_change(cand: float, base: float) -> float:
    if not (math.isfinite(cand) and math.isfinite(base)):
        return float("nan")
    if base == 0.0:
        return 0.0 if cand == 0.0 else math.copysign(math.inf, cand)
    return (cand - base) / abs(base)


def _rel_changes(cand: np.ndarray, base: np.ndarray) -> np.ndarray:
    """`_rel_change` elementwise over float64 arrays (the same arithmetic, so the same bits)."""
    out = np.full(cand.shape, np.nan)
    finite = np.isfinite(cand) & np.isfinite(base)
    zero = finite & (base == 0.0)
    out[zero] = np.where(cand[zero] == 0.0, 0.0, np.copysign(np.inf, cand[zero]))
    rest = finite & (base != 0.0)
    out[rest] = (cand[rest] - base[rest]) / np.abs(base[rest])
    return out


def _paired_ci(
    both: np.ndarray,
    fn: Callable[[np.ndarray], float],
    seed: int,
    n_boot: int = 1000,
    levels: tuple[float, ...] = (0.95,),
) -> list[tuple[float, float]]:
    """Paired bootstrap intervals of the relative change of ``both[0]`` vs ``both[1]`` (``(2, M, R)``),
    one ``(low, high)`` per level, all from the same ``n_boot`` joint resamples of members and
    replicates. ``fn`` is the statistic on an unresampled ``(2, M, R)`` array: used as is when there is
    nothing to resample; the resamples' relative changes are taken at once (`_rel_changes`, the
    statistic ``rel`` of `WhatIfResult._compare` elementwise: 1,000 Python calls per interval cost
    seconds per report)."""
    _, m, r = both.shape
    if m * r <= 1:
        x = fn(both)
        return [(x, x) for _ in levels]
    rng = np.random.default_rng(seed)
    mi = rng.integers(m, size=(n_boot, m))
    ri = rng.integers(r, size=(n_boot, r))
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        means = np.nanmean(both[:, mi[:, :, None], ri[:, None, :]], axis=(2, 3))  # (2, B): resampled jointly
    boots = _rel_changes(means[0].astype(np.float64), means[1].astype(np.float64))
    boots = boots[np.isfinite(boots)]
    if not len(boots):
        return [(float("nan"), float("nan")) for _ in levels]
    out = []
    for level in levels:
        a = (1.0 - level) / 2.0
        out.append((float(np.quantile(boots, a)), float(np.quantile(boots, 1.0 - a))))
    return out


def _within_range(
    ci: tuple[float, float], baseline: float, low: float | None, high: float | None
) -> tuple[float, float]:
    """``ci`` of a relative change against ``baseline`` clipped to the changes the KPI's declared
    range allows: ``[(low - b)/|b|, (high - b)/|b|]`` (a non-negative KPI cannot fall by more than
    100 %). A bound, not a model: a width the calibration gives past it is the calibration's to fix
    (`edgetwin.twin.intervals.change_interval`)."""
    lo, hi = float(ci[0]), float(ci[1])
    if not math.isfinite(baseline) or baseline == 0.0:
        return lo, hi
    if low is not None and math.isfinite(low):
        floor = (low - baseline) / abs(baseline)
        lo, hi = max(lo, floor), max(hi, floor)
    if high is not None and math.isfinite(high):
        ceil = (high - baseline) / abs(baseline)
        lo, hi = min(lo, ceil), min(hi, ceil)
    return lo, hi
