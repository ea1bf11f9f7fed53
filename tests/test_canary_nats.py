"""A canary's log over a real nats-server: shipped through JetStream to a durable collector, and
when the server dies mid-canary the canary stops (the slice returns to the current policy), the
rows stay spooled, and once the server is back every reported row arrives exactly once."""

from __future__ import annotations

import asyncio
import contextlib
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from test_canary import GUARDED, SPEC, Constant

from edgetwin.edge.bus import NatsBus, NatsConfig
from edgetwin.edge.canary import CanaryConfig, CanaryLogCollector, read_spool
from edgetwin.edge.canary_slice import CanarySlice
from edgetwin.edge.registry import FileRegistry
from edgetwin.edge.runtime import EdgeRuntime
from edgetwin.edge.signing import Signer, TrustStore
from edgetwin.emulator.cluster import ClusterConfig, EdgeCluster, check_actions
from edgetwin.emulator.logs import SLOAwarePolicy
from edgetwin.emulator.population import SCENARIOS
from edgetwin.loop.fleet import _loader, _rows, _stub_dir

pytestmark = pytest.mark.nats


def nats_bus(url: str, name: str) -> NatsBus:
    return NatsBus(NatsConfig(servers=[url], name=name, reconnect_backoff_s=0.05, reconnect_backoff_max_s=0.5,
                              connect_attempts=3, durable_publish_timeout_s=1.0))  # fmt: skip


async def wait_for(cond: Any, timeout: float = 60.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return True
        await asyncio.sleep(0.05)
    return bool(cond())


def test_canary_log_through_jetstream_survives_the_server_dying_mid_canary(nats_server, tmp_path: Path) -> None:
    signer = Signer.generate()
    reg = FileRegistry(tmp_path / "registry")
    for name in ("current", "cand"):
        reg.publish(_stub_dir(tmp_path / "stubs", name, SPEC), {"name": name, "version": name}, signer)
    reg.set_current("site/edge", "current", expected=None)
    loader = _loader({"current": SLOAwarePolicy(SPEC), "cand": Constant([1.0, 0.05, 0.0])})
    config = CanaryConfig("cand", CanarySlice(sites=("edge-ams", "edge-fra"), seed=0), 23.0, GUARDED)
    em = EdgeCluster(ClusterConfig(n_agents=40, steps=96))
    obs = em.reset(seed=2)
    scen = np.array(SCENARIOS, dtype=object)[em.scenario]
    sites = np.array(em.site_names, dtype=object)[em.home]

    async def main() -> None:
        nonlocal obs
        bus, cloud = nats_bus(nats_server.url, "rt"), nats_bus(nats_server.url, "cloud")
        await bus.connect()
        await cloud.connect()
        collector = CanaryLogCollector()
        await collector.subscribe(cloud)
        rt = EdgeRuntime("edge", reg, TrustStore([signer.public_key]), bus=bus, kpi_guard=None, poll_interval=0.1,
                         registry_timeout=1.0, cache_dir=tmp_path / "cache", loader=loader, spec=SPEC)  # fmt: skip
        reported = 0
        async with rt:
            canary = await rt.start_canary(config)
            in_slice = canary.router.arms(em.agent_ids.tolist(), sites.tolist(), scen.tolist()) != "fleet"
            for t in range(10):
                if t == 6:
                    # everything so far reached the cloud through JetStream
                    so_far = reported
                    assert await wait_for(lambda n=so_far: collector.rows("edge", canary.run_id) == n, 30)
                    nats_server.stop()  # the link (the whole server) dies mid-canary
                d = rt.decide_for(obs, em.agent_ids, sites, scen)
                actions = check_actions(d.actions, em.n)
                new_obs, reward, _, info = em.step(actions)
                rt.canary_report(_rows(em, 0, t, obs, actions, info, reward, d.policy, d.propensity, in_slice))
                reported += int(in_slice.sum())
                obs = new_obs
                await asyncio.sleep(0.05)
            assert await wait_for(lambda: canary.stop_reason == "link", 30), canary.stop_reason
            d = rt.decide_for(obs, em.agent_ids, sites, scen)
            assert set(d.policy) == {"current"}  # the slice is back on the current policy
            assert len(read_spool(canary.dir)) == reported
            nats_server.start()  # same port and JetStream store
            assert await wait_for(lambda: collector.rows("edge", canary.run_id) >= reported, 90), (
                collector.rows("edge", canary.run_id), reported)  # fmt: skip
            await asyncio.sleep(0.5)  # a late duplicate would show up now
            got = collector.log("edge", canary.run_id)
            assert len(got) == reported and collector.seqs("edge", canary.run_id) == list(range(1, 11))
            assert got.equals(read_spool(canary.dir))
        for b in (bus, cloud):
            with contextlib.suppress(Exception):
                await asyncio.wait_for(b.close(), 30)

    asyncio.run(asyncio.wait_for(main(), timeout=240))
