"""The edge side: the bus, its messages, signing, the policy registry and the edge runtime.

* `edgetwin.edge.bus`: one async `Bus` interface, in-process (`InMemoryBus`) or NATS (`NatsBus`,
  JetStream for what must survive a restart); `make_bus("memory" | "nats://...")`.
* `edgetwin.edge.messages`: the versioned `Envelope`, its binary frame and the kinds' schemas.
* `edgetwin.edge.decision_wire`: the decision subject in JSON / Arrow IPC with NATS headers, for
  clients that are not edgetwin (a Go scheduler plugin, say).
* `edgetwin.edge.signing`: Ed25519 keys, `Signer` / `TrustStore`, packed and signed artifacts.
* `edgetwin.edge.registry`: the policy registry (a directory, or NATS KV + Object Store) with
  versions, a scoped pointer, promotion and rollback.
* `edgetwin.edge.runtime`: `EdgeRuntime`, which serves the registry's policy at a site and rolls
  back by itself when its KPI watch sees a regression (built from one module per concern:
  `runtime_core`, `runtime_registry`, `runtime_rollback`, `runtime_serving`, `runtime_canary`,
  `runtime_commands`, `runtime_wire`, `runtime_messages`).
* `edgetwin.edge.canary_command`: the signed canary commands, outcome reports and status an
  operator drives a running `edgetwin serve` with (the interface `edgetwin.loop` builds on).

The federation (`edgetwin.federation`) talks over this bus; the emulated system that plays the real
edge in tests and the demo is driven through this package by `edgetwin.loop.fleet`; it is never
imported here.
"""

from __future__ import annotations

from edgetwin import lazy_exports

#: each public name -> the module that defines it, imported on first use (`lazy_exports`)
_WHERE = {
    "Bus": "edgetwin.edge.bus",
    "EdgeRuntime": "edgetwin.edge.runtime",
    "Envelope": "edgetwin.edge.messages",
    "FileRegistry": "edgetwin.edge.registry",
    "InMemoryBus": "edgetwin.edge.bus",
    "KindSchema": "edgetwin.edge.messages",
    "MemoryBroker": "edgetwin.edge.bus",
    "MessageRejected": "edgetwin.edge.messages",
    "NatsBus": "edgetwin.edge.bus",
    "NatsConfig": "edgetwin.edge.bus",
    "NatsRegistry": "edgetwin.edge.registry",
    "PolicyRegistry": "edgetwin.edge.registry",
    "Signer": "edgetwin.edge.signing",
    "Subjects": "edgetwin.edge.bus",
    "TrustStore": "edgetwin.edge.signing",
    "make_bus": "edgetwin.edge.bus",
    "open_registry": "edgetwin.edge.registry",
    "register_kind": "edgetwin.edge.messages",
}
__all__ = sorted(_WHERE)
__getattr__, __dir__ = lazy_exports(__name__, _WHERE)
