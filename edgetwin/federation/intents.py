"""Intents (seed 003 §4.2, §4.4): what ESAs announce (predicted backlog, tentative migrations) and
how a COA settles conflicting ones with congestion prices (`resolve_intents`).
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from edgetwin.federation.sites import SiteTelemetry

__all__ = [
    "IntentResolution",
    "intent_payload",
    "resolve_intents",
]


@dataclass
class IntentResolution:
    """How a COA settled one round's intents (seed 003 §4.2, §4.4: auction-style, congestion-priced).

    Attributes:
        prices: destination -> internal price per unit of migrated load.
        congestion: destination -> requested load / headroom (> 1: oversubscribed).
        accepted: ``{"site", "service", "to", "load", "bid"}`` migrations granted.
        rejected: those refused (the destination had no headroom left for them).
    """

    prices: dict[str, float] = field(default_factory=dict)
    congestion: dict[str, float] = field(default_factory=dict)
    accepted: list[dict[str, Any]] = field(default_factory=list)
    rejected: list[dict[str, Any]] = field(default_factory=list)


def resolve_intents(
    intents: Mapping[str, Mapping[str, Any]],
    base_price: float = 1.0,
    sensitivity: float = 2.0,
    cloud: str = "cloud",
) -> IntentResolution:
    """Resolve conflicting tentative migrations with congestion prices.

    Each site's intent names its ``headroom`` (vCPU it could take in) and ``migrations``
    (``{"service", "to", "load", "bid"}``: load in vCPU, bid = urgency). Per destination, requests
    are granted in order of bid (ties: site, service) while they fit its headroom; the rest are
    refused. The destination's price is ``base_price · (1 + sensitivity · congestion)``, so an
    oversubscribed site becomes expensive and ESAs route their next intents elsewhere. The cloud
    (``cloud``) has unbounded headroom at ``base_price · (1 + sensitivity)`` (the backhaul costs).

    Args:
        intents: site -> intent payload of this round.
    """
    headroom = {s: max(0.0, float(p.get("headroom", 0.0))) for s, p in intents.items()}
    requests: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for s, p in sorted(intents.items()):
        for m in p.get("migrations", []):
            load = max(0.0, float(m.get("load", 0.0)))
            requests[str(m["to"])].append(
                {
                    "site": s,
                    "service": str(m["service"]),
                    "to": str(m["to"]),
                    "load": load,
                    "bid": float(m.get("bid", 0.0)),
                }
            )
    res = IntentResolution()
    for dest in sorted(set(requests) | set(headroom)):
        reqs = sorted(requests.get(dest, []), key=lambda m: (-m["bid"], m["site"], m["service"]))
        demand = sum(m["load"] for m in reqs)
        if dest == cloud:
            res.congestion[dest] = 0.0
            res.prices[dest] = base_price * (1.0 + sensitivity)
            res.accepted.extend(reqs)
            continue
        room = headroom.get(dest, 0.0)
        cong = demand / room if room > 0 else (10.0 if demand > 0 else 0.0)
        res.congestion[dest] = float(min(cong, 10.0))
        res.prices[dest] = float(base_price * (1.0 + sensitivity * min(cong, 10.0)))
        used = 0.0
        for m in reqs:
            if used + m["load"] <= room + 1e-9:
                used += m["load"]
                res.accepted.append(m)
            else:
                res.rejected.append(m)
    return res


def intent_payload(
    site: str,
    cluster: str,
    tel: SiteTelemetry,
    peers: Sequence[str],
    prices: Mapping[str, float],
    risk_util: float = 0.85,
) -> dict[str, Any]:
    """An ESA's intent from its telemetry: migrate what its forecast says will not fit."""
    excess = max(0.0, tel.predicted_util - risk_util) * tel.vcpu
    migrations = []
    if excess > 0:
        # route to the cheapest peer by the last prices the COA published (the cloud if none)
        options = sorted([p for p in peers if p != site], key=lambda p: (prices.get(p, 1.0), p)) or ["cloud"]
        n = min(3, max(1, int(math.ceil(excess / 4.0))))
        for j in range(n):
            migrations.append(
                {
                    "service": f"{site}/svc-{j}",
                    "to": options[j % len(options)],
                    "load": excess / n,
                    "bid": float(tel.predicted_util),
                }
            )
    return {
        "site": site,
        "cluster": cluster,
        "predicted_backlog": float(tel.backlog_s + max(0.0, tel.predicted_util - 1.0) * 900.0),
        "migrations": migrations,
        "risk": float(np.clip(tel.predicted_util / risk_util - 1.0, 0.0, 10.0)),
        "headroom": float(max(0.0, risk_util - tel.predicted_util) * tel.vcpu),
        "congestion": float(prices.get(site, 1.0)),
    }
