"""Artifact manifests: the one integrity mechanism of every artifact directory (twins, policies).

An artifact is a directory; its manifest, ``MANIFEST.json`` in that directory, lists the sha256 of
**every** file under it (metadata such as ``policy.json`` or ``meta.json`` included; the manifest
itself and its detached signature ``SIGNATURE.json`` excepted) and the kind of artifact it is::

    {"format": "edgetwin-manifest/1", "kind": "policy",
     "files": {"model.safetensors": "<sha256>", "policy.json": "<sha256>", "spec.toml": "<sha256>"}}

`verify_manifest` refuses, with an `ArtifactTampered` (an `InputError`: exit 2) naming the file:

- a missing or unreadable manifest (artifacts written before manifests existed are refused too:
  re-export or refit them),
- an artifact of another kind (a twin directory given where a policy is expected),
- a file the manifest lists that is missing, a file present that the manifest does not list,
- a file whose sha256 differs from the manifest's,
- a symlink or special file anywhere in the directory (it could point outside, or be swapped
  after the check).

Writers call `write_manifest` last, after every other file is in place; loaders call
`verify_manifest` first, before parsing anything. The registry verifies the manifest before it
signs an artifact, and again after it unpacks a fetched one (`edgetwin.edge.registry`), so the
chain of custody runs from ``train`` / ``fit`` to ``serve``.

This protects against accidents and against tampering by anyone who cannot also rewrite the
manifest; the registry's Ed25519 signature (`edgetwin.edge.signing`) covers the packed directory,
manifest included, against those who can.
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from edgetwin.contract.errors import InputError
from edgetwin.contract.json_bounds import read_json

#: File name of the manifest inside an artifact directory.
MANIFEST_FILE = "MANIFEST.json"
#: File name of a directory's detached signature over its manifest (`edgetwin.edge.signed_dirs`):
#: like the manifest itself, outside what the manifest lists (a manifest cannot seal its signature).
SIGNATURE_FILE = "SIGNATURE.json"
#: Format tag; bump when the layout changes (older manifests are then refused, never guessed at).
MANIFEST_FORMAT = "edgetwin-manifest/1"
#: The longest manifest read (bytes): ~100 bytes a file; 64 MiB is ~600,000 files.
MAX_MANIFEST_BYTES = 64 * 1024 * 1024
#: The kinds of artifacts that carry a manifest.
KINDS = ("policy", "twin")
_HEX64 = frozenset("0123456789abcdef")


class ArtifactTampered(InputError):
    """An artifact directory failed its manifest check (exit 2): names the file and what is wrong.

    Attributes:
        artifact: the artifact directory.
        file: the offending file (or the manifest), as a path.
        problem: what is wrong with it, without the file name.
    """

    def __init__(self, message: str, file: str | Path, artifact: str | Path) -> None:
        self.artifact = Path(artifact)
        self.file = Path(file)
        self.problem = message
        super().__init__(message, str(file))


def sha256_file(path: str | Path) -> str:
    """Hex sha256 of a file's bytes, read in 1 MiB chunks."""
    h = hashlib.sha256()
    with Path(path).open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _walk(root: Path) -> Iterable[tuple[str, Path]]:
    """(posix path relative to ``root``, path) of every entry below ``root`` except the manifest
    and its signature.

    Directories are descended into (not yielded); symlinks and special files raise: they are never
    part of an artifact.
    """
    stack = [root]
    while stack:
        d = stack.pop()
        for entry in sorted(os.scandir(d), key=lambda e: e.name):
            p = Path(entry.path)
            rel = p.relative_to(root).as_posix()
            if rel in (MANIFEST_FILE, SIGNATURE_FILE):
                continue
            mode = entry.stat(follow_symlinks=False).st_mode
            if stat.S_ISLNK(mode) or not (stat.S_ISDIR(mode) or stat.S_ISREG(mode)):
                raise ArtifactTampered(
                    "is a symlink or special file; an artifact holds only regular files and directories",
                    p,
                    root,
                )
            if stat.S_ISDIR(mode):
                stack.append(p)
            else:
                yield rel, p


def file_hashes(directory: str | Path) -> dict[str, str]:
    """``{relative posix path: sha256}`` of every regular file under ``directory`` (sorted keys)."""
    root = Path(directory)
    return dict(sorted((rel, sha256_file(p)) for rel, p in _walk(root)))


def write_manifest(directory: str | Path, kind: str, *, require: Iterable[str] = ()) -> Path:
    """Seal an artifact directory: write ``MANIFEST.json`` listing every file's sha256.

    Call it after everything else is written. Any file later added, removed or changed makes
    `verify_manifest` refuse the directory.

    Args:
        directory: the artifact directory.
        kind: one of `KINDS`.
        require: files that must be present (e.g. ``policy.json``): sealing an incomplete
            artifact is a bug of the writer.

    Returns:
        The manifest's path.

    Raises:
        InputError: ``directory`` is not a directory, a required file is missing, or it holds a
            symlink or special file.
    """
    root = Path(directory)
    if kind not in KINDS:
        raise ValueError(f"unknown artifact kind {kind!r}; expected one of {KINDS}")
    if not root.is_dir():
        raise InputError("not a directory", str(root))
    files = file_hashes(root)
    for name in require:
        if name not in files:
            raise InputError(f"cannot seal a {kind} without {name}", str(root / name))
    doc = {"format": MANIFEST_FORMAT, "kind": kind, "files": files}
    path = root / MANIFEST_FILE
    tmp = root / f".{MANIFEST_FILE}.tmp"
    tmp.write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n")
    os.replace(tmp, path)
    return path


def read_manifest(directory: str | Path) -> dict[str, Any]:
    """Parse and shape-check ``MANIFEST.json`` of a directory (no hashing; see `verify_manifest`).

    Raises:
        ArtifactTampered: missing, unreadable, not JSON, wrong format, or a malformed ``files`` map.
    """
    root = Path(directory)
    path = root / MANIFEST_FILE
    if not root.is_dir():
        raise InputError("not an artifact directory (missing, or not a directory)", str(root))
    if path.is_symlink() or not path.is_file():
        raise ArtifactTampered(
            f"no {MANIFEST_FILE}: the artifact is unsealed (written by an edgetwin older than manifests, "
            "or tampered with); refusing it — re-export / refit it",
            path,
            root,
        )
    try:
        doc = read_json(path, max_bytes=MAX_MANIFEST_BYTES)
    except (OSError, UnicodeDecodeError, ValueError) as e:
        raise ArtifactTampered(f"unreadable manifest ({type(e).__name__}: {e})", path, root) from None
    if not isinstance(doc, dict) or doc.get("format") != MANIFEST_FORMAT:
        fmt = doc.get("format") if isinstance(doc, dict) else None
        raise ArtifactTampered(f"manifest format {fmt!r}, expected {MANIFEST_FORMAT!r}", path, root)
    files = doc.get("files")
    if not isinstance(files, dict) or not files:
        raise ArtifactTampered("manifest has no 'files' map (or an empty one)", path, root)
    for name, digest in files.items():
        parts = Path(name).parts
        if (
            not isinstance(name, str)
            or not name
            or name.startswith(("/", "\\"))
            or ".." in parts
            or name in (MANIFEST_FILE, SIGNATURE_FILE)
            or not isinstance(digest, str)
            or len(digest) != 64
            or not set(digest) <= _HEX64
        ):
            raise ArtifactTampered(
                f"manifest entry {name!r}: {digest!r} is not a file and its sha256", path, root
            )
    if doc.get("kind") not in KINDS:
        raise ArtifactTampered(f"manifest kind {doc.get('kind')!r} is not one of {KINDS}", path, root)
    return doc


def verify_manifest(directory: str | Path, kind: str, *, require: Iterable[str] = ()) -> dict[str, Any]:
    """Check an artifact directory against its manifest before anything in it is parsed.

    Args:
        directory: the artifact directory.
        kind: the kind the caller expects (``"policy"``, ``"twin"``).
        require: files the caller will read and that must therefore be listed.

    Returns:
        The manifest document.

    Raises:
        ArtifactTampered: naming the file: missing manifest, wrong kind, a listed file missing, an
            unlisted file present, a sha256 mismatch, a symlink or special file, a required file
            not listed.
    """
    root = Path(directory)
    doc = read_manifest(root)
    mpath = root / MANIFEST_FILE
    if doc["kind"] != kind:
        raise ArtifactTampered(f"this is a {doc['kind']} artifact, not a {kind}", mpath, root)
    listed: dict[str, str] = doc["files"]
    present = dict(_walk(root))
    for name in require:
        if name not in listed:
            raise ArtifactTampered(
                f"{MANIFEST_FILE} does not list {name}, which every {kind} has", root / name, root
            )
    for name in sorted(listed):
        if name not in present:
            raise ArtifactTampered(f"listed in {MANIFEST_FILE} but missing", root / name, root)
    for name in sorted(present):
        if name not in listed:
            raise ArtifactTampered(f"not listed in {MANIFEST_FILE} (a file was added)", present[name], root)
    for name in sorted(listed):
        if sha256_file(present[name]) != listed[name]:
            raise ArtifactTampered(
                f"sha256 does not match {MANIFEST_FILE} (the file was changed after the artifact was sealed)",
                present[name],
                root,
            )
    return doc
