"""EdgeRuntime on the embedded pieces (FileRegistry, in-memory bus): verified loads, refusals,
shielded decisions, hot swap under load, fail-static, KPI watch and automatic rollback on the
emulated cluster, and the `edgetwin serve` command."""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from edgetwin.contract.errors import InputError
from edgetwin.contract.spec import TwinSpec
from edgetwin.edge.bus import InMemoryBus, MemoryBroker
from edgetwin.edge.kpi_watch import KPIGuard, KPIMargin, KPIWatch
from edgetwin.edge.messages import Envelope
from edgetwin.edge.registry import FileRegistry, PolicyRegistry, metadata_from_policy_dir
from edgetwin.edge.runtime import (
    EdgeRuntime,
    NoPolicyLoaded,
    announce_policy,
    kpi_report,
    kpi_subject,
    request_decision,
    rollback_subject,
)
from edgetwin.edge.signing import Signer, TrustStore, save_public_key, sign_artifact
from edgetwin.emulator.cluster import ClusterConfig, EdgeCluster, cluster_spec
from edgetwin.emulator.logs import SLOAwarePolicy
from edgetwin.policies.export import export_policy, register_policy_kind
from edgetwin.policies.shield import ShieldConfig, SLOGuard

torch.set_num_threads(1)

SITE = "s1"
SCOPE = f"site/{SITE}"


# ------------------------------------------------------------------------------------- test policies
class ConstantPolicy:
    """Exportable heuristic: the same action on every row (a deliberately dumb or bad policy)."""

    name = "constant"

    def __init__(self, spec: TwinSpec, action: list[float]) -> None:
        self.spec = spec
        self.action = np.asarray(action, dtype=np.float64)

    def act(self, obs: np.ndarray) -> np.ndarray:
        return np.tile(self.action, (len(obs), 1))

    def to_config(self) -> dict[str, Any]:
        return {"action": self.action.tolist()}


class SLOAware:
    """The emulated cluster's SLO-aware logging heuristic, exportable."""

    name = "slo_aware"

    def __init__(self, spec: TwinSpec) -> None:
        self._p = SLOAwarePolicy(spec)

    def act(self, obs: np.ndarray) -> np.ndarray:
        return self._p.act(obs)

    def to_config(self) -> dict[str, Any]:
        return {}


# a policy's class is never imported from its directory: the test's own kinds are registered by code
register_policy_kind(ConstantPolicy, "tests.test_runtime.ConstantPolicy")
register_policy_kind(SLOAware, "tests.test_runtime.SLOAware")

SPEC = cluster_spec(ClusterConfig(n_agents=8))
OBS_DIM, A = len(SPEC.observation_columns), len(SPEC.action_columns)


def publish(
    reg: PolicyRegistry, tmp: Path, policy: Any, version: str, signer: Signer, metrics: dict[str, float] | None = None
) -> str:
    d = export_policy(policy, tmp / "exports" / version, policy_spec(policy), metadata={"metrics": metrics or {}})
    return reg.publish(d, {**metadata_from_policy_dir(d), "name": "test-policy", "version": version}, signer)


def policy_spec(policy: Any) -> TwinSpec:
    return getattr(policy, "spec", None) or SPEC


def promote(reg: PolicyRegistry, version: str, scope: str = SCOPE) -> None:
    reg.set_current(scope, version, expected=reg.current(scope))


@pytest.fixture
def keys() -> tuple[Signer, TrustStore]:
    signer = Signer.generate()
    return signer, TrustStore([signer.public_key])


@pytest.fixture
def reg(tmp_path: Path) -> FileRegistry:
    return FileRegistry(tmp_path / "registry")


def obs_batch(n: int, seed: int = 0) -> np.ndarray:
    cluster = EdgeCluster(ClusterConfig(n_agents=n, steps=4))
    return cluster.reset(seed=seed)


def run(coro: Any) -> Any:
    return asyncio.run(coro)


# ------------------------------------------------------------------------------------- loading
def test_loads_site_scope_with_fallback_to_global(tmp_path: Path, reg: FileRegistry, keys) -> None:
    signer, trust = keys
    publish(reg, tmp_path, ConstantPolicy(SPEC, [0.1, 0.5, 0.2]), "g1", signer)
    publish(reg, tmp_path, ConstantPolicy(SPEC, [0.9, 1.5, 0.7]), "s1", signer)
    promote(reg, "g1", "global")

    async def main() -> None:
        async with EdgeRuntime(SITE, reg, trust, cluster="c1", kpi_guard=None, poll_interval=0.05) as rt:
            assert (rt.version, rt.active.scope) == ("g1", "global")
            np.testing.assert_allclose(rt.decide(obs_batch(5)), np.tile([0.1, 0.5, 0.2], (5, 1)))
            promote(reg, "s1", SCOPE)  # a site pointer overrides global
            assert await rt.refresh()
            assert (rt.version, rt.active.scope) == ("s1", SCOPE)
            one = rt.decide(obs_batch(1)[0])  # a single observation (O,) is a batch of one
            np.testing.assert_allclose(one, [[0.9, 1.5, 0.7]])
            with pytest.raises(InputError, match="shape"):
                rt.decide(np.zeros((3, OBS_DIM + 1)))
            with pytest.raises(InputError, match="NaN"):
                rt.decide(np.full((2, OBS_DIM), np.nan))

    run(main())


def test_no_policy_yet_then_promotion_arrives(tmp_path: Path, reg: FileRegistry, keys) -> None:
    signer, trust = keys

    async def main() -> None:
        async with EdgeRuntime(SITE, reg, trust, kpi_guard=None, poll_interval=0.05) as rt:
            with pytest.raises(NoPolicyLoaded):
                rt.decide(obs_batch(2))
            publish(reg, tmp_path, ConstantPolicy(SPEC, [0.3, 0.3, 0.3]), "v1", signer)
            promote(reg, "v1")
            await until(lambda: rt.version == "v1")  # the poll loop picks it up
            assert rt.version == "v1"
            assert rt.decide(obs_batch(2)).shape == (2, A)

    run(main())


@pytest.mark.parametrize("attack", ["tampered_bytes", "tampered_metadata", "unsigned", "wrong_key"])
def test_refuses_bad_artifacts_and_keeps_last_good(tmp_path: Path, reg: FileRegistry, keys, caplog, attack: str) -> None:
    signer, trust = keys
    publish(reg, tmp_path, ConstantPolicy(SPEC, [0.2, 0.2, 0.2]), "v1", signer)
    promote(reg, "v1")
    evil = ConstantPolicy(SPEC, [1.0, 0.0, 1.0])
    if attack == "wrong_key":
        publish(reg, tmp_path, evil, "v2", Signer.generate())
    else:
        publish(reg, tmp_path, evil, "v2", signer)
        vdir = tmp_path / "registry" / "versions" / "v2"
        if attack == "tampered_bytes":
            art = vdir / "artifact.tar.gz"
            data = bytearray(art.read_bytes())
            data[len(data) // 2] ^= 0xFF
            art.write_bytes(bytes(data))
        else:
            m = json.loads((vdir / "manifest.json").read_text())
            if attack == "tampered_metadata":
                m["metadata"]["metrics"] = {"kpi.slo_violation": 0.0}
            else:  # strip the signature: an unsigned artifact
                packed = (vdir / "artifact.tar.gz").read_bytes()
                m = sign_artifact(packed, m["metadata"], None).to_dict()
            (vdir / "manifest.json").write_text(json.dumps(m))
    expected = {"tampered_bytes": "checksum_mismatch", "tampered_metadata": "bad_signature",
                "unsigned": "unsigned", "wrong_key": "untrusted_key"}[attack]  # fmt: skip

    async def main() -> None:
        async with EdgeRuntime(SITE, reg, trust, kpi_guard=None, poll_interval=0.05) as rt:
            assert rt.version == "v1"
            promote(reg, "v2")
            with caplog.at_level(logging.WARNING, logger="edgetwin.runtime"):
                assert not await rt.refresh()
            assert rt.version == "v1"
            np.testing.assert_allclose(rt.decide(obs_batch(3)), np.tile([0.2, 0.2, 0.2], (3, 1)))
            assert rt.status()["refused"]["v2"].startswith(expected)
            assert any(e.kind == "refused" and e.version == "v2" for e in rt.events)
            assert any("refused policy v2" in r.getMessage() and expected in r.getMessage() for r in caplog.records)
            assert not await rt.refresh()  # refused once, not fetched again every poll
            assert rt.stats.refused == 1

    run(main())


def test_refuses_policy_with_other_columns(tmp_path: Path, reg: FileRegistry, keys) -> None:
    signer, trust = keys
    publish(reg, tmp_path, ConstantPolicy(SPEC, [0.2, 0.2, 0.2]), "v1", signer)
    promote(reg, "v1")
    other = TwinSpec.from_dict({**SPEC.to_dict(), "features": [f for f in SPEC.to_dict()["features"] if f["name"] != "state.carbon_g_per_kwh"]})
    publish(reg, tmp_path, ConstantPolicy(other, [0.5, 0.5, 0.5]), "v2", signer)

    async def main() -> None:
        async with EdgeRuntime(SITE, reg, trust, kpi_guard=None) as rt:
            promote(reg, "v2")
            assert not await rt.refresh()
            assert rt.version == "v1"
            assert rt.status()["refused"]["v2"].startswith("incompatible")

    run(main())


def test_shield_applies_to_every_returned_action(tmp_path: Path, reg: FileRegistry, keys) -> None:
    signer, trust = keys
    # Out of the spec's bounds and below the SLO guard: the shield must fix both.
    publish(reg, tmp_path, ConstantPolicy(SPEC, [-3.0, 0.0, 9.0]), "v1", signer)
    promote(reg, "v1")
    shield = ShieldConfig(guards=[SLOGuard(action="action.capacity", demand="state.site_util", margin=0.15)])
    obs = obs_batch(6)
    util = obs[:, SPEC.observation_columns.index("state.site_util")]

    async def main() -> None:
        bus = InMemoryBus(name="rt")
        async with bus, EdgeRuntime(SITE, reg, trust, bus=bus, shield=shield, kpi_guard=None) as rt:
            a = rt.decide(obs)
            low, high = SPEC.bounds("action")
            assert (a >= low - 1e-9).all() and (a <= high + 1e-9).all()
            np.testing.assert_allclose(a[:, 1], np.minimum(1.15 * util, high[1]))
            client = InMemoryBus(bus.broker, name="client")
            async with client:
                d = await request_decision(client, SITE, obs, timeout=30.0)
            np.testing.assert_allclose(d.actions, a)

    run(main())


# ------------------------------------------------------------------------------------- bus
def test_bus_request_reply(tmp_path: Path, reg: FileRegistry, keys) -> None:
    signer, trust = keys
    publish(reg, tmp_path, ConstantPolicy(SPEC, [0.4, 0.6, 0.8]), "v1", signer)
    promote(reg, "v1")

    async def main() -> None:
        broker = MemoryBroker()
        bus, client = InMemoryBus(broker, name="rt"), InMemoryBus(broker, name="client")
        async with bus, client, EdgeRuntime(SITE, reg, trust, bus=bus, kpi_guard=None) as rt:
            d = await request_decision(client, SITE, obs_batch(4).astype(np.float32), timeout=30.0)
            assert (d.version, d.scope, d.revision) == ("v1", SCOPE, 1)
            np.testing.assert_allclose(d.actions, np.tile([0.4, 0.6, 0.8], (4, 1)))
            with pytest.raises(RuntimeError, match="expected observations of shape"):
                await request_decision(client, SITE, np.zeros((2, 5)))
            bad_site = Envelope(kind="decision_request", sender="c", payload={"site": "elsewhere"}, tensors={"obs": obs_batch(1)})
            reply = await client.request(f"edgetwin.decision.{SITE}", bad_site)
            assert reply.kind == "error" and "elsewhere" in reply.payload["reason"]
            assert rt.stats.bus_requests == 3 and rt.stats.bus_errors == 2

    run(main())


# ------------------------------------------------------------------------------------- hot swap
async def until(cond: Callable[[], bool], timeout: float = 60.0) -> None:
    """Wait until ``cond()`` holds; fail (not hang) after ``timeout`` seconds."""
    deadline = asyncio.get_running_loop().time() + timeout
    while not cond():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"condition not met within {timeout} s")
        await asyncio.sleep(0.01)


async def steady_load(
    client: InMemoryBus | Any,
    site: str,
    stop: asyncio.Event,
    n_clients: int = 4,
    batch: int = 8,
    versions: list[str] | None = None,
):
    """Closed-loop requesters: each sends, waits for the reply, repeats. Returns (sent, replies, versions).

    ``versions`` (if given) is filled as replies arrive, so a test can watch the load live.
    """
    sent, replies, errors = [0], [0], []
    versions = [] if versions is None else versions
    obs = obs_batch(batch)

    async def one() -> None:
        while not stop.is_set():
            sent[0] += 1
            try:
                d = await request_decision(client, site, obs, timeout=5.0)
            except Exception as e:  # counted: a dropped request fails the test
                errors.append(repr(e))
                continue
            replies[0] += 1
            versions.append(d.version)
            assert d.actions.shape == (batch, A)

    tasks = [asyncio.create_task(one()) for _ in range(n_clients)]
    await asyncio.gather(*tasks)
    return sent[0], replies[0], versions, errors


def test_hot_swap_under_steady_load_drops_no_request(tmp_path: Path, reg: FileRegistry, keys) -> None:
    signer, trust = keys
    publish(reg, tmp_path, ConstantPolicy(SPEC, [0.1, 0.1, 0.1]), "v1", signer)
    publish(reg, tmp_path, SLOAware(SPEC), "v2", signer)
    promote(reg, "v1")

    async def main() -> None:
        broker = MemoryBroker()
        bus, client, ops = (InMemoryBus(broker, name=n) for n in ("rt", "client", "ops"))
        async with bus, client, ops, EdgeRuntime(SITE, reg, trust, bus=bus, kpi_guard=None, poll_interval=30.0) as rt:
            stop, seen = asyncio.Event(), []
            load = asyncio.create_task(steady_load(client, SITE, stop, versions=seen))
            # Waits are on events, not on sleeps, so a loaded machine is slower but not wrong.
            await until(lambda: seen.count("v1") >= 20)
            promote(reg, "v2")
            # The poll period is long: the announcement is what triggers the swap.
            await announce_policy(ops, SCOPE, "v2", 2, reg.manifest("v2").sha256)
            await until(lambda: rt.version == "v2")
            await until(lambda: seen.count("v2") >= 20)
            stop.set()
            sent, replies, versions, errors = await load
        assert errors == []
        assert sent == replies > 50
        assert versions[0] == "v1" and versions[-1] == "v2"
        # once swapped, never back: requests after the swap are all on v2
        first_v2 = versions.index("v2")
        assert set(versions[first_v2:]) == {"v2"}
        assert rt.stats.by_version["v1"] > 0 and rt.stats.by_version["v2"] > 0
        assert rt.stats.swaps == 1

    run(main())


def test_python_api_threads_during_swaps(tmp_path: Path, reg: FileRegistry, keys) -> None:
    signer, trust = keys
    for i in range(1, 4):
        publish(reg, tmp_path, ConstantPolicy(SPEC, [0.1 * i] * 3), f"v{i}", signer)
    promote(reg, "v1")
    rt = EdgeRuntime(SITE, reg, trust, kpi_guard=None, poll_interval=0.02)
    counts, errors = [0, 0], []
    stop = threading.Event()
    obs = obs_batch(16)

    def worker(k: int) -> None:
        while not stop.is_set():
            try:
                d = rt.decide_with_info(obs)
                # every answer is entirely one version's
                assert np.allclose(d.actions, d.actions[0]) and d.version in {"v1", "v2", "v3"}
                counts[k] += 1
            except Exception as e:
                errors.append(repr(e))
            time.sleep(0.0005)  # a request stream, not a spin that starves the runtime's loop of the GIL

    def wait_until(cond: Callable[[], bool], timeout: float = 60.0) -> None:
        """Events, not sleeps: a loaded machine is slower here, never wrong (a fixed 0.15 s between
        promotions let a busy poller skip v2 and see v1 -> v3 as one swap)."""
        deadline = time.monotonic() + timeout
        while not cond():
            assert time.monotonic() < deadline, "condition not met within the timeout"
            time.sleep(0.005)

    with rt.running_in_thread():
        threads = [threading.Thread(target=worker, args=(k,)) for k in range(2)]
        for t in threads:
            t.start()
        wait_until(lambda: rt.stats.by_version.get("v1", 0) > 0)  # v1 has served requests
        for v in ("v2", "v3"):
            promote(reg, v)
            wait_until(lambda v=v: rt.version == v)  # each promotion is seen before the next
        n = rt.stats.by_version.get("v3", 0)
        wait_until(lambda: rt.stats.by_version.get("v3", 0) > n)  # and v3 serves requests
        stop.set()
        for t in threads:
            t.join()
    assert errors == []
    assert rt.version == "v3" and rt.stats.swaps == 2
    assert sum(counts) == rt.stats.decisions
    assert {"v1", "v3"} <= set(rt.stats.by_version)


# ------------------------------------------------------------------------------------- fail-static
class FlakyRegistry(PolicyRegistry):
    """A FileRegistry that can be made unreachable (a network share going away)."""

    def __init__(self, inner: FileRegistry) -> None:
        self.inner, self.down = inner, False

    def _check(self) -> None:
        if self.down:
            raise OSError("registry share unreachable")

    def _store(self, version, packed, manifest):  # type: ignore[no-untyped-def]
        self._check()
        return self.inner._store(version, packed, manifest)

    def _load(self, version):  # type: ignore[no-untyped-def]
        self._check()
        return self.inner._load(version)

    def manifest(self, version):  # type: ignore[no-untyped-def]
        self._check()
        return self.inner.manifest(version)

    def list_versions(self):  # type: ignore[no-untyped-def]
        self._check()
        return self.inner.list_versions()

    def current(self, scope):  # type: ignore[no-untyped-def]
        self._check()
        return self.inner.current(scope)

    def set_current(self, scope, version, *, expected, reason="", kind="promote"):  # type: ignore[no-untyped-def]
        self._check()
        return self.inner.set_current(scope, version, expected=expected, reason=reason, kind=kind)

    def history(self, scope):  # type: ignore[no-untyped-def]
        self._check()
        return self.inner.history(scope)

    def scopes(self):  # type: ignore[no-untyped-def]
        self._check()
        return self.inner.scopes()


def test_fail_static_when_registry_unreachable(tmp_path: Path, reg: FileRegistry, keys, caplog) -> None:
    signer, trust = keys
    publish(reg, tmp_path, ConstantPolicy(SPEC, [0.3, 0.3, 0.3]), "v1", signer)
    publish(reg, tmp_path, ConstantPolicy(SPEC, [0.6, 0.6, 0.6]), "v2", signer)
    promote(reg, "v1")
    flaky = FlakyRegistry(reg)
    cache = tmp_path / "cache"

    async def main() -> None:
        async with EdgeRuntime(SITE, flaky, trust, kpi_guard=None, poll_interval=0.02, cache_dir=cache) as rt:
            flaky.down = True
            with caplog.at_level(logging.WARNING, logger="edgetwin.runtime"):
                await until(lambda: rt.stats.registry_errors >= 2)  # several failed polls (events, not a sleep)
            assert rt.registry_reachable is False
            assert rt.stats.registry_errors >= 2
            assert sum(e.kind == "registry_unreachable" for e in rt.events) == 1  # logged once, not per poll
            assert any("fail-static" in r.getMessage() for r in caplog.records)
            np.testing.assert_allclose(rt.decide(obs_batch(2)), np.full((2, 3), 0.3))
            flaky.down = False
            promote(reg, "v2")
            await until(lambda: rt.version == "v2")
            assert rt.version == "v2" and rt.registry_reachable is True

        # A restart while the registry is down serves the cached last good version, re-verified.
        flaky.down = True
        async with EdgeRuntime(SITE, flaky, trust, kpi_guard=None, cache_dir=cache) as rt2:
            assert rt2.version == "v2" and rt2.active.revision == 0
            assert any(e.kind == "cache_start" for e in rt2.events)
            np.testing.assert_allclose(rt2.decide(obs_batch(1)), [[0.6, 0.6, 0.6]])

        # ... but not if the cached bytes were tampered with.
        art = cache / "versions" / "v2" / "artifact.tar.gz"
        data = bytearray(art.read_bytes())
        data[-10] ^= 0x01
        art.write_bytes(bytes(data))
        async with EdgeRuntime(SITE, flaky, trust, kpi_guard=None, cache_dir=cache) as rt3:
            assert rt3.version is None
            assert rt3.status()["refused"]["v2"].startswith("cached copy")

    run(main())


# ------------------------------------------------------------------------------------- KPI watch
def test_kpi_margin_parse_and_checks() -> None:
    m = KPIMargin.parse("kpi.slo_violation<=+10%")
    assert (m.kpi, m.higher_is_better, m.max_regression) == ("kpi.slo_violation", False, pytest.approx(0.10))
    assert not m.breached(0.20, 0.219) and m.breached(0.20, 0.221)
    r = KPIMargin.parse("kpi.revenue>=-5%")
    assert r.higher_is_better and r.breached(100.0, 94.0) and not r.breached(100.0, 96.0) and not r.breached(100.0, 500.0)
    assert KPIMargin.parse("x<=0.25").max_regression == pytest.approx(0.25)
    assert KPIMargin("z", min_delta=0.01).breached(0.0, 0.011) and not KPIMargin("z", min_delta=0.01).breached(0.0, 0.009)
    for bad in ("kpi.x<10%", "kpi.x", "<=5%", "kpi.x<=abc"):
        with pytest.raises(InputError):
            KPIMargin.parse(bad)
    with pytest.raises(InputError):
        KPIGuard(margins=(m, m))
    with pytest.raises(InputError):
        KPIGuard(window=0)
    g = KPIGuard.from_spec(SPEC)  # every KPI the cluster's spec gives a direction, at its declared margin
    assert [(x.kpi, x.higher_is_better, x.max_regression) for x in g.margins] == [
        ("kpi.task_time_ms", False, 0.05), ("kpi.slo_violation", False, 0.05), ("kpi.energy_j", False, 0.05),
        ("kpi.carbon_g", False, 0.05), ("kpi.revenue", True, 0.02)]  # fmt: skip


def test_kpi_watch_window_grace_patience_baselines() -> None:
    guard = KPIGuard(margins=(KPIMargin("kpi.lat", max_regression=0.2),), window=4, grace=1, patience=2)
    w = KPIWatch(guard)
    w.start("v2", {"lat": 100.0}, "metrics at promotion")  # metadata without the kpi. prefix
    assert w.observe({"kpi.lat": 1e6}) is None  # grace: ignored
    for _ in range(4):
        assert w.observe({"kpi.lat": 110.0, "other": 1.0}) is None  # within the margin
    assert w.observe({"kpi.lat": 300.0}) is None  # mean 157.5 > 120, streak 1 < patience
    b = w.observe({"kpi.lat": 300.0})  # streak 2
    assert b is not None and b.version == "v2" and b.baseline_source == "metrics at promotion"
    assert b.kpis["kpi.lat"]["value"] == pytest.approx((110 + 110 + 300 + 300) / 4)
    assert b.kpis["kpi.lat"]["change"] == pytest.approx(1.05)
    assert "kpi.lat" in b.reason() and "+105.0% worse" in b.reason()
    assert w.observe({"kpi.lat": 900.0}) is None  # fired once per version

    w.start("v3", None, "first_window")  # no baseline: the first full window becomes it
    for v in (500.0, 100.0, 100.0, 100.0, 100.0):  # the first is in the grace period
        assert w.observe({"kpi.lat": v}) is None
    assert w.baseline == {"kpi.lat": 100.0}
    fired = [w.observe({"kpi.lat": 200.0}) for _ in range(4)]
    assert fired[0] is None and fired[1] is not None  # mean 125 then 150 > 120, patience 2

    # Probation: a version that stayed within its margins is accepted and no longer judged (a fixed
    # baseline drifts away from live KPIs over a day).
    short = KPIWatch(KPIGuard(margins=(KPIMargin("kpi.lat", max_regression=0.2),), window=2, grace=0, patience=1, probation=3))
    short.start("v4", {"kpi.lat": 100.0}, "metrics at promotion")
    assert [short.observe({"kpi.lat": 100.0}) for _ in range(3)] == [None] * 3 and not short.accepted
    assert short.observe({"kpi.lat": 100.0}) is None and short.accepted
    assert all(short.observe({"kpi.lat": 1000.0}) is None for _ in range(5))
    assert short.window_means() == {"kpi.lat": 1000.0}  # still recorded: the next version's baseline
    # A reinstated version (judge=False) is recorded, never judged.
    short.start("v1", {"kpi.lat": 100.0}, "metrics at promotion", judge=False)
    assert all(short.observe({"kpi.lat": 1000.0}) is None for _ in range(5))
    with pytest.raises(InputError, match="probation"):
        KPIGuard(window=10, probation=5)


# ------------------------------------------------------------------------------------- rollback
def drive_cluster(rt: EdgeRuntime, cluster: EdgeCluster, steps: int, obs: np.ndarray, on_step=None) -> np.ndarray:
    """Serve the emulated cluster through the runtime; report the mean KPIs of every tick."""
    kpi_cols = SPEC.names("kpi")
    for t in range(steps):
        d = rt.decide_with_info(obs)
        obs, _, done, info = cluster.step(d.actions)
        rt.report_kpis(dict(zip(kpi_cols, info["kpis"].mean(axis=0), strict=True)), version=d.version)
        if on_step is not None:
            on_step(t, d)
        if done:
            obs = cluster.reset(seed=t)
    return obs


def test_rolls_back_by_itself_when_a_bad_policy_regresses_kpis(tmp_path: Path, reg: FileRegistry, keys, caplog) -> None:
    signer, trust = keys
    publish(reg, tmp_path, SLOAware(SPEC), "good", signer)
    # Everything local with no capacity at full price: tasks take ~60 % longer on the emulated cluster.
    publish(reg, tmp_path, ConstantPolicy(SPEC, [0.0, 0.05, 1.0]), "bad", signer)
    promote(reg, "good")
    guard = KPIGuard(
        margins=(KPIMargin("kpi.task_time_ms", max_regression=0.25), KPIMargin("kpi.slo_violation", max_regression=0.5)),
        window=6, grace=1, patience=2,
    )  # fmt: skip
    cluster = EdgeCluster(ClusterConfig(n_agents=60, steps=96))
    obs = cluster.reset(seed=3)
    notices: list[Envelope] = []

    async def main() -> None:
        nonlocal obs
        broker = MemoryBroker()
        bus, ops = InMemoryBus(broker, name="rt"), InMemoryBus(broker, name="ops")
        async with bus, ops:

            async def on_notice(rcv: Any) -> None:
                notices.append(rcv.envelope)

            await ops.subscribe(rollback_subject(SITE), on_notice)
            async with EdgeRuntime(SITE, reg, trust, bus=bus, kpi_guard=guard, poll_interval=0.05) as rt:
                obs = drive_cluster(rt, cluster, 15, obs)
                assert rt.version == "good" and not any(e.kind == "rollback" for e in rt.events)
                # The gate is overridden: the bad version is promoted anyway.
                promote(reg, "bad")
                assert await rt.refresh() and rt.version == "bad"
                served: list[str] = []
                with caplog.at_level(logging.WARNING, logger="edgetwin.runtime"):
                    obs = drive_cluster(rt, cluster, 15, obs, on_step=lambda t, d: served.append(d.version))
                    await until(lambda: reg.current(SCOPE) == "good" and notices)  # the registry side of the rollback runs on the loop
                assert rt.version == "good"
                n_bad = served.count("bad")
                assert 0 < n_bad <= 1 + guard.window + guard.patience  # grace + window fill + patience
                assert served[n_bad:] == ["good"] * (len(served) - n_bad)
                history = reg.history(SCOPE)
                assert [(h.kind, h.version) for h in history] == [("promote", "good"), ("promote", "bad"), ("rollback", "good")]
                assert "kpi.task_time_ms" in history[-1].reason
                assert any("rolling back bad" in r.getMessage() and "kpi.task_time_ms" in r.getMessage() for r in caplog.records)
                # The baseline was the good version's own last window on this site.
                ev = [e for e in rt.events if e.kind == "rollback"]
                assert len(ev) == 1 and "previous version's last window (good)" in ev[0].reason
                # After the rollback the good version keeps serving, recorded but not judged; the bad
                # one is not reloaded.
                assert rt.status()["kpi_watch"]["judging"] is False
                await rt.refresh()
                obs = drive_cluster(rt, cluster, 10, obs)
                assert rt.version == "good" and rt.stats.rollbacks == 1
        assert len(notices) == 1
        p = notices[0].payload
        assert (p["from_version"], p["to_version"], p["registry"], p["scope"]) == ("bad", "good", "rolled_back", SCOPE)
        assert p["kpis"]["kpi.task_time_ms"]["change"] > 0.25

    run(main())


def test_kpis_over_the_bus_and_rollback_while_registry_is_down(tmp_path: Path, reg: FileRegistry, keys) -> None:
    """KPI reports come over the bus; the registry is unreachable at the regression, so the runtime
    rolls back locally at once and completes the registry rollback when it is back."""
    signer, trust = keys
    publish(reg, tmp_path, ConstantPolicy(SPEC, [0.5, 1.0, 0.5]), "v1", signer, metrics={"kpi.x": 1.0})
    publish(reg, tmp_path, ConstantPolicy(SPEC, [0.9, 1.0, 0.5]), "v2", signer)
    promote(reg, "v1")
    flaky = FlakyRegistry(reg)
    guard = KPIGuard(margins=(KPIMargin("kpi.x", max_regression=0.1),), window=3, grace=0, patience=1)

    async def main() -> None:
        broker = MemoryBroker()
        bus, sensor = InMemoryBus(broker, name="rt"), InMemoryBus(broker, name="sensor")
        async with bus, sensor, EdgeRuntime(SITE, flaky, trust, bus=bus, kpi_guard=guard, poll_interval=0.05) as rt:
            assert rt.watch.baseline_source == "metrics at promotion"
            for _ in range(3):
                await sensor.publish(kpi_subject(SITE), kpi_report(SITE, {"kpi.x": 1.0}))
            await sensor.publish(kpi_subject(SITE), kpi_report(SITE, {"kpi.x": 9.0}, version="v0"))  # stale: ignored
            await until(lambda: rt.stats.kpi_reports + rt.stats.kpi_stale == 4)  # delivered, however slowly
            assert rt.stats.kpi_reports == 3 and rt.stats.kpi_stale == 1
            promote(reg, "v2")
            assert await rt.refresh() and rt.version == "v2"
            flaky.down = True
            for _ in range(3):
                await sensor.publish(kpi_subject(SITE), kpi_report(SITE, {"kpi.x": 2.0}))
            await until(lambda: rt.version == "v1" and rt.status()["pending_rollback"])
            assert rt.version == "v1"  # local rollback, registry still says v2
            assert reg.current(SCOPE) == "v2" and rt.status()["pending_rollback"][1] == "v2"
            await asyncio.sleep(0.15)
            assert rt.version == "v1"  # polls fail or see the vetoed v2: not swapped back
            flaky.down = False
            await until(lambda: reg.current(SCOPE) == "v1" and rt.status()["pending_rollback"] is None)
            assert reg.current(SCOPE) == "v1" and rt.status()["pending_rollback"] is None
            assert reg.history(SCOPE)[-1].kind == "rollback"
            assert rt.version == "v1"

    run(main())


# ------------------------------------------------------------------------------------- CLI
def test_serve_command(tmp_path: Path, reg: FileRegistry, keys) -> None:
    from edgetwin.cli import app

    signer, trust = keys
    publish(reg, tmp_path, ConstantPolicy(SPEC, [0.2, 0.4, 0.6]), "v1", signer)
    promote(reg, "v1")
    (tmp_path / "keys").mkdir()
    pub = save_public_key(signer.public_key, tmp_path / "keys" / "publisher.pub.pem")
    shield = tmp_path / "shield.json"
    shield.write_text(json.dumps(ShieldConfig(guards=[SLOGuard("action.capacity", "state.site_util")]).to_dict()))
    runner = CliRunner()
    args = ["serve", "--site", SITE, "--cache-dir", str(tmp_path / "cache"), "--registry", str(tmp_path / "registry"), "--bus", "memory", "--trust", str(pub.parent),
            "--shield", str(shield), "--guard", "kpi.slo_violation<=+15%", "--duration", "0.3"]  # fmt: skip
    res = runner.invoke(app, args)
    assert res.exit_code == 0, res.output
    assert "serving v1" in res.output and "edgetwin.decision.s1" in res.output and "kpi.slo_violation<=+15%" in res.output
    # bad input: exit 2 with the flag named
    res = runner.invoke(app, [*args[:-2], "--guard", "kpi.x<5"])
    assert res.exit_code != 0 and isinstance(res.exception, InputError) and "--guard" in str(res.exception)
    res = runner.invoke(app, ["serve", "--site", SITE, "--registry", str(tmp_path / "nope"), "--trust", str(pub.parent)])
    assert isinstance(res.exception, InputError)
