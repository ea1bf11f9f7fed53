"""A tick's per-site client inputs (issue 47's fixed cost at 1,000 agents): `World.client_site_inputs`
written block by block with its fixed columns kept, and the next tick's site means of z(state) that
the fused tick hands the world (`World.moved_to`), are the numbers the world computed before, to the bit."""

from __future__ import annotations

import numpy as np
import pytest
import test_twin_speed
import torch

from edgetwin.contract.policy import RandomPolicy
from edgetwin.imitation.layout import DAY_SECONDS
from edgetwin.imitation.world import World
from edgetwin.twin.twin import Twin

torch.set_num_threads(1)

#: the tiny twin of the emulated cluster of tests/test_twin_speed.py (declared dynamics, site-level state, a clock)
twin = test_twin_speed.twin


def _concatenated(w: World) -> np.ndarray:
    """`World.client_site_inputs` as it was written before: six parts concatenated and rounded at once."""
    lay = w.layout
    n_sites = w.n_sites
    counts = np.bincount(w.site, minlength=n_sites)
    parts = [w.site_means(np.asarray(w.model_zstate(), np.float64)), w.lag, (np.log1p(counts) - lay.log_size_center)[:, None]]
    if lay.site_profile:
        parts.append(w.site_means(np.asarray(w.zprofile(), np.float64)))
    if lay.use_time:
        t = np.asarray(np.full(1, w.t), np.float64)
        phase = 2.0 * np.pi * ((t * lay.spec.step_seconds) % DAY_SECONDS) / DAY_SECONDS
        parts += [np.broadcast_to(np.sin(phase), (n_sites, 1)), np.broadcast_to(np.cos(phase), (n_sites, 1))]
    return np.concatenate(parts, axis=1, dtype=np.float32)


@pytest.mark.parametrize("fused", [True, False])
def test_site_inputs_tick_after_tick_are_the_concatenated_ones(twin: Twin, fused: bool) -> None:
    """120 ticks (past a day of 900 s ticks: the time of day wraps), site by site and agent order
    shuffled (the world's own site means then, not the fused pass's)."""
    for shuffled in (False, True):
        sim = twin.simulation(n_agents=90, seed=2)
        sim.use_fused = fused
        if shuffled:
            perm = np.random.default_rng(0).permutation(sim.world.n)
            w = sim.world
            w.scenario, w.site, w.profile, w.state = w.scenario[perm], w.site[perm], w.profile[perm], w.state[perm]
        pol = RandomPolicy(twin.spec, 1)
        lay = sim.layout
        assert lay.use_time and lay.site_profile  # the branches the emulated cluster's twin takes
        for _ in range(120):
            sim.step(pol.act(sim.obs()), with_disagreement=False)
            w = sim.world
            if "zs_site_means" in w._memo:  # handed over by the fused tick: the world's own means
                own = w.site_means(np.asarray(w.model_zstate(), np.float64))
                assert w._zs_site_means().tobytes() == own.tobytes()
            assert w.client_site_inputs().tobytes() == _concatenated(w).tobytes(), w.t
        assert w.t == 120


def test_the_fused_tick_hands_over_the_site_means_where_the_agents_come_site_by_site(twin: Twin) -> None:
    sim = twin.simulation(n_agents=90, seed=2)
    assert sim.fused_tick() is not None
    sim.step(RandomPolicy(twin.spec, 1).act(sim.obs()), with_disagreement=False)
    sources, value = sim.world._memo["zs_site_means"]
    assert sources[0] is sim.world.state and not value.flags.writeable
