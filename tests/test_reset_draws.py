"""The twin's episode reset made cheaper (issue 47) draws what it drew before, to the bit.

The code before is kept in benchmarks/_scale_reset_before.py (the population model's DataFrames
built column by column, the GAN's straight-through one-hot, sklearn's ``kneighbors``, a neighbour
index fitted per scenario at every reset); here both run in one process on the same small fitted
models and their outputs are compared exactly: the same generator calls on the same inputs, so any
difference would be one of this pass's changes, not the BLAS.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from sklearn.neighbors import NearestNeighbors

from edgetwin.emulator.cluster import ClusterConfig
from edgetwin.emulator.logs import generate_logs
from edgetwin.generative import MODELS, PopulationModel, fit_population
from edgetwin.imitation.neighbours import kneighbors
from edgetwin.twin.simulation import Simulation
from edgetwin.twin.twin import Twin

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _scale_reset_before import reset_before, sample_before  # noqa: E402
from test_generative import SPEC, hyper_for, synthetic_profiles  # noqa: E402

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def twin() -> Twin:
    """A small twin of the emulated cluster with a calibrated GAN-SMMSG population (discrete and
    continuous profile columns, site constants) and its profile support."""
    df, spec = generate_logs(ClusterConfig(n_agents=24, steps=12), episodes=3, seed=0)
    return Twin.fit(df, spec, members=1, seed=0, progress=False, population_hyper={"steps": 30, "calibrate_samples": 2000},
                    bc_epochs=1, rounds=1, world_agents=16, n_steps=12, demo_batch_size=64)


@pytest.fixture(scope="module")
def models() -> dict[str, PopulationModel]:
    """Every population model kind (GAN-SMMSG, GAN, WGAN-GP, GMM) on synthetic profiles, small."""
    train = synthetic_profiles(1500, seed=0)
    out = {m: fit_population(train, SPEC, m, seed=0, **hyper_for(m, 10)) for m in MODELS}
    out["gmm-standard"] = fit_population(train, SPEC, "gmm", seed=0, transform="standard")
    return out


def _same_reset(a: Simulation, b: Simulation) -> None:
    for k in ("scenario", "site", "profile", "state", "lag"):
        assert getattr(a.world, k).tobytes() == getattr(b.world, k).tobytes(), k
    assert a.obs().tobytes() == b.obs().tobytes()
    assert (a.member, a.profile_redrawn, a.profile_outside) == (b.member, b.profile_redrawn, b.profile_outside)
    assert a.site_names == b.site_names and a.agent_names == b.agent_names
    assert a.rng.bit_generator.state == b.rng.bit_generator.state  # the rollout after it draws the same noise


@pytest.mark.parametrize("n_agents", [None, 7, 60])
def test_the_reset_draws_the_code_befores_population_to_the_bit(twin: Twin, n_agents: int | None) -> None:
    now, before = Simulation(twin, n_agents=n_agents, seed=0), Simulation(twin, n_agents=n_agents, seed=0)
    for seed in range(6):
        now.reset(seed)
        reset_before(before, seed)
        _same_reset(now, before)


def test_the_redraws_outside_the_support_are_the_code_befores(twin: Twin) -> None:
    """A support tightened to a fraction of its threshold: most first draws are redrawn, some stay
    outside after the retries; the redraw loop draws the same rows and seeds as before."""
    support = twin.profile_support
    kept = list(support.threshold)
    try:
        support.threshold = [t * 0.35 for t in kept]
        now, before = Simulation(twin, n_agents=40, seed=0), Simulation(twin, n_agents=40, seed=0)
        redrawn = outside = 0.0
        for seed in range(5):
            now.reset(seed)
            reset_before(before, seed)
            _same_reset(now, before)
            redrawn, outside = redrawn + now.profile_redrawn, outside + now.profile_outside
        assert redrawn > 0 and outside > 0, "the tightened support made the reset redraw (and give up on some)"
    finally:
        support.threshold = kept


class _FrameOnly:
    """A population that offers only ``sample`` (a DataFrame), like the empirical one."""

    def __init__(self, population: PopulationModel) -> None:
        self.population = population

    def sample(self, n: int, scenario: str | None = None, seed: int = 0) -> pd.DataFrame:
        return self.population.sample(n, scenario=scenario, seed=seed)


def test_a_population_without_an_array_path_gives_the_same_reset(twin: Twin) -> None:
    fast = Simulation(twin, n_agents=30, seed=0)
    original = twin.population
    try:
        twin.population = _FrameOnly(original)
        slow = Simulation(twin, n_agents=30, seed=0)
        for seed in range(3):
            slow.reset(seed)
            fast.reset(seed)
            _same_reset(fast, slow)
    finally:
        twin.population = original


@pytest.mark.parametrize("name", [*MODELS, "gmm-standard"])
def test_sample_and_sample_profiles_are_the_code_befores_rows(models: dict[str, PopulationModel], name: str) -> None:
    model = models[name]
    cols = model.spec.names("profile")
    for n, scenario, seed in ((50, None, 3), (17, model.scenarios[1], 4), (0, None, 5), (1, model.scenarios[0], 6)):
        got, want = model.sample(n, scenario=scenario, seed=seed), sample_before(model, n, scenario=scenario, seed=seed)
        pd.testing.assert_frame_equal(got, want, check_exact=True)
        arr = model.sample_profiles(n, scenario=scenario, seed=seed)
        assert arr.dtype == np.float64 and arr.shape == (n, len(cols))
        assert arr.tobytes() == want[cols].to_numpy(np.float64).tobytes()


def test_the_transformers_arrays_are_its_frames(models: dict[str, PopulationModel]) -> None:
    tr = models["gan-smmsg"].transformer
    z = np.random.default_rng(0).normal(size=(40, tr.net_dim))
    frame, arr = tr.inverse(z), tr.inverse_array(z)
    assert list(frame.columns) == tr.columns and arr.tobytes() == frame.to_numpy(np.float64).tobytes()
    codes = np.random.default_rng(1).normal(size=(40, len(tr.codecs)))
    assert tr.inverse_codes_array(codes).tobytes() == tr.inverse_codes(codes).to_numpy(np.float64).tobytes()
    assert tr.references.tobytes() == np.linspace(0.0, 1.0, len(tr.references)).tobytes()
    with pytest.raises(ValueError):
        tr.references[0] = 1.0  # one shared array: read-only


@pytest.mark.parametrize("algorithm", ["auto", "kd_tree", "ball_tree", "brute"])
def test_kneighbors_is_sklearns_kneighbors(algorithm: str) -> None:
    """Ties included (a bank with repeated rows, as logged profiles repeat across episodes): the
    same neighbours in the same order and the same distances as ``NearestNeighbors.kneighbors``."""
    rng = np.random.default_rng(0)
    bank = rng.normal(size=(120, 6))
    bank[60:90] = bank[:30]  # exact duplicates
    bank[:, 5] = np.round(bank[:, 5])  # a coarse column: equal distances
    nn = NearestNeighbors(n_neighbors=5, algorithm=algorithm).fit(bank)
    for x in (rng.normal(size=(50, 6)), bank[:20] + 0.0, rng.normal(size=(1, 6)).astype(np.float32)):
        for k in (1, 5):
            d0, i0 = nn.kneighbors(x, n_neighbors=k)
            d1, i1 = kneighbors(nn, x, k)
            assert i0.tobytes() == i1.tobytes() and d0.tobytes() == d1.tobytes()
            assert kneighbors(nn, x, k, return_distance=False).tobytes() == i0.tobytes()
    bad = rng.normal(size=(3, 6))
    bad[1, 2] = np.nan
    with pytest.raises(ValueError):  # refused as sklearn refuses it
        kneighbors(nn, bad, 1)


def test_the_initial_states_keep_their_index_until_the_bank_changes(twin: Twin) -> None:
    initial, lay = twin.initial, twin.layout
    sim = Simulation(twin, n_agents=30, seed=1)
    scen, prof = sim.world.scenario, sim.world.profile
    initial.sample(lay, scen, prof, np.random.default_rng(0))
    kept = {s: v[2] for s, v in initial._nn.items()}
    assert kept, "a neighbour index per scenario drawn"
    a = initial.sample(lay, scen, prof, np.random.default_rng(0))
    assert all(initial._nn[s][2] is nn for s, nn in kept.items())  # reused, not refitted
    s0 = next(iter(kept))
    old_bank = initial.zprofiles[s0]
    try:
        initial.zprofiles[s0] = old_bank.copy()  # another array (same values): refitted
        b = initial.sample(lay, scen, prof, np.random.default_rng(0))
        assert initial._nn[s0][2] is not kept[s0]
        assert a.tobytes() == b.tobytes()
    finally:
        initial.zprofiles[s0] = old_bank
