"""The policy registry: signed, immutable policy versions and compare-and-swap "current" pointers.

A registry holds *versions* (a packed policy directory + its signed `Manifest`, see
`edgetwin.edge.signing`), each published once and never overwritten, and one *current pointer* per
scope: ``"global"``, ``"cluster/<c>"`` or ``"site/<s>"``. Promotions move a pointer with
compare-and-swap, ``set_current(scope, version, expected=<what the caller believes is current>)``,
so two promotions cannot race: the one with a stale ``expected`` fails with `CASConflict`. Each
pointer keeps its history, which gives the rollback target.

Two implementations of the same contract:

- `FileRegistry` (sync, the embedded default): a directory; versions are published by an atomic
  directory rename and pointers are moved under an ``flock`` lock file with write-to-temp + rename,
  so it is safe across threads and processes on one host.
- `NatsRegistry` (async): NATS JetStream. Packed artifacts go to an Object Store bucket; manifests
  and pointers live in a KV bucket, where ``kv.create`` makes a version name immutable and
  ``kv.update(key, value, last=revision)`` is the compare-and-swap. Both buckets use file storage,
  so the registry survives a server restart.

`BlockingRegistry` runs an async registry from sync code (its client's event loop in another thread),
`ThreadedRegistry` runs a sync one from async code, and `open_registry` opens either from a path or a
``nats://`` URL, which is what the CLI uses.

Every fetch verifies the artifact (`verify_artifact`) before anything is unpacked.
"""

from __future__ import annotations

import abc
import asyncio
import contextlib
import dataclasses
import fcntl
import json
import logging
import os
import re
import shutil
import threading
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar

from edgetwin.contract.errors import InputError
from edgetwin.edge.signing import (
    NAME_RE,
    ArtifactRejected,
    Manifest,
    RejectReason,
    Signer,
    TrustStore,
    normalize_metadata,
    pack_directory,
    sign_artifact,
    unpack_artifact,
    verify_artifact,
)

logger = logging.getLogger(__name__)

T = TypeVar("T")

#: "global", "cluster/<c>" or "site/<s>"; c and s are letters, digits, '_' and '-'.
SCOPE_RE = re.compile(r"^(global|cluster/[A-Za-z0-9_\-]{1,64}|site/[A-Za-z0-9_\-]{1,64})$")
#: Pointer changes kept per scope (the oldest are dropped); bounds a KV value well under 1 MB.
HISTORY_LIMIT = 256
#: Prefix of auto-assigned versions ("v1", "v2", ...) when the metadata names none.
AUTO_VERSION_PREFIX = "v"
_AUTO_VERSION_RE = re.compile(rf"^{AUTO_VERSION_PREFIX}(\d+)$")


# ------------------------------------------------------------------------------------- errors
class RegistryError(RuntimeError):
    """The registry could not do what was asked (exit 1 in the CLI)."""


class CASConflict(RegistryError):
    """``set_current`` lost a race: the pointer is no longer what the caller expected."""

    def __init__(self, scope: str, expected: str | None, actual: str | None) -> None:
        self.scope, self.expected, self.actual = scope, expected, actual
        super().__init__(
            f"current version of {scope!r} is {actual!r}, not the expected {expected!r}: another "
            "promotion or rollback changed it first; re-read the current version and decide again"
        )


class NoRollbackTarget(RegistryError):
    """The scope has no earlier version to roll back to."""


class VersionExists(InputError):
    """The version name is already published; versions are immutable."""


class VersionNotFound(InputError):
    """No such version in the registry."""


def check_scope(scope: str) -> str:
    """Return ``scope`` if it is ``global``, ``cluster/<c>`` or ``site/<s>``; else raise `InputError`."""
    if not isinstance(scope, str) or not SCOPE_RE.match(scope):
        raise InputError(
            f"scope must be 'global', 'cluster/<name>' or 'site/<name>' (name: letters, digits, '_', '-'); "
            f"got {scope!r}",
            where="scope",
        )
    return scope


# ------------------------------------------------------------------------------------- pointers
@dataclasses.dataclass(frozen=True)
class PointerChange:
    """One move of a scope's current pointer.

    Attributes:
        version: the version that became current.
        previous: the version that was current before (None for the first promotion).
        kind: ``"promote"`` or ``"rollback"``.
        reason: why, in words (for rollbacks: what regressed).
        at: when, ISO 8601 UTC.
        revision: 1 for the first change of the scope, then +1 per change.
    """

    version: str
    previous: str | None
    kind: str
    reason: str
    at: str
    revision: int

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def _parse_pointer(raw: bytes | None) -> dict[str, Any] | None:
    return None if raw is None else json.loads(raw)


def _next_pointer(
    state: dict[str, Any] | None, scope: str, version: str, expected: str | None, kind: str, reason: str
) -> tuple[dict[str, Any], PointerChange]:
    """The pointer state after moving ``scope`` to ``version``, if it currently is ``expected``.

    Raises:
        CASConflict: the current version is not ``expected``.
    """
    actual = state["version"] if state else None
    if actual != expected:
        raise CASConflict(scope, expected, actual)
    history = list(state["history"]) if state else []
    revision = (state["revision"] if state else 0) + 1
    change = PointerChange(
        version=version,
        previous=actual,
        kind=kind,
        reason=reason,
        at=datetime.now(UTC).isoformat(timespec="milliseconds"),
        revision=revision,
    )
    history.append(change.to_dict())
    new = {"scope": scope, "version": version, "revision": revision, "history": history[-HISTORY_LIMIT:]}
    return new, change


def _history(state: dict[str, Any] | None) -> list[PointerChange]:
    return [PointerChange(**h) for h in state["history"]] if state else []


def rollback_target(history: list[PointerChange]) -> str | None:
    """The version a rollback of the current one returns to, from a scope's history (oldest first).

    It is the version that was current when the current version was last *promoted*; so repeated
    rollbacks walk back through earlier promotions (v3 -> v2 -> v1) instead of bouncing between two.
    """
    if not history:
        return None
    current = history[-1].version
    for change in reversed(history):
        if change.kind == "promote" and change.version == current:
            return change.previous
    return None


def _prepare(policy_dir: str | Path, metadata: Mapping[str, Any], signer: Signer) -> tuple[bytes, dict[str, Any]]:
    if not isinstance(signer, Signer):
        raise InputError("publishing needs a Signer (a private key): the registry holds only signed artifacts")
    packed = pack_directory(policy_dir)
    md = dict(metadata)
    if md.get("version") is None:
        md["version"] = f"{AUTO_VERSION_PREFIX}0"  # placeholder so the rest is validated before a name is picked
        normalize_metadata(md)
        md["version"] = None
    else:
        normalize_metadata(md)
    return packed, md


def _next_auto_version(existing: list[str]) -> str:
    numbers = [int(m.group(1)) for v in existing if (m := _AUTO_VERSION_RE.match(v))]
    return f"{AUTO_VERSION_PREFIX}{max(numbers, default=0) + 1}"


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds")


# ------------------------------------------------------------------------------------- interfaces
class PolicyRegistry(abc.ABC):
    """Signed, immutable policy versions and compare-and-swap current pointers (synchronous).

    Subclasses implement the storage primitives; publishing, fetching with verification and
    rollback are built on them here.
    """

    # -- storage primitives
    @abc.abstractmethod
    def _store(self, version: str, packed: bytes, manifest: Manifest) -> None:
        """Store a new version atomically; raise `VersionExists` if the name is taken."""

    @abc.abstractmethod
    def _load(self, version: str) -> tuple[bytes, Manifest]:
        """Packed bytes and manifest of ``version``; raise `VersionNotFound` if absent."""

    @abc.abstractmethod
    def manifest(self, version: str) -> Manifest:
        """The manifest (metadata, checksum, signature) of ``version``, unverified.

        Raises:
            VersionNotFound: no such version.
        """

    @abc.abstractmethod
    def list_versions(self) -> list[str]:
        """Published versions, oldest first."""

    @abc.abstractmethod
    def current(self, scope: str) -> str | None:
        """The current version of ``scope``, or None if nothing was promoted there."""

    @abc.abstractmethod
    def set_current(
        self, scope: str, version: str, *, expected: str | None, reason: str = "", kind: str = "promote"
    ) -> PointerChange:
        """Make ``version`` current in ``scope`` if the current one is still ``expected``.

        Args:
            scope: ``"global"``, ``"cluster/<c>"`` or ``"site/<s>"``.
            version: a published version.
            expected: the version the caller read as current (None: nothing is current yet).
            reason: recorded in the history.
            kind: ``"promote"`` or ``"rollback"`` (rollback targets follow promotions only).

        Raises:
            CASConflict: the current version is not ``expected`` (someone else moved it).
            VersionNotFound: ``version`` was never published.
        """

    @abc.abstractmethod
    def history(self, scope: str) -> list[PointerChange]:
        """Every change of ``scope``'s pointer (up to `HISTORY_LIMIT`), oldest first."""

    @abc.abstractmethod
    def scopes(self) -> list[str]:
        """Scopes that have a current pointer, sorted."""

    # -- built on the primitives
    def publish(self, policy_dir: str | Path, metadata: Mapping[str, Any], signer: Signer) -> str:
        """Pack, sign and store a policy directory as a new immutable version.

        Args:
            policy_dir: the exported policy (any directory of regular files).
            metadata: at least ``name``; ``version`` if you choose it (else the next ``v<N>``), and
                spec_hash, algorithm, training_data_hash, metrics, created, parent_version.
            signer: the publisher's private key.

        Returns:
            The version name.

        Raises:
            VersionExists: ``metadata["version"]`` is already published.
            InputError: bad metadata or directory.
        """
        packed, md = _prepare(policy_dir, metadata, signer)
        auto = md["version"] is None
        for _ in range(100):  # auto-versioning retries when a concurrent publisher took the number
            if auto:
                md["version"] = _next_auto_version(self.list_versions())
            manifest = sign_artifact(packed, normalize_metadata(md), signer)
            try:
                self._store(manifest.version, packed, manifest)
            except VersionExists:
                if auto:
                    continue
                raise
            logger.info("published %s (%s, sha256 %s...)", manifest.version, manifest.name, manifest.sha256[:12])
            return manifest.version
        raise RegistryError("could not pick a free version name after 100 attempts")

    def fetch(self, version: str, dest_dir: str | Path, trust: TrustStore) -> Path:
        """Verify ``version`` against ``trust`` and unpack it into ``dest_dir``.

        ``dest_dir`` must not exist or be empty; nothing is written there unless the artifact is
        verified. Returns ``dest_dir``.

        Raises:
            ArtifactRejected: unsigned, untrusted key, bad signature, checksum or version mismatch.
            VersionNotFound: no such version.
        """
        packed, manifest = self._load(version)
        verify_artifact(packed, manifest, trust, expected_version=version)
        return _unpack_atomically(packed, Path(dest_dir), version)

    def previous(self, scope: str) -> str | None:
        """The version a rollback of ``scope`` would return to (see `rollback_target`)."""
        return rollback_target(self.history(check_scope(scope)))

    def rollback(self, scope: str, *, expected: str | None, reason: str = "") -> str:
        """Point ``scope`` back at `previous` (compare-and-swap on ``expected``); returns that version.

        Raises:
            NoRollbackTarget: nothing to go back to.
            CASConflict: the current version is not ``expected``.
        """
        history = self.history(check_scope(scope))
        if history and history[-1].version != expected:
            raise CASConflict(scope, expected, history[-1].version)
        target = rollback_target(history)
        if target is None:
            raise NoRollbackTarget(f"{scope!r} has no earlier promoted version to roll back to")
        self.set_current(scope, target, expected=expected, reason=reason, kind="rollback")
        logger.warning("rolled back %s from %s to %s: %s", scope, expected, target, reason or "(no reason given)")
        return target


class AsyncPolicyRegistry(abc.ABC):
    """The `PolicyRegistry` contract with coroutine methods (same arguments, same errors)."""

    @abc.abstractmethod
    async def _store(self, version: str, packed: bytes, manifest: Manifest) -> None: ...

    @abc.abstractmethod
    async def _load(self, version: str) -> tuple[bytes, Manifest]: ...

    @abc.abstractmethod
    async def manifest(self, version: str) -> Manifest: ...

    @abc.abstractmethod
    async def list_versions(self) -> list[str]: ...

    @abc.abstractmethod
    async def current(self, scope: str) -> str | None: ...

    @abc.abstractmethod
    async def set_current(
        self, scope: str, version: str, *, expected: str | None, reason: str = "", kind: str = "promote"
    ) -> PointerChange: ...

    @abc.abstractmethod
    async def history(self, scope: str) -> list[PointerChange]: ...

    @abc.abstractmethod
    async def scopes(self) -> list[str]: ...

    async def publish(self, policy_dir: str | Path, metadata: Mapping[str, Any], signer: Signer) -> str:
        """See `PolicyRegistry.publish`."""
        packed, md = await asyncio.to_thread(_prepare, policy_dir, metadata, signer)
        auto = md["version"] is None
        for _ in range(100):
            if auto:
                md["version"] = _next_auto_version(await self.list_versions())
            manifest = sign_artifact(packed, normalize_metadata(md), signer)
            try:
                await self._store(manifest.version, packed, manifest)
            except VersionExists:
                if auto:
                    continue
                raise
            logger.info("published %s (%s, sha256 %s...)", manifest.version, manifest.name, manifest.sha256[:12])
            return manifest.version
        raise RegistryError("could not pick a free version name after 100 attempts")

    async def fetch(self, version: str, dest_dir: str | Path, trust: TrustStore) -> Path:
        """See `PolicyRegistry.fetch`."""
        packed, manifest = await self._load(version)
        verify_artifact(packed, manifest, trust, expected_version=version)
        return await asyncio.to_thread(_unpack_atomically, packed, Path(dest_dir), version)

    async def previous(self, scope: str) -> str | None:
        return rollback_target(await self.history(check_scope(scope)))

    async def rollback(self, scope: str, *, expected: str | None, reason: str = "") -> str:
        """See `PolicyRegistry.rollback`."""
        history = await self.history(check_scope(scope))
        if history and history[-1].version != expected:
            raise CASConflict(scope, expected, history[-1].version)
        target = rollback_target(history)
        if target is None:
            raise NoRollbackTarget(f"{scope!r} has no earlier promoted version to roll back to")
        await self.set_current(scope, target, expected=expected, reason=reason, kind="rollback")
        logger.warning("rolled back %s from %s to %s: %s", scope, expected, target, reason or "(no reason given)")
        return target


def _unpack_atomically(packed: bytes, dest: Path, version: str) -> Path:
    """Unpack into a temporary sibling, then rename, so ``dest`` is either complete or absent."""
    if dest.exists() and (not dest.is_dir() or any(dest.iterdir())):
        raise InputError("destination exists and is not an empty directory", where=str(dest))
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.parent / f".{dest.name}.{uuid.uuid4().hex}.partial"
    try:
        try:
            unpack_artifact(packed, tmp)
        except ArtifactRejected as e:
            raise ArtifactRejected(e.reason, e.detail, version) from None
        if dest.exists():
            dest.rmdir()  # empty (checked above)
        os.rename(tmp, dest)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return dest


# ------------------------------------------------------------------------------------- file
_FILE_FORMAT = "edgetwin-registry/1"


class FileRegistry(PolicyRegistry):
    """A registry in a directory (the embedded default).

    Layout::

        root/REGISTRY                         format marker
        root/versions/<v>/artifact.tar.gz     packed policy directory
        root/versions/<v>/manifest.json       signed manifest
        root/versions/<v>/published.json      publication order and time (registry bookkeeping)
        root/pointers/<scope>.json            current version + history of a scope
        root/.lock                            flock()ed around publishes and pointer moves

    A version is written into ``root/.tmp`` and renamed into ``versions/`` in one step, so readers
    never see half of one. Pointer moves read, compare and write (temp file + ``os.replace``) while
    holding an exclusive ``flock`` on ``.lock``: compare-and-swap that is safe across threads and
    processes on one host (flock is advisory and local; do not share the directory over NFS).

    Args:
        root: the registry directory.
        create: create it if missing; else a missing registry is an `InputError`.
        lock_timeout: seconds to wait for the lock before failing, in seconds.
    """

    def __init__(self, root: str | Path, *, create: bool = True, lock_timeout: float = 30.0) -> None:
        self.root = Path(root)
        self.lock_timeout = lock_timeout
        marker = self.root / "REGISTRY"
        if not marker.exists():
            if self.root.exists() and (not self.root.is_dir() or any(self.root.iterdir())):
                raise InputError("exists but is not a policy registry (no REGISTRY marker)", where=str(self.root))
            if not create:
                raise InputError("no policy registry here", where=str(self.root))
            for sub in ("versions", "pointers", ".tmp"):
                (self.root / sub).mkdir(parents=True, exist_ok=True)
            _atomic_write(marker, json.dumps({"format": _FILE_FORMAT}).encode())
        else:
            fmt = json.loads(marker.read_bytes()).get("format")
            if fmt != _FILE_FORMAT:
                raise InputError(f"registry format {fmt!r}, expected {_FILE_FORMAT!r}", where=str(marker))

    def __repr__(self) -> str:
        return f"FileRegistry({str(self.root)!r})"

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        fd = os.open(self.root / ".lock", os.O_RDWR | os.O_CREAT, 0o644)
        try:
            deadline = time.monotonic() + self.lock_timeout
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if time.monotonic() > deadline:
                        raise RegistryError(
                            f"registry {self.root} is locked by another process for over {self.lock_timeout:.0f} s"
                        ) from None
                    time.sleep(0.005)
            try:
                yield
            finally:
                fcntl.flock(fd, fcntl.LOCK_UN)
        finally:
            os.close(fd)

    def _version_dir(self, version: str) -> Path:
        return self.root / "versions" / version

    def _pointer_path(self, scope: str) -> Path:
        return self.root / "pointers" / f"{check_scope(scope)}.json"

    # -- versions
    def _store(self, version: str, packed: bytes, manifest: Manifest) -> None:
        tmp = self.root / ".tmp" / uuid.uuid4().hex
        tmp.mkdir(parents=True)
        try:
            _write_synced(tmp / "artifact.tar.gz", packed)
            _write_synced(tmp / "manifest.json", manifest.to_json())
            with self._locked():
                target = self._version_dir(version)
                if target.exists():
                    raise VersionExists(f"version {version!r} is already published; versions are immutable")
                seq = len(self.list_versions()) + 1
                _write_synced(tmp / "published.json", json.dumps({"seq": seq, "at": _now()}).encode())
                os.rename(tmp, target)  # atomic: the version appears complete or not at all
                _fsync_dir(target.parent)
        finally:
            if tmp.exists():
                shutil.rmtree(tmp, ignore_errors=True)

    def _load(self, version: str) -> tuple[bytes, Manifest]:
        d = self._existing(version)
        manifest_path = d / "manifest.json"
        if not manifest_path.exists():
            raise ArtifactRejected(RejectReason.UNSIGNED, "the artifact has no manifest", version)
        manifest = Manifest.from_json(manifest_path.read_bytes(), version)
        try:
            packed = (d / "artifact.tar.gz").read_bytes()
        except FileNotFoundError:
            raise ArtifactRejected(RejectReason.MALFORMED, "the packed artifact is missing", version) from None
        return packed, manifest

    def _existing(self, version: str) -> Path:
        if not isinstance(version, str) or not NAME_RE.match(version) or not self._version_dir(version).is_dir():
            raise VersionNotFound(f"no version {version!r} in the registry", where=str(self.root))
        return self._version_dir(version)

    def manifest(self, version: str) -> Manifest:
        return Manifest.from_json((self._existing(version) / "manifest.json").read_bytes(), version)

    def list_versions(self) -> list[str]:
        found = []
        for d in (self.root / "versions").iterdir():
            try:
                seq = json.loads((d / "published.json").read_bytes())["seq"]
            except (OSError, ValueError, KeyError):
                seq = float("inf")
            found.append((seq, d.name))
        return [name for _, name in sorted(found)]

    # -- pointers
    def _read_pointer(self, scope: str) -> dict[str, Any] | None:
        try:
            return _parse_pointer(self._pointer_path(scope).read_bytes())
        except FileNotFoundError:
            return None

    def current(self, scope: str) -> str | None:
        state = self._read_pointer(scope)
        return state["version"] if state else None

    def set_current(
        self, scope: str, version: str, *, expected: str | None, reason: str = "", kind: str = "promote"
    ) -> PointerChange:
        check_scope(scope)
        self._existing(version)
        with self._locked():
            new, change = _next_pointer(self._read_pointer(scope), scope, version, expected, kind, reason)
            path = self._pointer_path(scope)
            path.parent.mkdir(parents=True, exist_ok=True)
            _atomic_write(path, json.dumps(new, indent=1).encode())
        logger.info("%s: %s -> %s (%s)", scope, expected, version, kind)
        return change

    def history(self, scope: str) -> list[PointerChange]:
        return _history(self._read_pointer(scope))

    def scopes(self) -> list[str]:
        base = self.root / "pointers"
        return sorted(p.relative_to(base).with_suffix("").as_posix() for p in base.rglob("*.json"))


def _write_synced(path: Path, data: bytes) -> None:
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _atomic_write(path: Path, data: bytes) -> None:
    """Write via a temp file + ``os.replace`` so readers see the old or the new content, never half."""
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")
    _write_synced(tmp, data)
    os.replace(tmp, path)
    _fsync_dir(path.parent)


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
        record = {"manifest": manifest.to_dict(), "object": obj_name, "published": _now()}
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
        new, change = _next_pointer(state, scope, version, expected, kind, reason)
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
        return _history(json.loads(got[0]) if got else None)

    async def scopes(self) -> list[str]:
        out = []
        for key in await self._keys("current."):
            parts = key.split(".")[1:]
            out.append(parts[0] if len(parts) == 1 else f"{parts[0]}/{parts[1]}")
        return sorted(out)


# ------------------------------------------------------------------------------------- adapters
class BlockingRegistry(PolicyRegistry):
    """Sync facade over an `AsyncPolicyRegistry` whose client runs on ``loop`` in another thread.

    Args:
        inner: the async registry (e.g. `NatsRegistry`).
        loop: the running event loop its client belongs to (not the calling thread's).
        timeout: seconds to wait for each call.
    """

    def __init__(self, inner: AsyncPolicyRegistry, loop: asyncio.AbstractEventLoop, timeout: float = 60.0) -> None:
        self.inner, self.loop, self.timeout = inner, loop, timeout

    def __repr__(self) -> str:
        return f"BlockingRegistry({self.inner!r})"

    def _run(self, coro: Awaitable[T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(self.timeout)  # type: ignore[arg-type]

    def _store(self, version: str, packed: bytes, manifest: Manifest) -> None:
        self._run(self.inner._store(version, packed, manifest))

    def _load(self, version: str) -> tuple[bytes, Manifest]:
        return self._run(self.inner._load(version))

    def manifest(self, version: str) -> Manifest:
        return self._run(self.inner.manifest(version))

    def list_versions(self) -> list[str]:
        return self._run(self.inner.list_versions())

    def current(self, scope: str) -> str | None:
        return self._run(self.inner.current(scope))

    def set_current(
        self, scope: str, version: str, *, expected: str | None, reason: str = "", kind: str = "promote"
    ) -> PointerChange:
        return self._run(self.inner.set_current(scope, version, expected=expected, reason=reason, kind=kind))

    def history(self, scope: str) -> list[PointerChange]:
        return self._run(self.inner.history(scope))

    def scopes(self) -> list[str]:
        return self._run(self.inner.scopes())


class ThreadedRegistry(AsyncPolicyRegistry):
    """Async facade over a sync `PolicyRegistry` (each call in a worker thread), for async edge code."""

    def __init__(self, inner: PolicyRegistry) -> None:
        self.inner = inner

    def __repr__(self) -> str:
        return f"ThreadedRegistry({self.inner!r})"

    async def _call(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        return await asyncio.to_thread(fn, *args, **kwargs)

    async def _store(self, version: str, packed: bytes, manifest: Manifest) -> None:
        await self._call(self.inner._store, version, packed, manifest)

    async def _load(self, version: str) -> tuple[bytes, Manifest]:
        return await self._call(self.inner._load, version)

    async def manifest(self, version: str) -> Manifest:
        return await self._call(self.inner.manifest, version)

    async def list_versions(self) -> list[str]:
        return await self._call(self.inner.list_versions)

    async def current(self, scope: str) -> str | None:
        return await self._call(self.inner.current, scope)

    async def set_current(
        self, scope: str, version: str, *, expected: str | None, reason: str = "", kind: str = "promote"
    ) -> PointerChange:
        return await self._call(self.inner.set_current, scope, version, expected=expected, reason=reason, kind=kind)

    async def history(self, scope: str) -> list[PointerChange]:
        return await self._call(self.inner.history, scope)

    async def scopes(self) -> list[str]:
        return await self._call(self.inner.scopes)


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
        return {}
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


# ------------------------------------------------------------------------------------- summaries
def describe_version(registry: PolicyRegistry, version: str) -> dict[str, Any]:
    """One version's manifest as a flat dict (for `edgetwin registry show` / ``list``), unverified."""
    m = registry.manifest(version)
    return {
        "version": version,
        "name": m.metadata.get("name"),
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
