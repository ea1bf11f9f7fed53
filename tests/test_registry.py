"""FileRegistry: publish/fetch round trip, immutability, refusal of bad artifacts, CAS races, rollback."""

from __future__ import annotations

import asyncio
import json
import multiprocessing as mp
import shutil
import threading
from pathlib import Path

import pytest

from edgetwin.cli import main as cli_main
from edgetwin.contract.errors import InputError
from edgetwin.contract.manifest import write_manifest
from edgetwin.edge.registry import (
    HISTORY_LIMIT,
    CASConflict,
    FileRegistry,
    NoRollbackTarget,
    ThreadedRegistry,
    VersionExists,
    VersionNotFound,
    open_registry,
)
from edgetwin.edge.signing import (
    ArtifactRejected,
    Manifest,
    RejectReason,
    Signer,
    TrustStore,
    save_private_key,
    save_public_key,
)


def make_policy_dir(root: Path) -> Path:
    """A directory shaped like an exported policy: nested files, binary weights."""
    d = root / "policy"
    (d / "model").mkdir(parents=True)
    (d / "model" / "weights.bin").write_bytes(bytes(range(256)) * 40)
    (d / "policy.json").write_text('{"algorithm": "PPO", "obs_dim": 7}')
    write_manifest(d, "policy")  # sealed, as every exported policy is
    return d


def tree(d: Path) -> dict[str, bytes | None]:
    """Relative path -> file bytes (None for a directory)."""
    return {p.relative_to(d).as_posix(): (p.read_bytes() if p.is_file() else None) for p in sorted(d.rglob("*"))}


MD = {"name": "ppo-edge", "algorithm": "PPO", "spec_hash": "s1", "metrics": {"slo_violation_rate": 0.02}}


@pytest.fixture
def signer() -> Signer:
    return Signer.generate()


@pytest.fixture
def trust(signer: Signer) -> TrustStore:
    return TrustStore([signer.public_key])


@pytest.fixture
def policy(tmp_path: Path) -> Path:
    return make_policy_dir(tmp_path / "src")


@pytest.fixture
def reg(tmp_path: Path) -> FileRegistry:
    return FileRegistry(tmp_path / "registry")


def publish_n(reg: FileRegistry, policy: Path, signer: Signer, n: int) -> list[str]:
    return [reg.publish(policy, {**MD, "version": f"r{i}"}, signer) for i in range(1, n + 1)]


# ------------------------------------------------------------------------------------- versions
def test_publish_fetch_roundtrip(reg: FileRegistry, policy: Path, signer: Signer, trust: TrustStore, tmp_path):
    v = reg.publish(policy, {**MD, "version": "1.0.0", "parent_version": None}, signer)
    assert v == "1.0.0" and reg.list_versions() == ["1.0.0"]
    out = reg.fetch(v, tmp_path / "fetched", trust)
    assert tree(out) == tree(policy)
    m = reg.manifest(v)
    assert m.metadata["algorithm"] == "PPO" and m.metadata["metrics"] == {"slo_violation_rate": 0.02}
    assert m.key_id == signer.key_id
    # A registry reopened from disk (another process, later) sees the same thing.
    again = FileRegistry(reg.root, create=False)
    assert again.list_versions() == ["1.0.0"] and again.manifest(v) == m


def test_auto_versions_count_up_in_publication_order(reg: FileRegistry, policy: Path, signer: Signer):
    assert [reg.publish(policy, MD, signer) for _ in range(3)] == ["v1", "v2", "v3"]
    reg.publish(policy, {**MD, "version": "hand-picked"}, signer)
    assert reg.publish(policy, MD, signer) == "v4"
    assert reg.list_versions() == ["v1", "v2", "v3", "hand-picked", "v4"]


def test_versions_are_immutable(reg: FileRegistry, policy: Path, signer: Signer, trust: TrustStore, tmp_path):
    reg.publish(policy, {**MD, "version": "v1"}, signer)
    before = (reg.root / "versions" / "v1" / "artifact.tar.gz").read_bytes()
    (policy / "policy.json").write_text('{"algorithm": "PPO", "obs_dim": 8}')
    write_manifest(policy, "policy")
    with pytest.raises(VersionExists, match="already published"):
        reg.publish(policy, {**MD, "version": "v1"}, signer)
    assert (reg.root / "versions" / "v1" / "artifact.tar.gz").read_bytes() == before
    assert reg.list_versions() == ["v1"]
    assert not any((reg.root / ".tmp").iterdir())  # the refused attempt left nothing behind


def test_concurrent_publishers_of_one_version_exactly_one_wins(reg: FileRegistry, policy: Path, tmp_path):
    signers = [Signer.generate() for _ in range(6)]
    barrier = threading.Barrier(len(signers))
    results: list[str] = []

    def go(s: Signer) -> None:
        barrier.wait()
        try:
            reg.publish(policy, {**MD, "version": "race"}, s)
            results.append(s.key_id)
        except VersionExists:
            results.append("refused")

    threads = [threading.Thread(target=go, args=(s,)) for s in signers]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    winners = [r for r in results if r != "refused"]
    assert len(winners) == 1 and results.count("refused") == 5
    assert reg.manifest("race").key_id == winners[0]


def test_unpublished_version_and_bad_destination(reg: FileRegistry, policy: Path, signer: Signer, trust, tmp_path):
    with pytest.raises(VersionNotFound):
        reg.fetch("v9", tmp_path / "x", trust)
    with pytest.raises(VersionNotFound):
        reg.manifest("../../etc")
    v = reg.publish(policy, MD, signer)
    (tmp_path / "busy").mkdir()
    (tmp_path / "busy" / "file").write_text("x")
    with pytest.raises(InputError, match="not an empty directory"):
        reg.fetch(v, tmp_path / "busy", trust)
    # An empty existing directory is fine.
    (tmp_path / "empty").mkdir()
    assert tree(reg.fetch(v, tmp_path / "empty", trust)) == tree(policy)


def test_publish_refuses_unsigned_and_bad_metadata(reg: FileRegistry, policy: Path, signer: Signer):
    with pytest.raises(InputError, match="Signer"):
        reg.publish(policy, MD, None)  # type: ignore[arg-type]
    with pytest.raises(InputError, match="'version'"):
        reg.publish(policy, {**MD, "version": "has space"}, signer)
    with pytest.raises(InputError, match="slo"):
        reg.publish(policy, {**MD, "metrics": {"slo": "high"}}, signer)
    assert reg.list_versions() == []


def test_not_a_registry(tmp_path: Path):
    (tmp_path / "stuff").mkdir()
    (tmp_path / "stuff" / "file.txt").write_text("x")
    with pytest.raises(InputError, match="not a policy registry"):
        FileRegistry(tmp_path / "stuff")
    with pytest.raises(InputError, match="no policy registry"):
        FileRegistry(tmp_path / "missing", create=False)


# ------------------------------------------------------------------------------------- refusals
def _refusal(reg: FileRegistry, version: str, trust: TrustStore, dest: Path) -> RejectReason:
    with pytest.raises(ArtifactRejected) as e:
        reg.fetch(version, dest, trust)
    assert not dest.exists()  # nothing is unpacked from a refused artifact
    return e.value.reason


def test_fetch_refuses_tampered_unsigned_and_wrong_key(reg: FileRegistry, policy: Path, signer, trust, tmp_path):
    v1, v2 = publish_n(reg, policy, signer, 2)
    d1 = reg.root / "versions" / v1

    # Tampered bytes: a different (valid) policy's bytes under the signed manifest.
    good = (d1 / "artifact.tar.gz").read_bytes()
    (d1 / "artifact.tar.gz").write_bytes(good[:-8] + bytes(8))
    assert _refusal(reg, v1, trust, tmp_path / "a") == RejectReason.CHECKSUM_MISMATCH
    (d1 / "artifact.tar.gz").write_bytes(good)

    # Tampered metadata: better metrics written into the manifest.
    raw = json.loads((d1 / "manifest.json").read_bytes())
    raw["metadata"]["metrics"]["slo_violation_rate"] = 0.0
    (d1 / "manifest.json").write_text(json.dumps(raw))
    assert _refusal(reg, v1, trust, tmp_path / "b") == RejectReason.BAD_SIGNATURE

    # Unsigned: the signature stripped.
    raw = json.loads(Manifest.from_json((reg.root / "versions" / v2 / "manifest.json").read_bytes()).to_json())
    raw["signature"] = raw["key_id"] = None
    (d1 / "manifest.json").write_text(json.dumps(raw))
    assert _refusal(reg, v1, trust, tmp_path / "c") == RejectReason.UNSIGNED

    # Wrong key: v2 untouched, but the agent trusts someone else.
    assert _refusal(reg, v2, TrustStore([Signer.generate().public_key]), tmp_path / "d") == RejectReason.UNTRUSTED_KEY

    # A valid artifact copied under another version's name.
    shutil.rmtree(d1)
    shutil.copytree(reg.root / "versions" / v2, d1)
    assert _refusal(reg, v1, trust, tmp_path / "e") == RejectReason.VERSION_MISMATCH

    # And the untouched one still loads.
    assert tree(reg.fetch(v2, tmp_path / "ok", trust)) == tree(policy)


# ------------------------------------------------------------------------------------- pointers
def test_cas_pointer_and_stale_expected(reg: FileRegistry, policy: Path, signer: Signer):
    v1, v2, v3 = publish_n(reg, policy, signer, 3)
    assert reg.current("global") is None
    reg.set_current("global", v1, expected=None)
    with pytest.raises(CASConflict, match="not the expected None") as e:
        reg.set_current("global", v2, expected=None)
    assert e.value.actual == v1
    reg.set_current("global", v2, expected=v1)
    with pytest.raises(CASConflict):
        reg.set_current("global", v3, expected=v1)
    assert reg.current("global") == v2
    # Scopes are independent.
    reg.set_current("site/edge-a", v3, expected=None)
    reg.set_current("cluster/eu_1", v1, expected=None)
    assert reg.current("global") == v2 and reg.current("site/edge-a") == v3
    assert reg.scopes() == ["cluster/eu_1", "global", "site/edge-a"]
    with pytest.raises(VersionNotFound):
        reg.set_current("global", "v404", expected=v2)
    for bad in ("site", "site/", "region/x", "site/a/b", "GLOBAL", "site/a.b"):
        with pytest.raises(InputError, match="scope"):
            reg.current(bad)


def test_cas_race_between_threads_exactly_one_wins(reg: FileRegistry, policy: Path, signer: Signer):
    versions = publish_n(reg, policy, signer, 8)
    reg.set_current("site/s1", versions[0], expected=None)
    barrier = threading.Barrier(7)
    outcome: dict[str, str] = {}

    def promote(v: str) -> None:
        barrier.wait()
        try:
            reg.set_current("site/s1", v, expected=versions[0])
            outcome[v] = "won"
        except CASConflict:
            outcome[v] = "lost"

    threads = [threading.Thread(target=promote, args=(v,)) for v in versions[1:]]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    winners = [v for v, o in outcome.items() if o == "won"]
    assert len(winners) == 1 and len(outcome) == 7
    assert reg.current("site/s1") == winners[0]
    assert [h.version for h in reg.history("site/s1")] == [versions[0], winners[0]]


def _cas_worker(root: str, scope: str, versions: list[str], moves: int, start, results) -> None:
    """Move ``scope`` ``moves`` times with read-then-CAS, retrying on conflict; report the conflicts."""
    reg = FileRegistry(root, create=False)
    start.wait()
    done = conflicts = 0
    while done < moves:
        cur = reg.current(scope)
        nxt = versions[(versions.index(cur) + 1) % len(versions)]
        try:
            reg.set_current(scope, nxt, expected=cur)
            done += 1
        except CASConflict:
            conflicts += 1
    results.put(conflicts)


def test_cas_across_processes_loses_no_update(reg: FileRegistry, policy: Path, signer: Signer):
    """4 processes x 20 read-then-CAS moves: every success is in the history, chained without gaps."""
    versions = publish_n(reg, policy, signer, 3)
    reg.set_current("global", versions[0], expected=None)
    ctx = mp.get_context("fork")
    start, results = ctx.Event(), ctx.Queue()
    n_proc, moves = 4, 20
    assert 1 + n_proc * moves <= HISTORY_LIMIT
    procs = [
        ctx.Process(target=_cas_worker, args=(str(reg.root), "global", versions, moves, start, results))
        for _ in range(n_proc)
    ]
    for p in procs:
        p.start()
    start.set()
    for p in procs:
        p.join(timeout=120)
        assert p.exitcode == 0
    conflicts = sum(results.get(timeout=5) for _ in procs)
    history = reg.history("global")
    assert len(history) == 1 + n_proc * moves
    assert [h.revision for h in history] == list(range(1, len(history) + 1))
    for prev, change in zip(history, history[1:], strict=False):
        assert change.previous == prev.version  # no move was made from a stale read
    print(f"{conflicts} CAS conflicts retried across {n_proc} processes")


def test_history_and_rollback(reg: FileRegistry, policy: Path, signer: Signer):
    v1, v2, v3, v4 = publish_n(reg, policy, signer, 4)
    scope = "cluster/c1"
    assert reg.previous(scope) is None
    for prev, v in [(None, v1), (v1, v2), (v2, v3)]:
        reg.set_current(scope, v, expected=prev, reason=f"gate passed for {v}")
    assert reg.previous(scope) == v2
    with pytest.raises(CASConflict):
        reg.rollback(scope, expected=v2, reason="stale")
    assert reg.rollback(scope, expected=v3, reason="p95 latency +40%") == v2
    assert reg.current(scope) == v2
    assert reg.rollback(scope, expected=v2, reason="again") == v1  # walks back, does not bounce to v3
    with pytest.raises(NoRollbackTarget):
        reg.rollback(scope, expected=v1)
    # A new promotion after rollbacks: its rollback target is what it replaced.
    reg.set_current(scope, v4, expected=v1)
    assert reg.previous(scope) == v1
    h = reg.history(scope)
    assert [(c.kind, c.previous, c.version) for c in h] == [
        ("promote", None, v1),
        ("promote", v1, v2),
        ("promote", v2, v3),
        ("rollback", v3, v2),
        ("rollback", v2, v1),
        ("promote", v1, v4),
    ]
    assert h[3].reason == "p95 latency +40%"


def test_threaded_registry_for_async_callers(reg: FileRegistry, policy: Path, signer: Signer, trust, tmp_path):
    areg = ThreadedRegistry(reg)

    async def main() -> tuple[str, str | None, Path]:
        v = await areg.publish(policy, MD, signer)
        await areg.set_current("global", v, expected=None)
        return v, await areg.current("global"), await areg.fetch(v, tmp_path / "out", trust)

    v, cur, out = asyncio.run(main())
    assert cur == v == "v1" and tree(out) == tree(policy)


# ------------------------------------------------------------------------------------- CLI
def run_cli(*args: str) -> int:
    with pytest.raises(SystemExit) as e:
        cli_main(list(args))
    return int(e.value.code)


def test_cli_keygen_publish_list_show(tmp_path: Path, policy: Path, capsys):
    keys, registry = tmp_path / "keys", str(tmp_path / "reg")
    assert run_cli("registry", "keygen", "--out", str(keys), "--json") == 0
    kid = json.loads(capsys.readouterr().out)["key_id"]
    assert run_cli("registry", "keygen", "--out", str(keys)) == 2  # no silent overwrite
    # An exported policy's policy.json supplies defaults; --metadata and flags override them.
    (policy / "policy.json").write_text(json.dumps({
        "format": "edgetwin-policy/1", "algorithm": "sac", "spec_hash": "h1", "training_data_sha256": "t1",
        "metrics": {"reward": 3, "note": "not a number"},
    }))  # fmt: skip
    write_manifest(policy, "policy")
    (tmp_path / "md.json").write_text(json.dumps({"algorithm": "PPO"}))
    key = str(keys / "publisher.key.pem")
    common = ["--registry", registry, "--key", key]
    assert run_cli("registry", "publish", str(policy), *common, "--metadata", str(tmp_path / "md.json"),
                   "--metric", "p95_ms=41.5", "--json") == 0  # fmt: skip
    published = json.loads(capsys.readouterr().out)
    assert published["version"] == "v1" and published["key_id"] == kid
    assert published["metrics"] == {"reward": 3.0, "p95_ms": 41.5}
    assert published["algorithm"] == "PPO" and published["name"] == "policy"
    assert published["spec_hash"] == "h1" and published["training_data_hash"] == "t1"
    assert run_cli("registry", "publish", str(policy), *common, "--version", "v1") == 2  # immutable
    assert run_cli("registry", "publish", str(policy), *common, "--metric", "p95") == 2
    assert run_cli("registry", "publish", str(tmp_path / "nope"), *common) == 2

    assert run_cli("registry", "list", "--registry", registry, "--json") == 0
    listing = json.loads(capsys.readouterr().out)
    assert [v["version"] for v in listing["versions"]] == ["v1"]

    assert run_cli("registry", "show", "v1", "--registry", registry, "--trust", str(keys), "--json") == 0
    assert json.loads(capsys.readouterr().out)["verified"] is True
    other = tmp_path / "other"
    other.mkdir()
    save_private_key(Signer.generate().private_key, other / "x.key.pem")
    # A trust store of someone else's key: refused (a tampered or untrusted artifact is bad input: exit 2), the reason on stderr, once.
    save_public_key(Signer.generate().public_key, other / "x.pub.pem")
    assert run_cli("registry", "show", "v1", "--registry", registry, "--trust", str(other)) == 2
    assert "untrusted_key" in capsys.readouterr().err

    with open_registry(registry) as reg:
        reg.set_current("site/a", "v1", expected=None)
    assert run_cli("registry", "show", "--scope", "site/a", "--registry", registry, "--json") == 0
    assert json.loads(capsys.readouterr().out)["current"] == "v1"
    assert run_cli("registry", "show", "--scope", "planet/x", "--registry", registry) == 2
    assert run_cli("registry", "list", "--registry", str(tmp_path / "missing")) == 2
