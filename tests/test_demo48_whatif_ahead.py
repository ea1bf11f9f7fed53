"""Issue 48 (the demo's time): one policy's what-if cells run ahead (`run_policy_cells`, the demo's
logging policy on its spare core while the candidate trains) give `run_whatif` the numbers it
computes itself; cells run with other arguments are refused, not mixed in."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch

from edgetwin.contract.errors import InputError
from edgetwin.emulator.cluster import ClusterConfig
from edgetwin.emulator.logs import generate_logs
from edgetwin.twin.twin import Twin
from edgetwin.twin.whatif import builtin_policy, load_scenarios, run_whatif
from edgetwin.twin.whatif.run import run_policy_cells
from tests.test_whatif import DATA

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def twin_and_recent() -> tuple[Twin, pd.DataFrame]:
    config = ClusterConfig(n_agents=20, steps=48)  # 12 h: the edge-failure window (07:30-10:30) fits
    log, spec = generate_logs(config, episodes=3, policy="random", seed=0)
    twin = Twin.fit(log, spec, members=2, seed=0, progress=False, population_model="empirical", response_model="bc",
                    bc_epochs=2)  # fmt: skip
    recent, _ = generate_logs(config, episodes=2, policy="random", seed=10_000)
    return twin, recent


def _numbers(result: object) -> dict[tuple[str, str, str], np.ndarray]:
    cells = result.cells  # type: ignore[attr-defined]
    out = {(p, s, k): np.asarray(c.values[k]) for (p, s), c in cells.items() for k in c.values}
    out |= {(p, s, "oos"): np.asarray(c.oos_t) for (p, s), c in cells.items()}
    return out


def test_cells_run_ahead_give_the_same_what_if(twin_and_recent: tuple[Twin, pd.DataFrame]) -> None:
    twin, recent = twin_and_recent
    scenarios = [s for s in load_scenarios(DATA / "emulated_cluster.toml") if s.name == "edge-failure-fra"]
    kw = {"episodes": 2, "seeds": 1, "seed": 5, "log": recent}
    policies = [builtin_policy("logging", twin), builtin_policy("random", twin)]
    plain = run_whatif(twin, policies, scenarios, baseline="logging", progress=False, **kw)
    ahead = run_policy_cells(twin, builtin_policy("logging", twin), scenarios, **kw)
    assert ahead.policy == "logging" and len(ahead.outcomes) == 2  # nominal + the scenario
    reused = run_whatif(twin, policies, scenarios, baseline="logging", progress=False, ahead=[ahead], **kw)
    a, b = _numbers(plain), _numbers(reused)
    assert a.keys() == b.keys()
    for key in a:
        np.testing.assert_array_equal(a[key], b[key], err_msg=str(key))
    for k in plain.kpis:  # the paired comparisons the report prints (repr: a NaN equals itself)
        assert repr(plain.compare("nominal", k.name)) == repr(reused.compare("nominal", k.name))
    # the comparison can fail: cells of another seed give other numbers, and are refused
    other = run_policy_cells(twin, builtin_policy("logging", twin), scenarios, **{**kw, "seed": 6})
    assert other.outcomes["nominal"][0].kpis != ahead.outcomes["nominal"][0].kpis
    with pytest.raises(InputError, match="not this what-if's"):
        run_whatif(twin, policies, scenarios, baseline="logging", progress=False, ahead=[other], **kw)


def test_the_gates_cells_run_ahead_give_the_same_decision(twin_and_recent: tuple[Twin, pd.DataFrame]) -> None:
    """The demo's gate: the logging policy's and the log's own actions' cells (nominal) run ahead, the
    candidate's run by the gate; the decision and its reason are the gate's own."""
    from edgetwin.policies.gate import run_gate

    twin, recent = twin_and_recent
    kw = {"episodes": 2, "seeds": 1, "seed": 5, "log": recent}
    cand, base = builtin_policy("random", twin), builtin_policy("logging", twin)
    plain = run_gate(twin, cand, base, **kw)
    cells = [run_policy_cells(twin, builtin_policy(n, twin), **kw) for n in ("logging", "logged")]
    reused = run_gate(twin, cand, base, ahead=cells, **kw)
    assert (plain.verdict, plain.reason()) == (reused.verdict, reused.reason())
    # only the nominal cells ran ahead: a what-if with more scenarios runs the others itself
    scenarios = [s for s in load_scenarios(DATA / "emulated_cluster.toml") if s.name == "edge-failure-fra"]
    whole = run_whatif(twin, [base, cand], scenarios, baseline="logging", progress=False, **kw)
    part = run_whatif(twin, [base, cand], scenarios, baseline="logging", progress=False, ahead=cells[:1], **kw)
    a, b = _numbers(whole), _numbers(part)
    assert a.keys() == b.keys() and all(np.array_equal(a[k], b[k], equal_nan=True) for k in a)
