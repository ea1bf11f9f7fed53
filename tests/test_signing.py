"""Signed artifacts: keys, deterministic packing, and refusal of unsigned / tampered / wrong-key ones."""

from __future__ import annotations

import base64
import dataclasses
import io
import logging
import os
import stat
import tarfile
import time
from pathlib import Path

import pytest

from edgetwin.contract.errors import InputError
from edgetwin.edge.signing import (
    ArtifactRejected,
    Manifest,
    RejectReason,
    Signer,
    TrustStore,
    generate_keypair,
    key_id,
    load_private_key,
    load_public_key,
    normalize_metadata,
    pack_directory,
    save_private_key,
    save_public_key,
    sign_artifact,
    unpack_artifact,
    verify_artifact,
)


def make_policy_dir(root: Path, weights: bytes = b"\x00\x01weights\xff" * 50) -> Path:
    """A directory shaped like an exported policy: nested files, one executable."""
    d = root / "policy"
    (d / "model").mkdir(parents=True)
    (d / "model" / "weights.bin").write_bytes(weights)
    (d / "policy.json").write_text('{"algorithm": "PPO", "obs_dim": 7}')
    (d / "spec.toml").write_text('[features]\nx = "state"\n')
    (d / "run.sh").write_text("#!/bin/sh\necho hi\n")
    os.chmod(d / "run.sh", 0o755)
    return d


def tree(d: Path) -> dict[str, bytes | None]:
    """Relative path -> file bytes (None for a directory)."""
    return {p.relative_to(d).as_posix(): (p.read_bytes() if p.is_file() else None) for p in sorted(d.rglob("*"))}


METADATA = {
    "name": "ppo-edge",
    "version": "v1",
    "spec_hash": "abc123",
    "algorithm": "PPO",
    "training_data_hash": "def456",
    "metrics": {"slo_violation_rate": 0.031, "p95_latency_ms": 41.5},
    "parent_version": None,
}


@pytest.fixture
def signer() -> Signer:
    return Signer.generate()


@pytest.fixture
def artifact(tmp_path: Path, signer: Signer) -> tuple[bytes, Manifest]:
    packed = pack_directory(make_policy_dir(tmp_path))
    return packed, sign_artifact(packed, normalize_metadata(METADATA), signer)


# ------------------------------------------------------------------------------------- keys
def test_keys_roundtrip_through_pem_and_private_key_is_0600(tmp_path: Path) -> None:
    private, public = generate_keypair()
    kp = save_private_key(private, tmp_path / "k.key.pem")
    pp = save_public_key(public, tmp_path / "k.pub.pem")
    assert stat.S_IMODE(kp.stat().st_mode) == 0o600
    assert key_id(load_public_key(pp)) == key_id(public)
    assert key_id(load_private_key(kp).public_key()) == key_id(public)
    # A signature made with the loaded private key verifies with the loaded public key.
    load_public_key(pp).verify(load_private_key(kp).sign(b"payload"), b"payload")
    # Two fresh pairs differ; key ids are 16 hex digits.
    assert key_id(generate_keypair()[1]) != key_id(public)
    assert len(key_id(public)) == 16 and int(key_id(public), 16) >= 0


def test_loading_a_world_readable_private_key_warns(tmp_path: Path, caplog) -> None:
    path = save_private_key(generate_keypair()[0], tmp_path / "k.pem")
    os.chmod(path, 0o644)
    with caplog.at_level(logging.WARNING, logger="edgetwin.edge.signing"):
        load_private_key(path)
    assert "chmod 600" in caplog.text


def test_key_files_are_not_overwritten_and_bad_pem_is_input_error(tmp_path: Path) -> None:
    private, public = generate_keypair()
    save_private_key(private, tmp_path / "k.pem")
    with pytest.raises(InputError, match="refusing to overwrite"):
        save_private_key(generate_keypair()[0], tmp_path / "k.pem")
    (tmp_path / "junk.pem").write_text("not a key")
    with pytest.raises(InputError, match="junk.pem"):
        load_private_key(tmp_path / "junk.pem")
    with pytest.raises(InputError, match="junk.pem"):
        load_public_key(tmp_path / "junk.pem")
    with pytest.raises(InputError, match="missing.pem"):
        load_private_key(tmp_path / "missing.pem")


def test_trust_store_from_dir_takes_public_keys_only(tmp_path: Path) -> None:
    a, b = Signer.generate(), Signer.generate()
    save_public_key(a.public_key, tmp_path / "a.pub.pem")
    save_public_key(b.public_key, tmp_path / "b.pub.pem")
    save_private_key(Signer.generate().private_key, tmp_path / "secret.key.pem")  # skipped in a directory
    store = TrustStore.from_paths([tmp_path])
    assert store.key_ids == sorted([a.key_id, b.key_id])
    assert a.key_id in store
    with pytest.raises(InputError, match="no such trust store"):
        TrustStore.from_paths([tmp_path / "nope"])
    (tmp_path / "empty").mkdir()
    with pytest.raises(InputError, match="no public keys"):
        TrustStore.from_paths([tmp_path / "empty"])


# ------------------------------------------------------------------------------------- packing
def test_packing_is_deterministic_and_roundtrips(tmp_path: Path) -> None:
    d1 = make_policy_dir(tmp_path / "one")
    time.sleep(0.01)
    d2 = make_policy_dir(tmp_path / "two")  # same content, other mtimes and inode order
    os.utime(d2 / "policy.json", (1, 1))
    assert pack_directory(d1) == pack_directory(d2)
    out = unpack_artifact(pack_directory(d1), tmp_path / "out")
    assert tree(out) == tree(d1)
    assert os.access(out / "run.sh", os.X_OK)
    # Any byte of content changes the packed bytes.
    (d2 / "model" / "weights.bin").write_bytes(b"other")
    assert pack_directory(d1) != pack_directory(d2)


def test_pack_refuses_symlinks_and_non_directories(tmp_path: Path) -> None:
    d = make_policy_dir(tmp_path)
    (d / "link").symlink_to("/etc/passwd")
    with pytest.raises(InputError, match="symlink"):
        pack_directory(d)
    with pytest.raises(InputError, match="expected a policy directory"):
        pack_directory(d / "policy.json")


def test_unpack_refuses_escaping_members(tmp_path: Path) -> None:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        info = tarfile.TarInfo("../evil.txt")
        info.size = 4
        tar.addfile(info, io.BytesIO(b"evil"))
    with pytest.raises(ArtifactRejected) as e:
        unpack_artifact(buf.getvalue(), tmp_path / "out")
    assert e.value.reason == RejectReason.MALFORMED
    assert not (tmp_path / "evil.txt").exists()
    with pytest.raises(ArtifactRejected) as e:
        unpack_artifact(b"not a tarball", tmp_path / "out2")
    assert e.value.reason == RejectReason.MALFORMED


# ------------------------------------------------------------------------------------- verification
def test_signed_artifact_verifies(artifact: tuple[bytes, Manifest], signer: Signer) -> None:
    packed, manifest = artifact
    verify_artifact(packed, manifest, TrustStore([signer.public_key]), expected_version="v1")
    # ...also after a JSON round trip of the manifest, as it travels.
    verify_artifact(packed, Manifest.from_json(manifest.to_json()), TrustStore([signer.public_key]))


def test_tampered_bytes_are_refused(artifact: tuple[bytes, Manifest], signer: Signer, caplog) -> None:
    packed, manifest = artifact
    evil = bytearray(packed)
    evil[len(evil) // 2] ^= 0x01
    with caplog.at_level(logging.WARNING, logger="edgetwin.edge.signing"), pytest.raises(ArtifactRejected) as e:
        verify_artifact(bytes(evil), manifest, TrustStore([signer.public_key]))
    assert e.value.reason == RejectReason.CHECKSUM_MISMATCH
    assert "checksum_mismatch" in caplog.text  # the refusal is logged with its reason


def test_tampered_metadata_is_refused(artifact: tuple[bytes, Manifest], signer: Signer) -> None:
    packed, manifest = artifact
    md = dict(manifest.metadata, metrics={"slo_violation_rate": 0.0, "p95_latency_ms": 1.0})
    with pytest.raises(ArtifactRejected) as e:
        verify_artifact(packed, dataclasses.replace(manifest, metadata=md), TrustStore([signer.public_key]))
    assert e.value.reason == RejectReason.BAD_SIGNATURE
    # Re-pointing the checksum at other bytes breaks the signature too.
    forged = dataclasses.replace(manifest, sha256="0" * 64)
    with pytest.raises(ArtifactRejected) as e:
        verify_artifact(packed, forged, TrustStore([signer.public_key]))
    assert e.value.reason == RejectReason.BAD_SIGNATURE


def test_unsigned_artifact_is_refused(tmp_path: Path, signer: Signer) -> None:
    packed = pack_directory(make_policy_dir(tmp_path))
    manifest = sign_artifact(packed, normalize_metadata(METADATA), None)
    assert manifest.signature is None
    with pytest.raises(ArtifactRejected) as e:
        verify_artifact(packed, manifest, TrustStore([signer.public_key]))
    assert e.value.reason == RejectReason.UNSIGNED


def test_wrong_key_is_refused(artifact: tuple[bytes, Manifest]) -> None:
    packed, manifest = artifact
    stranger = Signer.generate()
    with pytest.raises(ArtifactRejected) as e:
        verify_artifact(packed, manifest, TrustStore([stranger.public_key]))
    assert e.value.reason == RejectReason.UNTRUSTED_KEY
    assert manifest.key_id in str(e.value)


def test_signature_by_another_key_under_a_trusted_key_id_is_refused(
    artifact: tuple[bytes, Manifest], signer: Signer
) -> None:
    packed, manifest = artifact
    mallory = Signer.generate()
    sig = base64.b64encode(mallory.sign(manifest.signed_payload())).decode()
    forged = dataclasses.replace(manifest, signature=sig)  # still claims the trusted key id
    with pytest.raises(ArtifactRejected) as e:
        verify_artifact(packed, forged, TrustStore([signer.public_key]))
    assert e.value.reason == RejectReason.BAD_SIGNATURE


def test_valid_artifact_under_another_version_name_is_refused(
    artifact: tuple[bytes, Manifest], signer: Signer
) -> None:
    packed, manifest = artifact
    with pytest.raises(ArtifactRejected) as e:
        verify_artifact(packed, manifest, TrustStore([signer.public_key]), expected_version="v2")
    assert e.value.reason == RejectReason.VERSION_MISMATCH


def test_malformed_manifest_is_refused() -> None:
    with pytest.raises(ArtifactRejected) as e:
        Manifest.from_json(b"{not json")
    assert e.value.reason == RejectReason.MALFORMED
    with pytest.raises(ArtifactRejected, match="sha256"):
        Manifest.from_dict({"format": "edgetwin-artifact/1", "metadata": {}, "sha256": "xyz", "size": 1})


# ------------------------------------------------------------------------------------- metadata
def test_metadata_is_validated_and_completed() -> None:
    md = normalize_metadata({"name": "p", "version": "1.0.2", "metrics": {"energy_kwh": 3}})
    assert md["metrics"] == {"energy_kwh": 3.0}
    assert md["created"] and md["parent_version"] is None and md["algorithm"] is None
    with pytest.raises(InputError, match="'version'"):
        normalize_metadata({"name": "p", "version": "../etc"})
    with pytest.raises(InputError, match="'version'"):
        normalize_metadata({"name": "p", "version": "a..b"})
    with pytest.raises(InputError, match="'name'"):
        normalize_metadata({"version": "v1"})
    with pytest.raises(InputError, match="p95"):
        normalize_metadata({"name": "p", "version": "v1", "metrics": {"p95": float("nan")}})
    with pytest.raises(InputError, match="parent_version"):
        normalize_metadata({"name": "p", "version": "v1", "parent_version": 3})
    with pytest.raises(InputError, match="plain JSON"):
        normalize_metadata({"name": "p", "version": "v1", "extra": object()})
