"""The runtime's KPI watch: which KPIs may regress by how much, and when a live window says they did.

* `KPIMargin` (`edgetwin.contract.margins`, the one margin type the gate and the loop share too):
  one guarded KPI and its allowed regression (``kpi.slo_violation<=5%``), relative to a baseline,
  in the direction the spec says is better.
* `KPIGuard`: the margins of a runtime, where its baseline comes from (`BaselineSource`), and how
  many observations a window needs before it may judge.
* `KPIWatch`: the sliding window of live KPI reports behind a served version; `KPIWatch.observe`
  returns the `Breach` that makes `edgetwin.edge.runtime.EdgeRuntime` roll back.
"""

from __future__ import annotations

import dataclasses
import logging
import math
from collections import deque
from collections.abc import Mapping
from typing import Any, Literal

import numpy as np

from edgetwin.contract.errors import InputError
from edgetwin.contract.margins import KPIMargin
from edgetwin.contract.spec import TwinSpec

__all__ = ["BaselineSource", "Breach", "KPIGuard", "KPIMargin", "KPIWatch", "lookup_kpi"]

log = logging.getLogger("edgetwin.runtime")

BaselineSource = Literal["auto", "previous", "metadata", "first_window"]


@dataclasses.dataclass(frozen=True)
class KPIGuard:
    """The rollback watch's configuration.

    Attributes:
        margins: the guarded KPIs (empty: the watch only records); None: those the served policy's
            spec reward weighs (`from_spec`, 10 %), fixed when the first policy is loaded.
        window: KPI reports averaged per judgement (a sliding window).
        grace: reports ignored right after a swap (the system's state still reflects the old policy).
        patience: consecutive breached judgements before rolling back (one noisy window is not enough).
        probation: reports (after the grace) during which a newly promoted version is judged; after
            that it is accepted and only recorded. A fixed baseline drifts away from live KPIs over
            a day (diurnal load), so judging forever would roll back good versions.
        baseline: what the window is compared with. ``"previous"``: the last full window served by
            the version that was replaced (measured on this site just before the swap);
            ``"metadata"``: the version's signed metrics at promotion (twin estimates);
            ``"first_window"``: the first full window after the swap (catches later decay only);
            ``"auto"``: previous, else metadata (if it names every guarded KPI), else first window.

    A version reinstated by a rollback (the runtime's or anyone's) is recorded but not judged: it
    was the last good one, and rolling back further is an operator's decision.
    """

    margins: tuple[KPIMargin, ...] | None = ()
    window: int = 20
    grace: int = 2
    patience: int = 2
    probation: int = 100
    baseline: BaselineSource = "auto"

    def __post_init__(self) -> None:
        if self.margins is not None:
            object.__setattr__(self, "margins", tuple(self.margins))
        if self.window < 1:
            raise InputError(f"window must be >= 1 report, got {self.window}", where="kpi guard")
        if self.grace < 0 or self.patience < 1 or self.probation < self.window:
            raise InputError(
                f"need grace >= 0, patience >= 1 and probation >= window, got {self.grace}, {self.patience}, "
                f"{self.probation} (window {self.window})",
                where="kpi guard",
            )
        if self.baseline not in ("auto", "previous", "metadata", "first_window"):
            raise InputError(
                f"baseline must be auto, previous, metadata or first_window, got {self.baseline!r}",
                where="kpi guard",
            )
        names = [m.kpi for m in self.margins or ()]
        if len(set(names)) != len(names):
            raise InputError(f"a KPI is guarded twice: {names}", where="kpi guard")

    @classmethod
    def from_spec(cls, spec: TwinSpec, max_regression: float = 0.10, **kwargs: Any) -> KPIGuard:
        """Guard every ``kpi.*`` column the spec gives a direction: its declared ``better`` (at its
        declared ``margin``, else ``max_regression``), else the direction its reward weight wants.

        A spec that gives no KPI a direction gives an empty guard (logged): pass margins explicitly.
        """
        weights = spec.reward_weights
        margins = tuple(
            KPIMargin(f.name, higher_is_better=(f.better == "higher") if f.better else weights[f.name] > 0,
                      max_regression=max_regression if f.margin is None else float(f.margin))
            for f in spec.by_role("kpi")
            if f.better is not None or weights.get(f.name, 0.0) != 0
        )  # fmt: skip
        if not margins:
            log.warning(
                "spec %r: its reward weighs no kpi.* column, so no KPI is guarded; give margins", spec.name
            )
        return cls(margins=margins, **kwargs)

    def resolve(self, spec: TwinSpec | None) -> KPIGuard:
        """This guard with its margins fixed (from ``spec`` when they are None)."""
        if self.margins is not None:
            return self
        options = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "margins"}
        return KPIGuard.from_spec(spec, **options) if spec is not None else KPIGuard(margins=(), **options)

    def describe(self) -> str:
        if self.margins is None:
            return f"the KPIs the policy's reward weighs; window {self.window}"
        if not self.margins:
            return "no KPI guarded"
        ms = ", ".join(m.describe() for m in self.margins)
        return (
            f"{ms}; window {self.window}, grace {self.grace}, patience {self.patience}, "
            f"probation {self.probation}, baseline {self.baseline}"
        )


@dataclasses.dataclass(frozen=True)
class Breach:
    """A guarded KPI regressed: what the rollback reports.

    Attributes:
        version: the version whose window regressed.
        kpis: per breached KPI: ``value`` (window mean), ``baseline``, ``change`` (relative,
            signed so that positive is worse) and ``margin`` (the allowed relative worsening).
        baseline_source: where the baseline came from.
        reports: how many reports the version had received.
    """

    version: str
    kpis: dict[str, dict[str, float]]
    baseline_source: str
    reports: int

    def reason(self) -> str:
        parts = []
        for name, d in self.kpis.items():
            parts.append(
                f"{name} {d['value']:.4g} vs baseline {d['baseline']:.4g} "
                f"({100 * d['change']:+.1f}% worse, margin {100 * d['margin']:.1f}%)"
            )
        return (
            f"{self.version}: "
            + "; ".join(parts)
            + f" [baseline: {self.baseline_source}, {self.reports} reports]"
        )


def lookup_kpi(metrics: Mapping[str, float], kpi: str) -> float | None:
    """``metrics[kpi]``, also trying the name with or without the ``kpi.`` prefix."""
    for key in (kpi, kpi.removeprefix("kpi."), f"kpi.{kpi}"):
        v = metrics.get(key)
        if isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v):
            return float(v)
    return None


class KPIWatch:
    """Sliding-window regression detector for one served version at a time.

    `start` is called at every swap; `observe` takes each report and returns a `Breach` once the
    window mean of a guarded KPI has been worse than its baseline by more than its margin for
    ``patience`` consecutive reports, within the version's probation. After a breach, after the
    probation, or for a version started with ``judge=False``, it only records windows (which give
    the next version its ``"previous"`` baseline).
    """

    def __init__(self, guard: KPIGuard) -> None:
        if guard.margins is None:
            raise InputError("resolve the guard's margins first (KPIGuard.from_spec)", where="kpi guard")
        self.guard = guard
        self.margins: tuple[KPIMargin, ...] = guard.margins
        self.version: str | None = None
        self.baseline: dict[str, float] = {}
        self.baseline_source = "none"
        self.reports = 0
        self._windows: dict[str, deque[float]] = {}
        self._streak = 0
        self._fired = False
        self.judging = False

    @property
    def accepted(self) -> bool:
        """The version passed its probation without a breach."""
        return not self._fired and self.reports > self.guard.grace + self.guard.probation

    def start(self, version: str, baseline: Mapping[str, float] | None, source: str, *, judge: bool = True) -> None:
        """Begin watching ``version``; ``baseline`` None means: take the first full window."""
        self.judging = judge
        self.version = version
        self.baseline = dict(baseline or {})
        self.baseline_source = source if baseline else "first_window"
        self.reports = 0
        self._windows = {m.kpi: deque(maxlen=self.guard.window) for m in self.margins}
        self._streak = 0
        self._fired = False

    def window_means(self, *, full_only: bool = True) -> dict[str, float]:
        """Mean of each guarded KPI over the current window (only full windows unless told)."""
        return {
            k: float(np.mean(w))
            for k, w in self._windows.items()
            if w and (len(w) == self.guard.window or not full_only)
        }

    def observe(self, kpis: Mapping[str, float]) -> Breach | None:
        """Add one report (name -> value; unknown names are ignored); a `Breach` when it is time."""
        if self.version is None:
            return None
        self.reports += 1
        if self.reports <= self.guard.grace:
            return None
        for m in self.margins:
            v = lookup_kpi(kpis, m.kpi)
            if v is not None:
                self._windows[m.kpi].append(v)
        means = self.window_means()
        if not self.baseline:
            # "first_window": the first full window of every guarded KPI becomes the baseline.
            if means and len(means) == len(self._windows):
                self.baseline = dict(means)
                self.baseline_source = "first_window"
            return None
        if self._fired or not self.judging or self.accepted:
            return None
        breached: dict[str, dict[str, float]] = {}
        for m in self.margins:
            base, value = lookup_kpi(self.baseline, m.kpi), means.get(m.kpi)
            if base is None or value is None:
                continue
            if m.breached(base, value):
                breached[m.kpi] = {
                    "value": value,
                    "baseline": base,
                    "change": m.worsening(base, value) / max(abs(base), 1e-12),
                    "margin": m.max_regression,
                }
        self._streak = self._streak + 1 if breached else 0
        if breached and self._streak >= self.guard.patience:
            self._fired = True
            return Breach(self.version, breached, self.baseline_source, self.reports)
        return None
