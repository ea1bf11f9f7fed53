"""A guarded KPI and how far it may regress: the one type the gate, the canary plan, the canary's
guard, the loop's verdict and the runtime's rollback watch share.

Before issue 46 there were four types for this concept (``KPIMargin`` in the edge's KPI watch,
``Guard`` in the gate, ``PlanMargin`` in the canary plan, ``_ColumnGuard`` in the loop) and a
``better`` dict travelling beside them. They live here, in the lowest layer every user imports,
under one name; the old names are aliases of it so that existing call sites keep working.

A margin allows a worsening of ``max_regression · |baseline| + min_delta`` (in the KPI's units),
"worse" in the direction ``higher_is_better`` says. Two text forms:

* ``KPI<=+10%`` / ``KPI>=-5%`` (`KPIMargin.parse`): direction and margin together (the runtime's
  ``--guard``);
* ``KPI=0.05``, ``KPI=5%``, ``KPI=0.05:ABS`` (`KPIMargin.parse_relative`): margin only, the direction
  taken from the KPI's definition (the gate's ``--max-regression``; `with_direction`).
"""

from __future__ import annotations

import dataclasses
import math
import re

import numpy as np

from edgetwin.contract.errors import InputError

__all__ = ["DEFAULT_MARGIN", "KPIMargin"]

#: The default relative margin (5 %) of a guarded KPI.
DEFAULT_MARGIN = 0.05

_DIRECTED_RE = re.compile(
    r"^\s*(?P<name>[A-Za-z0-9_.\-]+)\s*(?P<op><=|>=)\s*(?P<val>[+-]?\d+(?:\.\d*)?|[+-]?\.\d+)\s*(?P<pct>%?)\s*$"
)
_RELATIVE_RE = re.compile(
    r"^\s*(?P<name>[^=\s]+)\s*=\s*(?P<rel>[+-]?\d+(?:\.\d*)?|[+-]?\.\d+)\s*(?P<pct>%?)\s*(?::\s*(?P<abs>\d+(?:\.\d*)?|\.\d+)\s*)?$"
)


@dataclasses.dataclass(frozen=True)
class KPIMargin:
    """One guarded KPI: its name, allowed regression, and the direction that is better.

    Attributes:
        kpi: the KPI's name (a what-if KPI, a log column such as ``kpi.slo_violation``, or a
            reported metric).
        max_regression: allowed relative worsening, a fraction of ``|baseline|`` (0.05 = 5 %).
        min_delta: allowed absolute worsening on top, in the KPI's units (keeps near-zero KPIs
            from tripping on noise).
        higher_is_better: False for costs (latency, violations, energy), True for revenue,
            reward. A margin parsed without a direction (``KPI=5%``) gets it from the KPI's
            definition (`with_direction`) before anything judges with it.
    """

    kpi: str
    max_regression: float = DEFAULT_MARGIN
    min_delta: float = 0.0
    higher_is_better: bool = False

    def __post_init__(self) -> None:
        if not self.kpi:
            raise InputError("a KPI margin needs a KPI name", "--max-regression")
        if isinstance(self.higher_is_better, np.bool_):  # numpy's, e.g. ``weight > 0`` on an array value
            object.__setattr__(self, "higher_is_better", bool(self.higher_is_better))
        if isinstance(self.max_regression, bool) or not isinstance(self.higher_is_better, bool):
            # the edge's former KPIMargin took (kpi, higher_is_better, max_regression, ...): refuse
            # that order loudly rather than read a direction as a 100 % margin
            raise InputError(
                f"KPIMargin({self.kpi!r}, max_regression, min_delta, higher_is_better): got "
                f"max_regression={self.max_regression!r}, higher_is_better={self.higher_is_better!r}; pass "
                "higher_is_better by keyword", "--max-regression",
            )
        if not (isinstance(self.max_regression, int | float) and math.isfinite(self.max_regression)
                and self.max_regression >= 0):  # fmt: skip
            raise InputError(
                f"margin of {self.kpi!r} must be a number >= 0, got {self.max_regression}", "--max-regression"
            )
        if not (math.isfinite(self.min_delta) and self.min_delta >= 0):
            raise InputError(
                f"absolute margin of {self.kpi!r} must be >= 0, got {self.min_delta}", "--max-regression"
            )

    @property
    def better(self) -> str:
        """``"higher"`` or ``"lower"``."""
        return "higher" if self.higher_is_better else "lower"

    def with_direction(self, better: str | bool) -> KPIMargin:
        """This margin with its direction set (``"higher"`` / ``"lower"`` or a bool)."""
        hib = better if isinstance(better, bool) else str(better) == "higher"
        return dataclasses.replace(self, higher_is_better=hib)

    def worsening(self, baseline: float, value: float) -> float:
        """How much worse ``value`` is than ``baseline``, in the KPI's units (negative: better)."""
        return baseline - value if self.higher_is_better else value - baseline

    def allowed(self, baseline: float) -> float:
        """The largest worsening (in the KPI's units) tolerated from ``baseline``."""
        return self.max_regression * abs(baseline) + self.min_delta

    def allowed_change(self, baseline: float) -> float:
        """The margin as a relative worsening of ``baseline`` (``inf`` at a 0 baseline with an
        absolute margin, 0 with none)."""
        base = abs(float(baseline))
        allowed = self.allowed(baseline)
        return allowed / base if base > 0 else (0.0 if allowed == 0 else math.inf)

    def breached(self, baseline: float, value: float) -> bool:
        return self.worsening(baseline, value) > self.allowed(baseline)

    def describe(self) -> str:
        sign = ">=" if self.higher_is_better else "<="
        pct = ("-" if self.higher_is_better else "+") + f"{100 * self.max_regression:g}%"
        return f"{self.kpi}{sign}{pct}" + (f" (±{self.min_delta:g} abs)" if self.min_delta else "")

    @classmethod
    def parse(cls, text: str, *, min_delta: float = 0.0, where: str = "--guard") -> KPIMargin:
        """``"kpi.slo_violation<=+10%"`` (a cost may rise 10 %) or ``"kpi.revenue>=-5%"`` (may fall
        5 %); the number may also be a plain fraction (``<=0.1``)."""
        m = _DIRECTED_RE.match(text)
        if m is None:
            raise InputError(
                f"expected NAME<=+P% (lower is better) or NAME>=-P% (higher is better), got {text!r}", where=where
            )
        val = abs(float(m["val"])) / (100.0 if m["pct"] else 1.0)
        return cls(m["name"], max_regression=val, min_delta=min_delta, higher_is_better=m["op"] == ">=")

    @classmethod
    def parse_relative(cls, text: str, where: str = "--max-regression") -> KPIMargin:
        """``"kpi.slo_violation=0.05"``, ``"...=5%"`` or ``"...=0.05:0.002"`` (relative[:absolute]);
        the direction comes from the KPI's definition (`with_direction`)."""
        m = _RELATIVE_RE.match(text)
        if m is None:
            raise InputError(f"expected KPI=FRACTION, KPI=P% or KPI=FRACTION:ABSOLUTE, got {text!r}", where)
        rel = float(m["rel"]) / (100.0 if m["pct"] else 1.0)
        if rel < 0:
            raise InputError(f"{m['name']}: the margin must be >= 0, got {m['rel']}", where)
        return cls(m["name"], rel, float(m["abs"]) if m["abs"] else 0.0)
