"""A twin's tick at the emulator's speed (issue 38): the client network's first layer split by what
its inputs vary with (`edgetwin.imitation.split.SplitNetwork`), and what that changes in the numbers.

The split path must see exactly the inputs the assembled path sees (the same bits, column block by
column block), give the assembled network's outputs within float32 rounding, keep a row's bits
independent of the other rows (checked by tests/test_scale.py's whole-vs-parts tick), follow
weights changed in place, and stay deterministic.
"""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

from edgetwin.contract.policy import RandomPolicy
from edgetwin.imitation.mail import numpy_forward
from edgetwin.imitation.split import SplitNetwork
from edgetwin.twin.twin import Twin

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def twin(tiny_cluster_twin: Twin) -> Twin:
    """A tiny twin of the emulated cluster: declared dynamics, site-level state, a clock, echoes."""
    return copy.deepcopy(tiny_cluster_twin)  # the session's fit (conftest), this file's own copy


def _ticked(twin: Twin, n: int = 90, ticks: int = 3):
    sim = twin.simulation(n_agents=n, seed=5)
    pol = RandomPolicy(twin.spec, 2)
    for _ in range(ticks):
        sim.step(pol.act(sim.obs()))
    action = sim.legal_action(pol.act(sim.obs()))
    return sim, action, sim.layout.scalers["action"].transform(action)


def test_the_split_inputs_are_the_client_inputs_column_blocks(twin: Twin) -> None:
    sim, action, za = _ticked(twin)
    w, lay = sim.world, sim.layout
    p, sa = len(lay.profile), len(lay.state) + len(lay.action)
    x = w.client_inputs(action, za=za)
    assert w.client_agent_inputs(za).tobytes() == np.ascontiguousarray(x[:, p : p + sa]).tobytes()
    assert w.client_site_inputs()[w.site].tobytes() == np.ascontiguousarray(x[:, p + sa :]).tobytes()
    rows = np.array([3, 17, 40, 41, 88])
    assert w.client_agent_inputs(za[rows], rows).tobytes() == np.ascontiguousarray(x[rows, p : p + sa]).tobytes()


def test_the_split_network_is_the_network_within_float32_rounding(twin: Twin) -> None:
    sim, action, za = _ticked(twin)
    w = sim.world
    x = w.client_inputs(action, za=za)
    with torch.no_grad():
        for s, idx in w.scenario_rows():
            for m in range(twin.n_members):
                model = twin.member_models[m][s]
                net = sim._split(model)
                assert net is not None
                got = sim._split_forward(m, s, w.client_agent_inputs(za)[idx], w.site[idx], w.client_site_inputs(), None)
                want = numpy_forward(model.numpy_layers(), x[idx])
                assert got.dtype == np.float32 and got.shape == want.shape
                # a few float32 ulps of the outputs' scale: the first layer summed in three parts
                np.testing.assert_allclose(got, want, rtol=0, atol=1e-5 * max(1.0, float(np.abs(want).max())))


def test_weights_changed_in_place_are_seen(twin: Twin) -> None:
    sim, action, za = _ticked(twin)
    w = sim.world
    s, idx = w.scenario_rows()[0]
    model = twin.member_models[sim.member][s]
    net = sim._split(model)
    assert isinstance(net, SplitNetwork)
    weight = model.numpy_layers()[0][0]
    with torch.no_grad():
        before = sim._split_forward(sim.member, s, w.client_agent_inputs(za)[idx], w.site[idx], w.client_site_inputs(), None)
        saved = weight.detach().clone()
        try:
            weight.mul_(1.5)  # a profile, an agent and a site column all change
            after = sim._split_forward(sim.member, s, w.client_agent_inputs(za)[idx], w.site[idx], w.client_site_inputs(), None)
            want = numpy_forward(model.numpy_layers(), w.client_inputs(action, za=za)[idx])
        finally:
            weight.copy_(saved)
    assert not np.array_equal(before, after)
    np.testing.assert_allclose(after, want, rtol=0, atol=1e-5 * max(1.0, float(np.abs(want).max())))


def test_a_rollout_is_the_same_for_the_same_seed(twin: Twin) -> None:
    runs = []
    for _ in range(2):
        sim = twin.simulation(n_agents=120, seed=9)
        runs.append(sim.run(RandomPolicy(twin.spec, 0), steps=8).frame)
    assert runs[0].equals(runs[1])
    assert len(runs[0]) == 120 * 8


def test_the_response_noise_is_standard_normal_and_seeded() -> None:
    from scipy import stats

    from edgetwin.twin.simulation import normals

    z = normals(np.random.default_rng(0), (20_001, 11))
    assert z.shape == (20_001, 11) and z.dtype == np.float32
    flat = z.ravel().astype(np.float64)
    assert stats.kstest(flat, "norm").pvalue > 0.01
    # the two halves of the transform (cos and sin) are independent normals too
    half = len(flat) // 2
    assert abs(np.corrcoef(flat[:half], flat[half : 2 * half])[0, 1]) < 0.01
    assert abs(stats.kurtosis(flat)) < 0.05
    assert normals(np.random.default_rng(0), (20_001, 11)).tobytes() == z.tobytes()
    assert normals(np.random.default_rng(1), (20_001, 11)).tobytes() != z.tobytes()


def test_segment_means_are_group_means_within_float64_rounding() -> None:
    from edgetwin.imitation.steps import group_means, segment_means, segment_starts

    rng = np.random.default_rng(3)
    sizes = rng.integers(1, 40, 57)
    codes = np.repeat(np.arange(57), sizes)
    values = rng.standard_normal((len(codes), 9)) * 10.0 ** rng.integers(-3, 3, (len(codes), 9))
    starts = segment_starts(codes, 57)
    assert starts is not None
    counts = np.bincount(codes).astype(np.float64)
    got, want = segment_means(values, starts, counts), group_means(values, codes, 57)
    scale = np.abs(values).max()
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-14 * scale)
    assert segment_means(values, starts, counts).tobytes() == got.tobytes()  # deterministic
    assert segment_starts(codes[::-1], 57) is None  # not sorted
    assert segment_starts(np.array([0, 0, 2, 2]), 3) is None  # group 1 has no rows


def test_legal_z_is_the_z_of_the_legal_raw_values(twin: Twin) -> None:
    """`ColumnScaler.legal_z` (a clip in z units) against the round trip through raw units it
    replaces in a tick, on values inside, at and far beyond every bound."""
    from edgetwin.imitation.layout import ColumnScaler

    sc = twin.layout.scalers["outputs"]
    rng = np.random.default_rng(0)
    z = (rng.standard_normal((4000, sc.width)) * rng.choice([0.5, 3.0, 40.0], (4000, sc.width))).astype(np.float32)
    got, want = sc.legal_z(z), sc.transform(sc.inverse(z))
    assert got is not None and got.dtype == np.float32
    np.testing.assert_allclose(got, want, rtol=2e-6, atol=2e-6)
    assert (got != z).any()  # some values were clipped
    discrete = ColumnScaler(["a"], np.array([False]), np.zeros(1), np.ones(1), np.zeros(1), np.ones(1) * 3,
                            [np.array([0.0, 1.0, 3.0])])
    assert discrete.legal_z(np.zeros((2, 1), np.float32)) is None
