"""The twin's per-service-group predictions that prediction-powered inference rectifies
(`edgetwin.loop.ppi`): `twin_group_series` (per tick) and `twin_group_predictions` (over a window).

Each replays the recent log's episodes in the twin (`edgetwin.twin.whatif.engine.run_episode`)
with every member under every policy, on one world seed per (episode, member) shared by the
policies (paired). A canary (`edgetwin.loop.rounds.canary_loop`) asks for such replays several
times: the day-to-day term, the plan (the full switch and the logged actions) and the verdict (each
member again, with the canary's own assignment); the plan's and the verdict's full-switch replays
are the same replays (same twin, policy, episode, world seed and member). Two things make them
cheaper without changing a number (issue 48: the demo's canary spent 21.6 s here):

- the replays read only the per-agent series, so they skip the support check (`run_episode`'s
  ``support=False``; its rows are still drawn, so the stream, and every series, is the same);
- within `shared_replays`, a replay of a policy the caller names is run once and its series
  reused by a later call (`_ReplayMemo`). Only the caller knows that a policy's replay depends on
  nothing but (twin, episode, world seed, member): a `fixed_policy` object that keeps state
  between replays (a sampling policy's stream, `edgetwin.loop.ppi.replay_spec`) would answer a
  second replay differently, so nothing is reused unless named.

Why the per-agent means stay pandas' ``groupby().mean()``: they cost 3 % of the replays' time
(py-spy), and pandas sums with compensation (Kahan) where numpy does not: the same numbers would
need that summation reimplemented.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from edgetwin.contract.errors import InputError

__all__ = ["shared_replays", "twin_group_predictions", "twin_group_series"]


@dataclass
class _ReplayMemo:
    """The replays of one `shared_replays` scope: key -> (columns, per-column ``(T, N)`` series,
    ``(N,)`` source rows). ``keep`` holds the named specs and the twins replayed, so that the
    ``id`` s in the keys stay theirs while the scope lasts."""

    specs: dict[int, Any]
    entries: dict[tuple[Any, ...], tuple[frozenset[str], dict[str, np.ndarray], np.ndarray | None]] = field(
        default_factory=dict
    )
    keep: dict[int, Any] = field(default_factory=dict)
    #: replays run and replays reused (for tests and profiles)
    runs: int = 0
    reused: int = 0


_MEMOS: list[_ReplayMemo] = []


@contextmanager
def shared_replays(*specs: Any) -> Iterator[_ReplayMemo]:
    """Within it, `twin_group_series` replays each (twin, one of ``specs``, logged episode, world
    seed, member) once and reuses its series when asked again (for the same columns or fewer).

    The caller vouches that each spec's replay depends on nothing else: a factory that builds a
    fresh policy from its arguments (`edgetwin.twin.whatif.builtin_policy`'s ``"logging"``,
    ``shared`` False), or one object whose ``act`` is deterministic and whose ``reset()``
    forgets the previous episode (an exported non-recurrent policy, `edgetwin.policies.export.LoadedPolicy`).
    Specs not named are replayed every time, as outside the scope. Yields the scope's memo (its
    ``runs`` and ``reused`` counts)."""
    memo = _ReplayMemo({id(s): s for s in specs})
    _MEMOS.append(memo)
    try:
        yield memo
    finally:
        _MEMOS.remove(memo)


def _episode_key(ep: Any) -> str:
    """A digest of everything a replay reads of a `LoggedEpisode` (two cuts of the same log rows,
    e.g. from two copies of the log, give the same key)."""
    h = hashlib.blake2b(digest_size=16)
    h.update(repr((str(ep.name), int(ep.t0), list(ep.site_names))).encode())
    arrays = [ep.agents, ep.scenario, ep.site, ep.profile, ep.state, ep.action]
    arrays += [ep.columns[k] for k in sorted(ep.columns)]
    for a in arrays:
        a = np.asarray(a)
        h.update(repr((a.dtype.str, a.shape)).encode())
        h.update(np.ascontiguousarray(a).tobytes() if a.dtype != object else repr(a.tolist()).encode())
    return h.hexdigest()


def _replay(
    twin: Any, pol: Any, ep: Any, ep_key: str | None, kdefs: Sequence[Any], kpis: Sequence[str], wseed: int, member: int
) -> tuple[dict[str, np.ndarray], np.ndarray | None]:
    """One replay's ``(T, N)`` series per column of ``kpis`` and its source rows: run (without the
    support check, whose shares nobody here reads), or reused from the innermost `shared_replays`
    scope that names ``pol``."""
    from edgetwin.twin.whatif import NOMINAL
    from edgetwin.twin.whatif.engine import run_episode

    memo = next((m for m in reversed(_MEMOS) if id(pol) in m.specs and m.specs[id(pol)] is pol), None)
    key = (id(twin), id(pol), ep_key, int(wseed), int(member))
    if memo is not None and ep_key is not None:
        hit = memo.entries.get(key)
        if hit is not None and set(kpis) <= hit[0]:
            memo.reused += 1
            return hit[1], hit[2]
    out = run_episode(twin, pol, NOMINAL, kdefs, seed=wseed, member=member, logged=ep, support=False)
    if memo is not None and ep_key is not None:
        memo.runs += 1
        memo.keep[id(twin)] = twin
        memo.entries[key] = (frozenset(kpis), dict(out.series), out.source)
    return out.series, out.source


def twin_group_series(
    twin: Any,
    policies: Mapping[str, Any],
    log: pd.DataFrame,
    kpis: Sequence[str],
    *,
    episodes: int = 1,
    seed: int = 0,
    members: Sequence[int] | None = None,
) -> dict[tuple[str, str], pd.DataFrame]:
    """The twin's per-service-group, per-tick prediction of each KPI column under each policy.

    Replays the log's last ``episodes`` episodes (their agents, sites, profiles, first states) with
    every member (or ``members``), on the same world seed for every policy (paired), and averages
    each agent's per-tick values over members and episodes.

    Args:
        policies: name -> `edgetwin.twin.whatif.PolicySpec`, or a `edgetwin.loop.ppi.CanaryAssignment`
            (anything with ``spec_for(agents, name)``: its routed policy built per episode, as the
            row order is the episode's agents).
        kpis: per-step columns (``kpi.slo_violation``, ``reward``, ...).

    Returns:
        ``(policy, column)`` -> DataFrame, index the agent ids (sorted), columns the ticks ``0..T-1``.
    """
    from edgetwin.twin.whatif.kpis import KpiDef
    from edgetwin.twin.whatif.replay import logged_episodes

    eps = logged_episodes(log, twin, max_episodes=episodes)
    if not eps:
        raise InputError("the log has no episode to replay", "--log")
    kdefs = [KpiDef(k, k, "mean") for k in kpis]
    mem = list(members) if members is not None else list(range(twin.n_members))
    parts: dict[tuple[str, str], list[pd.DataFrame]] = {}
    for e_i, ep in enumerate(eps):
        ep_pols = {name: pol.spec_for(ep.agents, name) if callable(getattr(pol, "spec_for", None)) else pol
                   for name, pol in policies.items()}  # fmt: skip
        ep_key = _episode_key(ep) if _MEMOS else None
        for m in mem:
            wseed = int(np.random.default_rng([seed, e_i, m]).integers(2**31))
            for name, pol in ep_pols.items():
                series, source = _replay(twin, pol, ep, ep_key, kdefs, kpis, wseed, m)
                src = source if source is not None else np.arange(len(ep.agents))
                agents = np.asarray(ep.agents).astype(str)[src]
                for k in kpis:
                    frame = pd.DataFrame(series[k].T, index=agents)  # (N, T)
                    parts.setdefault((name, k), []).append(frame.groupby(level=0).mean())
    return {key: pd.concat(fs).groupby(level=0).mean().sort_index() for key, fs in parts.items()}


def twin_group_predictions(
    twin: Any,
    policies: Mapping[str, Any],
    log: pd.DataFrame,
    kpis: Sequence[str],
    *,
    episodes: int = 1,
    seed: int = 0,
    window: tuple[int, int] | None = None,
    members: Sequence[int] | None = None,
) -> pd.DataFrame:
    """Per service group, the twin's mean of each KPI column under each policy over the ticks of
    ``window`` (``[start, stop)``; default the whole episode): `twin_group_series` averaged.

    Returns:
        One row per agent (sorted ids), columns ``(policy, column)`` (a MultiIndex).
    """
    series = twin_group_series(twin, policies, log, kpis, episodes=episodes, seed=seed, members=members)
    cols = {}
    for key, f in series.items():
        lo, hi = window if window is not None else (0, f.shape[1])
        cols[key] = f.iloc[:, lo:hi].mean(axis=1)
    df = pd.DataFrame(cols)
    df.columns = pd.MultiIndex.from_tuples(list(cols))
    return df
