"""The training data of the client, engine and transition models: a log's steps as standardised arrays
(`StepTable`, `build_steps`), with each agent's client inputs built by `client_features`.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from edgetwin.contract.errors import InputError
from edgetwin.contract.spec import POLICY_COLUMN
from edgetwin.imitation.layout import DAY_SECONDS, Layout

__all__ = [
    "StepTable",
    "build_steps",
    "client_features",
    "group_bins",
    "group_means",
    "segment_means",
    "segment_starts",
    "transition_features",
]


def group_means(
    values: np.ndarray,
    codes: np.ndarray,
    n_groups: int,
    bins: np.ndarray | None = None,
    counts: np.ndarray | None = None,
) -> np.ndarray:
    """Per-group means of ``values (N, D)`` by integer ``codes (N,)`` -> ``(n_groups, D)``.

    One `np.bincount` over all columns at once (bin ``code * D + column``): it adds each bin's
    values in row order, exactly as one bincount per column would, so the sums are the same to
    the last bit; a tick computes several of these, and the per-column calls cost more than the
    sums at a twin's sizes.

    Args:
        bins: ``(N * D,)`` the bin of every value, `group_bins` of these codes and D, and
            counts: ``(n_groups,)`` float64 rows per group: when the caller keeps them (a world's
            sites change once per episode, its means are taken every tick), else computed here.
    """
    codes = np.asarray(codes)
    if counts is None:
        counts = np.bincount(codes, minlength=n_groups).astype(np.float64)
    d = values.shape[1]
    if d == 0 or len(codes) == 0:
        return np.zeros((n_groups, d), dtype=np.float64)
    if bins is None:
        bins = group_bins(codes, d)
    sums: np.ndarray = np.bincount(bins, weights=np.asarray(values, np.float64).ravel(), minlength=n_groups * d)
    sums = sums.reshape(n_groups, d)
    sums /= np.maximum(counts, 1.0)[:, None]  # (float64 sums: bincount with weights)
    return sums


def segment_starts(codes: np.ndarray, n_groups: int) -> np.ndarray | None:
    """``(n_groups,)`` the first row of each group when ``codes (N,)`` is sorted and every group
    ``0..n_groups-1`` has rows (a world's agents come site by site), else None (`segment_means`)."""
    codes = np.asarray(codes)
    if len(codes) == 0 or n_groups < 1 or codes[0] != 0 or codes[-1] != n_groups - 1:
        return None
    step = np.diff(codes)
    if (step < 0).any() or (step > 1).any():
        return None
    return np.concatenate([[0], np.flatnonzero(step) + 1]).astype(np.intp)


def segment_means(values: np.ndarray, starts: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """`group_means` of ``values (N, D)`` whose groups are consecutive runs of rows beginning at
    ``starts`` (`segment_starts`), with ``counts (n_groups,)`` float64 rows per group.

    ~2.5x faster than `group_means`' bincount at a twin's sizes (10,000 agents, ~300 sites).
    The same means up to float64 rounding: ``np.add.reduceat`` adds a group's rows in its own
    (unrolled) order, not strictly row by row as bincount does, so a mean can differ in its last
    bits (~1e-16 relative); deterministic, and the same for a whole tick and its row subsets
    (both take a world's site means over all its agents).
    """
    v = np.asarray(values, np.float64)
    if v.shape[1] == 0:
        return np.zeros((len(starts), 0), dtype=np.float64)
    sums: np.ndarray = np.add.reduceat(v, starts, axis=0)
    sums /= np.maximum(counts, 1.0)[:, None]
    return sums


def group_bins(codes: np.ndarray, d: int) -> np.ndarray:
    """``(N * d,)`` int64 bins ``code * d + column`` of a row-major ``(N, d)`` array (`group_means`)."""
    return (np.asarray(codes).astype(np.int64)[:, None] * d + np.arange(d)).ravel()


def client_features(
    layout: Layout,
    zp: np.ndarray,
    zs: np.ndarray,
    za: np.ndarray,
    codes: np.ndarray,
    n_groups: int,
    lag: np.ndarray,
    t: np.ndarray,
    state_means: np.ndarray | None = None,
    site_size: np.ndarray | None = None,
    profile_means: np.ndarray | None = None,
    log_size: np.ndarray | None = None,
) -> np.ndarray:
    """Assemble the client model's inputs ``X (N, layout.n_client_inputs)`` (float32).

    Args:
        zp, zs, za: standardised profile / state / action, ``(N, P)``, ``(N, S)``, ``(N, A)``.
        codes: ``(N,)`` id of the (site, tick) group each row belongs to, ``0..n_groups-1``.
        lag: ``(N, A+Y)`` site means of standardised actions and outputs at t-1 for each row's
            site (zeros at t = 0, the standardised mean).
        t: ``(N,)`` step index, for the time-of-day inputs, or ``(1,)`` when every row is at
            the same tick (a world's tick: its sin and cos are then computed once).
        state_means, site_size: ``(N, S)`` site means of z(state) and ``(N,)`` agents per site,
            when the rows are a subset of their sites (default: computed from these rows).
        profile_means: ``(N, P)`` site means of z(profile), likewise (used when
            ``layout.site_profile``).
        log_size: ``(N, 1)`` the size input ``log1p(site_size) - layout.log_size_center``, when
            the caller keeps it (default: computed from ``site_size``).

    Each part is written into one float32 array (the same float64 -> float32 rounding as
    converting it on its own), not converted and then concatenated.
    """
    n = len(codes)
    if log_size is None:
        if site_size is None:
            site_size = np.bincount(codes, minlength=n_groups)[codes]
        log_size = (np.log1p(site_size) - layout.log_size_center)[:, None]
    if state_means is None:
        state_means = group_means(np.asarray(zs, np.float64), codes, n_groups)[codes]
    parts = [zp, zs, za, state_means, lag, log_size]
    if layout.site_profile:
        if profile_means is None:
            profile_means = group_means(np.asarray(zp, np.float64), codes, n_groups)[codes]
        parts.append(profile_means)
    if layout.use_time:
        phase = (
            2.0 * np.pi * ((np.asarray(t, np.float64) * layout.spec.step_seconds) % DAY_SECONDS) / DAY_SECONDS
        )
        parts += [np.sin(phase)[:, None], np.cos(phase)[:, None]]
    widths = [p.shape[1] if np.ndim(p) == 2 else 1 for p in parts]  # (every part is (N,) or (N, w))
    x = np.empty((n, sum(widths)), dtype=np.float32)
    col = 0
    for p, w in zip(parts, widths, strict=True):
        if w:
            x[:, col : col + w] = np.asarray(p).reshape(-1, w)  # (1, w) broadcasts: one tick for all rows
            col += w
    return x


@dataclass
class StepTable:
    """A log turned into model-ready arrays, row-aligned with the sorted log.

    Attributes:
        frame: the log sorted by (episode, t, agent), index reset.
        x_client: ``(N, n_client_inputs)`` client inputs.
        y_client: ``(N, n_model_outputs)`` standardised targets; Δstate is NaN where no next row.
        x_engine: ``(N, n_engine_inputs)`` engine inputs; ``za``: ``(N, A)`` standardised actions.
        has_next: ``(N,)`` the row's agent appears at t+1 of the same episode.
        next_index: ``(N,)`` row index of that next row (or -1).
        scenario: ``(N,)`` scenario id (index into ``layout.scenarios``).
        episode: ``(N,)`` episode codes.
        site_now: ``(N, A+Y)`` site means of standardised actions and outputs at the row's own
            tick (what the transition model sees: the tick's actions are all known at its end).
        site_group: ``(N,)`` id of the row's (episode, site, t) group, ``0..n_groups-1``.
    """

    frame: pd.DataFrame
    x_client: np.ndarray
    y_client: np.ndarray
    x_engine: np.ndarray
    za: np.ndarray
    has_next: np.ndarray
    next_index: np.ndarray
    scenario: np.ndarray
    episode: np.ndarray
    site_now: np.ndarray | None = None
    site_group: np.ndarray | None = None

    def rows(self, scenario: int | None = None, need_next: bool = False) -> np.ndarray:
        """Row indices of one scenario (or all), optionally only those with a next row."""
        mask = np.ones(len(self.frame), dtype=bool) if scenario is None else self.scenario == scenario
        if need_next:
            mask &= self.has_next
        return np.flatnonzero(mask)

    def policy_ids(self) -> np.ndarray | None:
        """``(N,)`` the id of the policy that decided each row (the log's ``policy`` column), or None
        when the log does not say."""
        return self.frame[POLICY_COLUMN].astype(str).to_numpy() if POLICY_COLUMN in self.frame else None

    def agent_days(self) -> np.ndarray:
        """``(N,)`` an ``episode/agent`` id per row: one agent's day, whose rows are not independent
        of each other (cross-fitting keeps them in one fold)."""
        return self.frame["episode"].astype(str).to_numpy() + "/" + self.frame["agent"].astype(str).to_numpy()


def _lookup(keys: np.ndarray, wanted: np.ndarray) -> np.ndarray:
    """``(M,)`` int64 the position in ``keys (N,)`` (distinct int64) of each of ``wanted (M,)``,
    -1 where it is not there (a sorted search, no hash table of Python objects)."""
    order = np.argsort(keys, kind="stable")
    ranked = keys[order]
    at = np.minimum(np.searchsorted(ranked, wanted), max(len(keys) - 1, 0))
    found = (ranked[at] == wanted) if len(keys) else np.zeros(len(wanted), bool)
    return np.where(found, order[at] if len(keys) else -1, -1).astype(np.int64)


def build_steps(log: pd.DataFrame, layout: Layout) -> StepTable:
    """Turn a log table into `StepTable` arrays (vectorised; no per-row Python)."""
    df = log.sort_values(["episode", "t", "agent"], kind="stable").reset_index(drop=True)
    sc = layout.scalers
    zp = sc["profile"].transform(df[layout.profile].to_numpy(np.float64))
    zs = sc["state"].transform(df[layout.state].to_numpy(np.float64))
    za = sc["action"].transform(df[layout.action].to_numpy(np.float64))
    zy = sc["outputs"].transform(df[layout.outputs].to_numpy(np.float64))
    t = df["t"].to_numpy(np.int64)
    # integer keys, not tuples: a MultiIndex of strings materialised a million Python tuples (its
    # `_values`) per lookup, ~3 s of each member's steps at a million rows; the codes and their
    # order of first appearance are the MultiIndex's (pandas factorizes both that way)
    episode_code = pd.factorize(df["episode"].astype(str))[0].astype(np.int64)
    site_in_episode = pd.factorize(df["site"].astype(str))[0].astype(np.int64)
    site_codes = pd.factorize(episode_code * (int(site_in_episode.max(initial=0)) + 1) + site_in_episode)[0].astype(np.int64)
    t0 = int(t.min(initial=0))
    span = int(t.max(initial=0)) - t0 + 2  # room for t - 1 and t + 1 of every row
    group_codes, group_uniques = pd.factorize(site_codes * span + (t - t0 + 1))
    n_groups = len(group_uniques)

    # actions and outputs of each (site, t) group, shifted so that every row sees t-1
    y_means = group_means(np.concatenate([za, zy], axis=1).astype(np.float64), group_codes, n_groups)
    prev = _lookup(np.asarray(group_uniques, np.int64), site_codes * span + (t - t0))
    lag = np.zeros((len(df), layout.n_lag), dtype=np.float64)
    ok = prev >= 0
    lag[ok] = y_means[prev[ok]]

    x = client_features(layout, zp, zs, za, group_codes, n_groups, lag, t)

    # next-state targets: the same (episode, agent) at t+1
    agent_code = pd.factorize(df["agent"].astype(str))[0].astype(np.int64)
    row_key = (episode_code * (int(agent_code.max(initial=0)) + 1) + agent_code) * span + (t - t0)
    uniq, first = np.unique(row_key, return_index=True)
    if len(uniq) < len(row_key):
        seen = np.zeros(len(row_key), bool)
        seen[first] = True
        dup = int(np.flatnonzero(~seen)[0])
        raise InputError(
            f"duplicate (episode, agent, t) row {(str(df['episode'].iloc[dup]), str(df['agent'].iloc[dup]), int(t[dup]))}; "
            "validate the log first", "log",
        )
    next_index = _lookup(row_key, row_key + 1)
    has_next = next_index >= 0
    y = zy
    if layout.learn_transition:
        delta = np.full_like(zs, np.nan)
        delta[has_next] = zs[next_index[has_next]] - zs[has_next]
        y = np.concatenate([zy, delta], axis=1)
    scen_index = {s: i for i, s in enumerate(layout.scenarios)}
    scenario = df["scenario"].astype(str).map(scen_index)
    if scenario.isna().any():
        bad = df["scenario"][scenario.isna()].iloc[0]
        raise InputError(f"scenario {bad!r} was not seen when the twin was fitted", "log")
    return StepTable(
        frame=df,
        x_client=x,
        y_client=y.astype(np.float32),
        x_engine=np.concatenate([zp, zs], axis=1).astype(np.float32),
        za=za,
        has_next=has_next,
        next_index=next_index,
        scenario=scenario.to_numpy(np.int64),
        episode=pd.factorize(df["episode"])[0],
        site_now=y_means[group_codes].astype(np.float32),
        site_group=np.asarray(group_codes, dtype=np.int64),
    )


def transition_features(x_client: np.ndarray, zy: np.ndarray, site_now: np.ndarray) -> np.ndarray:
    """The transition model's inputs ``(N, n_transition_inputs)`` (float32).

    Args:
        x_client: ``(N, n_client_inputs)`` client inputs of the tick.
        zy: ``(N, Y)`` the agent's own standardised outputs of the tick (the next state follows
            what it actually did, e.g. a "last tick's response" state column).
        site_now: ``(N, A+Y)`` its site's means of standardised actions and outputs of the tick.
    """
    return np.concatenate(
        [np.asarray(x_client, np.float32), np.asarray(zy, np.float32), np.asarray(site_now, np.float32)], axis=1
    )
