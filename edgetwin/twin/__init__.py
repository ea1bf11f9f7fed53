"""The `Twin`: a learned simulator of the logged system, and everything a user asks of it.

* `edgetwin.twin.twin`: `Twin` (``fit`` / ``save`` / ``load``, ``sample_population``, ``make_env``,
  ``rollout``) and `load_log`.
* `edgetwin.twin.member`: one ensemble member's fitted models; `edgetwin.twin.support`: how far a
  row or a generated profile is from the logs.
* `edgetwin.twin.simulation`: `Simulation`, the batched world under every env, rollout and what-if.
* `edgetwin.twin.envs`: the Gymnasium, SB3 VecEnv and PettingZoo environments over a twin.
* `edgetwin.twin.fidelity`: how well a twin reproduces held-out logs (`fidelity_report`).
* `edgetwin.twin.whatif`: what-ifs (perturbations, scenarios, KPIs, the engine, results).
* `edgetwin.twin.report`: the what-if report (HTML + PNG).
* `edgetwin.twin.policy_calibration`: intervals of a policy's value calibrated on the cross-fitted
  values of the policies the log holds (regimes, randomized arms).

The twin builds on `edgetwin.generative` (who shows up) and `edgetwin.imitation` (how they respond)
and never imports `policies`, `emulator`, `edge` or `federation`.
"""

from __future__ import annotations

from edgetwin import lazy_exports

#: each public name -> the module that defines it, imported on first use (`lazy_exports`)
_WHERE = {
    "KpiDef": "edgetwin.twin.whatif",
    "Scenario": "edgetwin.twin.whatif",
    "Simulation": "edgetwin.twin.simulation",
    "Twin": "edgetwin.twin.twin",
    "TwinEnv": "edgetwin.twin.envs",
    "TwinParallelEnv": "edgetwin.twin.envs",
    "TwinVecEnv": "edgetwin.twin.envs",
    "WhatIfResult": "edgetwin.twin.whatif",
    "cross_fitted_policy_values": "edgetwin.twin.policy_calibration",
    "fidelity_report": "edgetwin.twin.fidelity",
    "load_kpis": "edgetwin.twin.whatif",
    "load_log": "edgetwin.twin.twin",
    "load_scenarios": "edgetwin.twin.whatif",
    "policy_value_calibration": "edgetwin.twin.policy_calibration",
    "run_whatif": "edgetwin.twin.whatif",
    "write_report": "edgetwin.twin.report",
}
__all__ = sorted(_WHERE)
__getattr__, __dir__ = lazy_exports(__name__, _WHERE)
