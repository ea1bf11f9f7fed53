"""The gate's calibrated change interval stays within what its calibration measured and the KPI's range.

On tests/test_canary_loop.py's small twin (40 groups x 2 days, 2 members, no MAIL rounds) the interval of
a candidate's offload change went from [-25.4 %, +26.6 %] to [-412 %, +414 %] with the members' output
noise model: both members replay the logged day 0.0001 apart on an offload ratio the log had 49 % lower,
so the normalised multiple (level error / members' level spread) read 1,502, and times the members'
0.27-point spread of the candidate's change it gave +-4.1, past the physical bound. A KPI's declared
range (the spec's bounds of its column, `default_kpis`) now clips its change's interval
(`WhatIfResult.compare`). The hybrid's normalised term itself is kept (see `change_interval`).
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from edgetwin.twin.intervals import calibration_from_arrays, change_interval
from edgetwin.twin.whatif.results import _within_range


def _small_twin_arrays() -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """``(M=2, R=1)`` values as the small twin gave them: the logged replay (members 0.0001 apart), its
    truth, and the baseline's and candidate's replays (members' changes 0.83 % and 0.44 %)."""
    logged = np.array([[0.42600], [0.42614]])
    truth = np.array([0.28625])
    base = np.array([[0.42578], [0.42597]])
    cand = np.array([[0.42931], [0.42785]])
    return logged, truth, base, cand


def test_a_collapsed_members_spread_is_bounded_by_the_kpis_declared_range() -> None:
    logged, truth, base, cand = _small_twin_arrays()
    cal = calibration_from_arrays({"offload": logged}, {"offload": truth})
    assert cal.quantile_norm["offload"] > 1000  # the cause: a level error over a near-zero members' spread
    c, b = float(cand.mean()), float(base.mean())
    mid = (c - b) / abs(b)
    lo, hi = change_interval((mid - 0.002, mid + 0.002), cand, base, cal, "offload")
    assert hi - lo > 7.0  # +-3.9 here (+-4.1 on the twin): the normalised multiple times the spread of the change
    # an offload ratio in [0, 1] at 0.426 can fall by at most 100 % and rise by at most 135 %
    lo2, hi2 = _within_range((lo, hi), b, 0.0, 1.0)
    assert lo2 == pytest.approx(-1.0) and hi2 == pytest.approx(1.0 / b - 1.0)
    assert math.isfinite(lo2) and lo2 <= mid <= hi2


def test_a_kpis_declared_range_bounds_its_change() -> None:
    # a non-negative KPI cannot fall by more than 100 %; a ratio in [0, 1] at 0.4 cannot rise past +150 %
    assert _within_range((-4.12, 4.13), 0.4, 0.0, 1.0) == pytest.approx((-1.0, 1.5))
    assert _within_range((-0.2, 0.3), 0.4, 0.0, 1.0) == (-0.2, 0.3)  # inside: untouched
    assert _within_range((-4.0, 4.0), 0.4, None, None) == (-4.0, 4.0)  # nothing declared: nothing clipped


def test_default_kpis_carry_the_specs_declared_bounds() -> None:
    from edgetwin.emulator.cluster import ClusterConfig, cluster_spec
    from edgetwin.twin.whatif import default_kpis

    spec = cluster_spec(ClusterConfig(n_agents=10, steps=4))
    outputs = [f.name for f in spec.features if f.role in ("response", "kpi")]
    ks = {k.name: k for k in default_kpis(spec, outputs)}
    for name in outputs:
        f = spec.feature(name)
        assert (ks[name].low, ks[name].high) == (f.low, f.high)
    assert ks["return"].low is None and ks["return"].high is None  # a sum over a day: no declared range


@pytest.mark.slow
def test_the_small_twins_gate_interval_is_within_the_physical_range() -> None:
    """tests/test_canary_loop.py's twin and clearly worse candidate: the offload change's interval is
    within what an offload ratio in [0, 1] allows (it was [-412 %, +414 %])."""
    import torch

    from edgetwin.emulator.cluster import ClusterConfig
    from edgetwin.emulator.logs import generate_logs
    from edgetwin.policies.gate import Guard, resolve_policy, run_gate
    from edgetwin.twin.twin import Twin
    from edgetwin.twin.whatif import fixed_policy

    torch.set_num_threads(1)
    cluster = ClusterConfig(n_agents=40, steps=24)
    log, spec = generate_logs(cluster, 2, "random", seed=0)
    twin = Twin.fit(log, spec, seed=0, members=2, progress=False, rounds=0, bc_epochs=2,
                    population_model="empirical")  # fmt: skip
    fleet, _ = generate_logs(cluster, 1, "random", seed=5)

    class Constant:
        def act(self, obs: np.ndarray) -> np.ndarray:
            return np.tile([1.0, 0.05, 0.0], (len(obs), 1))

    d = run_gate(twin, fixed_policy("edge-no-capacity", Constant()), resolve_policy("logging", twin, name="current"),
                 log=fleet, guards=[Guard("response.offload_ratio", 0.05), Guard("kpi.slo_violation", 0.05)],
                 episodes=4, seed=0)  # fmt: skip
    c = d.result.compare("nominal", "response.offload_ratio")
    lo, hi = c["change_interval"]
    assert -1.0 <= lo <= c["change"] <= hi <= 1.0 / c["baseline"] - 1.0 + 1e-12
    check = next(k for k in d.checks if k.kpi == "response.offload_ratio")
    assert check.interval == [lo, hi]  # the gate reads the bounded interval
