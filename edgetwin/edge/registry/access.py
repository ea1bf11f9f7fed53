"""Opening a registry from a path or a ``nats://`` URL (`open_registry` for sync code, what the CLI
uses; `open_async_registry` for async code, what the runtime uses), the
metadata a policy directory publishes with, and descriptions of versions and of a registry.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import threading
from collections.abc import AsyncIterator, Awaitable, Iterator
from pathlib import Path
from typing import Any, TypeVar

from edgetwin.contract.errors import InputError
from edgetwin.edge.registry.adapters import BlockingRegistry, ThreadedRegistry
from edgetwin.edge.registry.base import AsyncPolicyRegistry, PolicyRegistry, RegistryError, rollback_target
from edgetwin.edge.registry.file_registry import FileRegistry
from edgetwin.edge.registry.nats_registry import DeferredNatsRegistry, NatsRegistry

logger = logging.getLogger("edgetwin.edge.registry")

T = TypeVar("T")


def is_nats_url(location: str | Path) -> bool:
    return str(location).startswith(("nats://", "tls://", "ws://", "wss://"))


@contextlib.contextmanager
def open_registry(
    location: str | Path, *, create: bool = True, bucket: str = "edgetwin", connect_timeout: float = 5.0
) -> Iterator[PolicyRegistry]:
    """Open a registry for sync use: a directory (`FileRegistry`) or a ``nats://`` URL (`NatsRegistry`).

    For NATS, a private event loop in a daemon thread holds the connection; it is drained and
    closed when the ``with`` block ends.

    Raises:
        InputError: a directory that is not a registry (or missing, with ``create=False``).
        RegistryError: the NATS server cannot be reached.
    """
    if not is_nats_url(location):
        yield FileRegistry(location, create=create)
        return

    import nats

    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, name="edgetwin-registry-nats", daemon=True)
    thread.start()

    def run(coro: Awaitable[T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, loop).result(connect_timeout + 60)  # type: ignore[arg-type]

    try:
        async def quiet(e: Exception) -> None:  # nats-py's default error callback logs tracebacks
            logger.debug("nats: %s", e)

        try:
            # max_reconnect_attempts also bounds the *initial* connection attempts in nats-py; with
            # allow_reconnect=False it would instead retry forever against a refused port.
            nc = run(
                nats.connect(
                    str(location),
                    connect_timeout=connect_timeout,
                    max_reconnect_attempts=3,
                    reconnect_time_wait=0.25,
                    error_cb=quiet,
                )
            )
        except Exception as e:  # nats-py raises several kinds (NoServersError, OSError, TimeoutError)
            raise RegistryError(f"cannot connect to the registry at {location}: {type(e).__name__}: {e}") from None
        try:
            yield BlockingRegistry(NatsRegistry(nc, bucket=bucket), loop)
        finally:
            with contextlib.suppress(Exception):
                run(nc.drain())
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=10)
        loop.close()


# ------------------------------------------------------------------------------------- summaries
def metadata_from_policy_dir(policy_dir: str | Path) -> dict[str, Any]:
    """Registry metadata defaults read from an exported policy's ``policy.json``, if it has one.

    Takes ``algorithm``, ``spec_hash``, ``training_data_sha256`` (as ``training_data_hash``) and the
    numeric ``metrics`` (others are skipped with a log line: the registry signs numbers only). The
    registry does not need this file: any directory can be published with explicit metadata.
    """
    doc_path = Path(policy_dir) / "policy.json"
    if not doc_path.is_file():
        return _metadata_from_twin_dir(Path(policy_dir))
    try:
        doc = json.loads(doc_path.read_text())
    except (OSError, ValueError) as e:
        raise InputError(f"policy.json is not valid JSON ({e})", where=str(doc_path)) from None
    if not isinstance(doc, dict):
        return {}
    md: dict[str, Any] = {}
    for src, dst in (("algorithm", "algorithm"), ("spec_hash", "spec_hash"), ("training_data_sha256", "training_data_hash"),
                     ("training_data_hash", "training_data_hash")):  # fmt: skip
        if doc.get(src) is not None:
            md[dst] = doc[src]
    metrics = {}
    for k, v in (doc.get("metrics") or {}).items():
        if isinstance(v, int | float) and not isinstance(v, bool) and v == v and abs(v) != float("inf"):
            metrics[k] = float(v)
        else:
            logger.info("%s: metric %r is not a finite number; not carried into the registry metadata", doc_path, k)
    md["metrics"] = metrics
    return md


def _metadata_from_twin_dir(twin_dir: Path) -> dict[str, Any]:
    """Registry metadata defaults of a twin directory, from its ``meta.json``: its spec hash and the
    sha256 of the data it was fitted on (``training_data_hash``), and ``algorithm`` "twin"."""
    meta_path = twin_dir / "meta.json"
    if not meta_path.is_file():
        return {}
    try:
        doc = json.loads(meta_path.read_text())
    except (OSError, ValueError) as e:
        raise InputError(f"meta.json is not valid JSON ({e})", where=str(meta_path)) from None
    if not isinstance(doc, dict):
        return {}
    md: dict[str, Any] = {"algorithm": "twin"}
    for src, dst in (("spec_hash", "spec_hash"), ("data_sha256", "training_data_hash")):
        if isinstance(doc.get(src), str):
            md[dst] = doc[src]
    return md


def describe_version(registry: PolicyRegistry, version: str) -> dict[str, Any]:
    """One version's manifest as a flat dict (for `edgetwin registry show` / ``list``), unverified."""
    m = registry.manifest(version)
    return {
        "version": version,
        "name": m.metadata.get("name"),
        "kind": m.metadata.get("kind") or "policy",
        "algorithm": m.metadata.get("algorithm"),
        "created": m.metadata.get("created"),
        "parent_version": m.metadata.get("parent_version"),
        "spec_hash": m.metadata.get("spec_hash"),
        "training_data_hash": m.metadata.get("training_data_hash"),
        "metrics": m.metadata.get("metrics") or {},
        "sha256": m.sha256,
        "size": m.size,
        "key_id": m.key_id,
        "signed": bool(m.signature),
        "metadata": m.metadata,
    }


def describe_registry(registry: PolicyRegistry) -> dict[str, Any]:
    """Every version (oldest first) and every scope's current pointer and rollback target."""
    pointers = {}
    for scope in registry.scopes():
        history = registry.history(scope)
        pointers[scope] = {
            "current": history[-1].version if history else None,
            "rollback_to": rollback_target(history),
            "revision": history[-1].revision if history else 0,
            "changed": history[-1].at if history else None,
        }
    versions = []
    for v in registry.list_versions():
        d = describe_version(registry, v)
        d.pop("metadata")
        d["current_in"] = [s for s, p in pointers.items() if p["current"] == v]
        versions.append(d)
    return {"registry": repr(registry), "versions": versions, "pointers": pointers}


@contextlib.asynccontextmanager
async def open_async_registry(
    location: str | Path, *, bucket: str = "edgetwin"
) -> AsyncIterator[AsyncPolicyRegistry]:
    """A registry for async code: a directory (`FileRegistry` in worker threads) or a NATS URL
    (`DeferredNatsRegistry`, which does not fail when the server is down).

    Raises:
        InputError: a directory that is not a policy registry.
    """
    if not is_nats_url(location):
        yield ThreadedRegistry(FileRegistry(location, create=False))
        return
    reg = DeferredNatsRegistry(str(location), bucket=bucket)
    await reg.open()
    try:
        yield reg
    finally:
        await reg.close()
