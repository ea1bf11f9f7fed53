"""`World`: one tick of a batch of agents on sites, generic over the log contract.

The harness under MAIL-MMSG's training and the twin's simulation: agents interact only through
their ``site`` (means over a site's agents at a tick, see `edgetwin.imitation.steps.client_features`),
and the client model's outputs move the state (by the spec's transition, a learned one, the site
means or, for the site-level columns, an optional `SiteStateModel`; the spec's declared
``[[dynamics]]`` columns are computed from the tick last, `Layout.apply_declared`). `Composition` (which agents
share a site, as logged) and `InitialStates` (their logged first states) are where a world starts.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd
from sklearn.neighbors import NearestNeighbors

from edgetwin.contract.errors import InputError
from edgetwin.imitation.layout import DAY_SECONDS, Layout
from edgetwin.imitation.neighbours import kneighbors
from edgetwin.imitation.site_model import SiteStateModel, site_element_features
from edgetwin.imitation.steps import (
    client_features,
    group_bins,
    group_means,
    segment_means,
    segment_starts,
    transition_features,
)

# SiteStateModel is exported here too: twins saved before it had a module of its own pickled their
# site model as edgetwin.imitation.world.SiteStateModel (tests/test_imitation.py loads one).
__all__ = ["Composition", "InitialStates", "SiteStateModel", "World", "site_consistent"]


#: (step seconds, tick number) -> the tick's time of day as ``(sin, cos)`` (`World._time_of_day`)
_TIME_OF_DAY: dict[tuple[float, int], np.ndarray] = {}


@dataclass
class World:
    """N simulated agents on sites, advanced one tick at a time (batched over all agents).

    Attributes:
        layout: the twin's layout.
        scenario: ``(N,)`` scenario ids; ``site``: ``(N,)`` site ids ``0..n_sites-1``.
        profile: ``(N, P)`` raw profiles; ``state``: ``(N, S)`` raw states at the current tick.
        lag: ``(n_sites, A+Y)`` site means of standardised actions and outputs of the previous tick.
        t: the current tick.
        site_model: a `SiteStateModel` that moves the site-level state columns at the end of each
            tick from the whole site's tick; None: the mean of the agents' own predictions.

    What is derived from ``profile``, ``state`` and ``site`` alone (their standardised values,
    site means and sizes) is computed once per array and kept until the attribute is assigned
    another array: a tick reads the state's z-values in `client_inputs` and again in `apply`, and
    a profile does not change within an episode. The kept arrays are read-only; change a world by
    assigning new arrays (as `apply` and the what-if engine do), never by writing into them.
    """

    layout: Layout
    scenario: np.ndarray
    site: np.ndarray
    profile: np.ndarray
    state: np.ndarray
    lag: np.ndarray
    t: int = 0
    site_model: Any = None
    _memo: dict[str, tuple[tuple[Any, ...], Any]] = field(
        default_factory=dict, init=False, repr=False, compare=False
    )

    @property
    def n(self) -> int:
        return len(self.scenario)

    @property
    def n_sites(self) -> int:
        return self._kept("n_sites", (self.site,), lambda: int(self.site.max()) + 1 if self.n else 0)

    def _kept(self, key: str, sources: tuple[Any, ...], compute: Callable[[], Any]) -> Any:
        """``compute()`` of the arrays ``sources``, recomputed only when one of them is another object."""
        hit = self._memo.get(key)
        if hit is not None and all(a is b for a, b in zip(hit[0], sources, strict=True)):
            return hit[1]
        value = compute()
        if isinstance(value, np.ndarray):
            value.flags.writeable = False
        self._memo[key] = (sources, value)
        return value

    def zprofile(self) -> np.ndarray:
        """``(N, P)`` standardised profiles (float32, read-only)."""
        return self._kept("zp", (self.profile,), lambda: self.layout.scalers["profile"].transform(self.profile))

    def zstate(self) -> np.ndarray:
        """``(N, S)`` standardised states (float32, read-only)."""
        return self._kept("zs", (self.state,), lambda: self.layout.scalers["state"].transform(self.state))

    def scenario_rows(self) -> list[tuple[int, np.ndarray]]:
        """``[(scenario id, rows of its agents)]`` in increasing id (the agents' scenarios only)."""
        sc = self.scenario
        return self._kept(
            "scen", (sc,), lambda: [(int(s), np.flatnonzero(sc == s)) for s in np.unique(sc)]
        )

    def site_means(self, values: np.ndarray) -> np.ndarray:
        """``(n_sites, D)`` per-site means of ``values (N, D)`` (`group_means` over ``site``, with
        its bins and counts kept per ``site`` array: the same sums, without rebuilding them)."""
        d = values.shape[1]
        n_sites = self.n_sites
        counts = self._kept(
            "counts", (self.site,), lambda: np.bincount(self.site, minlength=n_sites).astype(np.float64)
        )
        starts = self._kept("starts", (self.site,), lambda: segment_starts(self.site, n_sites))
        if starts is not None:  # agents site by site (a generated world): the same sums, faster
            return segment_means(values, starts, counts)
        bins = self._kept(f"bins{d}", (self.site,), lambda: group_bins(self.site, d))
        return group_means(values, self.site, n_sites, bins=bins, counts=counts)

    def _site_inputs(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray | None]:
        """``(model z(state) (N, S), its site means (N, S), site sizes (N,), z(profile) site means
        (N, P) or None)`` of every agent at this tick."""
        lay = self.layout
        zs_all = self.model_zstate()
        n_sites = self.n_sites
        means = self._kept("zs_means", (self.state, self.site), lambda: self._zs_site_means()[self.site])
        size = self._kept("size", (self.site,), lambda: np.bincount(self.site, minlength=n_sites)[self.site])
        pmeans = (
            self._kept("zp_means", (self.profile, self.site), lambda: self._zp_site_means()[self.site])
            if lay.site_profile
            else None
        )
        return zs_all, means, size, pmeans

    def model_zstate(self) -> np.ndarray:
        """``(N, S)`` z(state) as the learned models see it (`Layout.model_state`; read-only)."""
        return self._kept("mzs", (self.state,), lambda: self.layout.model_state(self.zstate()))

    def _zs_site_means(self) -> np.ndarray:
        """``(n_sites, S)`` float64 site means of `model_zstate`."""
        return self._kept(
            "zs_site_means", (self.state, self.site), lambda: self.site_means(np.asarray(self.model_zstate(), np.float64))
        )

    def _zp_site_means(self) -> np.ndarray:
        """``(n_sites, P)`` float64 site means of `zprofile`."""
        return self._kept(
            "zp_site_means", (self.profile, self.site), lambda: self.site_means(np.asarray(self.zprofile(), np.float64))
        )

    def client_site_inputs(self) -> np.ndarray:
        """``(n_sites, W)`` float32: the client inputs that are one value per site at this tick, the
        columns ``[P+S+A, n_client_inputs)`` of `client_inputs` (site means of the models'
        z(state), the lagged site means, the log site size, the site means of z(profile), the time
        of day), one row per site: an agent's row of `client_inputs` ends with its site's row here,
        to the bit (the same float64 values rounded to float32 the same way).

        A fresh array each tick, written column block by column block: the columns that do not
        change between ticks (the log site size, the profile means) are copied from a float32 row
        block kept per world (rounded once, as a concatenation rounds them), and the time of day's
        sine and cosine are computed once per tick number. Why: at 1,000 agents (~30 sites) the
        concatenation of six parts, a broadcast per time column and their rounding cost more than
        the site means themselves (~20 of ~38 us a tick)."""
        lay = self.layout
        zs_means = self._zs_site_means()
        fixed = self._kept("site_fixed", (self.site, self.profile), self._site_fixed_inputs)
        n_sites, s, k = len(fixed), zs_means.shape[1], self.lag.shape[1]
        out = np.empty((n_sites, s + k + fixed.shape[1] + (2 if lay.use_time else 0)), np.float32)
        out[:, :s] = zs_means
        out[:, s : s + k] = self.lag
        out[:, s + k : s + k + fixed.shape[1]] = fixed
        if lay.use_time:
            out[:, -2:] = self._time_of_day()
        return out

    def _site_fixed_inputs(self) -> np.ndarray:
        """``(n_sites, 1 + P')`` float32: `client_site_inputs`' columns that hold while the sites and
        profiles do, the log site size and (with ``site_profile``) the site means of z(profile)."""
        lay = self.layout
        counts = np.bincount(self.site, minlength=self.n_sites)
        parts: list[np.ndarray] = [(np.log1p(counts) - lay.log_size_center)[:, None]]
        if lay.site_profile:
            parts.append(self._zp_site_means())
        return np.concatenate(parts, axis=1, dtype=np.float32)

    def _time_of_day(self) -> np.ndarray:
        """``(2,)`` float64 sine and cosine of this tick's time of day, as `client_features` computes
        them for a world's tick (``t`` as ``(1,)``: numpy's sine of a one-value array, the same bits),
        kept per (step length, tick number) for every world (`_TIME_OF_DAY`)."""
        step = float(self.layout.spec.step_seconds)
        hit = _TIME_OF_DAY.get((step, self.t))
        if hit is None:
            if len(_TIME_OF_DAY) > 4096:  # many step lengths or long episodes: keep the memo small
                _TIME_OF_DAY.clear()
            t = np.asarray(np.full(1, self.t), np.float64)
            phase = 2.0 * np.pi * ((t * step) % DAY_SECONDS) / DAY_SECONDS
            hit = _TIME_OF_DAY[(step, self.t)] = np.concatenate([np.sin(phase), np.cos(phase)])
            hit.flags.writeable = False
        return hit

    def client_agent_inputs(self, za: np.ndarray, rows: np.ndarray | None = None) -> np.ndarray:
        """``(n, S+A)`` float32 (a fresh array): the per-agent client inputs ``[z(state) as the
        models see it, z(action)]`` of agents ``rows`` (default all) given their standardised
        actions ``za (n, A)``: the columns ``[P, P+S+A)`` of `client_inputs`, to the bit."""
        zs = self.model_zstate()
        if rows is not None:
            zs = zs[rows]
        return np.concatenate([zs, za], axis=1, dtype=np.float32)

    def engine_inputs(self) -> np.ndarray:
        """``(N, P+S)`` standardised ``[profile, state]``."""
        return np.concatenate([self.zprofile(), self.zstate()], axis=1)

    def client_inputs(
        self, action: np.ndarray, rows: np.ndarray | None = None, za: np.ndarray | None = None
    ) -> np.ndarray:
        """Client inputs for raw actions taken at this tick.

        Args:
            action: ``(N, A)``, or ``(len(rows), A)`` when ``rows`` is given.
            rows: compute only these agents' inputs (the others' actions are not needed: the
                model is causal per agent).
            za: the standardised ``action``, when the caller has it already.
        """
        zs_all, means, size, pmeans = self._site_inputs()
        zp = self.zprofile()
        site = self.site
        log_size = self._kept(
            "log_size", (self.site,), lambda: (np.log1p(size) - self.layout.log_size_center)[:, None]
        )
        if rows is not None:
            r = np.asarray(rows)
            zp, zs_all, means, size, site, log_size = zp[r], zs_all[r], means[r], size[r], site[r], log_size[r]
            pmeans = None if pmeans is None else pmeans[r]
        return client_features(
            self.layout,
            zp,
            zs_all,
            self.layout.scalers["action"].transform(action) if za is None else za,
            site,
            self.n_sites,
            self.lag[site],
            np.full(1, self.t),  # every agent is at this tick
            state_means=means,
            site_size=size,
            profile_means=pmeans,
            log_size=log_size,
        )

    def apply(
        self,
        action: np.ndarray,
        y: np.ndarray,
        transition: Mapping[int, Any] | None = None,
        outputs: np.ndarray | None = None,
        za: np.ndarray | None = None,
        zy: np.ndarray | None = None,
    ) -> tuple[np.ndarray, np.ndarray]:
        """Apply standardised model outputs ``y (N, n_model_outputs)`` of this tick.

        Args:
            action: ``(N, A)`` raw actions of the tick.
            y: ``(N, n_model_outputs)`` standardised client outputs (``Δstate`` last, if learned).
            transition: per scenario id, a model with ``mean(x) -> Δz(state)`` over
                `transition_features`; when given (and the transition is learned) it replaces the
                client's ``Δstate``: it sees the whole site's actions and outputs of this tick.
            outputs, za: the raw outputs ``inverse(y[:, :Y])`` and standardised ``action``, when
                the caller has them already (exactly these values; they are not recomputed).
            zy: ``(N, Y)`` the standardised legal outputs, when the caller has them (default
                ``transform(outputs)``; a twin's tick passes `ColumnScaler.legal_z` of ``y``).

        Returns:
            ``(outputs_raw (N, Y), next_state_raw (N, S))``; the world moves to t+1.
        """
        lay = self.layout
        ny = lay.n_outputs
        if outputs is not None:
            out_raw = outputs
        else:
            out_raw = lay.scalers["outputs"].inverse(y[:, :ny]) if ny else np.zeros((self.n, 0))
        zs = self.zstate()
        if zy is None:
            zy = lay.scalers["outputs"].transform(out_raw) if ny else np.zeros((self.n, 0))
        if za is None:
            za = lay.scalers["action"].transform(action)
        site_now = self.site_means(np.concatenate([za, zy], axis=1, dtype=np.float64))
        fn = lay.spec.transition_fn() if lay.spec.transition is not None else None
        if fn is not None:
            resp = out_raw[:, : len(lay.response)]
            nxt = np.asarray(fn(self.state, action, resp), dtype=np.float64).reshape(self.n, len(lay.state))
            nxt = lay.scalers["state"].legalise(nxt)
        elif lay.learn_transition:
            delta = y[:, ny:]
            if transition is not None:
                x = transition_features(self.client_inputs(action, za=za), zy, site_now[self.site])
                pred = np.zeros_like(delta)
                for s, idx in self.scenario_rows():
                    pred[idx] = transition[s].mean(x[idx])
                absolute = np.asarray(lay.state_absolute or [False] * len(lay.state), dtype=bool)
                delta = np.where(absolute, pred - zs, pred)
            # in float64 (z(state) is float32, a client's Δstate float32, a transition's float64)
            z_next = np.add(zs, delta, dtype=np.float64)
            site_cols = lay.site_state_columns
            if len(site_cols):
                # a site's property is one value for all its agents: their mean prediction
                z_next[:, site_cols] = self.site_means(z_next[:, site_cols])[self.site]
            if self.site_model is not None and len(site_cols):
                z_next[:, self.site_model.columns] = self._site_next(zs, za, zy)[self.site]
            nxt = lay.roll_clocks(self.state, lay.scalers["state"].inverse(z_next))
            nxt = lay.roll_echoes(out_raw, nxt)
        else:
            nxt = self.state.copy()
        # the operator's accounting last: declared columns see every agent's outputs of the tick
        nxt = lay.apply_declared(self.profile, self.state, action, out_raw, self.site, nxt, n_sites=self.n_sites)
        self.lag = site_now
        self.state = nxt
        self.t += 1
        return out_raw, nxt

    def moved_to(
        self, state: np.ndarray, zs: np.ndarray, mzs: np.ndarray, zs_site_means: np.ndarray | None = None
    ) -> None:
        """Move to ``state (N, S)`` raw at t+1 (what `apply` ends with; the caller sets `lag`), with
        its z-values ``zs`` (`zstate`'s float32) and ``mzs`` (`model_zstate`'s values) computed by
        the caller (`edgetwin.twin.fused.FusedTick`), kept as if this world had computed them; so
        are ``zs_site_means`` (`_zs_site_means`' ``(n_sites, S)``, its bits) where the caller has them."""
        for a in (zs, mzs) if zs_site_means is None else (zs, mzs, zs_site_means):
            a.flags.writeable = False
        self.state = state
        self._memo["zs"] = ((state,), zs)
        self._memo["mzs"] = ((state,), mzs)
        if zs_site_means is not None:
            self._memo["zs_site_means"] = ((state, self.site), zs_site_means)
        self.t += 1

    def _site_next(self, zs: np.ndarray, za: np.ndarray, zy: np.ndarray) -> np.ndarray:
        """``(n_sites, k)`` next z of the site-level columns from the site model (before `lag` moves)."""
        m = self.site_model
        who, did = site_element_features(
            self.layout, self.zprofile(), zs, za, zy, self.scenario, np.full(self.n, self.t)
        )
        n_sites = self.n_sites
        zs_site = group_means(np.asarray(zs[:, m.columns], np.float64), self.site, n_sites)
        size = np.bincount(self.site, minlength=n_sites).astype(np.float64)
        site_x = m.site_inputs(zs_site, self.lag, size, np.full(n_sites, self.t), self.layout.spec.step_seconds)
        return m.predict(who, did, self.site, site_x)


def site_consistent(layout: Layout, values: np.ndarray, site: np.ndarray, which: str) -> np.ndarray:
    """``values (N, W)`` raw profiles (``which="profile"``) or states (``"state"``) with every
    site-scoped column set to its site's mean, so that a world drawn agent by agent (a population
    model knows no sites) still has one value per site where the spec or the logs say so."""
    flags = layout.site_profile_columns if which == "profile" else layout.site_state
    cols = np.flatnonzero(np.asarray(flags, dtype=bool)) if flags else np.zeros(0, np.int64)
    if not len(cols) or not len(site):
        return values
    out = values.copy()
    out[:, cols] = group_means(np.asarray(values[:, cols], np.float64), site, int(site.max()) + 1)[site]
    return out


@dataclass
class Composition:
    """How many agents of each scenario share a site, as logged; worlds are built from it.

    A generated world is a set of logged site units: each generated site is one logged
    (episode, site) at its first tick, with that site's name, its site constants (the
    ``scope = "site"`` profile columns) and its site-level state at that tick, so that a what-if
    naming a logged site works on a generated world and a site keeps the capacity it was logged with.

    Attributes:
        units: ``(U, n_scenarios)`` agent counts per logged (episode, site) at its first tick.
        unit_sites: ``(U,)`` the logged site name of each unit (empty for twins saved before it).
        unit_profile: ``(U, P)`` raw site-constant profile values per unit (NaN for agent columns).
        unit_state: ``(U, S)`` raw site-level state values per unit at its first tick (NaN for
            agent columns).
    """

    units: np.ndarray
    unit_sites: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype="U1"))
    unit_profile: np.ndarray = field(default_factory=lambda: np.zeros((0, 0)))
    unit_state: np.ndarray = field(default_factory=lambda: np.zeros((0, 0)))

    @classmethod
    def fit(cls, log: pd.DataFrame, layout: Layout) -> Composition:
        first = log[log["t"] == log.groupby("episode")["t"].transform("min")]
        counts = (
            first.groupby(["episode", "site", "scenario"], sort=True)
            .size()
            .unstack("scenario", fill_value=0)
            .reindex(columns=layout.scenarios, fill_value=0)
        )
        keys = counts.index.to_frame(index=False)
        grouped = first.groupby(["episode", "site"], sort=True)
        site_p = np.asarray(layout.site_profile_columns or [False] * len(layout.profile), dtype=bool)
        site_s = np.asarray(layout.site_state or [False] * len(layout.state), dtype=bool)
        unit_profile = np.full((len(keys), len(layout.profile)), np.nan)
        unit_state = np.full((len(keys), len(layout.state)), np.nan)
        if site_p.any():
            unit_profile[:, site_p] = grouped[[c for c, k in zip(layout.profile, site_p, strict=True) if k]].mean().to_numpy(np.float64)
        if site_s.any():
            unit_state[:, site_s] = grouped[[c for c, k in zip(layout.state, site_s, strict=True) if k]].mean().to_numpy(np.float64)
        return cls(
            units=counts.to_numpy(np.int64),
            unit_sites=keys["site"].astype(str).to_numpy().astype("U"),
            unit_profile=unit_profile,
            unit_state=unit_state,
        )

    def sample(self, rng: np.random.Generator, n_agents: int | None = None) -> tuple[np.ndarray, np.ndarray]:
        """Draw logged site units until ``n_agents`` agents (default: one unit's worth).

        Returns:
            ``(scenario (N,), site (N,))`` integer ids; sites are numbered ``0..``.
        """
        scen, site, _ = self.sample_units(rng, n_agents)
        return scen, site

    def sample_units(
        self, rng: np.random.Generator, n_agents: int | None = None
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """As `sample`, also returning ``units (n_sites,)``: the logged unit of each generated site."""
        target = int(self.units[rng.integers(len(self.units))].sum()) if n_agents is None else int(n_agents)
        if target < 1:
            raise InputError(f"n_agents must be >= 1, got {n_agents}", "n_agents")
        scen: list[np.ndarray] = []
        site: list[np.ndarray] = []
        picked: list[int] = []
        total, k = 0, 0
        while total < target:
            u = int(rng.integers(len(self.units)))
            unit = self.units[u]
            ids = np.repeat(np.arange(len(unit)), unit)
            ids = ids[: target - total]
            if len(ids):
                scen.append(ids)
                site.append(np.full(len(ids), k))
                picked.append(u)
                total += len(ids)
                k += 1
        return np.concatenate(scen), np.concatenate(site), np.asarray(picked, np.int64)

    def site_names(self, units: np.ndarray) -> list[str]:
        """Names of generated sites from their logged units: the logged name, ``name#2``, ``name#3``
        ... when a name repeats (``site<k>`` for twins saved without names)."""
        if len(self.unit_sites) != len(self.units):
            return [f"site{k}" for k in range(len(units))]
        out: list[str] = []
        seen: dict[str, int] = {}
        for u in units:
            name = str(self.unit_sites[u])
            seen[name] = seen.get(name, 0) + 1
            out.append(name if seen[name] == 1 else f"{name}#{seen[name]}")
        return out

    def site_values(self, values: np.ndarray, units: np.ndarray, site: np.ndarray, which: str) -> np.ndarray:
        """``values (N, W)`` with the site-scoped columns set from each agent's site's logged unit.

        Args:
            values: raw ``profile`` (``which="profile"``) or ``state`` (``"state"``) rows.
            units: ``(n_sites,)`` the logged unit of each generated site; site: ``(N,)`` site ids.
        """
        table = self.unit_profile if which == "profile" else self.unit_state
        if table.shape != (len(self.units), values.shape[1]):
            return values
        fill = table[units[site]]
        known = ~np.isnan(fill)
        out = values.copy()
        out[known] = fill[known]
        return out


@dataclass
class InitialStates:
    """Initial states drawn from logged first ticks, matched to a profile by nearest neighbours.

    As in seed 004 §3.1.2, what the model does not predict is loaded from real trajectories: a new
    agent starts from the first logged state of one of the ``k`` logged agents of its scenario
    whose profiles are nearest to its own.
    """

    zprofiles: list[np.ndarray]
    states: list[np.ndarray]
    k: int = 5
    #: per scenario ``(bank, k, fitted NearestNeighbors)``, reused while the bank is the same array:
    #: refitting at every draw was ~1 ms a scenario of a twin's episode reset (issue 47)
    _nn: dict[int, tuple[np.ndarray, int, NearestNeighbors]] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def fit(cls, log: pd.DataFrame, layout: Layout) -> InitialStates:
        first = log[log["t"] == log.groupby(["episode", "agent"])["t"].transform("min")]
        zp, st = [], []
        for s in layout.scenarios:
            rows = first[first["scenario"].astype(str) == s]
            zp.append(layout.scalers["profile"].transform(rows[layout.profile].to_numpy(np.float64)))
            st.append(rows[layout.state].to_numpy(np.float64))
        return cls(zp, st)

    def sample(
        self, layout: Layout, scenario: np.ndarray, profile: np.ndarray, rng: np.random.Generator
    ) -> np.ndarray:
        """``(N, S)`` raw initial states for agents with raw ``profile (N, P)``."""
        out = np.zeros((len(scenario), len(layout.state)))
        zp = layout.scalers["profile"].transform(profile)
        for s in np.unique(scenario):
            rows = np.flatnonzero(scenario == s)
            bank_p, bank_s = self.zprofiles[s], self.states[s]
            if len(bank_s) == 0:
                continue
            k = min(self.k, len(bank_s))
            if bank_p.shape[1] == 0:
                pick = rng.integers(len(bank_s), size=len(rows))
            else:
                kept = self._nn.get(int(s))
                if kept is None or kept[0] is not bank_p or kept[1] != k:
                    kept = self._nn[int(s)] = (bank_p, k, NearestNeighbors(n_neighbors=k).fit(bank_p))
                nn = kept[2]
                near = kneighbors(nn, zp[rows], k, return_distance=False)
                pick = near[np.arange(len(rows)), rng.integers(k, size=len(rows))]
            out[rows] = bank_s[pick]
        return out

    def to_arrays(self) -> dict[str, np.ndarray]:
        d: dict[str, np.ndarray] = {}
        for i, (p, s) in enumerate(zip(self.zprofiles, self.states, strict=True)):
            d[f"p{i}"], d[f"s{i}"] = p, s
        return d

    @classmethod
    def from_arrays(cls, d: Any, n_scenarios: int) -> InitialStates:
        return cls(
            [np.asarray(d[f"p{i}"]) for i in range(n_scenarios)],
            [np.asarray(d[f"s{i}"]) for i in range(n_scenarios)],
        )
