"""The policy registry: signed, immutable policy versions and compare-and-swap "current" pointers.

A registry holds *versions* (a packed policy directory + its signed `Manifest`, see
`edgetwin.edge.signing`), each published once and never overwritten, and one *current pointer* per
scope: ``"global"``, ``"cluster/<c>"`` or ``"site/<s>"``. Promotions move a pointer with
compare-and-swap, so two promotions cannot race. Every fetch verifies the artifact before anything
is unpacked.

* `edgetwin.edge.registry.base`: the contract (`PolicyRegistry`, `AsyncPolicyRegistry`), scopes,
  pointer history and rollback targets, the errors.
* `edgetwin.edge.registry.file_registry`: `FileRegistry`, a directory (sync, the embedded default).
* `edgetwin.edge.registry.nats_registry`: `NatsRegistry`, NATS JetStream KV + Object Store (async).
* `edgetwin.edge.registry.adapters`: `BlockingRegistry` / `ThreadedRegistry`, across sync and async.
* `edgetwin.edge.registry.access`: `open_registry` from a path or a ``nats://`` URL, and
  descriptions of versions and registries (what the CLI prints).
"""

from edgetwin.edge.registry.access import (
    describe_registry,
    describe_version,
    is_nats_url,
    metadata_from_policy_dir,
    open_async_registry,
    open_registry,
)
from edgetwin.edge.registry.adapters import (
    BlockingRegistry,
    ThreadedRegistry,
)
from edgetwin.edge.registry.base import (
    AUTO_VERSION_PREFIX,
    HISTORY_LIMIT,
    SCOPE_RE,
    AsyncPolicyRegistry,
    CASConflict,
    NoRollbackTarget,
    PointerChange,
    PolicyRegistry,
    RegistryError,
    VersionExists,
    VersionNotFound,
    artifact_kind,
    check_scope,
    rollback_target,
    verify_twin_dir,
)
from edgetwin.edge.registry.file_registry import (
    FileRegistry,
)
from edgetwin.edge.registry.nats_registry import (
    DeferredNatsRegistry,
    NatsRegistry,
)

__all__ = [
    "AUTO_VERSION_PREFIX",
    "HISTORY_LIMIT",
    "SCOPE_RE",
    "AsyncPolicyRegistry",
    "BlockingRegistry",
    "CASConflict",
    "DeferredNatsRegistry",
    "FileRegistry",
    "NatsRegistry",
    "NoRollbackTarget",
    "PointerChange",
    "PolicyRegistry",
    "RegistryError",
    "ThreadedRegistry",
    "VersionExists",
    "VersionNotFound",
    "artifact_kind",
    "check_scope",
    "describe_registry",
    "describe_version",
    "is_nats_url",
    "metadata_from_policy_dir",
    "open_async_registry",
    "open_registry",
    "rollback_target",
    "verify_twin_dir",
]
