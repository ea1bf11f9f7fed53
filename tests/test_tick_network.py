"""The tick's client networks run scenario by scenario on contiguous blocks (issue 47,
`edgetwin.twin.forward.GroupedForward`): the same bits as each scenario's `SplitNetwork.forward` on
its gathered rows, and a row's bits independent of how many other rows its call has, down to one.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from edgetwin.contract.policy import RandomPolicy
from edgetwin.emulator.cluster import ClusterConfig
from edgetwin.emulator.logs import generate_logs
from edgetwin.twin.forward import MIN_ROWS, ScenarioOrder
from edgetwin.twin.twin import Twin

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def twin() -> Twin:
    """A tiny twin of the emulated cluster (3 scenarios, 2 members)."""
    df, spec = generate_logs(ClusterConfig(n_agents=24, steps=12), episodes=3, seed=0)
    return Twin.fit(df, spec, members=2, seed=0, progress=False, population_model="empirical", bc_epochs=2,
                    rounds=1, world_agents=16, n_steps=12, demo_batch_size=64)


def test_the_grouped_networks_are_each_scenarios_network_to_the_bit(twin: Twin) -> None:
    sim = twin.simulation(n_agents=200, seed=2)
    pol = RandomPolicy(twin.spec, 2)
    for _ in range(2):
        sim.step(pol.act(sim.obs()))
    w = sim.world
    za = twin.layout.scalers["action"].transform(sim.legal_action(pol.act(sim.obs())))
    agent_x = w.client_agent_inputs(za)
    order = ScenarioOrder.of(w.scenario_rows(), w.n)
    assert len(order.groups) == 3 and np.array_equal(order.perm[order.pos], np.arange(w.n))
    site_x = w.client_site_inputs()
    with torch.no_grad():
        for m in range(twin.n_members):
            got = sim._grouped(m, order, np.ascontiguousarray(agent_x[order.perm]),
                               np.ascontiguousarray(w.site[order.perm], np.int64), site_x, None)[order.pos]
            for s, idx in w.scenario_rows():
                want = sim._split_forward(m, s, agent_x[idx], w.site[idx], site_x, None)
                assert got[idx].tobytes() == want.tobytes()


@pytest.mark.parametrize("fused", [True, False])
def test_one_agent_at_a_time_is_the_whole_tick_to_the_bit(twin: Twin, fused: bool) -> None:
    """The per-agent environment's path (`respond` of one row) against a tick of every agent: torch's
    GEMM rounds 1-3 rows otherwise, so blocks under `MIN_ROWS` rows are padded."""
    whole = twin.simulation(n_agents=30, seed=7, stochastic=False, member=0)
    single = twin.simulation(n_agents=30, seed=7, stochastic=False, member=0)
    whole.use_fused = single.use_fused = fused
    pol = RandomPolicy(twin.spec, 7)
    for _ in range(3):
        a = np.asarray(pol.act(whole.obs()), np.float64)
        r = whole.step(a, with_disagreement=True)
        parts = [single.respond(np.array([j]), a[j : j + 1], with_disagreement=True) for j in range(whole.n)]
        nxt = single.end_tick()
        for k, got in enumerate(np.concatenate([p[k] for p in parts]) for k in range(3)):
            want = (r.outputs, r.reward, r.disagreement)[k]
            assert got.tobytes() == want.tobytes(), k
        assert nxt.tobytes() == r.next_state.tobytes()
    # blocks of 2 and of MIN_ROWS + 1 rows too
    for rows in (np.array([3, 11]), np.arange(MIN_ROWS + 1)):
        a = np.asarray(pol.act(whole.obs()), np.float64)
        want = whole.respond(np.arange(whole.n), a, with_disagreement=False)[0][rows]
        got = single.respond(rows, a[rows], with_disagreement=False)[0]
        assert got.tobytes() == want.tobytes()
