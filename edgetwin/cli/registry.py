"""``edgetwin registry``: keys, and signed artifacts published, listed and shown (verified against trusted keys)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer

from edgetwin.cli.common import (
    BucketOpt,
    JsonOpt,
    RegistryOpt,
    app,
    emit_json,
    out,
)
from edgetwin.contract.errors import InputError

registry_app = typer.Typer(
    help="Signed registry of policies and twins: keys, sign, publish, list, show, fetch.", no_args_is_help=True
)
app.add_typer(registry_app, name="registry")


@registry_app.command("keygen")
def registry_keygen(
    out_dir: Annotated[Path, typer.Option("--out", help="Directory for NAME.key.pem (0600) and NAME.pub.pem.")],
    name: Annotated[str, typer.Option(help="File name stem of the key pair.")] = "publisher",
    force: Annotated[bool, typer.Option("--force", help="Overwrite existing key files.")] = False,
    as_json: JsonOpt = False,
) -> None:
    """Generate an Ed25519 signing key pair (from the OS's CSPRNG: keys are deliberately not seedable)."""
    from edgetwin.edge.signing import Signer, save_private_key, save_public_key

    out_dir.mkdir(parents=True, exist_ok=True)
    signer = Signer.generate()
    pub = out_dir / f"{name}.pub.pem"
    if pub.exists() and not force:
        raise InputError("a key file already exists here; pass --force to overwrite it", where=str(pub))
    key = save_private_key(signer.private_key, out_dir / f"{name}.key.pem", overwrite=force)
    save_public_key(signer.public_key, pub, overwrite=force)
    result = {"key_id": signer.key_id, "private_key": str(key), "public_key": str(pub)}
    if as_json:
        emit_json(result)
    else:
        out.print(f"key {signer.key_id}: private {key} (keep it secret), public {pub} (give it to edge agents)")


@registry_app.command("publish")
def registry_publish(
    policy_dir: Annotated[Path, typer.Argument(help="Exported policy or twin directory.")],
    registry: RegistryOpt,
    key: Annotated[
        Path, typer.Option("--key", envvar="EDGETWIN_SIGNING_KEY", help="Ed25519 private key (PEM) that signs.")
    ],
    name: Annotated[str | None, typer.Option(help="Policy name; default: metadata's, else the directory name.")] = None,
    version: Annotated[str | None, typer.Option(help="Version name; default: the next v<N>.")] = None,
    metadata: Annotated[
        Path | None, typer.Option(help="JSON file of metadata (spec_hash, algorithm, metrics, ...).")
    ] = None,
    parent: Annotated[str | None, typer.Option(help="Parent version.")] = None,
    metric: Annotated[list[str] | None, typer.Option(help="A metric at promotion, NAME=VALUE; repeatable.")] = None,
    bucket: BucketOpt = "edgetwin",
    as_json: JsonOpt = False,
) -> None:
    """Pack, sign and publish a policy or twin directory as a new immutable version.

    Metadata comes from the policy's own policy.json (algorithm, spec hash, training data hash,
    metrics) or the twin's meta.json (spec hash, data hash), then --metadata, then the flags, each
    overriding the one before. A twin is also signed as a directory (its SIGNATURE.json travels
    with it), so `registry fetch` gives a twin that `whatif --trust` and the others accept.
    """
    from edgetwin.edge.registry import describe_version, metadata_from_policy_dir, open_registry
    from edgetwin.edge.signing import Signer

    md: dict[str, Any] = metadata_from_policy_dir(policy_dir)  # an exported policy's policy.json, if any
    if metadata is not None:
        try:
            extra = json.loads(metadata.read_text())
        except (OSError, ValueError) as e:
            raise InputError(f"expected a JSON object of metadata ({e})", where=str(metadata)) from None
        if not isinstance(extra, dict):
            raise InputError("expected a JSON object of metadata", where=str(metadata))
        md |= extra
    md["name"] = name or md.get("name") or policy_dir.name
    if version is not None:
        md["version"] = version
    if parent is not None:
        md["parent_version"] = parent
    metrics = dict(md.get("metrics") or {})
    for item in metric or []:
        k, sep, v = item.partition("=")
        try:
            metrics[k] = float(v)
        except ValueError:
            sep = ""
        if not sep or not k:
            raise InputError(f"expected NAME=VALUE with a number, got {item!r}", where="--metric")
    md["metrics"] = metrics
    signer = Signer.from_pem(key)
    with open_registry(registry, bucket=bucket) as reg:
        published = reg.publish(policy_dir, md, signer)
        result = describe_version(reg, published)
    if as_json:
        emit_json(result)
    else:
        out.print(f"published {published} ({result['name']}, sha256 {result['sha256'][:12]}, key {signer.key_id})")


@registry_app.command("list")
def registry_list(registry: RegistryOpt, bucket: BucketOpt = "edgetwin", as_json: JsonOpt = False) -> None:
    """Published versions (oldest first) and the current version of every scope."""
    from rich.table import Table

    from edgetwin.edge.registry import describe_registry, open_registry

    with open_registry(registry, create=False, bucket=bucket) as reg:
        summary = describe_registry(reg)
    if as_json:
        emit_json(summary)
        return
    table = Table("version", "name", "algorithm", "created", "key", "sha256", "current in", title=summary["registry"])
    for v in summary["versions"]:
        table.add_row(
            v["version"], v["name"], v["algorithm"] or "", v["created"] or "", v["key_id"] or "UNSIGNED",
            v["sha256"][:12], ", ".join(v["current_in"]),
        )  # fmt: skip
    out.print(table)
    for scope, p in summary["pointers"].items():
        out.print(f"{scope}: {p['current']} (rollback to {p['rollback_to']}, revision {p['revision']})")


@registry_app.command("show")
def registry_show(
    registry: RegistryOpt,
    version: Annotated[str | None, typer.Argument(help="Version to show.")] = None,
    scope: Annotated[
        str | None, typer.Option(help="Show a scope's pointer history instead: global, cluster/C or site/S.")
    ] = None,
    trust: Annotated[
        list[Path] | None, typer.Option(help="Public key file or directory: also verify the artifact (exit 2 if refused).")
    ] = None,
    bucket: BucketOpt = "edgetwin",
    as_json: JsonOpt = False,
) -> None:
    """A version's signed metadata (optionally verified against trusted keys), or a scope's history."""
    import tempfile

    from edgetwin.edge.registry import check_scope, describe_version, open_registry, rollback_target
    from edgetwin.edge.signing import TrustStore

    if (version is None) == (scope is None):
        raise InputError("give either a VERSION or --scope", where="registry show")
    store = TrustStore.from_paths(trust) if trust else None
    with open_registry(registry, create=False, bucket=bucket) as reg:
        if scope is not None:
            history = reg.history(check_scope(scope))
            result: dict[str, Any] = {
                "scope": scope,
                "current": history[-1].version if history else None,
                "rollback_to": rollback_target(history),
                "history": [h.to_dict() for h in history],
            }
        else:
            assert version is not None  # exactly one of version / scope, checked above
            result = describe_version(reg, version)
            if store is not None:
                kind = result.get("kind") or "policy"
                with tempfile.TemporaryDirectory() as tmp:
                    fetched = reg.fetch(version, Path(tmp) / kind, store, kind=kind)  # ArtifactRejected: exit 2
                    if kind == "twin":  # and the twin's own directory signature, as --trust will check it
                        from edgetwin.edge.signed_dirs import verify_directory

                        verify_directory(fetched, "twin", store)
                result["verified"] = True
    if as_json:
        emit_json(result)
    elif scope is not None:
        out.print(f"{scope}: current {result['current']}, rollback to {result['rollback_to']}")
        for h in result["history"]:
            out.print(f"  r{h['revision']} {h['at']} {h['kind']:8} {h['previous']} -> {h['version']}  {h['reason']}")
    else:
        out.print_json(data=result)
        if store is not None:
            out.print(f"verified: signed by trusted key {result['key_id']}, checksum and metadata intact")




@registry_app.command("sign")
def registry_sign(
    artifact_dir: Annotated[Path, typer.Argument(help="Sealed twin or policy directory to sign in place.")],
    key: Annotated[
        Path, typer.Option("--key", envvar="EDGETWIN_SIGNING_KEY", help="Ed25519 private key (PEM) that signs.")
    ],
    as_json: JsonOpt = False,
) -> None:
    """Sign a twin or policy directory where it is: write its SIGNATURE.json over its manifest.

    The directory is verified against its manifest first (nothing tampered is signed). Commands
    given --trust KEYS (whatif, train, evaluate --on twin, promote --twin) then accept it when
    KEYS hold the matching public key; see docs/log-format.md, "Artifacts are data".
    """
    from edgetwin.edge.registry import artifact_kind
    from edgetwin.edge.signed_dirs import sign_directory
    from edgetwin.edge.signing import Signer

    signer = Signer.from_pem(key)
    kind = artifact_kind(artifact_dir)
    path = sign_directory(artifact_dir, kind, signer, {"publisher": signer.key_id})
    result = {"signed": str(artifact_dir), "kind": kind, "key_id": signer.key_id, "signature": str(path)}
    if as_json:
        emit_json(result)
    else:
        out.print(f"signed {kind} {artifact_dir} with key {signer.key_id} ({path.name})")


@registry_app.command("fetch")
def registry_fetch(
    registry: RegistryOpt,
    version: Annotated[str, typer.Argument(help="Version to fetch.")],
    out_dir: Annotated[Path, typer.Option("--out", help="Directory to unpack into (must not exist or be empty).")],
    trust: Annotated[
        list[Path], typer.Option(help="Public key file or directory: the artifact must be signed by one of them.")
    ],
    bucket: BucketOpt = "edgetwin",
    as_json: JsonOpt = False,
) -> None:
    """Verify a version against trusted keys and unpack it: a policy or a twin, ready to use."""
    from edgetwin.edge.registry import describe_version, open_registry
    from edgetwin.edge.signing import TrustStore

    store = TrustStore.from_paths(trust)
    with open_registry(registry, create=False, bucket=bucket) as reg:
        kind = describe_version(reg, version).get("kind") or "policy"
        reg.fetch(version, out_dir, store, kind=kind)  # raises ArtifactRejected: exit 2
    if kind == "twin":
        from edgetwin.edge.signed_dirs import verify_directory

        verify_directory(out_dir, "twin", store)
    result = {"version": version, "kind": kind, "out": str(out_dir), "verified": True}
    if as_json:
        emit_json(result)
    else:
        out.print(f"fetched {kind} {version} into {out_dir} (signature verified)")
