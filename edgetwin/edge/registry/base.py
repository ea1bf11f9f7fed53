"""The policy registry's contract: `PolicyRegistry` (sync) and `AsyncPolicyRegistry`, scopes,
pointers and their history, and the errors.

A registry holds *versions* (a packed policy directory + its signed `Manifest`, see
`edgetwin.edge.signing`), each published once and never overwritten, and one *current pointer* per
scope: ``"global"``, ``"cluster/<c>"`` or ``"site/<s>"``. Promotions move a pointer with
compare-and-swap, ``set_current(scope, version, expected=<what the caller believes is current>)``,
so two promotions cannot race: the one with a stale ``expected`` fails with `CASConflict`. Each
pointer keeps its history, which gives the rollback target.

Two implementations of the same contract, one module each:

- `FileRegistry` (sync, the embedded default, `edgetwin.edge.registry.file_registry`): a directory.
- `NatsRegistry` (async, `edgetwin.edge.registry.nats_registry`): NATS JetStream KV + Object Store.

`BlockingRegistry` / `ThreadedRegistry` (`edgetwin.edge.registry.adapters`) cross between sync and
async code, and `open_registry` (`edgetwin.edge.registry.access`) opens either from a path or a
``nats://`` URL, which is what the CLI uses.

Custody: `publish` verifies the policy or twin directory against its manifest
(`edgetwin.contract.manifest`) before it packs and signs anything, so the registry never signs a
tampered or unsealed directory; every fetch verifies the signature (`verify_artifact`) before
anything is unpacked, the signed kind against the one asked for (a twin is never handed over as a
policy), and the unpacked directory against its manifest before it is handed over. A twin is also
signed *as a directory* when it is published (`edgetwin.edge.signed_dirs`: its ``SIGNATURE.json``
travels in the packed bytes), so a fetched twin verifies offline with ``--trust`` wherever it goes.
"""

from __future__ import annotations

import abc
import asyncio
import dataclasses
import json
import logging
import os
import re
import shutil
import uuid
from collections.abc import Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from edgetwin.contract.errors import InputError
from edgetwin.contract.manifest import KINDS, ArtifactTampered, read_manifest, verify_manifest
from edgetwin.edge.signing import (
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

logger = logging.getLogger("edgetwin.edge.registry")


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


def parse_pointer(raw: bytes | None) -> dict[str, Any] | None:
    return None if raw is None else json.loads(raw)


def next_pointer(
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


def pointer_history(state: dict[str, Any] | None) -> list[PointerChange]:
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
    kind = artifact_kind(policy_dir)
    if kind == "twin":
        doc = verify_twin_dir(policy_dir)  # before anything is packed or signed
        packed = _pack_signed_twin(Path(policy_dir), signer, metadata)
        doc = {"spec_hash": doc.get("spec_hash")}
    else:
        doc = verify_policy_dir(policy_dir)  # before anything is packed or signed
        packed = pack_directory(policy_dir)
    md = dict(metadata)
    md["kind"] = kind
    # the signed metadata may add to policy.json / meta.json, but not disown the spec it acts in
    if md.get("spec_hash") is not None and doc.get("spec_hash") not in (None, md["spec_hash"]):
        what = "meta.json" if kind == "twin" else "policy.json"
        raise InputError(
            f"metadata says spec_hash {md['spec_hash']!r} but the sealed {what} says {doc['spec_hash']!r}",
            where=str(Path(policy_dir) / what),
        )
    if md.get("version") is None:
        md["version"] = f"{AUTO_VERSION_PREFIX}0"  # placeholder so the rest is validated before a name is picked
        normalize_metadata(md)
        md["version"] = None
    else:
        normalize_metadata(md)
    return packed, md


def artifact_kind(directory: str | Path) -> str:
    """``"policy"`` or ``"twin"``: the kind its manifest records (read, not yet verified).

    Raises:
        InputError: not a directory, or no readable manifest (`ArtifactTampered`).
    """
    return str(read_manifest(directory)["kind"])


def verify_twin_dir(twin_dir: str | Path) -> dict[str, Any]:
    """Check a twin directory before it is signed: sealed, every file matching its manifest.

    Returns:
        Its ``meta.json`` document (a JSON object).

    Raises:
        InputError: no manifest, another kind, a missing, added or altered file (naming it), or a
            meta.json that is not a JSON object.
    """
    root = Path(twin_dir)
    verify_manifest(root, "twin", require=("meta.json", "spec.toml"))
    try:
        doc = json.loads((root / "meta.json").read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as e:
        raise InputError(f"meta.json is not valid JSON ({e})", where=str(root / "meta.json")) from None
    if not isinstance(doc, dict):
        raise InputError("meta.json is not a JSON object", where=str(root / "meta.json"))
    return doc


def _pack_signed_twin(root: Path, signer: Signer, metadata: Mapping[str, Any]) -> bytes:
    """The twin's packed bytes with a fresh ``SIGNATURE.json`` by ``signer`` inside (the source
    directory is not touched): the directory signature travels with the twin."""
    import tempfile

    from edgetwin.edge.signed_dirs import sign_directory

    with tempfile.TemporaryDirectory(prefix="edgetwin-twin-") as tmp:
        copy = Path(tmp) / "twin"
        shutil.copytree(root, copy, symlinks=True)
        sign_directory(copy, "twin", signer, {"name": metadata.get("name"), "publisher": signer.key_id})
        return pack_directory(copy)


def verify_policy_dir(policy_dir: str | Path) -> dict[str, Any]:
    """Check a directory before it is signed: a sealed policy whose files all match its manifest.

    Returns:
        Its ``policy.json`` document (a JSON object).

    Raises:
        InputError: not a directory, no manifest, a twin or other artifact, a missing, added or
            altered file (`ArtifactTampered`, naming the file), or a policy.json that is not an object.
    """
    root = Path(policy_dir)
    verify_manifest(root, "policy", require=("policy.json",))
    doc_path = root / "policy.json"
    try:
        doc = json.loads(doc_path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as e:
        raise InputError(f"policy.json is not valid JSON ({e})", where=str(doc_path)) from None
    if not isinstance(doc, dict):
        raise InputError("policy.json is not a JSON object", where=str(doc_path))
    return doc


def _next_auto_version(existing: list[str]) -> str:
    numbers = [int(m.group(1)) for v in existing if (m := _AUTO_VERSION_RE.match(v))]
    return f"{AUTO_VERSION_PREFIX}{max(numbers, default=0) + 1}"


def utc_now() -> str:
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

    def fetch(self, version: str, dest_dir: str | Path, trust: TrustStore, kind: str = "policy") -> Path:
        """Verify ``version`` against ``trust`` and unpack it into ``dest_dir``.

        ``dest_dir`` must not exist or be empty; nothing is written there unless the artifact is
        verified. Returns ``dest_dir``.

        Args:
            kind: ``"policy"`` or ``"twin"``: what the caller will load; another kind is refused.

        Raises:
            ArtifactRejected: unsigned, untrusted key, bad signature, checksum or version mismatch,
                another kind than ``kind``.
            VersionNotFound: no such version.
        """
        packed, manifest = self._load(version)
        verify_artifact(packed, manifest, trust, expected_version=version)
        _check_kind(manifest, kind, version)
        return _unpack_atomically(packed, Path(dest_dir), version, kind)

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

    async def fetch(self, version: str, dest_dir: str | Path, trust: TrustStore, kind: str = "policy") -> Path:
        """See `PolicyRegistry.fetch`."""
        packed, manifest = await self._load(version)
        verify_artifact(packed, manifest, trust, expected_version=version)
        _check_kind(manifest, kind, version)
        return await asyncio.to_thread(_unpack_atomically, packed, Path(dest_dir), version, kind)

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


def _check_kind(manifest: Manifest, kind: str, version: str) -> None:
    """Refuse a verified artifact of another kind than the caller's (a twin fetched as a policy)."""
    if kind not in KINDS:
        raise ValueError(f"unknown artifact kind {kind!r}; expected one of {KINDS}")
    have = manifest.metadata.get("kind") or "policy"  # versions published before kinds were policies
    if have != kind:
        raise ArtifactRejected(RejectReason.MALFORMED, f"version {version} is a {have}, not a {kind}", version)


def _unpack_atomically(packed: bytes, dest: Path, version: str, kind: str = "policy") -> Path:
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
        try:  # signed, but was what got signed a sealed, intact policy (twin)?
            verify_manifest(tmp, kind, require=("policy.json",) if kind == "policy" else ("meta.json", "spec.toml"))
        except ArtifactTampered as e:
            rel = e.file.relative_to(tmp) if e.file.is_relative_to(tmp) else e.file.name
            raise ArtifactRejected(RejectReason.UNSEALED, f"{rel}: {e.problem}", version) from None
        if dest.exists():
            dest.rmdir()  # empty (checked above)
        os.rename(tmp, dest)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return dest
