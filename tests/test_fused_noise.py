"""The fused tick's output noise by predicted level (issue 47): `edgetwin.twin.fused._level_draws`,
the branch-free bin search inside the tick's noise pass, must give the numbers of
`edgetwin.imitation.noise.noise_residuals` to the bit, on the cases its search branches on (one bin,
tied knots, a mean on a knot, beyond the outer knots, NaN, draws beyond the grid), and a tick with
a member's multi-bin noise model must be the numpy tick's, whole and by row subsets.
"""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

from edgetwin.contract.policy import RandomPolicy
from edgetwin.imitation.noise import Z_GRID, OutputNoise, noise_residuals, stack_tables
from edgetwin.twin.fused import _level_draws
from edgetwin.twin.twin import Twin

torch.set_num_threads(1)


def _models(rng: np.random.Generator, width: int) -> list[OutputNoise]:
    """Three scenarios' tables: 1-6 bins per output, some knots tied, tables monotone in the grid."""
    models = []
    for _ in range(3):
        k = 6
        knots = np.sort(rng.normal(size=(width, k)), axis=1)
        knots[0, 2] = knots[0, 1]  # a tie (a loaded file may hold one: the loader checks non-decreasing)
        n_bins = rng.integers(1, k + 1, size=width)
        n_bins[1] = 1
        n_bins[2] = k
        for j in range(width):
            knots[j, n_bins[j]:] = knots[j, n_bins[j] - 1]
        table = np.sort(rng.normal(size=(width, k, len(Z_GRID))), axis=2)
        models.append(OutputNoise(knots, table, n_bins.astype(np.int64), "quantile", 100))
    return models


def test_the_branch_free_level_draws_are_noise_residuals_to_the_bit() -> None:
    rng = np.random.default_rng(0)
    width, n = 5, 4000
    models = _models(rng, width)
    knots, table, n_bins = stack_tables(models)
    mu = rng.normal(scale=1.5, size=(n, width + 3)).astype(np.float32)
    # means on a knot, beyond the outer knots, NaN
    mu[:50, 0] = knots[0, 0, 1]
    mu[50:100, 2] = knots[1, 2, 5] + 1.0
    mu[100:150, 2] = knots[1, 2, 0] - 1.0
    mu[150:160, 3] = np.nan
    eps = rng.normal(scale=1.6, size=(n, width)).astype(np.float32)
    eps[:20] = 7.5  # beyond the grid's +3: the end segment extended
    eps[20:40] = -7.5
    eps[40:60] = np.float32(Z_GRID[7])  # on a grid point
    pos = rng.permutation(n).astype(np.int64)
    model = rng.integers(0, 3, size=n).astype(np.int64)
    want = np.empty((n, width), np.float32)
    noise_residuals(mu, pos, model, eps, knots, table, n_bins, want)
    got = eps.copy()
    _level_draws(mu, pos, model, got, knots, table, n_bins)
    assert got.tobytes() == want.tobytes()
    # a row's noise is its own: any subset of rows gives the same rows
    rows = rng.choice(n, 300, replace=False)
    sub = eps[rows].copy()
    _level_draws(mu, pos[rows], model[rows], sub, knots, table, n_bins)
    assert sub.tobytes() == want[rows].tobytes()


def test_level_draws_in_chunks_of_one_scenario_with_repeated_means_and_no_row() -> None:
    """`_level_draws` maps up to `_LEVEL_CHUNK` rows of one scenario at a time: rows of one scenario
    in runs longer than a chunk, rows reading the same mean, an unused scenario and no row at all
    give `noise_residuals`' bits."""
    from edgetwin.twin.fused import _LEVEL_CHUNK

    rng = np.random.default_rng(5)
    width = 4
    knots, table, n_bins = stack_tables(_models(rng, width))
    n = 3 * _LEVEL_CHUNK + 7
    mu = rng.normal(scale=1.5, size=(50, width + 1)).astype(np.float32)
    pos = rng.integers(0, 50, size=n).astype(np.int64)  # repeated, and fewer means than rows
    model = np.where(np.arange(n) < 2 * _LEVEL_CHUNK + 3, 2, 0).astype(np.int64)  # scenario 1 unused
    eps = rng.normal(size=(n, width)).astype(np.float32)
    want = np.empty((n, width), np.float32)
    noise_residuals(mu, pos, model, eps, knots, table, n_bins, want)
    got = eps.copy()
    _level_draws(mu, pos, model, got, knots, table, n_bins)
    assert got.tobytes() == want.tobytes()
    none = np.zeros((0, width), np.float32)
    _level_draws(mu, pos[:0], model[:0], none, knots, table, n_bins)
    assert none.shape == (0, width)


@pytest.fixture(scope="module")
def noisy_twin(tiny_cluster_twin: Twin) -> Twin:
    """A tiny twin whose member 1 carries a noise model of several bins per output (the tiny fit's
    own has one bin: too few rows), fitted on synthetic residuals around its outputs' z-range."""
    twin = copy.deepcopy(tiny_cluster_twin)  # the session's fit (conftest), this file's own copy
    rng = np.random.default_rng(3)
    ny = twin.layout.n_outputs
    mu = rng.normal(size=(4000, ny))
    y = mu + rng.standard_t(4, size=(4000, ny)) * (0.2 + 0.3 * np.abs(mu))
    twin.members[1].noise = {s: OutputNoise.fit(mu, y, bins=6, min_rows=100)
                             for s in range(len(twin.layout.scenarios))}
    return twin


def test_a_fused_tick_with_level_noise_is_the_numpy_tick_to_the_bit(noisy_twin: Twin) -> None:
    fused = noisy_twin.simulation(n_agents=120, seed=4, stochastic=True, member=1)
    plain = noisy_twin.simulation(n_agents=120, seed=4, stochastic=True, member=1)
    plain.use_fused = False
    assert fused.fused_tick() is not None and plain.fused_tick() is None
    tables = fused._noise_tables()
    assert tables is not None and (tables[2] > 1).all()
    pol = RandomPolicy(noisy_twin.spec, 3)
    for _ in range(6):
        a = np.asarray(pol.act(fused.obs()), np.float64)
        got, want = fused.step(a, with_disagreement=False), plain.step(a, with_disagreement=False)
        for k in ("outputs", "next_state", "reward"):
            assert getattr(got, k).tobytes() == getattr(want, k).tobytes(), k
    # by row subsets (the what-if engine's path): the same bits as the numpy passes
    parts = (np.arange(0, 120, 2), np.arange(1, 120, 2))
    a = np.asarray(pol.act(fused.obs()), np.float64)
    for p in parts:
        f, q = fused.respond(p, a[p], with_disagreement=False), plain.respond(p, a[p], with_disagreement=False)
        assert f[0].tobytes() == q[0].tobytes()
    assert fused.end_tick().tobytes() == plain.end_tick().tobytes()


def test_the_same_seed_gives_the_same_noisy_rollout(noisy_twin: Twin) -> None:
    runs = [noisy_twin.simulation(n_agents=40, seed=9, member=1).run(RandomPolicy(noisy_twin.spec, 9), steps=4).frame
            for _ in range(2)]
    assert runs[0].equals(runs[1])
