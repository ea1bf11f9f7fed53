"""The edge side: the bus, its messages, signing, the policy registry and the edge runtime.

* `edgetwin.edge.bus`: one async `Bus` interface, in-process (`InMemoryBus`) or NATS (`NatsBus`,
  JetStream for what must survive a restart); `make_bus("memory" | "nats://...")`.
* `edgetwin.edge.messages`: the versioned `Envelope`, its binary frame and the kinds' schemas.
* `edgetwin.edge.signing`: Ed25519 keys, `Signer` / `TrustStore`, packed and signed artifacts.
* `edgetwin.edge.registry`: the policy registry (a directory, or NATS KV + Object Store) with
  versions, a scoped pointer, promotion and rollback.
* `edgetwin.edge.runtime`: `EdgeRuntime`, which serves the registry's policy at a site and rolls
  back by itself when its KPI watch sees a regression.

The federation (`edgetwin.federation`) talks over this bus; the emulated system that plays the real
edge in tests and the demo is `edgetwin.emulator`.
"""

from edgetwin.edge.bus import Bus, InMemoryBus, MemoryBroker, NatsBus, NatsConfig, Subjects, make_bus
from edgetwin.edge.messages import Envelope, KindSchema, MessageRejected, register_kind
from edgetwin.edge.registry import FileRegistry, NatsRegistry, PolicyRegistry, open_registry
from edgetwin.edge.runtime import EdgeRuntime
from edgetwin.edge.signing import Signer, TrustStore

__all__ = [
    "Bus",
    "EdgeRuntime",
    "Envelope",
    "FileRegistry",
    "InMemoryBus",
    "KindSchema",
    "MemoryBroker",
    "MessageRejected",
    "NatsBus",
    "NatsConfig",
    "NatsRegistry",
    "PolicyRegistry",
    "Signer",
    "Subjects",
    "TrustStore",
    "make_bus",
    "open_registry",
    "register_kind",
]
