"""The twin's episode reset as it was before issue 47's reset pass (main at 869c062), kept here only to
compare against: `benchmarks/scale.py --reset` times it beside `Simulation.reset` in one process, and
tests/test_reset_draws.py checks that both give the same population, states and random stream.

What changed since (edgetwin's code now): the population model's draws as one array
(`PopulationModel.sample_profiles`) instead of a DataFrame built column by column, the GAN's
categories decoded without the straight-through one-hot (`_Layout.decode`), the quantile levels made
once, the fitted neighbour indexes of the initial states kept, and both neighbour queries asking the
tree directly (`edgetwin.imitation.neighbours.kneighbors`). This module repeats the code before with
the library's unchanged pieces (the generator's forward pass, the calibration, the legalising, the
site values), so any difference it finds is one of those changes'.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd
import torch
from scipy.special import ndtr
from sklearn.neighbors import NearestNeighbors

from edgetwin.generative.base import PopulationModel
from edgetwin.generative.gan import GANPopulation
from edgetwin.generative.gmm import GMMPopulation
from edgetwin.generative.transform import N_QUANTILES, ColumnCodec, ProfileTransformer, _nearest
from edgetwin.imitation.layout import Layout
from edgetwin.imitation.world import InitialStates, World
from edgetwin.twin.simulation import Simulation
from edgetwin.twin.support import ProfileSupport


def _inverse_cont(tr: ProfileTransformer, c: ColumnCodec, z: np.ndarray) -> np.ndarray:
    f = c.feature
    if c.quantiles is not None:
        x = np.interp(ndtr(z), np.linspace(0.0, 1.0, N_QUANTILES), c.quantiles)
    else:
        y = z * c.std + c.mean
        if f.kind == "heavy_tailed":
            r = y - np.log(c.offset)
            x = c.low + np.sign(r) * np.expm1(np.abs(r)) * c.offset
        else:
            x = y
    lo = -np.inf if f.low is None else f.low
    hi = np.inf if f.high is None else f.high
    return np.clip(x, lo, hi)


def inverse_before(tr: ProfileTransformer, z: np.ndarray) -> pd.DataFrame:
    """`ProfileTransformer.inverse` before: a DataFrame of one column per codec."""
    out = {}
    for s, e, c in tr.spans:
        if c.values is not None:
            out[c.feature.name] = c.values[np.argmax(z[:, s:e], axis=1)]
        else:
            out[c.feature.name] = _inverse_cont(tr, c, z[:, s].astype(np.float64))
    return pd.DataFrame(out)


def inverse_codes_before(tr: ProfileTransformer, z: np.ndarray) -> pd.DataFrame:
    """`ProfileTransformer.inverse_codes` before."""
    out = {}
    for j, c in enumerate(tr.codecs):
        if c.values is not None:
            out[c.feature.name] = c.values[_nearest(c.values, z[:, j] * c.std + c.mean)]
        else:
            out[c.feature.name] = _inverse_cont(tr, c, z[:, j].astype(np.float64))
    return pd.DataFrame(out)


@torch.no_grad()
def _profiles_before(model: PopulationModel, idx: np.ndarray, rng: np.random.Generator) -> pd.DataFrame:
    if isinstance(model, GANPopulation):
        g = torch.Generator().manual_seed(int(rng.integers(0, 2**62)))
        outs = []
        for rows, raw in model._raw_chunks(idx, g):
            if model.calibration is not None:
                raw = torch.as_tensor(model.calibration.apply(raw.numpy(), idx[rows]), dtype=torch.float32)
            outs.append(model.layout.activate(raw, 1.0, hard=True, generator=g).numpy())
        return inverse_before(model.transformer, np.concatenate(outs).astype(np.float64))
    if isinstance(model, GMMPopulation):
        z = model._sample_raw(idx, rng)
        if model.calibration is not None:
            z = model.calibration.apply(z, idx)
        return inverse_codes_before(model.transformer, z)
    raise TypeError(f"no code before for {type(model).__name__}")


def sample_before(model: Any, n: int, scenario: str | None = None, seed: int = 0) -> pd.DataFrame:
    """``model.sample(n, scenario, seed)`` before (a population that is not a `PopulationModel`,
    e.g. the empirical one, did not change: its own ``sample``)."""
    if not isinstance(model, PopulationModel):
        return model.sample(n, scenario=scenario, seed=seed)
    rng = np.random.default_rng(seed)
    if scenario is None:
        idx = rng.choice(len(model.scenarios), size=int(n), p=model.proportions)
    else:
        idx = np.full(int(n), model.scenarios.index(scenario), dtype=np.int64)
    prof = (
        _profiles_before(model, idx, rng)
        if n
        else pd.DataFrame({c: np.zeros(0) for c in model.spec.names("profile")})
    )
    out = pd.DataFrame({"scenario": np.asarray(model.scenarios, dtype=object)[idx]})
    for c in model.spec.names("profile"):
        out[c] = prof[c].to_numpy(np.float64)
    return out


def inside_before(support: ProfileSupport, scenario: int, zp: np.ndarray) -> np.ndarray:
    """`ProfileSupport.inside` before: sklearn's ``kneighbors``."""
    nn = support.nn[scenario]
    if nn is None or len(zp) == 0:
        return np.ones(len(zp), dtype=bool)
    d = nn.kneighbors(zp, n_neighbors=1)[0][:, 0]
    return d <= support.threshold[scenario]


def initial_before(
    initial: InitialStates, layout: Layout, scenario: np.ndarray, profile: np.ndarray, rng: np.random.Generator
) -> np.ndarray:
    """`InitialStates.sample` before: a neighbour index fitted per scenario at every call."""
    out = np.zeros((len(scenario), len(layout.state)))
    zp = layout.scalers["profile"].transform(profile)
    for s in np.unique(scenario):
        rows = np.flatnonzero(scenario == s)
        bank_p, bank_s = initial.zprofiles[s], initial.states[s]
        if len(bank_s) == 0:
            continue
        k = min(initial.k, len(bank_s))
        if bank_p.shape[1] == 0:
            pick = rng.integers(len(bank_s), size=len(rows))
        else:
            nn = NearestNeighbors(n_neighbors=k).fit(bank_p)
            near = nn.kneighbors(zp[rows], return_distance=False)
            pick = near[np.arange(len(rows)), rng.integers(k, size=len(rows))]
        out[rows] = bank_s[pick]
    return out


def reset_before(sim: Simulation, seed: int | None = None) -> np.ndarray:
    """`Simulation.reset` before, on ``sim`` (its world, member, names and random stream)."""
    if seed is not None:
        sim.rng = np.random.default_rng(seed)
    lay = sim.layout
    twin = sim.twin
    composition = twin.composition
    scen, site, units = composition.sample_units(sim.rng, sim.n_agents)
    profile = np.zeros((len(scen), len(lay.profile)))
    retries = twin.profile_retries if lay.profile else 0
    redrawn, outside = 0, 0
    for s in np.unique(scen):
        idx = np.flatnonzero(scen == s)
        for attempt in range(retries + 1):
            pop = sample_before(twin.population, len(idx), scenario=lay.scenarios[s], seed=int(sim.rng.integers(2**31)))
            drawn = lay.scalers["profile"].legalise(pop[lay.profile].to_numpy(np.float64))
            profile[idx] = composition.site_values(drawn, units, site[idx], "profile")
            if retries == 0:
                break
            ok = inside_before(twin.profile_support, int(s), lay.scalers["profile"].transform(profile[idx]))
            if attempt == 0:
                redrawn += int((~ok).sum())
            idx = idx[~ok]
            if len(idx) == 0:
                break
        outside += len(idx) if retries else 0
    profile = lay.scalers["profile"].legalise(profile)
    sim.profile_redrawn = redrawn / max(1, len(scen))
    sim.profile_outside = outside / max(1, len(scen))
    state = initial_before(twin.initial, lay, scen, profile, sim.rng)
    state = composition.site_values(state, units, site, "state")
    n_sites = int(site.max()) + 1
    sim.member = sim.fixed_member if sim.fixed_member is not None else int(sim.rng.integers(twin.n_members))
    sim.place(World(lay, scen, site, profile, state, np.zeros((n_sites, lay.n_lag))))
    sim.site_names = composition.site_names(units)
    sim.agent_names = [f"agent{i}" for i in range(len(scen))]
    return sim.obs()
