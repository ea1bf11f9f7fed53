"""Counterfactual replay: recorded episodes (`LoggedEpisode`) whose agents, sites, profiles and first
states come from a log, their own KPIs, and how much of them lies outside the twin's support.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from edgetwin.contract.errors import InputError
from edgetwin.contract.spec import REWARD_COLUMN, TwinSpec
from edgetwin.twin.whatif.kpis import KpiDef

__all__ = ["LoggedEpisode", "logged_episode_kpis", "logged_episodes", "logged_support_share"]


@dataclass
class LoggedEpisode:
    """One recorded episode, ready to be replayed: who, where, from which state, what was done.

    Attributes:
        name: the episode's id in the log.
        agents: ``(N,)`` agent ids (those present at the first logged tick).
        scenario: ``(N,)`` scenario ids of the twin; site: ``(N,)`` site codes; site_names: names.
        profile: ``(N, P)``; state: ``(T, N, S)`` logged states (NaN where the agent is absent).
        action: ``(T, N, A)`` logged actions; t0: the first logged step.
        columns: ``(T, N)`` logged arrays of every column KPIs may read.
    """

    name: str
    agents: np.ndarray
    scenario: np.ndarray
    site: np.ndarray
    site_names: list[str]
    profile: np.ndarray
    state: np.ndarray
    action: np.ndarray
    t0: int
    columns: dict[str, np.ndarray]

    @property
    def steps(self) -> int:
        return int(self.state.shape[0])


def logged_episodes(
    log: pd.DataFrame, twin: Any, max_episodes: int | None = None, steps: int | None = None
) -> list[LoggedEpisode]:
    """Cut a (validated) log into `LoggedEpisode` s for counterfactual replay.

    Args:
        log: a table in the contract with the twin's columns.
        twin: the twin (its layout says which columns are which).
        max_episodes: replay at most this many episodes (the last ones: the most recent traffic).
        steps: cut episodes to this many steps.

    Raises:
        InputError: a column of the twin is missing, a scenario the twin does not know.
    """
    lay = twin.layout
    need = ["episode", "t", "agent", "scenario", "site", *lay.profile, *lay.state, *lay.action]
    missing = [c for c in need if c not in log.columns]
    if missing:
        raise InputError(f"the log lacks column(s) {missing} that the twin needs to replay it", "--log")
    scen_map = {s: i for i, s in enumerate(lay.scenarios)}
    names = list(pd.unique(log["episode"]))
    if max_episodes is not None:
        names = names[-int(max_episodes) :]
    kpi_cols = [c for c in dict.fromkeys([*lay.outputs, REWARD_COLUMN]) if c in log.columns]
    out = []
    for name in names:
        ep = log[log["episode"] == name].sort_values(["t", "agent"], kind="stable")
        t0 = int(ep["t"].min())
        first = ep[ep["t"] == t0]
        scen = first["scenario"].astype(str).map(scen_map)
        if scen.isna().any():
            bad = first["scenario"][scen.isna()].iloc[0]
            raise InputError(
                f"episode {name!r}: scenario {bad!r} is unknown to the twin ({lay.scenarios})", "--log"
            )
        agents = first["agent"].astype(str).to_numpy()
        site_codes, site_names = pd.factorize(first["site"].astype(str))
        t_max = int(ep["t"].max())
        n_t = t_max - t0 + 1 if steps is None else min(int(steps), t_max - t0 + 1)
        wide: dict[str, np.ndarray] = {}
        cols = list(dict.fromkeys([*lay.state, *lay.action, *kpi_cols, *lay.profile]))
        ep = ep[ep["t"] < t0 + n_t]
        idx = pd.MultiIndex.from_product([range(t0, t0 + n_t), agents], names=["t", "agent"])
        table = ep.assign(agent=ep["agent"].astype(str)).set_index(["t", "agent"])[cols]
        table = table[~table.index.duplicated()].reindex(idx)
        for c in cols:
            wide[c] = table[c].to_numpy(np.float64).reshape(n_t, len(agents))
        out.append(
            LoggedEpisode(
                name=str(name),
                agents=agents,
                scenario=scen.to_numpy(np.int64),
                site=site_codes.astype(np.int64),
                site_names=[str(s) for s in site_names],
                profile=first[lay.profile].to_numpy(np.float64),
                state=np.stack([wide[c] for c in lay.state], axis=-1)
                if lay.state
                else np.zeros((n_t, len(agents), 0)),
                action=np.stack([wide[c] for c in lay.action], axis=-1),
                t0=t0,
                columns={c: wide[c] for c in cols},
            )
        )
    if not out:
        raise InputError("the log has no episode to replay", "--log")
    return out


def logged_episode_kpis(
    episodes: Sequence[LoggedEpisode], kpis: Sequence[KpiDef], spec: TwinSpec
) -> dict[str, np.ndarray]:
    """KPIs of the recorded episodes themselves, computed exactly as for simulated ones."""
    reward_fn = spec.reward_fn() if (spec.reward_weights or spec.reward_function) else None
    out: dict[str, list[float]] = {k.name: [] for k in kpis}
    for ep in episodes:
        cols = dict(ep.columns)
        if REWARD_COLUMN not in cols and reward_fn is not None:
            t, n = ep.steps, len(ep.agents)
            flat = {c: v.reshape(-1) for c, v in cols.items()}
            for j, c in enumerate(spec.names("profile")):
                if c not in flat and j < ep.profile.shape[1]:
                    flat[c] = np.tile(ep.profile[:, j], t)
            with contextlib.suppress(KeyError):  # the reward reads a column the log lacks
                cols[REWARD_COLUMN] = np.asarray(reward_fn(flat), dtype=np.float64).reshape(t, n)
        for k in kpis:
            if all(c in cols for c in k.columns):
                out[k.name].append(k.compute(cols[k.column], None if k.weight is None else cols[k.weight]))
    return {k: np.asarray(v) for k, v in out.items() if v}


def logged_support_share(twin: Any, episodes: Sequence[LoggedEpisode], seed: int = 0, max_rows: int = 4000) -> float:
    """Share of recorded agent-steps ``[profile, state, action]`` outside the twin's support."""
    lay = twin.layout
    rng = np.random.default_rng(seed)
    rows = []
    for ep in episodes:
        t, n = ep.steps, len(ep.agents)
        z = np.concatenate(
            [
                np.broadcast_to(lay.scalers["profile"].transform(ep.profile), (t, n, len(lay.profile))).reshape(t * n, -1),
                lay.model_state(lay.scalers["state"].transform(ep.state.reshape(t * n, -1))),  # declared columns as the models see them
                lay.scalers["action"].transform(ep.action.reshape(t * n, -1)),
            ],
            axis=1,
        )
        z = z[np.isfinite(z).all(axis=1)]
        take = rng.choice(len(z), size=min(len(z), max_rows // max(len(episodes), 1)), replace=False)
        rows.append(z[take])
    z = np.concatenate(rows) if rows else np.zeros((0, 1))
    if not len(z):
        return 0.0
    return float(twin.support.outside(z).mean())
