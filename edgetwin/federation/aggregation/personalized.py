"""Personalised aggregation: PFRL-DM's multi-head attention (seed 000 §4.4-4.5) and clustered FL.

`AttentionAggregator` follows Algorithm 1 of seed 000. The server collects the K public critics
``Theta = [psi_1; ...; psi_K]`` (K, D), computes multi-head attention weights ``W`` (K, K) between
the clients (eqs. 18-20), gives client k the personalised critic ``psi_k = W[k] @ Theta`` (eq. 21)
and keeps ``psi_G = mean_k psi_k`` (eq. 22) for clients that did not take part.

The paper does not say how a critic becomes a query/key. Here each client's parameters, centred on
the round's mean (so the attention sees how clients differ, not what they share), are embedded by a
seeded Gaussian random projection to ``d_model`` dimensions (Johnson-Lindenstrauss: it preserves
inner products). The server has no loss to train ``W^Q``, ``W^K`` with, so they are one fixed
random orthogonal matrix shared by queries and keys: every head's logits are then inner products of
the clients' embeddings within that head's subspace, i.e. similarities, and
``torch.nn.MultiheadAttention`` computes eqs. 18-20 and averages the heads' weights. The embeddings
are scaled so that a head's logit ``q·k / sqrt(d_k)`` is the cosine similarity of the two clients in
that head's subspace divided by ``temperature``. (Scaling them to norm ``sqrt(d_model)`` as a
LayerNorm would makes the logits ``sqrt(d_k)`` times larger; with centred critics, whose pairwise
cosines are negative, every client then gives itself ~95 % of the weight and the "personalised"
critic is its own: no federation at all.) ``W^V`` / ``W^O`` do not enter: the weights are applied to the raw parameters
(eq. 21), which keeps every personalised critic a convex combination of real critics.

`ClusteredFedAvg` (seed 003 §4.3; Sattler et al. 2020): clients whose updates point the same way
(cosine similarity, agglomerative clustering) are averaged together; each gets its cluster's model.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from edgetwin.contract.errors import InputError
from edgetwin.federation.aggregation.base import (
    AggregateResult,
    Aggregator,
    ClientUpdate,
    check_updates,
    stack,
)

__all__ = ["AttentionAggregator", "ClusteredFedAvg", "attention_weights", "cluster_by_cosine"]


def attention_weights(
    params: np.ndarray, num_heads: int = 4, d_model: int = 64, temperature: float = 1.0, seed: int = 0
) -> np.ndarray:
    """Multi-head attention weights between clients (seed 000 eqs. 18-20), head-averaged.

    Args:
        params: (K, D) the clients' parameter vectors.
        num_heads: h; ``d_model`` must be divisible by it.
        d_model: embedding width.
        temperature: > 0; a head's logit is the clients' cosine similarity divided by it (1: the
            weights of two clients differ by at most a factor e^2 per head); larger spreads the
            attention more evenly.
        seed: of the projections.

    Returns:
        (K, K) row-stochastic: row k is how much client k attends to each client.
    """
    import torch

    theta = np.asarray(params, dtype=np.float64)
    if theta.ndim != 2:
        raise InputError(f"expected (K, D) parameters, got shape {theta.shape}", where="params")
    k, dim = theta.shape
    if d_model % num_heads:
        raise InputError(f"d_model={d_model} is not divisible by num_heads={num_heads}", where="num_heads")
    if not temperature > 0:
        raise InputError(f"temperature must be > 0, got {temperature}", where="temperature")
    if k == 1:
        return np.ones((1, 1))
    rng = np.random.default_rng(seed)
    centred = theta - theta.mean(axis=0)
    # Project in column blocks so a large D never needs the whole (D, d_model) matrix at once.
    emb = np.zeros((k, d_model))
    for start in range(0, dim, 65536):
        block = centred[:, start : start + 65536]
        emb += block @ rng.standard_normal((block.shape[1], d_model))
    norms = np.linalg.norm(emb, axis=1, keepdims=True)
    d_k = d_model // num_heads
    # Each head's slice of a unit-variance embedding has squared norm ~d_k; q·k/sqrt(d_k) is then
    # cos/temperature when the total squared norm is d_model / (sqrt(d_k) · temperature).
    emb = np.where(norms > 0, emb / np.maximum(norms, 1e-300), 0.0) * np.sqrt(d_model / (np.sqrt(d_k) * temperature))
    w_qk, _ = np.linalg.qr(rng.standard_normal((d_model, d_model)))

    mha = torch.nn.MultiheadAttention(d_model, num_heads, bias=False, batch_first=True, dtype=torch.float64)
    with torch.no_grad():
        wqk = torch.as_tensor(w_qk.T)
        mha.in_proj_weight.copy_(torch.cat([wqk, wqk, torch.eye(d_model, dtype=torch.float64)]))
        x = torch.as_tensor(emb)[None]
        _, weights = mha(x, x, x, need_weights=True, average_attn_weights=True)
    return weights[0].numpy()


class AttentionAggregator(Aggregator):
    """PFRL-DM personalised aggregation of the public critic (seed 000 Algorithm 1).

    Args:
        num_heads, d_model, temperature, seed: see `attention_weights`.

    State: the personalised model of every client that took part in the last round. A client
    trains from the model `model_for` gave it (its personalised critic if it took part last round,
    else ``psi_G``); its update is added back to that model to recover its critic.
    """

    name = "attention"
    needs_individual_updates = True

    def __init__(self, num_heads: int = 4, d_model: int = 64, temperature: float = 1.0, seed: int = 0) -> None:
        if num_heads < 1 or d_model < 1 or d_model % num_heads:
            raise InputError(f"need d_model divisible by num_heads >= 1, got {d_model}, {num_heads}", where="num_heads")
        if not temperature > 0:
            raise InputError(f"temperature must be > 0, got {temperature}", where="temperature")
        self.num_heads, self.d_model, self.temperature, self.seed = num_heads, d_model, float(temperature), seed
        self.personal: dict[str, np.ndarray] = {}
        self.last_participants: set[str] = set()

    def aggregate_params(self, client_ids: Sequence[str], params: np.ndarray, round: int = 0) -> AggregateResult:
        """The server step of Algorithm 1 on the collected critics ``params`` (K, D)."""
        theta = np.asarray(params, dtype=np.float64)
        if theta.ndim != 2 or theta.shape[0] != len(client_ids):
            raise InputError(f"params shape {theta.shape} does not match {len(client_ids)} clients", where="params")
        w = attention_weights(theta, self.num_heads, self.d_model, self.temperature, seed=self.seed)
        personal = w @ theta  # eq. 21
        global_params = personal.mean(axis=0).astype(np.float32)  # eq. 22
        out = {cid: personal[i].astype(np.float32) for i, cid in enumerate(client_ids)}
        self.personal.update(out)
        self.last_participants = set(client_ids)
        info = {"strategy": self.name, "n": len(client_ids), "clients": list(client_ids), "attention": w.round(6).tolist()}
        return AggregateResult(global_params, personalized=out, info=info)

    def aggregate(self, updates: Sequence[ClientUpdate], global_params: np.ndarray, round: int = 0) -> AggregateResult:
        g = np.asarray(global_params, dtype=np.float32)
        check_updates(updates, g.size)
        theta = np.stack([self.model_for(u.client_id, g).astype(np.float64) + u.mix * np.asarray(u.delta, np.float64) for u in updates])
        return self.aggregate_params([u.client_id for u in updates], theta, round)

    def model_for(self, client_id: str, global_params: np.ndarray) -> np.ndarray:
        # Algorithm 1: participants get their personalised critic, the others the server's psi_G.
        if client_id in self.last_participants and client_id in self.personal:
            return self.personal[client_id]
        return np.asarray(global_params, dtype=np.float32)

    def state_dict(self) -> dict[str, Any]:
        return {"personal": {k: v.copy() for k, v in self.personal.items()}, "last_participants": sorted(self.last_participants)}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.personal = {k: np.asarray(v, np.float32) for k, v in state.get("personal", {}).items()}
        self.last_participants = set(state.get("last_participants", []))


def cluster_by_cosine(deltas: np.ndarray, threshold: float = 0.5, n_clusters: int | None = None) -> np.ndarray:
    """(K,) cluster labels of updates ``deltas`` (K, D) by cosine distance (average linkage).

    Args:
        threshold: clusters are merged while their average cosine distance is below it (0..2).
        n_clusters: a fixed number of clusters instead of the threshold.
    """
    from sklearn.cluster import AgglomerativeClustering

    k = deltas.shape[0]
    if k == 1:
        return np.zeros(1, dtype=int)
    norms = np.linalg.norm(deltas, axis=1)
    # A zero update has no direction: cosine distance treats it as far from everything.
    x = np.where(norms[:, None] > 0, deltas / np.maximum(norms[:, None], 1e-300), 0.0)
    dist = np.clip(1.0 - x @ x.T, 0.0, 2.0)
    np.fill_diagonal(dist, 0.0)
    if n_clusters is not None:
        model = AgglomerativeClustering(n_clusters=min(n_clusters, k), metric="precomputed", linkage="average")
    else:
        model = AgglomerativeClustering(n_clusters=None, distance_threshold=threshold, metric="precomputed", linkage="average")
    return model.fit_predict(dist)


class ClusteredFedAvg(Aggregator):
    """Group clients by the cosine similarity of their updates and FedAvg within each group.

    Args:
        threshold: cosine-distance threshold of `cluster_by_cosine` (0.5: angle above ~60 degrees
            keeps groups apart).
        n_clusters: fixed number of clusters instead.

    Each client gets its cluster's model; ``params`` is the FedAvg of all clients.
    """

    name = "clustered"
    needs_individual_updates = True

    def __init__(self, threshold: float = 0.5, n_clusters: int | None = None) -> None:
        if not 0.0 < threshold <= 2.0:
            raise InputError(f"threshold must be in (0, 2], got {threshold}", where="threshold")
        if n_clusters is not None and n_clusters < 1:
            raise InputError(f"n_clusters must be >= 1, got {n_clusters}", where="n_clusters")
        self.threshold, self.n_clusters = float(threshold), n_clusters
        self.personal: dict[str, np.ndarray] = {}

    def aggregate(self, updates: Sequence[ClientUpdate], global_params: np.ndarray, round: int = 0) -> AggregateResult:
        g = np.asarray(global_params, dtype=np.float32)
        check_updates(updates, g.size)
        deltas = stack(updates) * np.array([u.mix for u in updates])[:, None]
        models = np.stack([self.model_for(u.client_id, g).astype(np.float64) for u in updates]) + deltas
        w = np.array([u.num_samples for u in updates], dtype=np.float64)
        labels = cluster_by_cosine(deltas, self.threshold, self.n_clusters)
        personal: dict[str, np.ndarray] = {}
        clusters = []
        for c in np.unique(labels):
            idx = np.flatnonzero(labels == c)
            model = (w[idx] @ models[idx] / w[idx].sum()).astype(np.float32)
            clusters.append([updates[int(i)].client_id for i in idx])
            for i in idx:
                personal[updates[int(i)].client_id] = model
        self.personal.update(personal)
        params = (w @ models / w.sum()).astype(np.float32)
        info = {"strategy": self.name, "n": len(updates), "clients": [u.client_id for u in updates], "clusters": clusters}
        return AggregateResult(params, personalized=personal, info=info)

    def model_for(self, client_id: str, global_params: np.ndarray) -> np.ndarray:
        return self.personal.get(client_id, np.asarray(global_params, dtype=np.float32))

    def state_dict(self) -> dict[str, Any]:
        return {"personal": {k: v.copy() for k, v in self.personal.items()}}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.personal = {k: np.asarray(v, np.float32) for k, v in state.get("personal", {}).items()}
