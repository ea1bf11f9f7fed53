"""Byzantine-robust aggregation rules (seed 003 §8.1: median, Krum, norm clipping).

All rules combine client *updates* (deltas) and step the model by the result. Sample weights are
ignored on purpose: a Byzantine client could otherwise buy influence by claiming many samples.

- `CoordinateMedian` (Yin et al. 2018): per-coordinate median.
- `TrimmedMean` (Yin et al. 2018): per coordinate, drop the ``beta`` share of largest and smallest
  values and average the rest; needs ``beta >= byzantine_fraction``.
- `Krum` / multi-Krum (Blanchard et al. 2017): score each update by the summed squared distance to
  its ``n - f - 2`` nearest neighbours, average the ``m`` best; needs ``n >= 2f + 3``.
- `NormClipping` (Sun et al. 2019): scale every update to norm <= ``max_norm`` (fixed, or the
  median norm of the round) and average.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from edgetwin.contract.errors import InputError
from edgetwin.federation.aggregation.base import (
    AggregateResult,
    Aggregator,
    ClientUpdate,
    QuorumNotMet,
    check_updates,
    stack,
)

__all__ = [
    "CoordinateMedian",
    "Krum",
    "NormClipping",
    "TrimmedMean",
    "clip_by_norm",
    "coordinate_median",
    "krum_scores",
    "trimmed_mean",
]


def coordinate_median(deltas: np.ndarray) -> np.ndarray:
    """(D,) per-coordinate median of ``deltas`` (K, D)."""
    return np.median(deltas, axis=0)


def trimmed_mean(deltas: np.ndarray, beta: float) -> np.ndarray:
    """(D,) mean of each coordinate after dropping ``floor(beta * K)`` values at each end."""
    k = deltas.shape[0]
    cut = int(np.floor(beta * k))
    if 2 * cut >= k:
        raise QuorumNotMet(f"trimmed mean with beta={beta} removes all of {k} updates")
    s = np.sort(deltas, axis=0)
    return s[cut : k - cut].mean(axis=0)


def krum_scores(deltas: np.ndarray, f: int) -> np.ndarray:
    """(K,) Krum score: sum of squared distances to the ``K - f - 2`` nearest other updates."""
    k = deltas.shape[0]
    sq = np.sum(deltas**2, axis=1)
    d2 = np.maximum(sq[:, None] + sq[None, :] - 2.0 * deltas @ deltas.T, 0.0)
    np.fill_diagonal(d2, np.inf)
    nn = k - f - 2
    return np.sort(d2, axis=1)[:, :nn].sum(axis=1)


def clip_by_norm(deltas: np.ndarray, max_norm: float) -> tuple[np.ndarray, np.ndarray]:
    """``(clipped (K, D), norms (K,))``: each row scaled to L2 norm <= ``max_norm``."""
    norms = np.linalg.norm(deltas, axis=1)
    scale = np.minimum(1.0, max_norm / np.maximum(norms, 1e-12))
    return deltas * scale[:, None], norms


class _RobustRule(Aggregator):
    needs_individual_updates = True

    def __init__(self, server_lr: float = 1.0) -> None:
        if not server_lr > 0:
            raise InputError(f"server_lr must be > 0, got {server_lr}", where="server_lr")
        self.server_lr = float(server_lr)

    def _step(self, updates: Sequence[ClientUpdate], global_params: np.ndarray, step: np.ndarray, info: dict) -> AggregateResult:
        params = (np.asarray(global_params, np.float64) + self.server_lr * step).astype(np.float32)
        info = {"strategy": self.name, "n": len(updates), "clients": [u.client_id for u in updates], **info}
        return AggregateResult(params, info=info)

    @staticmethod
    def _deltas(updates: Sequence[ClientUpdate], global_params: np.ndarray) -> np.ndarray:
        check_updates(updates, np.asarray(global_params).size)
        # The staleness discount still applies: it shrinks a late vector before the rule sees it.
        return stack(updates) * np.array([u.mix for u in updates])[:, None]


class CoordinateMedian(_RobustRule):
    """Per-coordinate median of the updates."""

    name = "median"

    def aggregate(self, updates, global_params, round=0):  # type: ignore[override]
        return self._step(updates, global_params, coordinate_median(self._deltas(updates, global_params)), {})


class TrimmedMean(_RobustRule):
    """Per-coordinate trimmed mean.

    Args:
        beta: share cut at each end, in [0, 0.5).
        byzantine_fraction: the share of Byzantine clients assumed; ``beta`` below it is refused.
    """

    name = "trimmed_mean"

    def __init__(self, beta: float = 0.2, byzantine_fraction: float = 0.0, server_lr: float = 1.0) -> None:
        super().__init__(server_lr)
        if not 0.0 <= beta < 0.5:
            raise InputError(f"beta must be in [0, 0.5), got {beta}", where="beta")
        if not 0.0 <= byzantine_fraction < 0.5:
            raise InputError(f"byzantine_fraction must be in [0, 0.5), got {byzantine_fraction}", where="byzantine_fraction")
        if beta < byzantine_fraction:
            raise InputError(
                f"trimmed-mean cut beta={beta} is below the assumed Byzantine fraction {byzantine_fraction}: "
                "Byzantine values would survive the trim",
                where="beta",
            )
        self.beta = float(beta)
        self.byzantine_fraction = float(byzantine_fraction)

    def aggregate(self, updates, global_params, round=0):  # type: ignore[override]
        deltas = self._deltas(updates, global_params)
        return self._step(updates, global_params, trimmed_mean(deltas, self.beta), {"trimmed_each_end": int(np.floor(self.beta * len(updates)))})


class Krum(_RobustRule):
    """Krum (``m = 1``) or multi-Krum (average of the ``m`` best-scored updates).

    Args:
        f: number of Byzantine clients tolerated.
        m: how many updates are averaged (1: Krum).
        num_clients: if known, the configuration is checked now: Krum needs ``n >= 2f + 3``.
    """

    name = "krum"

    def __init__(self, f: int = 1, m: int = 1, num_clients: int | None = None, server_lr: float = 1.0) -> None:
        super().__init__(server_lr)
        if f < 0 or m < 1:
            raise InputError(f"Krum needs f >= 0 and m >= 1, got f={f}, m={m}", where="f/m")
        self.f, self.m = int(f), int(m)
        if num_clients is not None:
            self.check_n(num_clients, where="num_clients")

    def min_clients(self) -> int:
        """``2f + 3``, the fewest updates Krum can work with."""
        return 2 * self.f + 3

    def check_n(self, n: int, where: str = "clients") -> None:
        """Refuse ``n < 2f + 3`` (and ``m > n - f``) with an `InputError`."""
        if n < 2 * self.f + 3:
            raise InputError(f"Krum with f={self.f} needs n >= 2f + 3 = {2 * self.f + 3} clients, got n={n}", where=where)

    def aggregate(self, updates, global_params, round=0):  # type: ignore[override]
        n = len(updates)
        if n < self.min_clients():
            raise QuorumNotMet(f"Krum with f={self.f} needs at least {self.min_clients()} updates, got {n}")
        deltas = self._deltas(updates, global_params)
        scores = krum_scores(deltas, self.f)
        m = min(self.m, n - self.f)
        chosen = np.argsort(scores, kind="stable")[:m]
        info = {"selected": [updates[i].client_id for i in chosen], "scores": scores.round(6).tolist()}
        return self._step(updates, global_params, deltas[chosen].mean(axis=0), info)


class NormClipping(_RobustRule):
    """Clip every update to ``max_norm`` and average them (uniformly, like the other rules).

    Args:
        max_norm: fixed bound; None uses the median update norm of the round (adaptive).
    """

    name = "norm_clip"

    def __init__(self, max_norm: float | None = None, server_lr: float = 1.0) -> None:
        super().__init__(server_lr)
        if max_norm is not None and not max_norm > 0:
            raise InputError(f"max_norm must be > 0, got {max_norm}", where="max_norm")
        self.max_norm = max_norm

    def aggregate(self, updates, global_params, round=0):  # type: ignore[override]
        deltas = self._deltas(updates, global_params)
        bound = self.max_norm if self.max_norm is not None else float(np.median(np.linalg.norm(deltas, axis=1)))
        clipped, norms = clip_by_norm(deltas, max(bound, 1e-12))
        step = clipped.mean(axis=0)
        return self._step(updates, global_params, step, {"max_norm": bound, "clipped": int((norms > bound).sum())})
