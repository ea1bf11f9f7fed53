"""The message bus between edge agents: one async interface, in-process or NATS.

`Bus` is what agents program against::

    bus = make_bus("memory")                  # or "nats://127.0.0.1:4222", or a NatsConfig
    async with bus:
        sub = await bus.subscribe("edgetwin.intent.*.>", on_intent)          # core pub/sub, wildcards
        await bus.publish(Subjects.intent("c0", "site-1"), envelope)
        reply = await bus.request(Subjects.decision("site-1"), req, timeout=1.0)
        await bus.publish_durable(Subjects.update("site", "c0"), update_env)    # survives restarts
        await bus.subscribe_durable(Subjects.update("site", "c0"), "coa-c0", on_update)

* `edgetwin.edge.bus.base`: the `Bus` interface, `Subjects`, `Received`, `BusStats`.
* `edgetwin.edge.bus.memory_bus`: `InMemoryBus`, the embedded default (no server), and its
  `MemoryBroker` with JetStream's durable semantics.
* `edgetwin.edge.bus.nats_bus`: `NatsBus` over nats-py (JetStream for the durable subjects) and
  its `NatsConfig`.
* `edgetwin.edge.bus.connect`: `make_bus`, one of them from a URL or a config.
"""

from edgetwin.edge.bus.base import (
    DEFAULT_DURABLE_SUBJECTS,
    Bus,
    BusStats,
    Handler,
    NoResponders,
    RawHandler,
    RawMessage,
    Received,
    Responder,
    Subjects,
    Subscription,
    subject_matches,
)
from edgetwin.edge.bus.connect import make_bus
from edgetwin.edge.bus.memory_bus import InMemoryBus, MemoryBroker
from edgetwin.edge.bus.nats_bus import NatsBus, NatsConfig

__all__ = [
    "DEFAULT_DURABLE_SUBJECTS",
    "Bus",
    "BusStats",
    "Handler",
    "InMemoryBus",
    "MemoryBroker",
    "NatsBus",
    "NatsConfig",
    "NoResponders",
    "RawHandler",
    "RawMessage",
    "Received",
    "Responder",
    "Subjects",
    "Subscription",
    "make_bus",
    "subject_matches",
]
