"""Identical twin replays give identical answers when the policy samples (issue 48: the closed-loop
benchmark's `NoisyPolicy` drew from one stream shared by every replay and never rewound)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from edgetwin.contract.policy import NoisyPolicy, RandomPolicy
from edgetwin.emulator.cluster import ClusterConfig
from edgetwin.emulator.logs import SLOAwarePolicy, generate_logs
from edgetwin.loop.ppi import replay_spec, twin_group_series
from edgetwin.twin.twin import Twin
from edgetwin.twin.whatif import fixed_policy

torch.set_num_threads(1)
CLUSTER = ClusterConfig(n_agents=30, steps=16)
KPIS = ["action.edge_share", "kpi.slo_violation"]


@pytest.fixture(scope="module")
def world():  # type: ignore[no-untyped-def]
    log, spec = generate_logs(CLUSTER, 2, "random", seed=0)
    twin = Twin.fit(log, spec, seed=0, members=2, progress=False, rounds=0, bc_epochs=1,
                    population_model="empirical")  # fmt: skip
    return {"spec": spec, "twin": twin, "fleet": log}


def _frames(world, specs) -> dict:  # type: ignore[no-untyped-def]
    return twin_group_series(world["twin"], specs, world["fleet"], KPIS, seed=3)


def test_reseeded_noise_depends_on_the_seed_alone() -> None:
    spec = generate_logs(ClusterConfig(n_agents=4, steps=2), 1, "random", seed=0)[1]
    obs = np.ones((6, len(spec.observation_columns)))
    p = NoisyPolicy(SLOAwarePolicy(spec), spec, 0.2, seed=5)
    first = p.reseeded(11).act(obs)
    p.act(obs)  # advance the original's stream: the copy must not care
    np.testing.assert_array_equal(first, p.reseeded(11).act(obs))
    assert not np.array_equal(first, p.reseeded(12).act(obs))
    assert not np.array_equal(first, NoisyPolicy(SLOAwarePolicy(spec), spec, 0.2, seed=6).reseeded(11).act(obs))


def test_identical_replays_of_a_noisy_policy_answer_identically(world) -> None:  # type: ignore[no-untyped-def]
    noisy = NoisyPolicy(SLOAwarePolicy(world["spec"]), world["spec"], 0.3, seed=500)
    spec = replay_spec("current", noisy)
    a, b = _frames(world, {"current": spec}), _frames(world, {"current": spec})
    for key in a:
        np.testing.assert_array_equal(a[key].to_numpy(), b[key].to_numpy())
    # the defect this guards against: one object shared by every replay answers differently
    shared = fixed_policy("current", noisy)
    c, d = _frames(world, {"current": shared}), _frames(world, {"current": shared})
    assert not np.array_equal(c[("current", "action.edge_share")].to_numpy(), d[("current", "action.edge_share")].to_numpy())


def test_a_sampling_policy_without_reseeded_is_copied_per_replay(world) -> None:  # type: ignore[no-untyped-def]
    spec = replay_spec("random", RandomPolicy(world["spec"], seed=2))
    a, b = _frames(world, {"random": spec}), _frames(world, {"random": spec})
    np.testing.assert_array_equal(a[("random", "action.edge_share")].to_numpy(), b[("random", "action.edge_share")].to_numpy())
