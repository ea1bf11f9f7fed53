"""EdgeRuntime over a real nats-server: JetStream registry, request/reply decisions, hot swap under
load, fail-static across a server stop/restart, and automatic rollback of a bad promotion while the
emulated cluster is served through the bus."""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from pathlib import Path
from typing import Any

import nats
import numpy as np
import pytest
import torch
from test_runtime import SPEC, ConstantPolicy, SLOAware, steady_load, until

from edgetwin.edge.bus import NatsBus, NatsConfig
from edgetwin.edge.kpi_watch import KPIGuard, KPIMargin
from edgetwin.edge.message_auth import Keyring
from edgetwin.edge.messages import Envelope
from edgetwin.edge.registry import DeferredNatsRegistry, NatsRegistry, metadata_from_policy_dir
from edgetwin.edge.runtime import (
    EdgeRuntime,
    announce_policy,
    kpi_report,
    kpi_subject,
    request_decision,
    rollback_subject,
    signed_frame,
)
from edgetwin.edge.signing import Signer, TrustStore
from edgetwin.emulator.cluster import ClusterConfig, EdgeCluster
from edgetwin.policies.export import export_policy

pytestmark = pytest.mark.nats
torch.set_num_threads(1)

SITE = "s1"
SCOPE = f"site/{SITE}"


def nats_bus(url: str, name: str) -> NatsBus:
    # Short reconnect backoff so a restarted server is found again within a second.
    return NatsBus(NatsConfig(servers=[url], name=name, reconnect_backoff_s=0.05, reconnect_backoff_max_s=0.5, connect_attempts=3))


async def publish(reg: NatsRegistry, tmp: Path, policy: Any, version: str, signer: Signer) -> str:
    d = export_policy(policy, tmp / "exports" / version, policy.spec if hasattr(policy, "spec") else SPEC)
    return await reg.publish(d, {**metadata_from_policy_dir(d), "name": "test-policy", "version": version}, signer)


async def promote(reg: NatsRegistry, version: str, scope: str = SCOPE) -> int:
    return (await reg.set_current(scope, version, expected=await reg.current(scope))).revision


async def wait_for(cond: Any, timeout: float = 60.0, step: float = 0.02) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return True
        await asyncio.sleep(step)
    return bool(cond())

async def close_all(*conns: Any) -> None:
    """Close buses and NATS connections, each bounded: a slow close must not hang the test."""
    for c in conns:
        closer = c.drain() if hasattr(c, "drain") else c.close()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(closer, timeout=60)



def test_fail_static_when_the_server_stops_and_recovery_after_restart(nats_server, tmp_path: Path) -> None:
    signer = Signer.generate()
    trust = TrustStore([signer.public_key])
    obs = EdgeCluster(ClusterConfig(n_agents=5, steps=4)).reset(seed=0)

    async def main() -> None:
        nc = await nats.connect(nats_server.url)
        admin = NatsRegistry(nc)
        await publish(admin, tmp_path, ConstantPolicy(SPEC, [0.3, 0.7, 0.2]), "v1", signer)
        await publish(admin, tmp_path, ConstantPolicy(SPEC, [0.6, 0.9, 0.4]), "v2", signer)
        await promote(admin, "v1")
        await close_all(nc)

        reg = DeferredNatsRegistry(nats_server.url)
        await reg.open()
        bus, client = nats_bus(nats_server.url, "rt"), nats_bus(nats_server.url, "client")
        await bus.connect()
        await client.connect()
        rt = EdgeRuntime(SITE, reg, trust, bus=bus, kpi_guard=None, poll_interval=0.1, registry_timeout=1.0)
        async with rt:
            d = await request_decision(client, SITE, obs, timeout=30.0)
            assert d.version == "v1"
            np.testing.assert_allclose(d.actions, np.tile([0.3, 0.7, 0.2], (5, 1)))

            nats_server.stop()
            assert await wait_for(lambda: rt.registry_reachable is False, timeout=60)
            # fail-static: the Python API answers with the last good policy, polls keep failing quietly
            for _ in range(5):
                np.testing.assert_allclose(rt.decide(obs), np.tile([0.3, 0.7, 0.2], (5, 1)))
                await asyncio.sleep(0.1)
            assert await wait_for(lambda: rt.stats.registry_errors >= 2, timeout=60)  # polls keep failing
            assert rt.version == "v1" and sum(e.kind == "registry_unreachable" for e in rt.events) == 1
            with pytest.raises(Exception):  # noqa: B017  (timeout or connection error: the bus is down)
                await request_decision(client, SITE, obs, timeout=0.5)

            nats_server.start()  # same port, same JetStream store

            async def bus_answers() -> bool:
                try:
                    return (await request_decision(client, SITE, obs, timeout=0.5)).version == "v1"
                except Exception:
                    return False

            ok = False
            for _ in range(60):
                if ok := await bus_answers():
                    break
                await asyncio.sleep(0.25)
            assert ok, "bus requests did not work again after the restart"
            assert await wait_for(lambda: rt.registry_reachable is True, timeout=60)
            # the registry is back too: a promotion made after the restart is picked up
            nc = await nats.connect(nats_server.url)
            await promote(NatsRegistry(nc), "v2")
            await close_all(nc)
            assert await wait_for(lambda: rt.version == "v2", timeout=60)
            assert (await request_decision(client, SITE, obs, timeout=30.0)).version == "v2"
            kinds = [e.kind for e in rt.events]
            assert "registry_unreachable" in kinds and "registry_reachable" in kinds
        await client.close()
        await bus.close()
        await reg.close()

    asyncio.run(asyncio.wait_for(main(), timeout=300))  # a hang fails the test, not CI


def test_hot_swap_under_load_over_nats(nats_server, tmp_path: Path) -> None:
    signer = Signer.generate()
    trust = TrustStore([signer.public_key])

    async def main() -> None:
        nc = await nats.connect(nats_server.url)
        reg = NatsRegistry(nc)
        await publish(reg, tmp_path, ConstantPolicy(SPEC, [0.1, 0.1, 0.1]), "v1", signer)
        await publish(reg, tmp_path, SLOAware(SPEC), "v2", signer)
        await promote(reg, "v1")
        bus, client, ops = (nats_bus(nats_server.url, n) for n in ("rt", "client", "ops"))
        for b in (bus, client, ops):
            await b.connect()
        async with EdgeRuntime(SITE, reg, trust, bus=bus, kpi_guard=None, poll_interval=30.0) as rt:
            stop, seen = asyncio.Event(), []
            load = asyncio.create_task(steady_load(client, SITE, stop, n_clients=4, batch=8, versions=seen))
            await until(lambda: seen.count("v1") >= 10)  # events, not sleeps: slow machines stay correct
            rev = await promote(reg, "v2")
            await announce_policy(ops, SCOPE, "v2", rev, (await reg.manifest("v2")).sha256)
            await until(lambda: rt.version == "v2")
            await until(lambda: seen.count("v2") >= 10)
            stop.set()
            sent, replies, versions, errors = await load
        assert errors == []
        assert sent == replies > 20
        first_v2 = versions.index("v2")
        assert first_v2 > 0 and set(versions[first_v2:]) == {"v2"}
        for b in (bus, client, ops):
            await b.close()
        await close_all(nc)

    asyncio.run(asyncio.wait_for(main(), timeout=300))  # a hang fails the test, not CI


def test_cluster_served_over_nats_rolls_back_a_bad_promotion(nats_server, tmp_path: Path) -> None:
    """The emulated cluster asks for its actions over NATS request/reply and reports its KPIs on the
    bus; a deliberately bad version is promoted (gate overridden) and the runtime rolls it back."""
    signer = Signer.generate()
    sensor = Signer.generate()  # the cluster's KPI sensor: reports are signed (issue 45 item 8)
    trust = TrustStore([signer.public_key])
    guard = KPIGuard(margins=(KPIMargin("kpi.task_time_ms", max_regression=0.25),), window=5, grace=1, patience=2)
    kpi_cols = SPEC.names("kpi")
    cluster = EdgeCluster(ClusterConfig(n_agents=40, steps=96))
    notices: list[Envelope] = []

    async def main() -> None:
        nc = await nats.connect(nats_server.url)
        reg = NatsRegistry(nc)
        await publish(reg, tmp_path, SLOAware(SPEC), "good", signer)
        await publish(reg, tmp_path, ConstantPolicy(SPEC, [0.0, 0.05, 1.0]), "bad", signer)
        await promote(reg, "good")
        bus, edge = nats_bus(nats_server.url, "rt"), nats_bus(nats_server.url, "cluster")
        await bus.connect()
        await edge.connect()

        async def on_notice(rcv: Any) -> None:
            notices.append(rcv.envelope)

        await edge.subscribe(rollback_subject(SITE), on_notice)
        served: list[str] = []

        async def drive(steps: int, obs: np.ndarray) -> np.ndarray:
            for _ in range(steps):
                d = await request_decision(edge, SITE, obs, timeout=30.0)
                served.append(d.version)
                obs, _, _, info = cluster.step(d.actions)
                kpis = dict(zip(kpi_cols, info["kpis"].mean(axis=0), strict=True))
                await edge.publish_raw(kpi_subject(SITE), signed_frame(kpi_report(SITE, kpis, version=d.version, sender="sensor"), sensor))
            return obs

        async with EdgeRuntime(SITE, reg, trust, bus=bus, kpi_guard=guard, poll_interval=0.1,
                               reporters=Keyring({"sensor": sensor.public_key})) as rt:
            obs = cluster.reset(seed=5)
            obs = await drive(12, obs)
            assert await wait_for(lambda: rt.stats.kpi_reports == 12)
            rev = await promote(reg, "bad")  # the gate was overridden
            await announce_policy(edge, SCOPE, "bad", rev, (await reg.manifest("bad")).sha256)
            assert await wait_for(lambda: rt.version == "bad")
            n0 = len(served)
            for _ in range(20):
                obs = await drive(1, obs)
                await asyncio.sleep(0.01)  # KPI reports are asynchronous: let the runtime see them
            assert await wait_for(lambda: bool(notices) and rt.version == "good", timeout=60)
            assert await wait_for(lambda: rt.status()["pending_rollback"] is None, timeout=60)
            assert await reg.current(SCOPE) == "good"
            history = await reg.history(SCOPE)
            assert [(h.kind, h.version) for h in history][-1] == ("rollback", "good")
            assert "kpi.task_time_ms" in history[-1].reason
            after = served[n0:]
            n_bad = after.count("bad")
            assert 0 < n_bad < len(after) and after[-1] == "good"
        p = notices[0].payload
        assert (p["from_version"], p["to_version"], p["registry"]) == ("bad", "good", "rolled_back")
        await close_all(bus, edge, nc)

    asyncio.run(asyncio.wait_for(main(), timeout=300))  # a hang fails the test, not CI


def test_serve_command_over_nats_in_its_own_process(nats_server, tmp_path: Path) -> None:
    """`edgetwin serve` as an operator runs it: a JetStream registry, an SB3 policy, NATS decisions,
    a clear startup line, and a clean stop on SIGTERM."""
    import signal
    import subprocess
    import sys

    from gymnasium.wrappers import RescaleAction
    from stable_baselines3 import PPO

    from edgetwin.edge.signing import save_public_key
    from edgetwin.emulator.envs import EdgeClusterEnv
    from edgetwin.policies.export import ActionTransform

    signer = Signer.generate()
    (tmp_path / "keys").mkdir()
    save_public_key(signer.public_key, tmp_path / "keys" / "pub.pem")
    low, high = SPEC.bounds("action")
    model = PPO("MlpPolicy", RescaleAction(EdgeClusterEnv(ClusterConfig(n_agents=4)), -1.0, 1.0), n_steps=64, seed=0, device="cpu")
    policy_dir = export_policy(model, tmp_path / "ppo", SPEC, action_transform=ActionTransform("box", low.tolist(), high.tolist()))
    obs = EdgeCluster(ClusterConfig(n_agents=3, steps=4)).reset(seed=0)

    async def setup() -> None:
        nc = await nats.connect(nats_server.url)
        reg = NatsRegistry(nc)
        await reg.publish(policy_dir, {**metadata_from_policy_dir(policy_dir), "name": "ppo", "version": "v1"}, signer)
        await reg.set_current("global", "v1", expected=None)
        await close_all(nc)

    asyncio.run(setup())
    cmd = [sys.executable, "-m", "edgetwin.cli", "serve", "--site", SITE, "--registry", nats_server.url, "--bus", nats_server.url,
           "--trust", str(tmp_path / "keys"), "--cache-dir", str(tmp_path / "cache"), "--log-level", "WARNING"]  # fmt: skip
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        line = proc.stdout.readline()  # type: ignore[union-attr]
        assert "edgetwin serve: site s1 serving v1 (scope global r1" in line and f"via {nats_server.url}" in line

        async def ask() -> Any:
            client = nats_bus(nats_server.url, "client")
            await client.connect()
            try:
                return await request_decision(client, SITE, obs, timeout=5.0)
            finally:
                await client.close()

        d = asyncio.run(ask())
        np.testing.assert_allclose(d.actions, policy_like(policy_dir).act(obs))
        assert (d.version, d.scope) == ("v1", "global")
    finally:
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 0
    assert "stopped; served 1 decisions (3 rows)" in out


def policy_like(path: Path) -> Any:
    from edgetwin.policies.export import load_policy

    return load_policy(path)
