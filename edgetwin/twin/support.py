"""The logs' support: how far a simulated row, or a generated profile, is from what was logged.

A twin is only trusted where its logs were. `SupportIndex` measures how far ``[profile, state,
action]`` rows are from the logged ones (the out-of-support share every rollout reports);
`ProfileSupport` tells whether a generated agent resembles a logged one of its scenario (the
simulation redraws those that do not).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import pandas as pd
from sklearn.neighbors import NearestNeighbors

from edgetwin.imitation.neighbours import kneighbors

__all__ = ["ProfileSupport", "SupportIndex"]


@dataclass
class SupportIndex:
    """How far ``[context, action]`` rows (``context`` = standardised profile and state) are from the logs.

    A row is *out of support* when its context is farther from every logged context than
    ``threshold``, or when its action is farther than ``action_threshold`` from every action logged
    in the ``k`` nearest logged contexts (the last ``n_action`` columns are the action; with
    ``n_action = 0`` the whole row is one block). Both thresholds are the 99th percentile of the same
    distances measured from logged rows to the logged rows of *other* episodes (``groups``), so a
    logged day the index did not see is flagged on about 1-2 % of its rows.

    Why held-out episodes: an agent's rows at adjacent ticks are near copies of each other (the same
    profile, a slowly moving state), so a nearest-other-row threshold measures how smooth one agent's
    trajectory is, not how far a new day is from the logs; on logs of a deployed policy it put 39 % of
    the logging policy's own steps on two unseen days outside. Why the action apart, given the
    context: in the joint space the profile and state columns outnumber the action columns, and a
    threshold loose enough for new agents lets any action through (uniformly random actions under a
    noisy heuristic's logs: 0.4 % outside in the joint space); what a twin cannot vouch for is an
    action that was never taken *in such a context* (docs/benchmarks/whatif_gate/README.md).
    `outside` says which rows; `score` is the larger of the two distances in units of its
    threshold (> 1: outside).
    """

    bank: np.ndarray
    threshold: float
    #: brute force: on 10-40 standardised columns it is 5-10x faster than sklearn's trees (and exact)
    nn: NearestNeighbors | None = None
    n_action: int = 0
    action_threshold: float = float("inf")
    k: int = 20

    @classmethod
    def fit(
        cls,
        z: np.ndarray,
        seed: int = 0,
        max_rows: int = 20_000,
        quantile: float = 0.99,
        groups: np.ndarray | None = None,
        max_folds: int = 10,
        n_action: int = 0,
        k: int = 20,
    ) -> SupportIndex:
        """Index ``z (N, D)`` (a random subset of at most ``max_rows`` rows is kept).

        Args:
            groups: ``(N,)`` episode of each row. The thresholds are then the ``quantile`` of each
                kept row's distances to the kept rows of other episodes, episodes grouped into at
                most ``max_folds`` folds (with up to ``max_folds`` episodes, leave one episode out).
                Without it (or with one episode) the nearest *other* row stands in.
            n_action: the last ``n_action`` columns of ``z`` are the action (judged given the context).
            k: how many nearest logged contexts the action is compared with.
        """
        rng = np.random.default_rng(seed)
        keep = rng.choice(len(z), size=min(max_rows, len(z)), replace=False) if len(z) else np.arange(0)
        idx = cls(bank=z[keep].astype(np.float32), threshold=float("inf"), n_action=int(n_action), k=int(k))
        if len(idx.bank) < 3:
            return idx
        fold = None
        if groups is not None:
            codes, uniques = pd.factorize(np.asarray(groups)[keep])
            if len(uniques) >= 2:
                fold = codes % min(max_folds, len(uniques))
        if fold is None:  # one episode: the nearest other row (the row itself is its own nearest)
            d_ctx, d_act = idx._distances(idx.bank, idx.bank, skip_self=True)
        else:
            d_ctx, d_act = np.empty(len(idx.bank)), np.empty(len(idx.bank))
            for f in np.unique(fold):
                inside = fold == f
                d_ctx[inside], d_act[inside] = idx._distances(idx.bank[~inside], idx.bank[inside])
        idx.threshold = float(np.quantile(d_ctx, quantile))
        if idx.n_action:
            idx.action_threshold = float(np.quantile(d_act, quantile))
        return idx

    def _context(self, z: np.ndarray) -> np.ndarray:
        return z[:, : z.shape[1] - self.n_action] if self.n_action else z

    def _distances(
        self, ref: np.ndarray, z: np.ndarray, skip_self: bool = False
    ) -> tuple[np.ndarray, np.ndarray]:
        """``(N,)`` context distance of ``z``'s rows to ``ref`` and ``(N,)`` action distance to the
        actions of their ``k`` nearest contexts in ``ref`` (zeros without an action block)."""
        z = np.asarray(z, dtype=np.float32)
        ctx_ref = self._context(ref)
        nn = self._nn() if ref is self.bank else NearestNeighbors(n_neighbors=1, algorithm="brute").fit(ctx_ref)
        extra = 1 if skip_self else 0
        k = min((self.k if self.n_action else 1) + extra, len(ref))
        d, i = nn.kneighbors(self._context(z), n_neighbors=k)
        d, i = d[:, extra:], i[:, extra:]
        if not self.n_action:
            return d[:, 0], np.zeros(len(z))
        a = z[:, z.shape[1] - self.n_action :]
        a_ref = ref[:, ref.shape[1] - self.n_action :]
        d_act = np.linalg.norm(a_ref[i] - a[:, None, :], axis=2).min(axis=1)
        return d[:, 0], d_act

    def _nn(self) -> NearestNeighbors:
        if self.nn is None:
            self.nn = NearestNeighbors(n_neighbors=1, algorithm="brute").fit(self._context(self.bank))
        return self.nn

    def score(self, z: np.ndarray) -> np.ndarray:
        """``(N,)`` distance from the logs in units of the threshold (the larger of context and action; > 1: outside)."""
        if len(self.bank) == 0 or len(z) == 0:
            return np.zeros(len(z))
        d_ctx, d_act = self._distances(self.bank, z)
        out = d_ctx / max(self.threshold, 1e-12)
        if self.n_action:
            out = np.maximum(out, d_act / max(self.action_threshold, 1e-12))
        return out

    def outside(self, z: np.ndarray) -> np.ndarray:
        """``(N,)`` bool: the rows of ``z (N, D)`` outside the logs' support."""
        return self.score(z) > 1.0

    def to_arrays(self) -> dict[str, np.ndarray]:
        return {
            "support_bank": self.bank,
            "support_threshold": np.array(self.threshold),
            "support_n_action": np.array(self.n_action),
            "support_action_threshold": np.array(self.action_threshold),
            "support_k": np.array(self.k),
        }

    @classmethod
    def from_arrays(cls, arr: Mapping[str, np.ndarray]) -> SupportIndex:
        """From `to_arrays`; a twin saved before the action block had only the joint threshold."""
        return cls(
            bank=np.asarray(arr["support_bank"]),
            threshold=float(arr["support_threshold"]),
            n_action=int(arr["support_n_action"]) if "support_n_action" in arr else 0,
            action_threshold=float(arr["support_action_threshold"]) if "support_action_threshold" in arr else float("inf"),
            k=int(arr["support_k"]) if "support_k" in arr else 20,
        )


class ProfileSupport:
    """Whether generated profiles lie in the logs' support, per scenario (standardised units).

    A profile is *in support* when its nearest logged profile of the same scenario is no farther
    than the ``quantile`` of logged profiles' nearest-other-profile distances. A generative
    population model puts some mass between and beyond the logged agents; the client models have
    never seen such agents, so `Simulation` redraws them (see ``Twin.profile_retries``).
    """

    def __init__(self, zprofiles: list[np.ndarray], quantile: float = 0.99) -> None:
        self.nn: list[NearestNeighbors | None] = []
        self.threshold: list[float] = []
        for z in zprofiles:
            if len(z) < 3 or z.shape[1] == 0:
                self.nn.append(None)
                self.threshold.append(float("inf"))
                continue
            nn = NearestNeighbors(n_neighbors=2).fit(z)
            d, _ = nn.kneighbors(z)
            self.nn.append(nn)
            self.threshold.append(float(np.quantile(d[:, 1], quantile)))

    def inside(self, scenario: int, zp: np.ndarray) -> np.ndarray:
        """``(n,)`` bool: rows of ``zp (n, P)`` within scenario ``scenario``'s support."""
        nn = self.nn[scenario]
        if nn is None or len(zp) == 0:
            return np.ones(len(zp), dtype=bool)
        d = kneighbors(nn, zp, 1)[0][:, 0]  # the tree asked directly: the same distances
        return d <= self.threshold[scenario]
