"""Aggregation strategies by name: what a hierarchy's ``strategy = {name = ...}`` and ``--strategy`` mean."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from edgetwin.contract.errors import InputError
from edgetwin.federation.aggregation.base import Aggregator
from edgetwin.federation.aggregation.fedavg import FedAvg, FedAvgM
from edgetwin.federation.aggregation.personalized import AttentionAggregator, ClusteredFedAvg
from edgetwin.federation.aggregation.privacy import GaussianDP
from edgetwin.federation.aggregation.robust import CoordinateMedian, Krum, NormClipping, TrimmedMean

__all__ = ["STRATEGIES", "make_aggregator"]

STRATEGIES: dict[str, type[Aggregator]] = {
    "fedavg": FedAvg,
    "fedavgm": FedAvgM,
    "median": CoordinateMedian,
    "trimmed_mean": TrimmedMean,
    "krum": Krum,
    "multi_krum": Krum,
    "norm_clip": NormClipping,
    "dp_gaussian": GaussianDP,
    "attention": AttentionAggregator,
    "clustered": ClusteredFedAvg,
}


def make_aggregator(spec: str | Mapping[str, Any], num_clients: int | None = None, where: str = "strategy") -> Aggregator:
    """A strategy from ``"fedavg"`` or ``{"name": "krum", "f": 1, ...}``.

    ``num_clients`` (the fewest updates a round can close with) lets Krum refuse ``n < 2f + 3``.
    """
    if isinstance(spec, str):
        name, params = spec, {}
    elif isinstance(spec, Mapping) and isinstance(spec.get("name"), str):
        name, params = spec["name"], {k: v for k, v in spec.items() if k != "name"}
    else:
        raise InputError(f"expected a strategy name or a table with 'name', got {spec!r}", where=where)
    cls = STRATEGIES.get(name)
    if cls is None:
        raise InputError(f"unknown strategy {name!r}; known: {sorted(STRATEGIES)}", where=where)
    if name == "multi_krum":
        params.setdefault("m", 3)
    if cls is Krum and num_clients is not None:
        params.setdefault("num_clients", num_clients)
    try:
        return cls(**params)
    except TypeError as e:
        raise InputError(f"{name}: {e}", where=where) from None
    except InputError as e:
        raise InputError(f"{name}: {e}", where=where) from None
