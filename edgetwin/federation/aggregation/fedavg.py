"""FedAvg, FedAvgM, staleness-aware mixing and partial participation (seed 003 §4.3, §5.3).

- `FedAvg` (McMahan et al. 2017): ``x <- x + lr * sum_k n_k delta_k / sum_k n_k``.
- `FedAvgM` (Hsu et al. 2019), server momentum 0.9: ``v <- beta v + avg_delta; x <- x + lr v``.
- `StalenessAware`: a late update computed from round ``b`` arriving in round ``r`` is discounted
  by ``(1 + (r - b))^-a`` (polynomial staleness function of FedAsync, Xie et al. 2019) before the
  inner strategy sees it; beyond ``max_staleness`` it is dropped.
- `ClientSampler`: the 60-80 % of clients asked to train each round, reproducible from the seed.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from edgetwin.contract.errors import InputError
from edgetwin.federation.aggregation.base import AggregateResult, Aggregator, ClientUpdate, LinearAggregator

__all__ = ["ClientSampler", "FedAvg", "FedAvgM", "StalenessAware"]


class FedAvg(LinearAggregator):
    """Sample-weighted average of the client updates.

    Args:
        weighting: ``"samples"`` or ``"uniform"``.
        server_lr: step applied to the averaged update (1.0: the plain average of client models).
    """

    name = "fedavg"

    def __init__(self, weighting: str = "samples", server_lr: float = 1.0) -> None:
        super().__init__(weighting)
        if not server_lr > 0:
            raise InputError(f"server_lr must be > 0, got {server_lr}", where="server_lr")
        self.server_lr = float(server_lr)

    def aggregate_sum(self, weighted_sum, total_weight, count, global_params, round=0):  # type: ignore[override]
        step = weighted_sum / total_weight
        params = (np.asarray(global_params, np.float64) + self.server_lr * step).astype(np.float32)
        return AggregateResult(params, info={"strategy": self.name, "n": count, "update_norm": float(np.linalg.norm(step))})


class FedAvgM(FedAvg):
    """FedAvg with server momentum.

    Args:
        momentum: beta (seed 003: 0.9).
        weighting, server_lr: as `FedAvg`.
    """

    name = "fedavgm"

    def __init__(self, momentum: float = 0.9, weighting: str = "samples", server_lr: float = 1.0) -> None:
        super().__init__(weighting, server_lr)
        if not 0.0 <= momentum < 1.0:
            raise InputError(f"momentum must be in [0, 1), got {momentum}", where="momentum")
        self.momentum = float(momentum)
        self.velocity: np.ndarray | None = None

    def aggregate_sum(self, weighted_sum, total_weight, count, global_params, round=0):  # type: ignore[override]
        step = weighted_sum / total_weight
        if self.velocity is None or self.velocity.shape != step.shape:
            self.velocity = np.zeros_like(step)
        self.velocity = self.momentum * self.velocity + step
        params = (np.asarray(global_params, np.float64) + self.server_lr * self.velocity).astype(np.float32)
        return AggregateResult(
            params,
            info={"strategy": self.name, "n": count, "update_norm": float(np.linalg.norm(step)),
                  "velocity_norm": float(np.linalg.norm(self.velocity))},
        )

    def state_dict(self) -> dict[str, Any]:
        return {"velocity": None if self.velocity is None else self.velocity.copy()}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        v = state.get("velocity")
        self.velocity = None if v is None else np.asarray(v, dtype=np.float64).copy()


class StalenessAware(Aggregator):
    """Discount late updates by ``(1 + staleness)^-exponent`` before ``inner`` aggregates them.

    Args:
        inner: the strategy that combines the discounted updates (FedAvg, FedAvgM, ...).
        exponent: a > 0; 0.5 halves an update that is 3 rounds late.
        max_staleness: updates older than this many rounds are dropped (None: never).
    """

    name = "staleness"

    def __init__(self, inner: Aggregator, exponent: float = 0.5, max_staleness: int | None = None) -> None:
        if not exponent >= 0:
            raise InputError(f"exponent must be >= 0, got {exponent}", where="exponent")
        if max_staleness is not None and max_staleness < 0:
            raise InputError(f"max_staleness must be >= 0, got {max_staleness}", where="max_staleness")
        self.inner = inner
        self.exponent = float(exponent)
        self.max_staleness = max_staleness

    @property
    def needs_individual_updates(self) -> bool:  # type: ignore[override]
        return self.inner.needs_individual_updates

    def discount(self, staleness: int) -> float:
        """The weight multiplier of an update ``staleness`` rounds late (1 when on time)."""
        return float((1.0 + max(0, staleness)) ** -self.exponent)

    def aggregate(self, updates: Sequence[ClientUpdate], global_params: np.ndarray, round: int = 0) -> AggregateResult:
        kept, dropped, staleness = [], [], {}
        for u in updates:
            s = round - u.base_round
            if s < 0:
                raise InputError(f"update of {u.client_id!r} is from round {u.base_round}, after round {round}", where="base_round")
            if self.max_staleness is not None and s > self.max_staleness:
                dropped.append(u.client_id)
                continue
            staleness[u.client_id] = s
            kept.append(ClientUpdate(u.client_id, u.delta, u.num_samples, u.base_round, u.mix * self.discount(s)))
        res = self.inner.aggregate(kept, global_params, round)
        res.info.update({"staleness": staleness, "dropped_stale": dropped})
        return res

    def model_for(self, client_id: str, global_params: np.ndarray) -> np.ndarray:
        return self.inner.model_for(client_id, global_params)

    def state_dict(self) -> dict[str, Any]:
        return self.inner.state_dict()

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.inner.load_state_dict(state)


class ClientSampler:
    """Partial participation: each round a seeded random 60-80 % of the clients.

    Args:
        fraction: a share in (0, 1], or a ``(low, high)`` range from which each round's share is
            drawn uniformly (seed 003: 0.6-0.8).
        min_clients: never fewer than this many (capped by the number of clients).
        seed: same seed and round -> same sample.
    """

    def __init__(self, fraction: float | tuple[float, float] = (0.6, 0.8), min_clients: int = 1, seed: int = 0) -> None:
        lo, hi = (fraction, fraction) if isinstance(fraction, int | float) else tuple(fraction)
        if not (0.0 < lo <= hi <= 1.0):
            raise InputError(f"participation must be within (0, 1] (low <= high), got {fraction}", where="participation")
        if min_clients < 1:
            raise InputError(f"min_clients must be >= 1, got {min_clients}", where="min_clients")
        self.low, self.high = float(lo), float(hi)
        self.min_clients = int(min_clients)
        self.seed = int(seed)

    def expected_min(self, n: int) -> int:
        """The fewest clients a round can sample out of ``n``."""
        return min(n, max(self.min_clients, int(np.ceil(self.low * n))))

    def sample(self, clients: Sequence[str], round: int) -> list[str]:
        """The participants of ``round`` (in the order of ``clients``)."""
        n = len(clients)
        if n == 0:
            return []
        rng = np.random.default_rng([self.seed, int(round)])
        share = rng.uniform(self.low, self.high) if self.high > self.low else self.low
        k = min(n, max(self.min_clients, int(np.ceil(share * n))))
        chosen = np.sort(rng.choice(n, size=k, replace=False))
        return [clients[i] for i in chosen]
