"""The fused tick (issue 47): a twin's element-wise passes compiled into a few numba loops per row
(`edgetwin.twin.fused.FusedTick`) must give the numpy passes' numbers to the bit, tick after tick,
with and without the response noise, whole or agent by agent, and stand aside where it does not apply.
"""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

from edgetwin.contract.policy import RandomPolicy
from edgetwin.twin.forward import MIN_ROWS, ScenarioOrder
from edgetwin.twin.fused import FusedTick
from edgetwin.twin.simulation import Simulation
from edgetwin.twin.twin import Twin

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def twin(tiny_cluster_twin: Twin) -> Twin:
    """A tiny twin of the emulated cluster: declared dynamics, site-level state, a clock, echoes,
    log-scaled outputs and states, a weighted reward: every branch of the fused passes."""
    return copy.deepcopy(tiny_cluster_twin)  # the session's fit (conftest), this file's own copy


def _pair(twin: Twin, n: int, stochastic: bool) -> tuple[Simulation, Simulation]:
    fused = twin.simulation(n_agents=n, seed=4, stochastic=stochastic, member=1)
    plain = twin.simulation(n_agents=n, seed=4, stochastic=stochastic, member=1)
    plain.use_fused = False
    assert fused.fused_tick() is not None and plain.fused_tick() is None
    return fused, plain


@pytest.mark.parametrize("stochastic", [True, False])
def test_a_fused_tick_is_the_numpy_tick_to_the_bit(twin: Twin, stochastic: bool) -> None:
    fused, plain = _pair(twin, 120, stochastic)
    pol = RandomPolicy(twin.spec, 3)
    for t in range(8):
        a = np.asarray(pol.act(fused.obs()), np.float64)
        if t == 2:
            a = a * 3.0 - 1.0  # outside the bounds: clipped the same way
        if t == 4:
            a[:7] = np.nan  # NaN actions go through the same max / min
        got, want = fused.step(a, with_disagreement=t % 2 == 0), plain.step(a, with_disagreement=t % 2 == 0)
        for k in ("obs", "action", "outputs", "next_state", "reward", "disagreement"):
            assert getattr(got, k).tobytes() == getattr(want, k).tobytes(), (t, k)
        assert fused.world.lag.tobytes() == plain.world.lag.tobytes()
        assert fused.world.zstate().tobytes() == plain.world.zstate().tobytes()
        assert np.asarray(fused.world.model_zstate(), np.float64).tobytes() == np.asarray(
            plain.world.model_zstate(), np.float64).tobytes()
    assert np.isnan(got.outputs).any() or np.isfinite(got.outputs).all()


def test_a_fused_tick_in_parts_with_overridden_outputs_is_the_numpy_one(twin: Twin) -> None:
    """`respond` on row subsets, `override_outputs` and `end_tick` (the what-if engine's and the
    per-agent environment's path) fused and not: the same bits."""
    fused, plain = _pair(twin, 60, True)
    pol = RandomPolicy(twin.spec, 5)
    parts = (np.arange(0, 60, 3), np.arange(1, 60, 3), np.arange(2, 60, 3))
    for _ in range(4):
        a = np.asarray(pol.act(fused.obs()), np.float64)
        for sim in (fused, plain):
            outs = [sim.respond(p, a[p], with_disagreement=False) for p in parts]
            sim.override_outputs(np.arange(4), np.full((4, len(twin.layout.outputs)), 0.5))
            sim.kept = (outs, sim.end_tick())  # type: ignore[attr-defined]
        for (fo, fr, _), (po, pr, _) in zip(fused.kept[0], plain.kept[0], strict=True):  # type: ignore[attr-defined]
            assert fo.tobytes() == po.tobytes() and fr.tobytes() == pr.tobytes()
        assert fused.kept[1].tobytes() == plain.kept[1].tobytes()  # type: ignore[attr-defined]


def test_a_fused_rollout_is_the_same_for_the_same_seed(twin: Twin) -> None:
    runs = [twin.simulation(n_agents=50, seed=9).run(RandomPolicy(twin.spec, 9), steps=5).frame for _ in range(2)]
    assert runs[0].equals(runs[1])


def test_the_numpy_passes_run_where_the_fused_ones_do_not_apply(twin: Twin) -> None:
    assert FusedTick.of(twin, 0) is not None
    other = copy.copy(twin)
    other.layout = copy.deepcopy(twin.layout)
    sc = other.layout.scalers["outputs"]
    sc.values = [None] * (sc.width - 1) + [np.array([0.0, 1.0])]  # a discrete output: snapping is not a clip
    assert FusedTick.of(other, 0) is None
    other.layout = copy.deepcopy(twin.layout)
    other.layout.spec = copy.copy(twin.layout.spec)
    object.__setattr__(other.layout.spec, "reward_weights", {"kpi.no_such_column": 1.0})
    assert FusedTick.of(other, 0) is None
    # a reward that replaces the spec's (training with another reward or constraints) is called
    sim = twin.simulation(n_agents=10, seed=0, member=0)
    assert sim.fused_tick() is not None
    calls: list[int] = []
    sim._reward_fn = lambda cols: calls.append(1) or np.zeros(len(next(iter(cols.values()))))
    assert sim.fused_tick() is None
    sim.step(RandomPolicy(twin.spec, 0).act(sim.obs()))
    assert calls


def test_a_pickled_fused_tick_carries_its_constants_not_its_work_arrays(twin: Twin) -> None:
    import pickle

    sim = twin.simulation(n_agents=30, seed=2, member=0)
    pol = RandomPolicy(twin.spec, 2)
    sim.step(pol.act(sim.obs()))
    fused = sim.fused_tick()
    assert fused is not None
    blob = pickle.dumps(fused)
    assert b"_scratch_memo" not in blob
    again = pickle.loads(blob)
    for got, want in zip(again.state_z(sim.world.state), fused.state_z(sim.world.state), strict=True):
        assert got.tobytes() == want.tobytes()


# ------------------------------------------------------------------ the networks by scenario block
# (`edgetwin.twin.forward`): the same bits as each scenario's `SplitNetwork.forward` on its gathered
# rows, and a row's bits independent of how many other rows its call has, down to one.


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


def test_a_world_not_site_by_site_runs_the_same_fused_and_not(twin: Twin) -> None:
    """A placed world whose agents are not grouped by site (a log's, a what-if's): the site means take
    `World.site_means`, not the compiled runs; fused and numpy passes still agree to the bit."""
    from edgetwin.imitation.world import World

    fused, plain = _pair(twin, 80, True)
    order = np.random.default_rng(3).permutation(80)
    for sim in (fused, plain):
        w = sim.world
        sim.place(World(w.layout, w.scenario[order], w.site[order], w.profile[order], w.state[order], w.lag.copy()))
    ft = fused.fused_tick()
    assert ft is not None and ft._site_runs(fused.world) is None
    pol = RandomPolicy(twin.spec, 8)
    for _ in range(3):
        a = np.asarray(pol.act(fused.obs()), np.float64)
        got, want = fused.step(a, with_disagreement=True), plain.step(a, with_disagreement=True)
        for k in ("outputs", "next_state", "reward", "disagreement"):
            assert getattr(got, k).tobytes() == getattr(want, k).tobytes(), k
        assert fused.world.lag.tobytes() == plain.world.lag.tobytes()


def test_a_copied_simulation_steps_as_the_original(twin: Twin) -> None:
    """Its kept work arrays (the networks' blocks, the scenario order) are copied with it, not shared."""
    sim = twin.simulation(n_agents=40, seed=6, member=0)
    pol = RandomPolicy(twin.spec, 6)
    sim.step(pol.act(sim.obs()))
    again = copy.deepcopy(sim)
    for _ in range(2):
        a = pol.act(sim.obs())
        assert sim.step(a).outputs.tobytes() == again.step(a).outputs.tobytes()


def test_responding_for_no_agent_changes_nothing(twin: Twin) -> None:
    sim = twin.simulation(n_agents=12, seed=1, stochastic=False, member=0)
    ref = twin.simulation(n_agents=12, seed=1, stochastic=False, member=0)
    a = np.asarray(RandomPolicy(twin.spec, 1).act(sim.obs()), np.float64)
    out, reward, dis = sim.respond(np.zeros(0, np.int64), a[:0])
    assert out.shape == (0, len(twin.layout.outputs)) and reward.shape == dis.shape == (0,)
    assert sim.step(a).next_state.tobytes() == ref.step(a).next_state.tobytes()
