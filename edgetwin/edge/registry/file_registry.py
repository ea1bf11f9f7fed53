"""`FileRegistry`: the policy registry in a directory (sync, the embedded default).

Versions are published by an atomic directory rename and pointers are moved under an ``flock`` lock
file with write-to-temp + rename, so it is safe across threads and processes on one host.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import shutil
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from edgetwin.contract.errors import InputError
from edgetwin.edge.registry.base import (
    PointerChange,
    PolicyRegistry,
    RegistryError,
    VersionExists,
    VersionNotFound,
    check_scope,
    next_pointer,
    parse_pointer,
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
                _write_synced(tmp / "published.json", json.dumps({"seq": seq, "at": utc_now()}).encode())
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
            return parse_pointer(self._pointer_path(scope).read_bytes())
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
            new, change = next_pointer(self._read_pointer(scope), scope, version, expected, kind, reason)
            path = self._pointer_path(scope)
            path.parent.mkdir(parents=True, exist_ok=True)
            _atomic_write(path, json.dumps(new, indent=1).encode())
        logger.info("%s: %s -> %s (%s)", scope, expected, version, kind)
        return change

    def history(self, scope: str) -> list[PointerChange]:
        return pointer_history(self._read_pointer(scope))

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
