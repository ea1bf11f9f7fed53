"""The first look's day term (issue 48): a bound on the part of the fleet-wide change's
day-to-day spread that the logs' baseline level cannot reveal (`unrevealed_day_bound`), and how
canaries on several days let their own between-day spread replace it (`pooled_day_term`).

`edgetwin.loop.verdict.calibrated_day_variance` carries the bound at the first look;
`edgetwin.loop.ppi.with_day_term` pools with `pooled_day_term`, and the plan counts its days with it
(`edgetwin.loop.plan.pooled_terms`, reading the revealed part with `revealed_day_variance`). Plain
arithmetic on variances (KPI units squared): no import of the loop, so that all three can read it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

__all__ = ["pooled_day_term", "revealed_day_variance", "unrevealed_day_bound"]


def unrevealed_day_bound(level_var: float, base_mean: float, change_mean: float) -> float:
    """The first look's bound on one day's variance of the fleet-wide change (KPI units squared):
    ``level_var · (1 + (c̄ / b̄)²)``, with ``level_var`` the baseline level's day-to-day variance as
    the logs show it, ``b̄`` the baseline's mean level and ``c̄ = b̄ + change_mean`` the candidate's.

    Why: the level's spread reveals only the part of the change's day spread that moves with the
    level (`calibrated_day_variance`'s scaling); a candidate whose effect is different on some days
    (on the emulated cluster: ten times its usual size on the days the fleet congests) moves the
    change in a way no log of the current policy shows, and one canary day shows no spread at
    all. What bounds it is observable only under two weak assumptions: the candidate's level moves
    from day to day by the same relative amount as the current policy's (``ρ² = level_var / b̄²``,
    observed), and a day that raises one policy's level does not lower the other's (correlation
    >= 0; both serve the same day's demand). Then ``var(C_d − B_d) <= ρ²·(c̄² + b̄²)``, whatever
    the correlation's size. On the emulated cluster's 20 truth days it holds for 77 of 84
    (candidate, KPI, seed) triples (docs/benchmarks/closed_loop/README.md, the day-term section),
    against 20 of 84 for the calibrated term alone. A zero baseline mean (no relative spread to
    carry): ``2·level_var``, the same bound with ``c̄ = b̄``."""
    lv = max(float(level_var), 0.0)
    ratio = (float(base_mean) + float(change_mean)) / float(base_mean) if base_mean else 1.0
    return lv * (1.0 + ratio * ratio) if math.isfinite(ratio) else 2.0 * lv


def pooled_day_term(first: float, revealed: float, tau2: float, days: int, first_df: float) -> tuple[float, float]:
    """One day's variance of the change a verdict pooled over canaries on ``days`` distinct days
    carries, and its degrees of freedom: the largest of the revealed part (``revealed``, the twin's
    calibrated replay, on ``first_df``), the rounds' own between-day variance (``tau2``,
    `edgetwin.loop.ppi.between_day_variance`, on ``days − 1``) and their blend with the first
    look's bound ``first`` (`calibrated_day_variance`) counted as one day's evidence,
    ``(first + (days − 1)·tau2) / days`` (its degrees of freedom Welch-Satterthwaite's over the two
    parts). ``days < 2``: ``(first, first_df)``, the first look's term.

    Why a blend and not the larger of the bound and ``tau2``: the bound is what one day must carry
    because nothing about the candidate's own days is measured yet; it is not evidence that the
    change moves that much (on the emulated cluster it is about 3x the truth's spread in sd at the
    median), and kept whole it would never let canaries on more days decide more than the first
    one. Counted as one pseudo-day it is outweighed by the candidate's own days as they come, while
    over 2-4 days, where Paule-Mandel's ``tau²`` is 0 more often than not even when the days differ,
    it still keeps most of the first look's caution. The revealed part stays a floor, as the twin's
    term was (`edgetwin.loop.ppi.with_day_term`): the rounds may not argue it away."""
    first, revealed, tau2 = max(float(first), 0.0), max(float(revealed), 0.0), max(float(tau2), 0.0)
    if days < 2:
        return first, float(first_df)
    blend = (first + (days - 1) * tau2) / days
    best = max(revealed, tau2, blend)
    if best == revealed and revealed >= blend:
        return revealed, float(first_df)
    if best == tau2 and tau2 >= blend:
        return tau2, float(days - 1)
    return blend, _welch_df2((first / days, float(first_df)), ((days - 1) * tau2 / days, float(days - 1)))


def revealed_day_variance(day_var: Mapping[str, Sequence[float]] | None, column: str) -> float:
    """The part of ``column``'s first-look day term (KPI units squared) the logs' level reveals (the
    twin's calibrated replay, `edgetwin.loop.verdict.DayVariance`'s ``revealed``), which the verdict
    stamps on its rounds (`edgetwin.loop.verdict.stamp_revealed`) and `pooled_day_term` keeps as a
    floor; the plan reads it here (`edgetwin.loop.plan.kpi_terms`). A plain map without it: the
    term itself (nothing known to be a bound: it stays whole, as `edgetwin.loop.ppi.with_day_term`
    reads a round without the stamp); 0 for a column it lacks."""
    got = (day_var or {}).get(column)
    if got is None:
        return 0.0
    revealed = getattr(day_var, "revealed", None) or {}
    return float(revealed[column]) if column in revealed else float(got[0])


def _welch_df2(a: tuple[float, float], b: tuple[float, float]) -> float:
    """Welch-Satterthwaite degrees of freedom of the sum of two independent variance terms
    ``(v, df)`` (`edgetwin.loop.ppi.welch_df`'s formula, here so that this module imports nothing
    of the loop: ``ppi`` reads it)."""
    tot = a[0] + b[0]
    den = sum(v * v / d for v, d in (a, b) if math.isfinite(d) and d > 0 and v > 0)
    if not (tot > 0 and math.isfinite(tot)):
        return float("inf")
    return float(tot * tot / den) if den > 0 else float("inf")
