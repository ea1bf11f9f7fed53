"""The guard's bound on the arms' composition is a t bound at the groups' degrees of freedom.

With a handful of groups per arm (the demo's 5 and 5) the composition's standard error rests on a few
degrees of freedom; a normal quantile in its place let a single noisy pre-period stop a canary whose
candidate does not regress (the default demo's task time, before this). The canary computes
Welch-Satterthwaite's df with se (`Canary.composition`); the guard uses Student's t at that df.
"""

from __future__ import annotations

import math

from scipy.stats import norm, t

from edgetwin.edge.canary_guard import CanaryGuard
from edgetwin.edge.kpi_watch import KPIMargin

MARGIN = KPIMargin("kpi.x", max_regression=0.05)


def run(composition: object, ticks: int = 24) -> object:
    """A stream whose candidate arm is 20 % worse every tick (constant: the sequence is tight), with
    the given composition (offset 0): whether the guard stops depends on the composition bound."""
    guard = CanaryGuard([MARGIN], alpha=0.05, t_star=ticks)
    stop = None
    for k in range(ticks):
        jitter = 0.01 * math.sin(k)
        stop = guard.observe({"kpi.x": 1.2 + jitter}, {"kpi.x": 1.0 + jitter}, {"kpi.x": composition})
    return stop


def test_few_degrees_of_freedom_widen_the_composition_bound() -> None:
    # excess worsening ~0.2 - 0.05 = 0.15; a composition se of 0.06 is inside a normal bound
    # (z = 1.96 at alpha 0.05 / 2: 0.12) and outside a t bound at 3 df (t = 3.18: 0.19)
    z, q3 = norm.ppf(1 - 0.05 / 2), t.ppf(1 - 0.05 / 2, 3)
    assert z * 0.06 < 0.14 < q3 * 0.06
    assert run((0.0, 0.06)) is not None  # no df: normal, stops
    assert run((0.0, 0.06, math.inf)) is not None  # infinitely many df: the same
    assert run((0.0, 0.06, 3.0)) is None  # 3 df: the composition could explain it, no stop
    assert run((0.0, 0.06, 200.0)) is not None  # many groups: close to normal again

