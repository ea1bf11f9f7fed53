"""The logs' support: how far a simulated row, or a generated profile, is from what was logged.

A twin is only trusted where its logs were. `SupportIndex` measures how far ``[profile, state,
action]`` rows are from the logged ones (the out-of-support share every rollout reports);
`ProfileSupport` tells whether a generated agent resembles a logged one of its scenario (the
simulation redraws those that do not).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd
from sklearn.neighbors import NearestNeighbors

__all__ = ["ProfileSupport", "SupportIndex"]


@dataclass
class SupportIndex:
    """How far ``[profile, state, action]`` rows are from the logs (standardised units).

    A row is *out of support* when its nearest logged neighbour is farther than the 99th
    percentile of the distances from logged rows to the nearest row of *another* episode
    (``groups``): by construction, a logged day the twin had not seen would be flagged on about 1 %
    of its rows. Why held-out episodes and not simply the nearest other row: an agent's rows at
    adjacent ticks are near copies of each other (the same profile, a slowly moving state), so the
    nearest-other-row distance measures how smooth one agent's trajectory is, not how far a new
    agent or a new day is from the logs. On logs of a deployed policy that rule flagged 39 % of the
    logging policy's own rows on two unseen days as outside the logs (docs/benchmarks.md, "What-if
    replay vs the emulated cluster"). Without ``groups`` (or with a single episode) it falls back to
    the nearest other row.
    """

    bank: np.ndarray
    threshold: float
    nn: NearestNeighbors | None = None

    @classmethod
    def fit(
        cls,
        z: np.ndarray,
        seed: int = 0,
        max_rows: int = 20_000,
        quantile: float = 0.99,
        groups: np.ndarray | None = None,
        max_folds: int = 10,
    ) -> SupportIndex:
        """Index ``z (N, D)`` (a random subset of at most ``max_rows`` rows is kept).

        Args:
            groups: ``(N,)`` episode of each row. The threshold is then the ``quantile`` of each kept
                row's distance to the kept rows of other episodes, episodes grouped into at most
                ``max_folds`` folds (leave one fold out; with up to ``max_folds`` episodes, leave one
                episode out).
        """
        rng = np.random.default_rng(seed)
        keep = rng.choice(len(z), size=min(max_rows, len(z)), replace=False) if len(z) else np.arange(0)
        bank = z[keep]
        idx = cls(bank=bank.astype(np.float32), threshold=float("inf"))
        if len(bank) < 3:
            return idx
        fold = None
        if groups is not None:
            codes, uniques = pd.factorize(np.asarray(groups)[keep])
            if len(uniques) >= 2:
                fold = codes % min(max_folds, len(uniques))
        if fold is None:
            d, _ = idx._nn().kneighbors(bank, n_neighbors=2)
            idx.threshold = float(np.quantile(d[:, 1], quantile))
            return idx
        held_out = np.empty(len(bank))
        for f in np.unique(fold):
            inside = fold == f
            nn = NearestNeighbors(n_neighbors=1).fit(idx.bank[~inside])
            held_out[inside] = nn.kneighbors(idx.bank[inside], n_neighbors=1)[0][:, 0]
        idx.threshold = float(np.quantile(held_out, quantile))
        return idx

    def _nn(self) -> NearestNeighbors:
        if self.nn is None:
            self.nn = NearestNeighbors(n_neighbors=1).fit(self.bank)
        return self.nn

    def distance(self, z: np.ndarray) -> np.ndarray:
        if len(self.bank) == 0 or len(z) == 0:
            return np.zeros(len(z))
        return self._nn().kneighbors(z.astype(np.float32), n_neighbors=1)[0][:, 0]


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
        d = nn.kneighbors(zp, n_neighbors=1)[0][:, 0]
        return d <= self.threshold[scenario]
