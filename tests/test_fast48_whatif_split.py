"""Issue 48 (the demo's time): the demo's what-if split between its two processes (the logging
policy's cells of most scenarios on the spare core while the policy trains, of the last
`MAIN_WHATIF_SCENARIOS` in the demo's process after the promotion, the trained policy's all on the
spare core as one task) gives the what-if `run_whatif` computes in one go."""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd
import pytest
import torch

from edgetwin import demo
from edgetwin.emulator.cluster import ClusterConfig
from edgetwin.emulator.logs import SLOAwarePolicy, generate_logs
from edgetwin.twin.twin import Twin
from edgetwin.twin.whatif import builtin_policy, fixed_policy, run_whatif
from edgetwin.twin.whatif.run import run_policy_cells

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def twin_and_recent() -> tuple[Twin, pd.DataFrame, Any]:
    config = ClusterConfig(n_agents=10, steps=96)  # a day: every shipped scenario's window fits
    log, spec = generate_logs(config, episodes=3, policy="random", seed=0)
    twin = Twin.fit(log, spec, members=1, seed=0, progress=False, population_model="empirical", response_model="bc",
                    bc_epochs=2)  # fmt: skip
    recent, _ = generate_logs(config, episodes=2, policy="random", seed=10_000)
    return twin, recent, spec


def _numbers(result: Any) -> dict[tuple[str, str, str], np.ndarray]:
    out = {(p, s, k): np.asarray(c.values[k]) for (p, s), c in result.cells.items() for k in c.values}
    out |= {(p, s, "oos"): np.asarray(c.oos_t) for (p, s), c in result.cells.items()}
    out |= {(p, s, "tl:" + k): np.asarray(v) for (p, s), c in result.cells.items() for k, v in c.timeline.items()}
    return out


def test_the_split_is_the_shipped_scenarios_in_order() -> None:
    first, last = demo._whatif_scenario_split()
    names = [s.name for s in demo._whatif_scenarios()]
    assert [s.name for s in first + last] == names
    assert len(last) == demo.MAIN_WHATIF_SCENARIOS and len(first) == len(names) - demo.MAIN_WHATIF_SCENARIOS > 0


@pytest.mark.slow  # ~23 s quiet (four what-if runs of every shipped scenario): the default run's 10-minute budget; cells run
# ahead and merged stay in it: tests/test_demo48_whatif_ahead.py::test_cells_run_ahead_give_the_same_what_if
def test_split_cells_give_the_what_if_run_in_one_go(twin_and_recent: tuple[Twin, pd.DataFrame, Any]) -> None:
    twin, recent, spec = twin_and_recent
    scenarios = list(demo._whatif_scenarios())
    kw = {"episodes": 2, "seeds": 1, "seed": 5, "log": recent}
    trained = fixed_policy("trained", SLOAwarePolicy(spec))  # one object for every episode, as an exported policy
    policies = [builtin_policy("logging", twin), trained]
    plain = run_whatif(twin, policies, scenarios, baseline="logging", progress=False, **kw)
    first, last = demo._whatif_scenario_split()
    gate_nominal = run_policy_cells(twin, builtin_policy("logging", twin), (), **kw)  # the gate's (nominal only)
    # the demo's own calls: `_whatif_ahead_task`'s on the spare core, `_whatif_main_cells`' here
    spare = gate_nominal.merged(demo._whatif_cells_ahead(twin, recent, 5, 2, include_nominal=False, scenarios=first))
    main = demo._whatif_cells_ahead(twin, recent, 5, 2, include_nominal=False, scenarios=last)
    trained_cells = run_policy_cells(twin, fixed_policy("trained", SLOAwarePolicy(spec)), scenarios, **kw)
    split = run_whatif(twin, policies, scenarios, baseline="logging", progress=False, ahead=[spare.merged(main), trained_cells],
                       **kw)  # fmt: skip
    a, b = _numbers(plain), _numbers(split)
    assert a.keys() == b.keys() and len(a) > 0
    for key in a:
        np.testing.assert_array_equal(a[key], b[key], err_msg=str(key))
    for k in plain.kpis:
        for s in scenarios:
            assert repr(plain.compare(s.name, k.name)) == repr(split.compare(s.name, k.name))
    # the check can fail: without the main process's cells the logging policy's last scenarios are
    # run again (the same numbers), but cells of another seed in their place are refused
    other = run_policy_cells(twin, builtin_policy("logging", twin), last, include_nominal=False, **{**kw, "seed": 6})
    assert other.outcomes[last[0].name][0].kpis != main.outcomes[last[0].name][0].kpis
    with pytest.raises(ValueError, match="merge"):
        spare.merged(other)
