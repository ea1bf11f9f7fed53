"""The federated twin's output noise by predicted level from per-site aggregates (issue 44):
`edgetwin.federation.twin.noise`, carried by the ``residual`` round."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from edgetwin.federation.twin.noise import EDGES, N_BINS, binned_residual_sums, noise_from_sums
from edgetwin.imitation.noise import Z_GRID

torch.set_num_threads(1)


def _rows(rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray]:
    """Heteroscedastic residuals: spread 0.1 at the bottom of the prediction, 1.0 at the top."""
    mu = rng.normal(0.0, 1.0, size=(n, 2))
    sd = 0.1 + 0.9 * (mu > 0.5)
    return mu, mu + 0.2 + sd * rng.normal(size=(n, 2))


def test_the_sites_sums_pool_to_the_pooled_rows_per_bin_moments() -> None:
    rng = np.random.default_rng(0)
    (m1, y1), (m2, y2) = _rows(rng, 3000), _rows(rng, 5000)
    a, b = binned_residual_sums(m1, y1), binned_residual_sums(m2, y2)
    summed = {k: a[k] + b[k] for k in a}
    mu, y = np.concatenate([m1, m2]), np.concatenate([y1, y2])
    noise = noise_from_sums(summed)
    assert noise is not None and noise.kind == "gaussian" and noise.n_rows == 8000
    # the top bin (prediction above 1.5) of output 0 from the pooled rows themselves
    top = mu[:, 0] > EDGES[-1]
    r = y[top, 0] - mu[top, 0]
    assert top.sum() >= 200
    k = int(noise.n_bins[0]) - 1
    assert noise.knots[0, k] == pytest.approx(mu[top, 0].mean())
    assert noise.table[0, k] == pytest.approx(r.mean() + r.std() * Z_GRID)
    # the spread grows with the predicted level, as in the rows (0.1 below 0.5, 1.0 above)
    sd = (noise.table[0, :, -1] - noise.table[0, :, 0]) / (Z_GRID[-1] - Z_GRID[0])
    assert sd[0] == pytest.approx(0.1, rel=0.1) and sd[int(noise.n_bins[0]) - 1] == pytest.approx(1.0, rel=0.1)
    assert (np.diff(noise.knots[0, : noise.n_bins[0]]) > 0).all()


def test_sparse_bins_are_merged_and_an_empty_output_gives_none() -> None:
    rng = np.random.default_rng(1)
    mu, y = _rows(rng, 300)  # 300 rows: too few for more than one bin of 200
    noise = noise_from_sums(binned_residual_sums(mu, y))
    assert noise is not None and list(noise.n_bins) == [1, 1]
    empty = {k: np.zeros((2, N_BINS)) for k in ("n", "s1", "ss", "smu")}
    assert noise_from_sums(empty) is None


def test_a_federated_fit_gives_its_members_the_noise_model_by_level() -> None:
    from edgetwin.emulator.cluster import ClusterConfig
    from edgetwin.emulator.logs import generate_logs
    from edgetwin.federation.twin.fit import FitOptions
    from edgetwin.federation.twin.runner import fit_federated, split_by_site

    df, spec = generate_logs(ClusterConfig(n_agents=18, steps=10), episodes=2, seed=3)
    opts = FitOptions.light(rounds=2, local_epochs=1, em_iters=2, n_components=2, support_centroids=16, bank=100,
                            net_arch=[16, 16], engine_arch=[8])  # fmt: skip
    twin, _ = fit_federated(split_by_site(df), spec, min_agents=3, options=opts)
    for mem in twin.members:
        assert mem.noise, "every member has a noise model for the scenarios the sites counted"
        assert "pooled per-bin residual moments" in mem.noise_source
        for model in mem.noise.values():
            assert model.width == twin.layout.n_outputs and model.kind == "gaussian"
            assert (model.table[:, :, -1] >= model.table[:, :, 0]).all()
    # the twin runs with it
    from edgetwin.contract.policy import RandomPolicy

    rec = twin.rollout(RandomPolicy(spec, seed=0), n_agents=6, steps=3, seed=0)
    assert len(rec) and np.isfinite(rec[spec.names("response")].to_numpy(np.float64)).all()


def test_a_scenario_the_causal_fit_replaces_drops_its_noise_table() -> None:
    import types

    import pandas as pd

    from edgetwin.federation.twin.assemble import TwinAssembler

    rng = np.random.default_rng(2)
    table = noise_from_sums(binned_residual_sums(*_rows(rng, 500)))
    asm = TwinAssembler.__new__(TwinAssembler)
    mem = types.SimpleNamespace(clients={0: "bc0", 1: "bc1"}, noise={0: table, 1: table}, history=pd.DataFrame())
    asm.members = [mem]  # type: ignore[list-item]
    # scenario 0 counted rows: its client becomes the causal model, whose own std answers; 1 keeps its table
    asm.set_causal(0, {0: "causal0", 1: "causal1"}, np.array([5.0, 0.0]), [])
    assert mem.clients == {0: "causal0", 1: "bc1"} and set(mem.noise) == {1}
    asm.set_causal(0, {1: "causal1"}, np.array([0.0, 5.0]), [])
    assert mem.noise is None and mem.clients[1] == "causal1"
