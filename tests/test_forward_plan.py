"""`GroupedForward`'s planned calls (issue 47): a tick's network calls are planned once and replayed;
the replay must give `SplitNetwork.forward`'s bits for every scenario block, see weights changed in
place, and be rebuilt when the call's arrays change."""

from __future__ import annotations

import numpy as np
import torch as th

from edgetwin.imitation.mail import _np_tanh
from edgetwin.imitation.split import SplitNetwork
from edgetwin.twin.forward import MIN_ROWS, GroupedForward, ScenarioOrder

th.set_num_threads(1)
P, A, W, H, OUT = 5, 4, 6, 16, 7


def _net(seed: int) -> SplitNetwork:
    g = th.Generator().manual_seed(seed)
    layers = [
        (th.randn(H, P + A + W, generator=g), th.randn(H, generator=g)), _np_tanh,
        (th.randn(H, H, generator=g), th.randn(H, generator=g)), _np_tanh,
        (th.randn(OUT, H, generator=g), None),
    ]
    return SplitNetwork(layers, P, A)


def _call(rng: np.random.Generator, sizes: tuple[int, ...], n_sites: int = 5) -> tuple:
    n = sum(sizes)
    scen = rng.permutation(np.repeat(np.arange(len(sizes)), sizes))
    groups = [(s, np.flatnonzero(scen == s)) for s in range(len(sizes))]
    order = ScenarioOrder.of(groups, n)
    nets = [_net(s) for s in range(len(sizes))]
    agent_x = rng.standard_normal((n, A)).astype(np.float32)
    profile = rng.standard_normal((n, P)).astype(np.float32)
    with th.no_grad():
        hps = [net.profile_part(profile[idx]) for net, (_, idx) in zip(nets, groups, strict=True)]
    site_x = rng.standard_normal((n_sites, W)).astype(np.float32)
    sites = rng.integers(0, n_sites, n)
    return nets, order, np.ascontiguousarray(agent_x[order.perm]), hps, site_x, np.ascontiguousarray(sites[order.perm])


def _want(nets: list[SplitNetwork], order: ScenarioOrder, agent_x: np.ndarray, hps: list[np.ndarray],
          site_x: np.ndarray, sites: np.ndarray) -> np.ndarray:
    """Each block through its `SplitNetwork.forward`, a block under `MIN_ROWS` rows padded (its last
    row repeated; torch's small-GEMM kernel rounds otherwise, `edgetwin.twin.forward`)."""
    out = []
    with th.no_grad():
        for net, hp, (a, b) in zip(nets, hps, order.bounds, strict=True):
            keep = np.minimum(np.arange(max(MIN_ROWS, b - a)), b - a - 1)
            y = net.forward(agent_x[a:b][keep].copy(), hp[keep], net.site_part(site_x), sites[a:b][keep])
            out.append(y[: b - a])
    return np.concatenate(out)


def test_a_planned_call_is_each_scenarios_network_to_the_bit_tick_after_tick() -> None:
    rng = np.random.default_rng(0)
    nets, order, agent_x, hps, site_x, sites = _call(rng, (40, 23, 57))
    fw = GroupedForward()
    with th.no_grad():
        for tick in range(3):  # the same arrays, new values in them each tick (as the fused tick's)
            agent_x[:] = rng.standard_normal(agent_x.shape)
            site_x = rng.standard_normal(site_x.shape).astype(np.float32)
            got = fw.run(nets, order, agent_x, hps, site_x, sites).copy()
            assert got.tobytes() == _want(nets, order, agent_x, hps, site_x, sites).tobytes(), tick
    assert 0 in fw._plans  # the calls were planned, not made block by block


def test_a_plan_sees_weights_changed_in_place_and_new_arrays() -> None:
    rng = np.random.default_rng(1)
    nets, order, agent_x, hps, site_x, sites = _call(rng, (30, 30))
    fw = GroupedForward()
    with th.no_grad():
        before = fw.run(nets, order, agent_x, hps, site_x, sites).copy()
        nets[0].layers[0][0].mul_(0.5)  # the first layer (its blocks are copies: the plan is rebuilt)
        nets[1].layers[2][0].add_(0.25)  # a later layer (the plan holds a view of it)
        got = fw.run(nets, order, agent_x, hps, site_x, sites).copy()
        assert got.tobytes() != before.tobytes()
        assert got.tobytes() == _want(nets, order, agent_x, hps, site_x, sites).tobytes()
        w, b = nets[0].layers[4]
        nets[0].layers[4] = (w * 2.0, b)  # a layer replaced by another tensor: another plan
        got = fw.run(nets, order, agent_x, hps, site_x, sites).copy()
        assert got.tobytes() == _want(nets, order, agent_x, hps, site_x, sites).tobytes()
        other = agent_x.copy() + 1.0  # another array: another plan
        got = fw.run(nets, order, other, hps, site_x, sites).copy()
        assert got.tobytes() == _want(nets, order, other, hps, site_x, sites).tobytes()


def test_a_block_under_min_rows_runs_padded_without_a_plan() -> None:
    rng = np.random.default_rng(2)
    nets, order, agent_x, hps, site_x, sites = _call(rng, (MIN_ROWS - 5, 20))
    fw = GroupedForward()
    with th.no_grad():
        got = fw.run(nets, order, agent_x, hps, site_x, sites).copy()
    assert got.tobytes() == _want(nets, order, agent_x, hps, site_x, sites).tobytes()
    assert not fw._plans


def test_a_copied_forward_with_its_arrays_is_not_replayed_on_stale_views() -> None:
    """A deep copy (or a pickle) of a `GroupedForward` together with the arrays it was called with:
    a plan's numpy views of its torch work arrays would be separate copies there, so the copy keeps
    no plan and builds its own."""
    import copy

    rng = np.random.default_rng(3)
    call = _call(rng, (25, 31))
    fw = GroupedForward()
    with th.no_grad():
        fw.run(*call)
        fw2, call2 = copy.deepcopy((fw, call))
        assert not fw2._plans
        call2[2][:] = rng.standard_normal(call2[2].shape)  # new values in the copied inputs
        got = fw2.run(*call2).copy()
    assert got.tobytes() == _want(*call2).tobytes()
