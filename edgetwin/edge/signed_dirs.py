"""Signed artifact directories: a twin (or policy) directory that says who sealed it.

A manifest (`edgetwin.contract.manifest`) proves a directory intact, not who wrote it: anyone who
can swap a file can recompute ``MANIFEST.json``. A signed directory also carries
``SIGNATURE.json``: an Ed25519 signature (the keys of `edgetwin.edge.signing`) over the sha256 of
its ``MANIFEST.json`` — which lists the sha256 of every other file — with the artifact's kind and
signed metadata::

    {"format": "edgetwin-signature/1", "kind": "twin", "manifest_sha256": "<hex>",
     "metadata": {...}, "key_id": "<16 hex>", "signature": "<base64>"}

The signed payload is ``FORMAT \\n kind \\n manifest_sha256 \\n canonical-JSON(metadata)``.
``SIGNATURE.json`` is outside the manifest (as the manifest itself is: a manifest cannot list its own
signature), so signing never changes what the manifest seals, and a directory can be signed after
it was written (``edgetwin fit --key``, ``edgetwin registry sign``, a federation coordinator, the
registry when it publishes a twin).

`verify_directory` checks, in order: the manifest (every file, `verify_manifest`), then the
signature: present, by a key of the trust store, valid over this manifest. Any failure raises
`ArtifactRejected` (exit 2) naming the directory and the reason; nothing in the directory has been
parsed (beyond the manifest and the signature's JSON) when it does.
"""

from __future__ import annotations

import base64
import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from cryptography.exceptions import InvalidSignature

from edgetwin.contract.json_bounds import read_json
from edgetwin.contract.manifest import MANIFEST_FILE, SIGNATURE_FILE, sha256_file, verify_manifest
from edgetwin.edge.signing import (
    ArtifactRejected,
    RejectReason,
    Signer,
    TrustStore,
    canonical_json,
)

__all__ = ["SIGNATURE_FILE", "SIGNATURE_FORMAT", "is_signed", "sign_directory", "verify_directory"]

#: Format tag of ``SIGNATURE.json`` and the first line of its signed payload.
SIGNATURE_FORMAT = "edgetwin-signature/1"
#: The longest ``SIGNATURE.json`` read (bytes): a key id, a signature, a digest and small metadata.
_MAX_SIGNATURE_BYTES = 1024 * 1024


def _payload(kind: str, manifest_sha256: str, metadata: Mapping[str, Any]) -> bytes:
    return b"\n".join([SIGNATURE_FORMAT.encode(), kind.encode(), manifest_sha256.encode(), canonical_json(dict(metadata))])


def sign_directory(
    directory: str | Path, kind: str, signer: Signer, metadata: Mapping[str, Any] | None = None
) -> Path:
    """Sign a sealed artifact directory: write its ``SIGNATURE.json`` (replacing any earlier one).

    The directory is verified against its manifest first: nothing tampered is ever signed.

    Args:
        directory: a sealed twin or policy directory.
        kind: ``"twin"`` or ``"policy"`` (the manifest's kind must be this).
        signer: the private key.
        metadata: plain JSON to sign with it (e.g. who, for which federation round).

    Returns:
        The path of ``SIGNATURE.json``.

    Raises:
        InputError: the directory fails its manifest (`ArtifactTampered`), or metadata is not JSON.
    """
    root = Path(directory)
    verify_manifest(root, kind)
    digest = sha256_file(root / MANIFEST_FILE)
    md = json.loads(canonical_json(dict(metadata or {})))
    sig = signer.sign(_payload(kind, digest, md))
    doc = {
        "format": SIGNATURE_FORMAT,
        "kind": kind,
        "manifest_sha256": digest,
        "metadata": md,
        "key_id": signer.key_id,
        "signature": base64.b64encode(sig).decode(),
    }
    tmp = root / f".{SIGNATURE_FILE}.tmp"
    tmp.write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n")
    os.replace(tmp, root / SIGNATURE_FILE)
    return root / SIGNATURE_FILE


def is_signed(directory: str | Path) -> bool:
    """Whether the directory carries a ``SIGNATURE.json`` (not whether it verifies)."""
    return (Path(directory) / SIGNATURE_FILE).is_file()


def _rejected(reason: RejectReason, detail: str, root: Path) -> ArtifactRejected:
    return ArtifactRejected(reason, f"{root}: {detail}")


def verify_directory(directory: str | Path, kind: str, trust: TrustStore, *, require: tuple[str, ...] = ()) -> dict[str, Any]:
    """Check a directory's manifest and its signature against trusted keys; returns the signed metadata.

    Args:
        directory: the twin or policy directory.
        kind: the kind expected (``"twin"``, ``"policy"``).
        trust: the public keys accepted.
        require: files the manifest must list (as `verify_manifest`).

    Raises:
        ArtifactTampered: the manifest check fails (a file swapped, added, removed; exit 2).
        ArtifactRejected: unsigned, signed by an untrusted key, a signature that does not match this
            manifest (the directory was re-sealed after signing) or another kind, or a malformed
            ``SIGNATURE.json`` (exit 2).
    """
    root = Path(directory)
    verify_manifest(root, kind, require=require)
    path = root / SIGNATURE_FILE
    if path.is_symlink() or not path.is_file():
        raise _rejected(
            RejectReason.UNSIGNED,
            f"the {kind} carries no {SIGNATURE_FILE}; sign it with `edgetwin registry sign {root} --key KEY` "
            "(or `fit --key`), or fetch a signed one from a registry",
            root,
        )
    try:
        doc = read_json(path, max_bytes=_MAX_SIGNATURE_BYTES)
        if not isinstance(doc, dict) or doc.get("format") != SIGNATURE_FORMAT:
            raise ValueError(f"format {doc.get('format') if isinstance(doc, dict) else None!r}, expected {SIGNATURE_FORMAT!r}")
        key, sig_b64, digest, md = doc["key_id"], doc["signature"], doc["manifest_sha256"], doc["metadata"]
        if not all(isinstance(v, str) for v in (key, sig_b64, digest)) or not isinstance(md, dict):
            raise ValueError("key_id, signature and manifest_sha256 must be strings, metadata an object")
        sig = base64.b64decode(sig_b64, validate=True)
    except (OSError, UnicodeDecodeError, ValueError, KeyError) as e:
        raise _rejected(RejectReason.MALFORMED, f"{SIGNATURE_FILE} cannot be read ({e})", root) from None
    public = trust.get(key)
    if public is None:
        raise _rejected(
            RejectReason.UNTRUSTED_KEY,
            f"signed by key {key}, which is not trusted (trusted: {', '.join(trust.key_ids) or 'none'})",
            root,
        )
    actual = sha256_file(root / MANIFEST_FILE)
    try:
        public.verify(sig, _payload(kind, actual, md))
    except InvalidSignature:
        why = (
            "the directory was re-sealed after it was signed (its MANIFEST.json changed)"
            if digest != actual
            else f"the signature does not match (not a {kind}'s, or its metadata was altered)"
        )
        raise _rejected(RejectReason.BAD_SIGNATURE, f"signature by key {key} does not verify: {why}", root) from None
    return dict(md)
