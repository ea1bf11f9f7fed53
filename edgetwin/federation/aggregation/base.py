"""Shared types of the aggregation strategies: client updates, results, flat parameter vectors.

Every strategy works on flat float32 vectors of length D. A client sends its *update*
``delta = params_after_local_training - params_it_started_from`` (what compression and secure
aggregation operate on); the server adds the aggregated update to the model it holds.
`ParamLayout` flattens a torch ``state_dict`` or a ``dict[str, np.ndarray]`` into such a vector and
back.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np

from edgetwin.contract.errors import InputError

__all__ = [
    "AggregateResult",
    "Aggregator",
    "ClientUpdate",
    "LinearAggregator",
    "ParamLayout",
    "QuorumNotMet",
    "check_updates",
    "flatten",
    "unflatten",
]


class QuorumNotMet(RuntimeError):
    """Too few updates arrived for a strategy to be meaningful (e.g. Krum with n < 2f + 3)."""


@dataclass
class ClientUpdate:
    """One client's contribution to a round.

    Attributes:
        client_id: who sent it (a site, or a child aggregator in a hierarchy).
        delta: (D,) float32, local parameters minus the parameters the client started from.
        num_samples: FedAvg weight (samples or effective batch size), > 0.
        base_round: the round of the model the client started from; staleness is
            ``round - base_round``.
        mix: extra multiplicative weight in [0, 1] (the staleness discount of `StalenessAware`).
    """

    client_id: str
    delta: np.ndarray
    num_samples: float = 1.0
    base_round: int = 0
    mix: float = 1.0


@dataclass
class AggregateResult:
    """What a round of aggregation produced.

    Attributes:
        params: (D,) float32, the new global model.
        personalized: client id -> (D,) model for strategies that personalise (attention,
            clustered); clients not in it use ``params``.
        info: diagnostics (weights, selected clients, clusters, epsilon, ...), JSON-able.
    """

    params: np.ndarray
    personalized: dict[str, np.ndarray] = field(default_factory=dict)
    info: dict[str, Any] = field(default_factory=dict)


def check_updates(updates: Sequence[ClientUpdate], dim: int, where: str = "updates") -> None:
    """Refuse empty rounds, duplicate clients, wrong sizes, non-finite values, bad weights."""
    if len(updates) == 0:
        raise QuorumNotMet(f"{where}: no updates to aggregate")
    seen: set[str] = set()
    for u in updates:
        if u.client_id in seen:
            raise InputError(f"client {u.client_id!r} sent two updates in one round", where=where)
        seen.add(u.client_id)
        d = np.asarray(u.delta)
        if d.shape != (dim,):
            raise InputError(f"update of {u.client_id!r} has shape {d.shape}, expected ({dim},)", where=where)
        if not np.all(np.isfinite(d)):
            raise InputError(f"update of {u.client_id!r} has NaN or infinite values", where=where)
        if not (u.num_samples > 0) or not np.isfinite(u.num_samples):
            raise InputError(f"update of {u.client_id!r} has num_samples={u.num_samples}, expected > 0", where=where)
        if not (0.0 <= u.mix <= 1.0):
            raise InputError(f"update of {u.client_id!r} has mix={u.mix}, expected in [0, 1]", where=where)


def stack(updates: Sequence[ClientUpdate]) -> np.ndarray:
    """(K, D) float64 matrix of the updates' deltas (float64: sums of many clients stay exact)."""
    return np.stack([np.asarray(u.delta, dtype=np.float64) for u in updates])


class Aggregator(ABC):
    """A server-side aggregation strategy.

    ``needs_individual_updates`` is True for rules that must see each client's vector (robust
    rules, clustering, attention); they cannot run behind secure aggregation.
    """

    name: ClassVar[str] = "aggregator"
    needs_individual_updates: ClassVar[bool] = True

    @abstractmethod
    def aggregate(self, updates: Sequence[ClientUpdate], global_params: np.ndarray, round: int = 0) -> AggregateResult:
        """Combine ``updates`` into a new model from ``global_params`` (D,)."""

    def model_for(self, client_id: str, global_params: np.ndarray) -> np.ndarray:
        """The model to send ``client_id`` next round (personalising strategies override)."""
        return global_params

    def state_dict(self) -> dict[str, Any]:
        """Server state that must survive a restart (momentum buffers, personalised models)."""
        return {}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:  # noqa: B027 (stateless by default)
        """Inverse of `state_dict`."""


class LinearAggregator(Aggregator):
    """A strategy that only needs the weighted *sum* of updates (FedAvg, FedAvgM, Gaussian DP).

    Such a strategy can run behind secure aggregation: clients send ``w_k * delta_k`` masked and
    ``w_k``, the server learns only ``sum_k w_k delta_k`` and ``sum_k w_k``.

    Args:
        weighting: ``"samples"`` (w_k = num_samples) or ``"uniform"`` (w_k = 1).
    """

    needs_individual_updates = False

    def __init__(self, weighting: str = "samples") -> None:
        if weighting not in ("samples", "uniform"):
            raise InputError(f"weighting must be 'samples' or 'uniform', got {weighting!r}", where="weighting")
        self.weighting = weighting

    def client_weight(self, u: ClientUpdate) -> tuple[float, float]:
        """``(weight on its delta, weight in the normaliser)`` of one update.

        The staleness discount ``mix`` only scales the delta, not the normaliser: a late update
        moves the model less instead of counting for less against the on-time ones only.
        """
        w = float(u.num_samples) if self.weighting == "samples" else 1.0
        return w * u.mix, w

    def aggregate(self, updates: Sequence[ClientUpdate], global_params: np.ndarray, round: int = 0) -> AggregateResult:
        g = np.asarray(global_params, dtype=np.float32)
        check_updates(updates, g.size)
        ws = np.array([self.client_weight(u) for u in updates])
        total = ws[:, 0] @ stack(updates)
        res = self.aggregate_sum(total, float(ws[:, 1].sum()), len(updates), g, round)
        res.info.setdefault("clients", [u.client_id for u in updates])
        res.info.setdefault("weights", (ws[:, 0] / ws[:, 1].sum()).round(6).tolist())
        return res

    @abstractmethod
    def aggregate_sum(
        self, weighted_sum: np.ndarray, total_weight: float, count: int, global_params: np.ndarray, round: int = 0
    ) -> AggregateResult:
        """New model from ``sum_k w_k delta_k`` (D,), ``sum_k w_k`` and the number of clients."""


# ------------------------------------------------------------------------------ flatten
@dataclass(frozen=True)
class ParamLayout:
    """Names, shapes and dtypes of a parameter dict, in order; maps it to a flat vector and back.

    Attributes:
        names: parameter names in the order they are concatenated.
        shapes: their shapes.
        kind: ``"torch"`` if built from torch tensors (`unflatten` returns tensors), else ``"numpy"``.
    """

    names: tuple[str, ...]
    shapes: tuple[tuple[int, ...], ...]
    kind: str = "numpy"

    @classmethod
    def of(cls, params: Mapping[str, Any]) -> ParamLayout:
        """The layout of ``params`` (a torch ``state_dict`` or a dict of arrays)."""
        if not isinstance(params, Mapping) or not params:
            raise InputError("expected a non-empty dict of parameter arrays", where="params")
        kind = "torch" if any(type(v).__module__.startswith("torch") for v in params.values()) else "numpy"
        return cls(tuple(params), tuple(tuple(np.shape(_to_numpy(v))) for v in params.values()), kind)

    @property
    def size(self) -> int:
        """D, the length of the flat vector."""
        return int(sum(int(np.prod(s, dtype=np.int64)) for s in self.shapes))

    def flatten(self, params: Mapping[str, Any]) -> np.ndarray:
        """(D,) float32 concatenation of ``params`` in layout order."""
        missing = [n for n in self.names if n not in params]
        extra = [n for n in params if n not in self.names]
        if missing or extra:
            raise InputError(f"parameters do not match the layout: missing {missing}, unexpected {extra}", where="params")
        parts = []
        for n, shape in zip(self.names, self.shapes, strict=True):
            a = _to_numpy(params[n])
            if tuple(a.shape) != shape:
                raise InputError(f"{n!r} has shape {tuple(a.shape)}, expected {shape}", where="params")
            parts.append(a.astype(np.float32, copy=False).ravel())
        return np.concatenate(parts) if parts else np.zeros(0, np.float32)

    def unflatten(self, vector: np.ndarray) -> dict[str, Any]:
        """The parameter dict of ``vector`` (D,): torch tensors or numpy arrays, by ``kind``."""
        v = np.asarray(vector, dtype=np.float32)
        if v.shape != (self.size,):
            raise InputError(f"vector has shape {v.shape}, layout needs ({self.size},)", where="params")
        out: dict[str, Any] = {}
        offset = 0
        for n, shape in zip(self.names, self.shapes, strict=True):
            k = int(np.prod(shape, dtype=np.int64))
            a = v[offset : offset + k].reshape(shape).copy()
            offset += k
            if self.kind == "torch":
                import torch

                out[n] = torch.from_numpy(a)
            else:
                out[n] = a
        return out


def _to_numpy(v: Any) -> np.ndarray:
    if hasattr(v, "detach"):  # torch.Tensor
        return v.detach().cpu().float().numpy()
    return np.asarray(v)


def flatten(params: Mapping[str, Any]) -> tuple[np.ndarray, ParamLayout]:
    """``(vector (D,) float32, layout)`` of a torch ``state_dict`` or a dict of arrays."""
    layout = ParamLayout.of(params)
    return layout.flatten(params), layout


def unflatten(vector: np.ndarray, layout: ParamLayout) -> dict[str, Any]:
    """Inverse of `flatten`."""
    return layout.unflatten(vector)
