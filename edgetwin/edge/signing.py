"""Signed policy artifacts: deterministic packing, Ed25519 keys, a trust store, verification.

A policy travels to the edge as one *artifact*: the policy directory packed deterministically
(`pack_directory`: a sorted tar with fixed mtimes, owners and modes, gzip with a fixed header, so
the same directory always gives the same bytes), sealed inside by its own ``MANIFEST.json`` (the
sha256 of every file: `edgetwin.contract.manifest`, the one file-integrity mechanism of twins and
policies), plus the signed envelope that travels beside it, the `Manifest` of this module:

- ``metadata``: JSON (name, version, spec hash, algorithm, training data hash, metrics at promotion,
  created, parent version, and anything else the publisher adds),
- ``sha256``: checksum of the packed bytes,
- ``signature``: Ed25519 (``cryptography``) over ``FORMAT \\n sha256 \\n canonical-JSON(metadata)``,
  with the id of the key that made it.

An edge agent calls `verify_artifact` before unpacking anything. Unsigned, tampered (bytes or
metadata), wrong-key or malformed artifacts raise `ArtifactRejected` with a `RejectReason`, and the
rejection is logged on the ``edgetwin.edge.signing`` logger.

Keys are PEM files (private keys written with mode 0600); a key's id is the first 16 hex digits of
the SHA-256 of its raw public bytes, so it does not depend on file names.
"""

from __future__ import annotations

import base64
import dataclasses
import enum
import gzip
import hashlib
import io
import json
import logging
import math
import os
import re
import stat
import tarfile
from collections.abc import Iterable, Iterator, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from edgetwin.contract.errors import InputError

logger = logging.getLogger(__name__)

#: Format tag of manifests and the first line of the signed payload; bump when either changes.
ARTIFACT_FORMAT = "edgetwin-artifact/1"
#: Versions and names: they become file names and NATS KV keys (where '.' separates tokens), so a
#: conservative alphabet, at most 128 characters, with no empty dot-separated part.
NAME_RE = re.compile(r"^(?=.{1,128}$)[A-Za-z0-9][A-Za-z0-9_\-]*(?:\.[A-Za-z0-9_\-]+)*$")
#: Metadata fields every published policy carries (others are allowed and are signed too).
METADATA_FIELDS = (
    "name",
    "version",
    "spec_hash",
    "algorithm",
    "training_data_hash",
    "metrics",
    "created",
    "parent_version",
)


# ------------------------------------------------------------------------------------- errors
class RejectReason(enum.StrEnum):
    """Why an artifact was refused."""

    UNSIGNED = "unsigned"  # no signature at all
    UNTRUSTED_KEY = "untrusted_key"  # signed by a key that is not in the trust store
    BAD_SIGNATURE = "bad_signature"  # the signature does not match checksum + metadata (metadata tampered)
    CHECKSUM_MISMATCH = "checksum_mismatch"  # the packed bytes are not the ones that were signed
    VERSION_MISMATCH = "version_mismatch"  # a valid artifact served under another version's name
    MALFORMED = "malformed"  # the manifest or the archive cannot be read
    UNSEALED = "unsealed"  # signed, but the packed directory fails its own MANIFEST.json (contract.manifest)


class ArtifactRejected(RuntimeError):
    """An artifact failed verification and must not be loaded (the CLI exits 2: refused input).

    Attributes:
        reason: the machine-readable `RejectReason`.
        detail: a sentence for a person.
        version: the version that was refused, if known.
    """

    exit_code = 2

    def __init__(self, reason: RejectReason, detail: str, version: str | None = None) -> None:
        self.reason = RejectReason(reason)
        self.detail = detail
        self.version = version
        what = f"artifact {version!r}" if version else "artifact"
        super().__init__(f"{what} rejected ({self.reason.value}): {detail}")


def _reject(reason: RejectReason, detail: str, version: str | None) -> ArtifactRejected:
    err = ArtifactRejected(reason, detail, version)
    # ``raised``: the caller gets this as an exception too (the CLI prints it once, as the error)
    logger.warning("%s", err, extra={"raised": True})
    return err


# ------------------------------------------------------------------------------------- keys
def key_id(public_key: Ed25519PublicKey) -> str:
    """Id of a public key: the first 16 hex digits of SHA-256 over its 32 raw bytes."""
    raw = public_key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return hashlib.sha256(raw).hexdigest()[:16]


def generate_keypair() -> tuple[Ed25519PrivateKey, Ed25519PublicKey]:
    """A fresh Ed25519 key pair from the OS's CSPRNG (deliberately not seedable)."""
    private = Ed25519PrivateKey.generate()
    return private, private.public_key()


def save_private_key(key: Ed25519PrivateKey, path: str | Path, *, overwrite: bool = False) -> Path:
    """Write a private key as unencrypted PKCS#8 PEM, created with mode 0600 (never world-readable).

    Raises:
        InputError: the file exists and ``overwrite`` is false.
    """
    path = Path(path)
    pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    flags = os.O_WRONLY | os.O_CREAT | (os.O_TRUNC if overwrite else os.O_EXCL)
    try:
        # The mode is given at creation so there is no window in which the key is readable by others.
        fd = os.open(path, flags, 0o600)
    except FileExistsError:
        raise InputError("a key file already exists here; refusing to overwrite it", where=str(path)) from None
    with os.fdopen(fd, "wb") as f:
        f.write(pem)
    os.chmod(path, 0o600)  # O_TRUNC on an existing file keeps its old mode
    return path


def save_public_key(key: Ed25519PublicKey, path: str | Path, *, overwrite: bool = False) -> Path:
    """Write a public key as SubjectPublicKeyInfo PEM."""
    path = Path(path)
    if path.exists() and not overwrite:
        raise InputError("a key file already exists here; refusing to overwrite it", where=str(path))
    path.write_bytes(key.public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo))
    return path


def load_private_key(path: str | Path) -> Ed25519PrivateKey:
    """Read an Ed25519 private key from PEM.

    Raises:
        InputError: the file is missing, not PEM, encrypted, or not an Ed25519 key.
    """
    path = Path(path)
    try:
        data = path.read_bytes()
    except OSError as e:
        raise InputError(f"cannot read the private key: {e.strerror}", where=str(path)) from None
    try:
        key = serialization.load_pem_private_key(data, password=None)
    except (ValueError, TypeError) as e:
        raise InputError(f"not an unencrypted PEM private key ({e})", where=str(path)) from None
    if not isinstance(key, Ed25519PrivateKey):
        raise InputError(f"expected an Ed25519 private key, got {type(key).__name__}", where=str(path))
    if os.name == "posix" and path.stat().st_mode & 0o077:
        logger.warning("private key %s is readable by group/others; chmod 600 it", path)
    return key


def load_public_key(path: str | Path) -> Ed25519PublicKey:
    """Read an Ed25519 public key from PEM (a private key file is accepted: its public half is used).

    Raises:
        InputError: the file is missing, not PEM, or not an Ed25519 key.
    """
    path = Path(path)
    try:
        data = path.read_bytes()
    except OSError as e:
        raise InputError(f"cannot read the public key: {e.strerror}", where=str(path)) from None
    if b"PRIVATE KEY" in data:
        return load_private_key(path).public_key()
    try:
        key = serialization.load_pem_public_key(data)
    except (ValueError, TypeError) as e:
        raise InputError(f"not a PEM public key ({e})", where=str(path)) from None
    if not isinstance(key, Ed25519PublicKey):
        raise InputError(f"expected an Ed25519 public key, got {type(key).__name__}", where=str(path))
    return key


class Signer:
    """A private key that signs artifacts, with the id under which verifiers will know it."""

    def __init__(self, private_key: Ed25519PrivateKey) -> None:
        self.private_key = private_key
        self.public_key = private_key.public_key()
        self.key_id = key_id(self.public_key)

    @classmethod
    def generate(cls) -> Signer:
        return cls(generate_keypair()[0])

    @classmethod
    def from_pem(cls, path: str | Path) -> Signer:
        return cls(load_private_key(path))

    def sign(self, payload: bytes) -> bytes:
        """Ed25519 signature (64 bytes) over ``payload``."""
        return self.private_key.sign(payload)

    def __repr__(self) -> str:
        return f"Signer(key_id={self.key_id!r})"


class TrustStore:
    """The public keys an edge agent accepts artifacts from, by key id."""

    def __init__(self, keys: Iterable[Ed25519PublicKey] = ()) -> None:
        self._keys: dict[str, Ed25519PublicKey] = {}
        for k in keys:
            self.add(k)

    def add(self, key: Ed25519PublicKey) -> str:
        """Trust ``key``; returns its id."""
        kid = key_id(key)
        self._keys[kid] = key
        return kid

    def get(self, kid: str) -> Ed25519PublicKey | None:
        return self._keys.get(kid)

    @property
    def key_ids(self) -> list[str]:
        return sorted(self._keys)

    def __contains__(self, kid: object) -> bool:
        return kid in self._keys

    def __len__(self) -> int:
        return len(self._keys)

    @classmethod
    def from_paths(cls, paths: Iterable[str | Path]) -> TrustStore:
        """Trust the keys in these PEM files, or in every ``*.pem`` file of these directories.

        A directory's private key files (``-----BEGIN PRIVATE KEY``) are skipped: a trust store
        holds public keys. Raises `InputError` if a path is missing or nothing was found.
        """
        store = cls()
        for p in map(Path, paths):
            if p.is_dir():
                for f in sorted(p.glob("*.pem")):
                    if b"PRIVATE KEY" in f.read_bytes():
                        continue
                    store.add(load_public_key(f))
            elif p.exists():
                store.add(load_public_key(p))
            else:
                raise InputError("no such trust store file or directory", where=str(p))
        if not store:
            raise InputError("no public keys (*.pem) found", where=", ".join(map(str, paths)) or "trust store")
        return store


# ------------------------------------------------------------------------------------- packing
def pack_directory(directory: str | Path) -> bytes:
    """Pack a directory into deterministic ``.tar.gz`` bytes.

    Entries are sorted, with mtime 0, owner 0/0 and no user/group names, and mode 0755 for
    directories and executables, 0644 for other files; gzip's header has no name and mtime 0. The
    same content therefore always gives the same bytes (and checksum), wherever it was written.

    Raises:
        InputError: not a directory, or it holds something other than regular files and directories
            (symlinks, devices): those would not mean the same thing on the edge.
    """
    root = Path(directory)
    if not root.is_dir():
        raise InputError("expected a policy directory", where=str(root))
    buf = io.BytesIO()
    with (
        gzip.GzipFile(filename="", mode="wb", fileobj=buf, mtime=0) as gz,
        tarfile.open(fileobj=gz, mode="w", format=tarfile.PAX_FORMAT) as tar,
    ):
        for rel, path in _walk_sorted(root):
            st = path.lstat()
            info = tarfile.TarInfo(rel)
            info.mtime = 0
            info.uid = info.gid = 0
            info.uname = info.gname = ""
            if stat.S_ISDIR(st.st_mode):
                info.type = tarfile.DIRTYPE
                info.mode = 0o755
                tar.addfile(info)
            elif stat.S_ISREG(st.st_mode):
                info.type = tarfile.REGTYPE
                info.mode = 0o755 if st.st_mode & stat.S_IXUSR else 0o644
                info.size = st.st_size
                with path.open("rb") as f:
                    tar.addfile(info, f)
            else:
                raise InputError(
                    "only regular files and directories can be packed (symlink or special file)", where=str(path)
                )
    return buf.getvalue()


def _walk_sorted(root: Path) -> Iterator[tuple[str, Path]]:
    """(posix relative path, path) of everything under ``root``, depth-first in sorted order."""
    for child in sorted(root.iterdir(), key=lambda p: p.name):
        rel = child.relative_to(root).as_posix()
        yield rel, child
        if child.is_dir() and not child.is_symlink():
            for sub_rel, sub in _walk_sorted(child):
                yield f"{rel}/{sub_rel}", sub


def unpack_artifact(packed: bytes, dest: str | Path) -> Path:
    """Unpack bytes from `pack_directory` into ``dest`` (created; must not exist or be empty).

    Only regular files and directories with relative, non-escaping paths are accepted, through
    tarfile's ``data`` filter as a second line of defence. Verify the artifact first.

    Raises:
        InputError: ``dest`` exists and is not an empty directory.
        ArtifactRejected: the archive is unreadable or has a member that is not allowed (MALFORMED).
    """
    dest = Path(dest)
    if dest.exists() and (not dest.is_dir() or any(dest.iterdir())):
        raise InputError("destination exists and is not an empty directory", where=str(dest))
    dest.mkdir(parents=True, exist_ok=True)
    try:
        with tarfile.open(fileobj=io.BytesIO(packed), mode="r:gz") as tar:
            members = tar.getmembers()
            for m in members:
                parts = Path(m.name).parts
                if m.name.startswith(("/", "\\")) or ".." in parts or not (m.isfile() or m.isdir()):
                    raise _reject(RejectReason.MALFORMED, f"archive member {m.name!r} is not allowed", None)
            tar.extractall(dest, members=members, filter="data")
    except (tarfile.TarError, OSError, EOFError) as e:
        raise _reject(RejectReason.MALFORMED, f"cannot unpack the archive: {e}", None) from None
    return dest


def sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


# ------------------------------------------------------------------------------------- metadata
def canonical_json(obj: Any) -> bytes:
    """Canonical JSON bytes: sorted keys, no whitespace, UTF-8, no NaN/Infinity.

    Raises:
        InputError: the object has NaN/Infinity or something JSON cannot represent.
    """
    try:
        return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode(
            "utf-8"
        )
    except (TypeError, ValueError) as e:
        raise InputError(f"metadata must be plain JSON (strings, finite numbers, lists, objects): {e}") from None


def normalize_metadata(metadata: Mapping[str, Any], *, where: str = "metadata") -> dict[str, Any]:
    """Check policy metadata and fill defaults; returns a new dict that round-trips through JSON.

    ``name`` and ``version`` must match `NAME_RE`; ``metrics`` must map names to finite numbers;
    ``parent_version`` is a version or None; ``created`` defaults to now (UTC, ISO 8601).
    Missing standard fields are set to None so every artifact has the same keys.

    Raises:
        InputError: naming the field and what was expected.
    """
    md = dict(metadata)
    for field in ("name", "version"):
        v = md.get(field)
        if not isinstance(v, str) or not NAME_RE.match(v):
            raise InputError(
                f"field {field!r} must be 1-128 characters of letters, digits, '_', '-' and single dots "
                f"between them, starting with a letter or digit; got {v!r}",
                where=where,
            )
    parent = md.get("parent_version")
    if parent is not None and (not isinstance(parent, str) or not NAME_RE.match(parent)):
        raise InputError(f"field 'parent_version' must be a version name or null; got {parent!r}", where=where)
    metrics = md.get("metrics")
    if metrics is None:
        md["metrics"] = {}
    elif not isinstance(metrics, Mapping):
        raise InputError(f"field 'metrics' must be an object of name -> number; got {type(metrics).__name__}", where)
    else:
        clean: dict[str, float] = {}
        for k, v in metrics.items():
            if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(float(v)):
                raise InputError(f"metric {k!r} must be a finite number; got {v!r}", where=where)
            clean[str(k)] = float(v)
        md["metrics"] = clean
    if md.get("created") is None:
        md["created"] = datetime.now(UTC).isoformat(timespec="seconds")
    for field in METADATA_FIELDS:
        md.setdefault(field, None)
    return json.loads(canonical_json(md))  # also rejects NaN and non-JSON values, naming them


# ------------------------------------------------------------------------------------- manifest
@dataclasses.dataclass(frozen=True)
class Manifest:
    """What travels beside the packed bytes of an artifact.

    Attributes:
        metadata: the policy's metadata (signed).
        sha256: hex SHA-256 of the packed bytes (signed).
        size: length of the packed bytes, in bytes (informational).
        key_id: id of the signing key, or None if unsigned.
        signature: base64 Ed25519 signature, or None if unsigned.
        format: `ARTIFACT_FORMAT`.
    """

    metadata: dict[str, Any]
    sha256: str
    size: int
    key_id: str | None
    signature: str | None
    format: str = ARTIFACT_FORMAT

    @property
    def version(self) -> str:
        return str(self.metadata.get("version"))

    @property
    def name(self) -> str:
        return str(self.metadata.get("name"))

    def signed_payload(self) -> bytes:
        return signed_payload(self.sha256, self.metadata)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def to_json(self) -> bytes:
        return canonical_json(self.to_dict())

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], version: str | None = None) -> Manifest:
        """Parse a manifest; raises `ArtifactRejected` (MALFORMED) if it is not one."""
        try:
            if d.get("format") != ARTIFACT_FORMAT:
                raise ValueError(f"format {d.get('format')!r}, expected {ARTIFACT_FORMAT!r}")
            md = d["metadata"]
            if not isinstance(md, dict):
                raise ValueError("metadata is not an object")
            sha = d["sha256"]
            if not isinstance(sha, str) or not re.fullmatch(r"[0-9a-f]{64}", sha):
                raise ValueError("sha256 is not 64 hex digits")
            return cls(
                metadata=md,
                sha256=sha,
                size=int(d["size"]),
                key_id=d.get("key_id"),
                signature=d.get("signature"),
            )
        except (KeyError, TypeError, ValueError) as e:
            raise _reject(RejectReason.MALFORMED, f"bad manifest: {e}", version) from None

    @classmethod
    def from_json(cls, data: bytes, version: str | None = None) -> Manifest:
        try:
            d = json.loads(data)
        except (ValueError, UnicodeDecodeError) as e:
            raise _reject(RejectReason.MALFORMED, f"manifest is not JSON: {e}", version) from None
        if not isinstance(d, dict):
            raise _reject(RejectReason.MALFORMED, "manifest is not a JSON object", version)
        return cls.from_dict(d, version)


def signed_payload(sha256: str, metadata: Mapping[str, Any]) -> bytes:
    """The exact bytes that are signed: format tag, checksum and canonical metadata, one per line."""
    return ARTIFACT_FORMAT.encode() + b"\n" + sha256.encode() + b"\n" + canonical_json(dict(metadata))


def sign_artifact(packed: bytes, metadata: Mapping[str, Any], signer: Signer | None) -> Manifest:
    """Checksum ``packed`` and sign it with its metadata (already normalised, see `normalize_metadata`).

    ``signer=None`` builds an unsigned manifest: only useful to show that verification refuses it.
    """
    md = json.loads(canonical_json(dict(metadata)))
    sha = sha256_hex(packed)
    if signer is None:
        return Manifest(metadata=md, sha256=sha, size=len(packed), key_id=None, signature=None)
    sig = signer.sign(signed_payload(sha, md))
    return Manifest(
        metadata=md, sha256=sha, size=len(packed), key_id=signer.key_id, signature=base64.b64encode(sig).decode()
    )


def verify_artifact(
    packed: bytes, manifest: Manifest, trust: TrustStore, *, expected_version: str | None = None
) -> None:
    """Check an artifact before anything is unpacked or loaded; returns None if it may be used.

    Order of checks: signed at all, by a trusted key, signature valid over checksum + metadata,
    packed bytes match the signed checksum, and (if given) the metadata's version is the one asked for.

    Raises:
        ArtifactRejected: with the first `RejectReason` that applies (also logged).
    """
    version = expected_version or manifest.metadata.get("version")
    if not manifest.signature or not manifest.key_id:
        raise _reject(RejectReason.UNSIGNED, "the artifact carries no signature", version)
    public = trust.get(manifest.key_id)
    if public is None:
        raise _reject(
            RejectReason.UNTRUSTED_KEY,
            f"signed by key {manifest.key_id}, which is not in the trust store (trusted: "
            f"{', '.join(trust.key_ids) or 'none'})",
            version,
        )
    try:
        sig = base64.b64decode(manifest.signature, validate=True)
        public.verify(sig, manifest.signed_payload())
    except (InvalidSignature, ValueError):
        raise _reject(
            RejectReason.BAD_SIGNATURE,
            f"signature by key {manifest.key_id} does not match the checksum and metadata "
            "(metadata tampered with, or the signature forged)",
            version,
        ) from None
    actual = sha256_hex(packed)
    if actual != manifest.sha256:
        raise _reject(
            RejectReason.CHECKSUM_MISMATCH,
            f"packed bytes have sha256 {actual[:16]}..., the signed checksum is {manifest.sha256[:16]}... "
            f"({len(packed)} bytes, signed size {manifest.size})",
            version,
        )
    if expected_version is not None and manifest.metadata.get("version") != expected_version:
        raise _reject(
            RejectReason.VERSION_MISMATCH,
            f"asked for version {expected_version!r} but the signed metadata says "
            f"{manifest.metadata.get('version')!r}",
            version,
        )
