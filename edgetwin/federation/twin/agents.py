"""How many agents a statistic is over: the unit of a federated twin fit's k-agent rule.

A site's ``min_agents`` setting (`edgetwin.federation.twin.fit.SiteFitter`) bounds every statistic
it sends to aggregates over at least that many *agents*, not rows: an agent's consecutive ticks are
near copies, so a mean of its 96 rows is its profile. Shared by the fit's phases
(`edgetwin.federation.twin.fit`) and the causal rounds (`edgetwin.federation.twin.causal`).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

__all__ = ["effective_agents", "released_rows"]


def effective_agents(weights_by_agent: np.ndarray) -> float:
    """Kish's effective number of agents ``(sum w)^2 / sum w^2`` of a group whose agents carry
    ``weights_by_agent`` (rows, or responsibilities, per agent): 10 agents with one row each give
    10; one agent with 100 rows and 9 with one row each give about 1.2 — what a mean over the
    group reveals of its largest contributor."""
    w = np.asarray(weights_by_agent, np.float64)
    ss = float((w * w).sum())
    return float(w.sum() ** 2 / ss) if ss > 0 else 0.0


def released_rows(df: pd.DataFrame, min_agents: int) -> tuple[pd.DataFrame, list[str]]:
    """The rows of a site's log its statistics may be computed on, and the scenarios left out.

    A scenario is released when its rows are over at least ``min_agents`` effective agents
    (`effective_agents` of its rows per agent) and so are its (episode, agent) first rows (what
    the population statistics are over). Every statistic a site sends is computed on these rows
    only, so its totals are sums of released per-scenario cells: a total minus the cells could
    otherwise isolate a small scenario's agents (docs/federation.md, "Differences an observer can
    form"). ``df`` needs ``episode``, ``agent`` and ``scenario``; the row order is kept.
    """
    keep: list[str] = []
    dropped: list[str] = []
    for scen, rows in df.groupby("scenario", sort=True):
        first = rows.drop_duplicates(["episode", "agent"])
        eff = min(effective_agents(rows.groupby("agent").size().to_numpy()),
                  effective_agents(first.groupby("agent").size().to_numpy()))
        (keep if eff >= min_agents else dropped).append(str(scen))
    return df[df["scenario"].astype(str).isin(keep)], dropped
