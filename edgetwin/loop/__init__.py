"""The closed loop, in the loop's order: when the twin cannot tell, ask the edge.

gate abstains → **plan** a canary → **start** it on the fleet (a signed command) → the sites serve
and guard it → **collect** its durable log → **verdict** (the twin's fleet-wide prediction rectified
by the canary's measurements) → `Twin.update` → **promote** with the verdict as evidence.

What runs *at* a site (serving a canary's arms, its guard, its spooled log) is `edgetwin.edge`;
this package is the operator's side of the loop and sits above the edge and the emulator
(DESIGN.md, layer 7). Nothing here knows whether the fleet is real: the emulated cluster is driven
as a fleet through the same wire an operator's system uses (`edgetwin.loop.fleet`).

* `edgetwin.loop.plan`: `plan_canary` → `CanaryPlan` (which groups, how many hours, within the
  operator's share × hours × loss budget; the interval the plan expects).
* `edgetwin.loop.ppi`: prediction-powered estimates of the fleet-wide effect of switching and the
  verdict on them (`ppi_estimates`, `ppi_verdict`, `combine_estimates`).
* `edgetwin.loop.verdict`: `canary_verdict`, one round's estimates per guarded KPI; `check_canary_log`.
* `edgetwin.loop.rounds`: `canary_loop`, rounds of plan → canary → `Twin.update` → verdict until a
  verdict or the budget is spent; `promote_after_canary`.
* `edgetwin.loop.fleet`: the emulated cluster as "the real system", driven through an edge
  runtime (`canary_on_cluster`).
"""

from __future__ import annotations

from edgetwin import lazy_exports

#: each public name -> the module that defines it, imported on first use (`lazy_exports`)
_WHERE = {
    "CanaryPlan": "edgetwin.loop.plan",
    "PlanBudget": "edgetwin.loop.plan",
    "canary_loop": "edgetwin.loop.rounds",
    "canary_on_cluster": "edgetwin.loop.fleet",
    "plan_canary": "edgetwin.loop.plan",
    "ppi_estimates": "edgetwin.loop.ppi",
    "ppi_verdict": "edgetwin.loop.ppi",
    "promote_after_canary": "edgetwin.loop.rounds",
}
__all__ = sorted(_WHERE)
__getattr__, __dir__ = lazy_exports(__name__, _WHERE)
