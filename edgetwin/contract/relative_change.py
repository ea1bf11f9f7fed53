"""A relative change over a baseline that is itself uncertain: its interval by interval division.

Every guarded KPI is judged as a relative change ``(c - b) / |b|`` against a relative margin
(`edgetwin.contract.margins`). Two parts of edgetwin know the numerator far better than the
denominator: the twin's what-if (pairing cancels its level error in ``c - b`` but not in ``|b|``:
`edgetwin.twin.intervals`) and the canary's prediction-powered verdict (the fleet's baseline level
carries the twin's fleet term, the control arm's rectifier and the day-to-day spread of the level:
`edgetwin.loop.ppi.finish_estimate`). Both read the change the same way, here: the effect's interval
``[d_lo, d_hi]`` (KPI units) over every denominator ``|b|`` in ``[max(|b̂| - e, 0), |b̂| + e]``.

Why not the delta method (the loop's verdict used it before): ``rel ± z·(se_d + |rel|·se_b)/|b̂|``
evaluates the baseline's share of the error at the *estimate*'s ratio, so it is too narrow where
the effect is large and the baseline noisy, and it stays finite where the baseline may be 0. On
bivariate-normal draws (tests/test_relative_change.py) it covered a true ratio of 0.3 in 87 % of
draws at a stated 90 % with a baseline known to ±50 % (1 sd), and a true ratio of +6 % was judged
within a 5 % margin 7.6 % of the time (the tail it promises is 5 %).

Why interval division holds: each end of it is the ratio at which the linear combination
``d - r·|b|`` is on the edge of its own interval, with that combination's standard error bounded by
``se_d + |r|·se_b`` (Cauchy-Schwarz, whatever the correlation of the two estimates); it is Fieller's
interval under that bound. So judging it against a margin ``r = m`` is the test of the margin's own
hypothesis ``worsening - m·|b| <= 0`` (the guard's form, `edgetwin.edge.canary_guard`), and each
side holds at its one-sided share of the level wherever the baseline's sign is known. Where the
baseline's interval reaches 0 the ratio is unbounded on the side the effect may take (a relative
change over a baseline that may be 0 has no size), and an effect of known sign keeps its bounded
side, which the gate still decides by (`edgetwin.policies.gate_checks.check_verdict`).
"""

from __future__ import annotations

import math

__all__ = ["relative_change_interval"]


def relative_change_interval(effect_lo: float, effect_hi: float, baseline: float, error: float) -> tuple[float, float]:
    """The interval of ``effect / |b|`` for an effect in ``[effect_lo, effect_hi]`` (KPI units) and a
    real baseline ``b`` within ``error`` (KPI units, >= 0) of the estimate ``baseline``.

    The effect over every denominator in ``[max(|baseline| - error, 0), |baseline| + error]``: a
    positive end is largest over the smallest denominator, a negative one over the largest. When
    that range reaches 0, a side the effect may take is unbounded (``±inf``); an effect surely of
    one sign keeps its other end (at the largest denominator); an end of exactly 0 stays 0.
    ``error = 0`` gives ``[effect_lo, effect_hi] / |baseline|``; a baseline of exactly 0 with no
    error gives ``(-inf, inf)`` unless the effect is 0 there too (then NaN: no ratio at all).

    Returns ``(lo, hi)``, relative (0.05 = +5 %)."""
    lo, hi = float(effect_lo), float(effect_hi)
    den = abs(float(baseline))
    err = float(error) if error > 0.0 else 0.0
    near, far = den - err, den + err
    if not near > 0.0:
        if not far > 0.0:
            return (-math.inf if lo < 0 else (math.nan if lo == 0 else math.inf),
                    math.inf if hi > 0 else (math.nan if hi == 0 else -math.inf))  # fmt: skip
        return (lo / far if lo >= 0 else -math.inf), (hi / far if hi <= 0 else math.inf)
    return (lo / near if lo < 0 else lo / far), (hi / far if hi < 0 else hi / near)
