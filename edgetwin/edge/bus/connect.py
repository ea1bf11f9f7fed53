"""`make_bus`: a bus from ``"memory"``, ``"memory://NAME"``, ``"nats://host:port"`` or a `NatsConfig`."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from edgetwin.contract.errors import InputError
from edgetwin.edge.bus.base import DEFAULT_MAX_BYTES, Bus
from edgetwin.edge.bus.memory_bus import InMemoryBus, MemoryBroker
from edgetwin.edge.bus.nats_bus import NatsBus, NatsConfig

__all__ = ["make_bus"]


def make_bus(spec: str | NatsConfig | Mapping[str, Any] = "memory", **overrides: Any) -> Bus:
    """A bus from a string, a `NatsConfig` or a config dict.

    - ``"memory"``: an in-process bus with its own broker;
      ``"memory://NAME"``: a client of the process-wide broker ``NAME`` (agents in one process).
    - ``"nats://host:port"`` (or ``tls://``; several comma-separated): a `NatsBus`; ``overrides``
      are `NatsConfig` fields (e.g. ``token=...``).
    """
    if isinstance(spec, NatsConfig):
        return NatsBus(spec)
    if isinstance(spec, Mapping):
        return NatsBus(NatsConfig.from_dict({**spec, **overrides}))
    if not isinstance(spec, str):
        raise InputError(f"expected 'memory', 'memory://NAME' or 'nats://host:port', got {spec!r}", where="--bus")
    if spec == "memory" or spec == "memory://":
        return InMemoryBus(max_bytes=overrides.pop("max_bytes", DEFAULT_MAX_BYTES), name=overrides.pop("name", "edgetwin"))
    if spec.startswith("memory://"):
        return InMemoryBus(
            MemoryBroker.named(spec[len("memory://") :]),
            max_bytes=overrides.pop("max_bytes", DEFAULT_MAX_BYTES),
            name=overrides.pop("name", "edgetwin"),
        )
    if spec.startswith(("nats://", "tls://", "ws://", "wss://")):
        return NatsBus(NatsConfig.from_dict({"servers": [s.strip() for s in spec.split(",")], **overrides}, where="--bus"))
    raise InputError(f"expected 'memory', 'memory://NAME' or 'nats://host:port', got {spec!r}", where="--bus")
