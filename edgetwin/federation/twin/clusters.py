"""Clusters that are each a mean over at least ``min_agents`` distinct agents (`agent_clusters`):
what a site's summary centroids, support bank and EM groups are built from, so that no centroid
is one agent's profile; and the mixture component log-densities EM uses on a group's mean."""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd
from scipy.linalg import solve_triangular
from sklearn.cluster import KMeans, MiniBatchKMeans
from threadpoolctl import threadpool_limits

from edgetwin.federation.twin.agents import effective_agents


def component_logpdf(x: np.ndarray, w: np.ndarray, mu: np.ndarray, chol: np.ndarray) -> np.ndarray:
    """``(N, K)`` log w_k N(x; mu_k, L_k L_k^T)."""
    d = x.shape[1]
    out = np.empty((len(x), len(w)))
    for k in range(len(w)):
        y = solve_triangular(chol[k], (x - mu[k]).T, lower=True)
        logdet = 2.0 * np.log(np.diag(chol[k])).sum()
        out[:, k] = np.log(max(w[k], 1e-300)) - 0.5 * ((y * y).sum(axis=0) + logdet + d * np.log(2 * np.pi))
    return out


def kmeans(x: np.ndarray, k: int, seed: int, weights: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Centroids ``(k', D)`` and the label of each row (k' <= k)."""
    k = max(1, min(k, len(x)))
    with threadpool_limits(limits=1):
        if len(x) > 5000 and weights is None:
            km: Any = MiniBatchKMeans(n_clusters=k, random_state=seed, n_init=3, batch_size=2048)
        else:
            km = KMeans(n_clusters=k, random_state=seed, n_init=3)
        km.fit(x, sample_weight=weights)
    return km.cluster_centers_, km.labels_


def agent_clusters(x: np.ndarray, agents: np.ndarray, k: int, min_agents: int, seed: int,
                   weights: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Centroids of ``x (N, D)`` that are each a mean over at least ``min_agents`` effective agents.

    k-means with ``k`` clusters, then, while some cluster's `effective_agents` (rows per agent
    ``agents (N,)``) is below ``min_agents``, that cluster is merged into the cluster with the
    nearest centroid: no centroid is one agent's profile, however many rows it logged (an agent's
    consecutive ticks are near copies, so a centroid "of at least 5 rows" was often one agent).

    Returns:
        ``(centroids (C, D), rows (C,), labels (N,))``; C = 0 when all rows together are fewer than
        ``min_agents`` effective agents. ``labels`` is -1 for rows of no kept cluster.
    """
    codes = pd.factorize(np.asarray(agents))[0]
    n_agents = int(codes.max()) + 1 if len(codes) else 0
    if n_agents == 0 or effective_agents(np.bincount(codes)) < min_agents:
        return np.zeros((0, x.shape[1])), np.zeros(0), np.full(len(x), -1)
    k = max(1, min(k, len(x)))
    _, lab = kmeans(x, k, seed, weights)
    lab = np.asarray(lab).copy()

    def stats(c: int) -> tuple[np.ndarray, float]:
        rows = lab == c
        return x[rows].mean(axis=0), effective_agents(np.bincount(codes[rows], minlength=n_agents))

    live = {int(c): stats(int(c)) for c in np.unique(lab)}
    while len(live) > 1:
        worst = min(live, key=lambda c: (live[c][1], c))
        if live[worst][1] >= min_agents:
            break
        mu = live[worst][0]
        target = min((c for c in live if c != worst), key=lambda c: (float(np.linalg.norm(live[c][0] - mu)), c))
        lab[lab == worst] = target
        del live[worst]
        live[target] = stats(target)
    order = sorted(live)
    if live[order[0]][1] < min_agents:  # a single cluster left, and it is too few agents
        return np.zeros((0, x.shape[1])), np.zeros(0), np.full(len(x), -1)
    remap = np.full(int(lab.max()) + 1, -1)
    remap[order] = np.arange(len(order))
    lab = remap[lab]
    cent = np.stack([live[c][0] for c in order])
    return cent, np.bincount(lab, minlength=len(order)).astype(np.float64), lab
