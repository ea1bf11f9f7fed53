"""How many agents a statistic is over: the unit of a federated twin fit's k-agent rule.

A site's ``min_agents`` setting (`edgetwin.federation.twin.fit.SiteFitter`) bounds every statistic
it sends to aggregates over at least that many *agents*, not rows: an agent's consecutive ticks are
near copies, so a mean of its 96 rows is its profile. Shared by the fit's phases
(`edgetwin.federation.twin.fit`) and the causal rounds (`edgetwin.federation.twin.causal`).
"""

from __future__ import annotations

import numpy as np

__all__ = ["effective_agents"]


def effective_agents(weights_by_agent: np.ndarray) -> float:
    """Kish's effective number of agents ``(sum w)^2 / sum w^2`` of a group whose agents carry
    ``weights_by_agent`` (rows, or responsibilities, per agent): 10 agents with one row each give
    10; one agent with 100 rows and 9 with one row each give about 1.2 — what a mean over the
    group reveals of its largest contributor."""
    w = np.asarray(weights_by_agent, np.float64)
    ss = float((w * w).sum())
    return float(w.sum() ** 2 / ss) if ss > 0 else 0.0
