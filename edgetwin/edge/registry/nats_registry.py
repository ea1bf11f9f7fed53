"""`NatsRegistry`: the policy registry on NATS JetStream (async); `DeferredNatsRegistry`, one that
connects in the background (a runtime started while the server is down stays fail-static).

Packed artifacts go to an Object Store bucket; manifests and pointers live in a KV bucket, where
``kv.create`` makes a version name immutable and ``kv.update(key, value, last=revision)`` is the
compare-and-swap. Both buckets use file storage, so the registry survives a server restart.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import re
from typing import Any

from edgetwin.contract.errors import InputError
from edgetwin.edge.registry.base import (
    AsyncPolicyRegistry,
    CASConflict,
    PointerChange,
    RegistryError,
    VersionExists,
    VersionNotFound,
    check_scope,
    next_pointer,
    pointer_history,
    utc_now,
)
from edgetwin.edge.signing import (
    NAME_RE,
    ArtifactRejected,
    Manifest,
    RejectReason,
)

logger = logging.getLogger("edgetwin.edge.registry")


# ------------------------------------------------------------------------------------- NATS
class NatsRegistry(AsyncPolicyRegistry):
    """A registry in NATS JetStream: Object Store for artifacts, KV for manifests and pointers.

    Buckets (created on first use, file storage): ``<bucket>_artifacts`` (Object Store) holds the
    packed bytes under ``<version>/<sha256>``; ``<bucket>_registry`` (KV) holds
    ``artifact.<version>`` (manifest + object name + publication time), written with ``kv.create``
    so a version name is claimed exactly once, and ``current.<global|cluster.c|site.s>`` (pointer +
    history), moved with ``kv.update(key, value, last=revision)`` as compare-and-swap.

    The artifact bytes are stored before the version is claimed, under a content-addressed name,
    so a publisher that loses the race for a version never overwrites the winner's bytes.

    Args:
        js: a JetStream context, or a connected ``nats.aio.client.Client`` (its ``jetstream()`` is used).
        bucket: prefix of the two bucket names (letters, digits, '_', '-').
        replicas: JetStream replicas of both buckets (1 for a single server).
    """

    def __init__(self, js: Any, *, bucket: str = "edgetwin", replicas: int = 1) -> None:
        from nats.aio.client import Client

        if isinstance(js, Client):
            js = js.jetstream()
        if not re.fullmatch(r"[A-Za-z0-9_\-]+", bucket):
            raise InputError(f"bucket prefix must be letters, digits, '_' or '-'; got {bucket!r}", where="bucket")
        self.js = js
        self.bucket = bucket
        self.replicas = replicas
        self._kv: Any = None
        self._obs: Any = None
        self._open_lock = asyncio.Lock()

    def __repr__(self) -> str:
        return f"NatsRegistry(bucket={self.bucket!r})"

    async def _buckets(self) -> tuple[Any, Any]:
        if self._kv is not None:
            return self._kv, self._obs
        from nats.js.api import KeyValueConfig, ObjectStoreConfig, StorageType
        from nats.js.errors import BucketNotFoundError

        async with self._open_lock:
            if self._kv is None:
                kv_name, obs_name = f"{self.bucket}_registry", f"{self.bucket}_artifacts"
                try:
                    kv = await self.js.key_value(kv_name)
                except BucketNotFoundError:
                    kv = await self.js.create_key_value(
                        KeyValueConfig(
                            bucket=kv_name,
                            description="edgetwin policy registry: manifests and current pointers",
                            history=16,  # the JetStream-side audit trail of each key
                            storage=StorageType.FILE,
                            replicas=self.replicas,
                        )
                    )
                try:
                    obs = await self.js.object_store(obs_name)
                except BucketNotFoundError:
                    obs = await self.js.create_object_store(
                        obs_name,
                        ObjectStoreConfig(
                            description="edgetwin policy registry: packed, signed policy artifacts",
                            storage=StorageType.FILE,
                            replicas=self.replicas,
                        ),
                    )
                self._kv, self._obs = kv, obs
        return self._kv, self._obs

    @staticmethod
    def _pointer_key(scope: str) -> str:
        return "current." + check_scope(scope).replace("/", ".")

    @staticmethod
    def _artifact_key(version: str) -> str:
        if not isinstance(version, str) or not NAME_RE.match(version):
            raise VersionNotFound(f"no version {version!r} in the registry (not a valid version name)")
        return f"artifact.{version}"

    async def _get(self, key: str) -> tuple[bytes, int] | None:
        from nats.js.errors import KeyNotFoundError

        kv, _ = await self._buckets()
        try:
            entry = await kv.get(key)
        except KeyNotFoundError:  # also KeyDeletedError
            return None
        return entry.value, entry.revision

    # -- versions
    async def _store(self, version: str, packed: bytes, manifest: Manifest) -> None:
        from nats.js.errors import KeyWrongLastSequenceError

        kv, obs = await self._buckets()
        key = self._artifact_key(version)
        if await self._get(key) is not None:
            raise VersionExists(f"version {version!r} is already published; versions are immutable")
        obj_name = f"{version}/{manifest.sha256}"
        await obs.put(obj_name, packed)
        record = {"manifest": manifest.to_dict(), "object": obj_name, "published": utc_now()}
        try:
            await kv.create(key, json.dumps(record).encode())
        except KeyWrongLastSequenceError:
            winner = await self._get(key)
            if winner is None or json.loads(winner[0]).get("object") != obj_name:
                with contextlib.suppress(Exception):  # best effort: the loser's bytes are unreferenced
                    await obs.delete(obj_name)
            raise VersionExists(f"version {version!r} is already published; versions are immutable") from None

    async def _record(self, version: str) -> tuple[dict[str, Any], int]:
        got = await self._get(self._artifact_key(version))
        if got is None:
            raise VersionNotFound(f"no version {version!r} in the registry", where=f"nats bucket {self.bucket}")
        try:
            record = json.loads(got[0])
            if not isinstance(record, dict):
                raise ValueError("not an object")
        except ValueError as e:
            raise ArtifactRejected(RejectReason.MALFORMED, f"registry record is not JSON: {e}", version) from None
        return record, got[1]

    async def _load(self, version: str) -> tuple[bytes, Manifest]:
        from nats.js.errors import DigestMismatchError, ObjectNotFoundError

        record, _ = await self._record(version)
        if not record.get("manifest"):
            raise ArtifactRejected(RejectReason.UNSIGNED, "the artifact has no manifest", version)
        manifest = Manifest.from_dict(record["manifest"], version)
        _, obs = await self._buckets()
        try:
            result = await obs.get(str(record.get("object")))
        except ObjectNotFoundError:
            raise ArtifactRejected(RejectReason.MALFORMED, "the packed artifact is missing", version) from None
        except DigestMismatchError:
            raise ArtifactRejected(
                RejectReason.CHECKSUM_MISMATCH, "object store digest mismatch (corrupted chunks)", version
            ) from None
        return result.data, manifest

    async def manifest(self, version: str) -> Manifest:
        record, _ = await self._record(version)
        return Manifest.from_dict(record.get("manifest") or {}, version)

    async def _keys(self, prefix: str) -> list[str]:
        """Keys of the KV bucket that start with ``prefix`` (this registry never deletes a key).

        Read from the stream's per-subject counts rather than `KeyValue.keys()`: nats-py's watcher
        behind ``keys()`` can signal "no more keys" before it has handled messages already in
        flight, and so returned an empty list under CPU load.
        """
        await self._buckets()
        stream, subject_prefix = f"KV_{self.bucket}_registry", f"$KV.{self.bucket}_registry."
        info = await self.js.stream_info(stream, subjects_filter=f"{subject_prefix}{prefix}>")
        subjects = info.state.subjects or {}
        return sorted(s.removeprefix(subject_prefix) for s in subjects)

    async def list_versions(self) -> list[str]:
        revisions = []
        for key in await self._keys("artifact."):
            got = await self._get(key)
            if got is not None:
                revisions.append((got[1], key.removeprefix("artifact.")))
        return [v for _, v in sorted(revisions)]  # KV revision = publication order

    # -- pointers
    async def current(self, scope: str) -> str | None:
        got = await self._get(self._pointer_key(scope))
        return json.loads(got[0])["version"] if got else None

    async def set_current(
        self, scope: str, version: str, *, expected: str | None, reason: str = "", kind: str = "promote"
    ) -> PointerChange:
        from nats.js.errors import KeyWrongLastSequenceError

        key = self._pointer_key(scope)
        await self._record(version)  # must be published
        kv, _ = await self._buckets()
        got = await self._get(key)
        state, revision = (json.loads(got[0]), got[1]) if got else (None, 0)
        new, change = next_pointer(state, scope, version, expected, kind, reason)
        try:
            if revision == 0:
                await kv.create(key, json.dumps(new).encode())
            else:
                await kv.update(key, json.dumps(new).encode(), last=revision)
        except KeyWrongLastSequenceError:
            # Someone moved the pointer between our read and our write.
            raise CASConflict(scope, expected, await self.current(scope)) from None
        logger.info("%s: %s -> %s (%s)", scope, expected, version, kind)
        return change

    async def history(self, scope: str) -> list[PointerChange]:
        got = await self._get(self._pointer_key(scope))
        return pointer_history(json.loads(got[0]) if got else None)

    async def scopes(self) -> list[str]:
        out = []
        for key in await self._keys("current."):
            parts = key.split(".")[1:]
            out.append(parts[0] if len(parts) == 1 else f"{parts[0]}/{parts[1]}")
        return sorted(out)


class DeferredNatsRegistry(AsyncPolicyRegistry):
    """A `NatsRegistry` whose connection is made in the background and kept up by nats-py.

    Until the first connection succeeds every call raises `RegistryError`, so a runtime started
    while the server is down serves its cached last good policy (fail-static) and picks the
    registry up once the server answers.

    Args:
        url: ``nats://host:port`` (several comma-separated).
        bucket: the registry's bucket prefix.
        connect_timeout: seconds per connection attempt.
    """

    def __init__(self, url: str, *, bucket: str = "edgetwin", connect_timeout: float = 2.0) -> None:
        self.url, self.bucket, self.connect_timeout = url, bucket, connect_timeout
        self.inner: Any = None
        self.nc: Any = None
        self._task: asyncio.Task[None] | None = None

    def __repr__(self) -> str:
        return f"DeferredNatsRegistry({self.url!r}, bucket={self.bucket!r})"

    async def open(self) -> None:
        """Start connecting (returns at once; waits up to one attempt for a server that is up)."""
        self._task = asyncio.create_task(self._connect(), name="edgetwin-registry-connect")
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.shield(self._task), self.connect_timeout + 0.5)

    async def _connect(self) -> None:
        import nats


        async def quiet(e: Exception) -> None:  # nats-py's default error callback prints tracebacks
            logger.debug("registry nats: %r", e)

        # max_reconnect_attempts=-1 also makes the *initial* connection retry until a server answers.
        self.nc = await nats.connect(
            [u.strip() for u in self.url.split(",")],
            name="edgetwin-runtime-registry",
            connect_timeout=self.connect_timeout,
            max_reconnect_attempts=-1,
            reconnect_time_wait=0.5,
            error_cb=quiet,
        )
        self.inner = NatsRegistry(self.nc, bucket=self.bucket)
        logger.info("registry %s connected", self.url)

    async def close(self) -> None:
        if self._task is not None and not self._task.done():
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task
        if self.nc is not None:
            with contextlib.suppress(Exception):
                await self.nc.close()

    def _require(self) -> Any:
        if self.inner is None:
            raise RegistryError(f"registry {self.url} not connected yet")
        return self.inner

    async def _store(self, version: str, packed: bytes, manifest: Manifest) -> None:
        await self._require()._store(version, packed, manifest)

    async def _load(self, version: str) -> tuple[bytes, Manifest]:
        return await self._require()._load(version)

    async def manifest(self, version: str) -> Manifest:
        return await self._require().manifest(version)

    async def list_versions(self) -> list[str]:
        return await self._require().list_versions()

    async def current(self, scope: str) -> str | None:
        return await self._require().current(scope)

    async def set_current(
        self, scope: str, version: str, *, expected: str | None, reason: str = "", kind: str = "promote"
    ) -> PointerChange:
        return await self._require().set_current(scope, version, expected=expected, reason=reason, kind=kind)

    async def history(self, scope: str) -> list[PointerChange]:
        return await self._require().history(scope)

    async def scopes(self) -> list[str]:
        return await self._require().scopes()
