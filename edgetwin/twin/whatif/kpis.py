"""`KpiDef`: what a what-if reports about a policy (a statistic of an output column), and the defaults."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from edgetwin.contract.errors import InputError
from edgetwin.contract.spec import REWARD_COLUMN, TwinSpec
from edgetwin.twin.whatif.files import read_document

__all__ = ["STATS", "KpiDef", "default_kpis", "kpis_from_dicts", "load_kpis", "merge_kpis", "weighted_quantile"]

#: KPI statistics (`KpiDef.stat`).
STATS = ("mean", "sum", "ratio", "p50", "p90", "p95", "p99", "max")


@dataclass(frozen=True)
class KpiDef:
    """A KPI computed from one episode's agent-steps.

    Attributes:
        name: how reports call it.
        column: the column it reads (an observation, action or output column, or ``reward``).
        stat: ``mean`` (over agent-steps, weighted by ``weight`` if given), ``sum`` (per agent:
            the episode total divided by the agents, e.g. the return), ``ratio`` (``Σ column /
            Σ weight``, e.g. energy per task), quantiles ``p50``..``p99`` (weighted), ``max``.
        weight: a column weighting the mean/quantiles, or the denominator of a ratio.
        better: ``"higher"``, ``"lower"`` or None (no direction: reported, never guarded).
        unit: for reports.
        margin: the relative worsening the operator accepts (the spec's ``margin`` of the column);
            None: the gate's default margin.
        low, high: the range the KPI's value can take, from the spec's declared bounds of its
            column (None: unbounded on that side). A change against a baseline ``b`` then lies in
            ``[(low - b)/|b|, (high - b)/|b|]`` (-100 % for a non-negative KPI), and its interval is
            clipped to that range (`edgetwin.twin.whatif.results.WhatIfResult.compare`).
    """

    name: str
    column: str
    stat: str = "mean"
    weight: str | None = None
    better: str | None = None
    unit: str = ""
    margin: float | None = None
    low: float | None = None
    high: float | None = None

    def __post_init__(self) -> None:
        if self.stat not in STATS:
            raise InputError(f"KPI {self.name!r}: stat {self.stat!r} is not one of {STATS}", "kpi")
        if self.better not in (None, "higher", "lower"):
            raise InputError(
                f"KPI {self.name!r}: better must be 'higher' or 'lower', got {self.better!r}", "kpi"
            )
        if self.stat == "ratio" and self.weight is None:
            raise InputError(f"KPI {self.name!r}: a ratio needs a weight column (its denominator)", "kpi")

    @property
    def columns(self) -> list[str]:
        return [self.column] + ([self.weight] if self.weight else [])

    def compute(self, x: np.ndarray, w: np.ndarray | None) -> float:
        """The KPI of one episode: ``x``, ``w`` are ``(T, N)`` arrays of its agent-steps."""
        x = np.asarray(x, dtype=np.float64)
        ok = np.isfinite(x)
        if w is not None:
            w = np.maximum(np.nan_to_num(np.asarray(w, dtype=np.float64)), 0.0)
        if not ok.any():
            return float("nan")
        if self.stat == "sum":
            return float(np.nansum(x) / max(x.shape[-1], 1))
        if self.stat == "ratio":
            assert w is not None
            den = w[ok].sum()
            return float(x[ok].sum() / den) if den > 0 else float("nan")
        if self.stat == "max":
            return float(np.nanmax(x))
        xv, wv = x[ok], (None if w is None else w[ok])
        if self.stat == "mean":
            if wv is not None and wv.sum() > 0:
                return float(np.average(xv, weights=wv))
            return float(xv.mean())
        q = float(self.stat[1:]) / 100.0
        return weighted_quantile(xv, wv, q)

    def to_dict(self) -> dict[str, Any]:
        return {k: v for k, v in asdict(self).items() if v is not None and v != ""}


def weighted_quantile(x: np.ndarray, w: np.ndarray | None, q: float) -> float:
    """The ``q`` quantile of ``x`` with non-negative weights ``w`` (plain quantile if None/zero)."""
    if w is None or w.sum() <= 0:
        return float(np.quantile(x, q))
    order = np.argsort(x, kind="stable")
    cw = np.cumsum(w[order])
    return float(x[order][min(int(np.searchsorted(cw, q * cw[-1], side="left")), len(x) - 1)])


def default_kpis(spec: TwinSpec, outputs: Sequence[str]) -> list[KpiDef]:
    """The mean of every output column, plus the return when there is a reward.

    Directions come from the spec: a column's declared ``better`` (and its ``margin``), else its
    reward weight (a positive weight: higher is better); the reward and return are
    higher-is-better; other columns have no direction until a KPI file gives one.
    """
    weights = dict(spec.reward_weights)
    has_reward = bool(spec.reward_weights or spec.reward_function) or REWARD_COLUMN in outputs
    out = []
    for c in outputs:
        w = weights.get(c, 0.0)
        feat = None if c == REWARD_COLUMN else spec.feature(c)
        better = "higher" if (c == REWARD_COLUMN or w > 0) else ("lower" if w < 0 else None)
        if feat is not None and feat.better is not None:
            better = feat.better
        unit = "" if feat is None else feat.unit
        # the mean of a column bounded by the spec lies within the same bounds
        low = None if feat is None or feat.low is None else float(feat.low)
        high = None if feat is None or feat.high is None else float(feat.high)
        out.append(KpiDef(c, c, "mean", better=better, unit=unit, margin=None if feat is None else feat.margin,
                          low=low, high=high))
    if has_reward:
        if REWARD_COLUMN not in outputs:
            out.append(KpiDef(REWARD_COLUMN, REWARD_COLUMN, "mean", better="higher"))
        out.append(KpiDef("return", REWARD_COLUMN, "sum", better="higher"))
    return out


def kpis_from_dicts(raw: Any, source: str) -> list[KpiDef]:
    """Parse ``[[kpi]]`` tables ``{name, column, stat?, weight?, better?, unit?}``."""
    if isinstance(raw, Mapping):
        raw = [raw]
    if not isinstance(raw, list):
        raise InputError("'kpi' must be a list of tables ([[kpi]])", source)
    out = []
    for i, d in enumerate(raw):
        where = f"{source}: kpi #{i + 1}"
        if not isinstance(d, Mapping) or "column" not in d:
            raise InputError(
                "a [[kpi]] needs at least 'column' (and usually 'name', 'stat', 'better')", where
            )
        unknown = sorted(set(d) - {"name", "column", "stat", "weight", "better", "unit"})
        if unknown:
            raise InputError(
                f"unknown key(s) {unknown}; allowed: name, column, stat, weight, better, unit", where
            )
        try:
            out.append(
                KpiDef(
                    name=str(d.get("name", d["column"])),
                    column=str(d["column"]),
                    stat=str(d.get("stat", "mean")),
                    weight=None if d.get("weight") is None else str(d["weight"]),
                    better=d.get("better"),
                    unit=str(d.get("unit", "")),
                )
            )
        except InputError as e:
            raise InputError(str(e).removeprefix("kpi: "), where) from None
    return out


def load_kpis(path: str | Path) -> list[KpiDef]:
    """``[[kpi]]`` tables of a TOML/JSON file (a scenario file may carry them too)."""
    path = Path(path)
    doc = read_document(path)
    if "kpi" not in doc:
        raise InputError("no [[kpi]] table", str(path))
    return kpis_from_dicts(doc["kpi"], str(path))


def merge_kpis(base: Sequence[KpiDef], extra: Sequence[KpiDef]) -> list[KpiDef]:
    """``base`` with ``extra`` added; an extra KPI with a base KPI's name replaces it."""
    names = {k.name for k in extra}
    return [k for k in base if k.name not in names] + list(extra)
