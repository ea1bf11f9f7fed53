"""NatsRegistry over a real nats-server with JetStream: round trip, refusals, CAS races, restart."""

from __future__ import annotations

import asyncio
import json
import socket
import subprocess
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import nats
import pytest

from edgetwin.contract.manifest import write_manifest
from edgetwin.edge.registry import (
    CASConflict,
    NatsRegistry,
    NoRollbackTarget,
    RegistryError,
    VersionExists,
    VersionNotFound,
    open_registry,
)
from edgetwin.edge.signing import ArtifactRejected, RejectReason, Signer, TrustStore, save_private_key

pytestmark = pytest.mark.nats

MD = {"name": "ppo-edge", "algorithm": "PPO", "metrics": {"slo_violation_rate": 0.02}}


def make_policy_dir(root: Path, size: int = 300_000) -> Path:
    """An exported-policy-like directory; the weights span several Object Store chunks (128 KiB)."""
    d = root / "policy"
    (d / "model").mkdir(parents=True)
    (d / "model" / "weights.bin").write_bytes(bytes(i * 7 % 251 for i in range(size)))
    (d / "policy.json").write_text('{"algorithm": "PPO", "obs_dim": 7}')
    write_manifest(d, "policy")  # sealed, as every exported policy is
    return d


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def tree(d: Path) -> dict[str, bytes | None]:
    return {p.relative_to(d).as_posix(): (p.read_bytes() if p.is_file() else None) for p in sorted(d.rglob("*"))}


def with_registry(url: str, fn: Callable[[NatsRegistry, Any], Awaitable[Any]], bucket: str = "edgetwin") -> Any:
    """Run ``fn(registry, nc)`` on a fresh connection, then drain it."""

    async def main() -> Any:
        nc = await nats.connect(url)
        try:
            return await fn(NatsRegistry(nc, bucket=bucket), nc)
        finally:
            await nc.drain()

    return asyncio.run(main())


@pytest.fixture
def signer() -> Signer:
    return Signer.generate()


@pytest.fixture
def trust(signer: Signer) -> TrustStore:
    return TrustStore([signer.public_key])


@pytest.fixture
def policy(tmp_path: Path) -> Path:
    return make_policy_dir(tmp_path / "src")


def test_publish_fetch_roundtrip_and_immutability(nats_server, policy, signer, trust, tmp_path):
    async def go(reg: NatsRegistry, nc: Any) -> None:
        assert await reg.list_versions() == []
        v1 = await reg.publish(policy, MD, signer)
        v2 = await reg.publish(policy, {**MD, "version": "2.0", "parent_version": v1}, signer)
        assert (v1, v2) == ("v1", "2.0")
        assert await reg.list_versions() == ["v1", "2.0"]  # publication order
        out = await reg.fetch(v2, tmp_path / "out", trust)
        assert tree(out) == tree(policy)
        m = await reg.manifest(v2)
        assert m.metadata["parent_version"] == "v1" and m.key_id == signer.key_id
        (policy / "policy.json").write_text('{"algorithm": "PPO", "obs_dim": 8}')
        write_manifest(policy, "policy")
        with pytest.raises(VersionExists):
            await reg.publish(policy, {**MD, "version": "2.0"}, signer)
        assert (await reg.manifest(v2)).sha256 == m.sha256  # untouched
        with pytest.raises(VersionNotFound):
            await reg.fetch("v404", tmp_path / "x", trust)

    with_registry(nats_server.url, go)


def test_concurrent_publishers_of_one_version_exactly_one_wins(nats_server, policy, tmp_path, trust):
    signers = [Signer.generate() for _ in range(5)]

    async def go(reg: NatsRegistry, nc: Any) -> None:
        other = await nats.connect(nats_server.url)
        try:
            regs = [reg, NatsRegistry(other)]
            # Different bytes per publisher, so a loser overwriting the winner would be detectable.
            dirs = []
            for i, _ in enumerate(signers):
                d = make_policy_dir(tmp_path / f"p{i}", size=1000 + i)
                dirs.append(d)
            results = await asyncio.gather(
                *[regs[i % 2].publish(dirs[i], {**MD, "version": "race"}, s) for i, s in enumerate(signers)],
                return_exceptions=True,
            )
        finally:
            await other.drain()
        winners = [i for i, r in enumerate(results) if r == "race"]
        assert len(winners) == 1, results
        assert all(isinstance(r, VersionExists) for i, r in enumerate(results) if i not in winners)
        w = winners[0]
        out = await reg.fetch("race", tmp_path / "out", TrustStore([signers[w].public_key]))
        assert tree(out) == tree(dirs[w])
        # Losers' bytes were removed from the Object Store; only the winner's remain.
        _, obs = await reg._buckets()
        names = [o.name for o in await obs.list(ignore_deletes=True)]
        assert names == [f"race/{(await reg.manifest('race')).sha256}"]

    with_registry(nats_server.url, go)


def test_fetch_refuses_tampered_unsigned_and_wrong_key(nats_server, policy, signer, trust, tmp_path):
    async def refused(reg: NatsRegistry, version: str, store: TrustStore, dest: Path) -> RejectReason:
        with pytest.raises(ArtifactRejected) as e:
            await reg.fetch(version, dest, store)
        assert not dest.exists()
        return e.value.reason

    async def go(reg: NatsRegistry, nc: Any) -> None:
        v1 = await reg.publish(policy, MD, signer)
        v2 = await reg.publish(policy, MD, signer)
        kv, obs = await reg._buckets()
        record = json.loads((await kv.get(f"artifact.{v1}")).value)

        # Tampered bytes in the Object Store (a consistent object: its own digest is right).
        good = (await obs.get(record["object"])).data
        await obs.put(record["object"], good[:-8] + bytes(8))
        assert await refused(reg, v1, trust, tmp_path / "a") == RejectReason.CHECKSUM_MISMATCH
        await obs.put(record["object"], good)

        # Tampered metadata in the KV record.
        evil = json.loads(json.dumps(record))
        evil["manifest"]["metadata"]["metrics"]["slo_violation_rate"] = 0.0
        await kv.put(f"artifact.{v1}", json.dumps(evil).encode())
        assert await refused(reg, v1, trust, tmp_path / "b") == RejectReason.BAD_SIGNATURE

        # Unsigned.
        unsigned = json.loads(json.dumps(record))
        unsigned["manifest"]["signature"] = unsigned["manifest"]["key_id"] = None
        await kv.put(f"artifact.{v1}", json.dumps(unsigned).encode())
        assert await refused(reg, v1, trust, tmp_path / "c") == RejectReason.UNSIGNED

        # Wrong key.
        stranger = TrustStore([Signer.generate().public_key])
        assert await refused(reg, v2, stranger, tmp_path / "d") == RejectReason.UNTRUSTED_KEY

        # v2's valid record served as v1.
        await kv.put(f"artifact.{v1}", (await kv.get(f"artifact.{v2}")).value)
        assert await refused(reg, v1, trust, tmp_path / "e") == RejectReason.VERSION_MISMATCH

        assert tree(await reg.fetch(v2, tmp_path / "ok", trust)) == tree(policy)

    with_registry(nats_server.url, go)


def test_cas_race_between_asyncio_tasks_exactly_one_wins(nats_server, policy, signer):
    async def go(reg: NatsRegistry, nc: Any) -> None:
        versions = [await reg.publish(policy, MD, signer) for _ in range(7)]
        other = await nats.connect(nats_server.url)
        try:
            regs = [reg, NatsRegistry(other)]
            # First promotion: all race to create the pointer from nothing.
            first = await asyncio.gather(
                *[regs[i % 2].set_current("global", v, expected=None) for i, v in enumerate(versions[:4])],
                return_exceptions=True,
            )
            won = [r for r in first if not isinstance(r, BaseException)]
            assert len(won) == 1 and sum(isinstance(r, CASConflict) for r in first) == 3
            base = won[0].version
            # Then all race to replace it, with the same (correct) expected version.
            second = await asyncio.gather(
                *[regs[i % 2].set_current("global", v, expected=base) for i, v in enumerate(versions) if v != base],
                return_exceptions=True,
            )
            won2 = [r for r in second if not isinstance(r, BaseException)]
            assert len(won2) == 1 and sum(isinstance(r, CASConflict) for r in second) == 5
            assert await regs[1].current("global") == won2[0].version
            assert [h.version for h in await reg.history("global")] == [base, won2[0].version]
        finally:
            await other.drain()

    with_registry(nats_server.url, go)


def test_history_rollback_and_scopes(nats_server, policy, signer):
    async def go(reg: NatsRegistry, nc: Any) -> None:
        v1, v2, v3 = [await reg.publish(policy, MD, signer) for _ in range(3)]
        await reg.set_current("site/edge-a", v1, expected=None)
        await reg.set_current("site/edge-a", v2, expected=v1)
        await reg.set_current("site/edge-a", v3, expected=v2)
        await reg.set_current("cluster/c1", v1, expected=None)
        assert await reg.scopes() == ["cluster/c1", "site/edge-a"]
        assert await reg.previous("site/edge-a") == v2
        with pytest.raises(CASConflict):
            await reg.set_current("site/edge-a", v1, expected=v2)
        assert await reg.rollback("site/edge-a", expected=v3, reason="energy +12%") == v2
        assert await reg.rollback("site/edge-a", expected=v2) == v1
        with pytest.raises(NoRollbackTarget):
            await reg.rollback("site/edge-a", expected=v1)
        h = await reg.history("site/edge-a")
        assert [(c.kind, c.version) for c in h] == [
            ("promote", v1),
            ("promote", v2),
            ("promote", v3),
            ("rollback", v2),
            ("rollback", v1),
        ]
        assert h[3].reason == "energy +12%"
        assert await reg.current("global") is None

    with_registry(nats_server.url, go)


def test_registry_survives_server_restart(nats_server, policy, signer, trust, tmp_path):
    async def before(reg: NatsRegistry, nc: Any) -> None:
        v1 = await reg.publish(policy, MD, signer)
        v2 = await reg.publish(policy, MD, signer)
        await reg.set_current("global", v1, expected=None)
        await reg.set_current("global", v2, expected=v1)

    with_registry(nats_server.url, before)

    async def across_restart() -> None:
        # A long-lived client (an edge agent's) keeps its registry object across the restart.
        async def quiet(e: Exception) -> None:
            pass

        nc = await nats.connect(nats_server.url, reconnect_time_wait=0.2, error_cb=quiet)
        reg = NatsRegistry(nc)
        assert await reg.current("global") == "v2"
        await asyncio.to_thread(nats_server.restart)
        for _ in range(100):
            if nc.is_connected:
                break
            await asyncio.sleep(0.1)
        assert nc.is_connected
        assert await reg.current("global") == "v2"
        assert tree(await reg.fetch("v2", tmp_path / "live", trust)) == tree(policy)
        await nc.drain()

    asyncio.run(across_restart())
    nats_server.restart()

    async def after(reg: NatsRegistry, nc: Any) -> None:
        assert await reg.list_versions() == ["v1", "v2"]
        assert await reg.current("global") == "v2"
        assert await reg.previous("global") == "v1"
        assert tree(await reg.fetch("v1", tmp_path / "out", trust)) == tree(policy)
        # Still immutable and still CAS-guarded after the restart.
        with pytest.raises(VersionExists):
            await reg.publish(policy, {**MD, "version": "v2"}, signer)
        with pytest.raises(CASConflict):
            await reg.set_current("global", "v1", expected="v1")
        assert await reg.publish(policy, MD, signer) == "v3"

    with_registry(nats_server.url, after)


def test_open_registry_sync_facade_and_unreachable_server(nats_server, policy, signer, trust, tmp_path):
    with open_registry(nats_server.url, bucket="sync_test") as reg:
        v = reg.publish(policy, MD, signer)
        reg.set_current("site/s1", v, expected=None)
        assert reg.current("site/s1") == v
        assert tree(reg.fetch(v, tmp_path / "out", trust)) == tree(policy)
    # A bucket prefix is a separate registry on the same server.
    with_registry(nats_server.url, lambda r, nc: _assert_empty(r))
    with pytest.raises(RegistryError, match="cannot connect"), open_registry(
        f"nats://127.0.0.1:{free_port()}", connect_timeout=1.0
    ):
        pass


async def _assert_empty(reg: NatsRegistry) -> None:
    assert await reg.list_versions() == []


def test_cli_over_nats(nats_server, policy, tmp_path):
    key = tmp_path / "k.key.pem"
    save_private_key(Signer.generate().private_key, key)
    cmd = [sys.executable, "-m", "edgetwin.cli", "registry"]
    r = subprocess.run(
        [*cmd, "publish", str(policy), "--registry", nats_server.url, "--key", str(key), "--json"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["version"] == "v1"
    r = subprocess.run([*cmd, "list", "--registry", nats_server.url, "--json"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert [v["version"] for v in json.loads(r.stdout)["versions"]] == ["v1"]
