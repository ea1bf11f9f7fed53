"""The loop plan -> canary -> update -> verdict: deterministic for a seed; a canary log of another
spec or fleet is refused."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from edgetwin.contract.errors import InputError
from edgetwin.edge.canary_loop import canary_loop, check_canary_log
from edgetwin.emulator.cluster import ClusterConfig
from edgetwin.emulator.logs import generate_logs, make_policy
from edgetwin.policies.canary_plan import PlanBudget
from edgetwin.policies.gate import Guard, resolve_policy
from edgetwin.twin.twin import Twin
from edgetwin.twin.whatif import fixed_policy

torch.set_num_threads(1)
CLUSTER = ClusterConfig(n_agents=40, steps=24)


class Constant:
    def __init__(self, spec, action):  # type: ignore[no-untyped-def]
        self.spec = spec
        self.action = np.asarray(action, dtype=np.float64)

    def act(self, obs: np.ndarray) -> np.ndarray:
        return np.tile(self.action, (len(obs), 1))


@pytest.fixture(scope="module")
def world():  # type: ignore[no-untyped-def]
    log, spec = generate_logs(CLUSTER, 2, "random", seed=0)
    twin = Twin.fit(log, spec, seed=0, members=2, progress=False, rounds=0, bc_epochs=2,
                    population_model="empirical")  # fmt: skip
    fleet, _ = generate_logs(CLUSTER, 1, "random", seed=5)
    return {"log": log, "spec": spec, "twin": twin, "fleet": fleet}


def _run(world, seed: int, rounds: int = 2):  # type: ignore[no-untyped-def]
    cand = Constant(world["spec"], [1.0, 0.3, 0.2])
    return canary_loop(
        world["twin"], world["fleet"], cand, make_policy("random", world["spec"], seed=1), CLUSTER,
        candidate_spec=fixed_policy("always-edge", cand),
        baseline_spec=resolve_policy("logging", world["twin"], name="current"),
        budget=PlanBudget(max_share=0.25), guards=[Guard("response.offload_ratio", 0.05), Guard("kpi.slo_violation", 0.05)],
        max_rounds=rounds, seed=seed, fleet_seed=5, old_logs=[world["log"]],
        update_options={"epochs": 1, "max_steps": 30}, log=lambda s: None,
    )  # fmt: skip


def test_same_seed_same_plan_and_verdict(world) -> None:  # type: ignore[no-untyped-def]
    a, b = _run(world, 0), _run(world, 0)
    assert a.gate["verdict"] == "abstain" and a.rounds  # the twin alone cannot tell: the loop ran canaries
    assert a.verdict == b.verdict and a.reason == b.reason
    assert [r.plan for r in a.rounds] == [r.plan for r in b.rounds]
    assert [r.estimates for r in a.rounds] == [r.estimates for r in b.rounds]
    r0 = a.rounds[0]
    assert r0.plan["n_groups"] <= 10 and r0.candidate_agent_steps > 0
    for c in r0.checks:  # the interval brackets the estimate; the verdict follows from it
        assert c["interval"][0] <= c["change"] <= c["interval"][1]
    if len(a.rounds) > 1:
        assert a.rounds[0].twin_updated  # the next round planned with the updated twin


def test_a_canary_log_of_another_spec_or_fleet_is_refused(world) -> None:  # type: ignore[no-untyped-def]
    fleet_ids = sorted(world["fleet"]["agent"].astype(str).unique())
    canary = world["fleet"][world["fleet"]["agent"].isin(fleet_ids[:6])].copy()
    check_canary_log(canary, world["twin"], world["fleet"], ["kpi.slo_violation"])  # its own fleet: fine
    other_fleet = world["log"][world["log"]["episode"] == 0].head(50)  # groups of another day's population
    with pytest.raises(InputError, match="another fleet"):
        check_canary_log(other_fleet, world["twin"], world["fleet"], ["kpi.slo_violation"])
    with pytest.raises(InputError, match="another spec"):
        check_canary_log(canary.assign(**{"state.foreign": 1.0}), world["twin"], world["fleet"], ["kpi.slo_violation"])
    with pytest.raises(InputError, match="lacks"):
        check_canary_log(canary.drop(columns=["kpi.slo_violation"]), world["twin"], world["fleet"], ["kpi.slo_violation"])
