"""A running edge runtime driven over a real nats-server, as an operator and a real system would:
signed canary commands (accepted / refused and counted, the fleet staying on the current policy),
arms on the JSON and Arrow decision wire, the system's outcome reports joined into the spooled and
shipped canary log, and the guard stopping a regressing slice on its own."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import nats
import numpy as np
import pandas as pd
import pyarrow as pa
import pytest
import torch
from test_runtime import OBS_DIM, SPEC
from test_runtime_canary import registry_v1_v2
from test_runtime_nats import wait_for

from edgetwin.edge.bus import NatsBus, NatsConfig
from edgetwin.edge.canary import CanaryLogCollector, read_spool
from edgetwin.edge.canary_command import (
    CanaryStart,
    CanaryStatus,
    CanaryStop,
    command_subject,
    outcome_envelope,
    outcome_subject,
    sign_start,
    sign_stop,
    status_request,
    status_subject,
)
from edgetwin.edge.canary_slice import CanarySlice
from edgetwin.edge.kpi_watch import KPIMargin
from edgetwin.edge.message_auth import Keyring, MessageAuth
from edgetwin.edge.metrics import instrument
from edgetwin.edge.registry import FileRegistry
from edgetwin.edge.runtime import EdgeRuntime
from edgetwin.edge.signing import Signer, TrustStore

pytestmark = pytest.mark.nats
torch.set_num_threads(1)

SITE = "s1"
GROUPS = [f"g{i}" for i in range(16)]
KPI = "kpi.slo_violation"


def nats_bus(url: str, name: str, auth: MessageAuth | None = None) -> NatsBus:
    bus = NatsBus(NatsConfig(servers=[url], name=name, reconnect_backoff_s=0.05, reconnect_backoff_max_s=0.5,
                             connect_attempts=3))  # fmt: skip
    bus.auth = auth
    return bus


def _start(reg: FileRegistry, run: str, **kw: Any) -> CanaryStart:
    args: dict[str, Any] = dict(
        run=run, candidate="v2", sha256=reg.manifest("v2").sha256, current="v1",
        slice=CanarySlice(sites=(SITE,), treat_share=0.5, seed=3), hours=3.0, margins=(KPIMargin(KPI, max_regression=0.05),),
        pre_ticks=2, batch=1, min_reports=2,
    )  # fmt: skip
    args.update(kw)
    return CanaryStart(**args)


def test_serve_accepts_only_signed_starts_of_versions_it_holds(nats_server, tmp_path: Path) -> None:
    operator, stranger = Signer.generate(), Signer.generate()
    reg = registry_v1_v2(tmp_path, operator)
    trust = TrustStore([operator.public_key])
    unsigned = sign_start(_start(reg, "r-unsigned"), operator)
    del unsigned.payload["sig"]
    commands = [
        unsigned,
        sign_start(_start(reg, "r-stranger"), stranger),  # a key not in --trust
        sign_start(_start(reg, "r-unknown", candidate="v9"), operator),  # not in the registry
        sign_start(_start(reg, "r-digest", sha256="0" * 64), operator),  # other bytes than the registry's
        sign_start(_start(reg, "r-ok"), operator),
        sign_start(_start(reg, "r-busy"), operator),  # another run while r-ok runs
    ]

    async def main() -> None:
        op = nats_bus(nats_server.url, "operator")
        await op.connect()
        # published BEFORE the site runs: the durable subject delivers what it missed, in order
        for env in commands:
            await op.publish_durable(command_subject(), env)
        rt = EdgeRuntime(SITE, reg, trust, bus=nats_server.url, kpi_guard=None, poll_interval=60,
                         cache_dir=tmp_path / "cache")  # fmt: skip
        metrics = instrument(rt)
        async with rt:
            assert await wait_for(lambda: sum(rt.stats.canary_refused.values()) == 5)
            assert dict(rt.stats.canary_refused) == {"unsigned": 1, "untrusted_key": 1, "unknown_version": 1,
                                                     "digest_mismatch": 1, "busy": 1}  # fmt: skip
            assert rt.stats.canary_accepted == 1 and rt.canary is not None and rt.canary.run_id == "r-ok"
            page = metrics.exposition().decode()
            assert 'edgetwin_canary_commands_refused_total{reason="untrusted_key",site="s1"} 1.0' in page
            reply = await op.request(status_subject(SITE), status_request("r-ok"), timeout=10)
            st = CanaryStatus.from_dict(reply.payload)
            assert (st.run, st.phase, st.candidate, st.current, st.ticks) == ("r-ok", "pre", "v2", "v1", 0)
            # a forged stop changes nothing; a signed one stops the slice
            await op.publish_durable(command_subject(), sign_stop(CanaryStop("r-ok"), stranger))
            await op.publish_durable(command_subject(), sign_stop(CanaryStop("r-ok"), operator))
            assert await wait_for(lambda: rt.canary is not None and not rt.canary.active)
            assert rt.canary.stop_reason == "operator" and rt.stats.canary_refused["untrusted_key"] == 2
            d = rt.decide_for(np.zeros((len(GROUPS), OBS_DIM)), GROUPS)
            assert set(d.policy) == {"v1"} and set(d.arm) == {"fleet"}  # the fleet is on the current policy
            st = CanaryStatus.from_dict((await op.request(status_subject(SITE), status_request(), timeout=10)).payload)
            assert (st.phase, st.stop_reason) == ("stopped", "operator")
        await op.close()

    asyncio.run(asyncio.wait_for(main(), timeout=120))


def _json_request(obs: np.ndarray, t: int) -> tuple[bytes, dict[str, str]]:
    body = {"obs": obs.tolist(), "agents": GROUPS, "t": t, "site": SITE}
    return json.dumps(body).encode(), {"Content-Type": "application/json"}


def _arrow_request(obs: np.ndarray, t: int) -> tuple[bytes, dict[str, str]]:
    cols = {c: obs[:, j] for j, c in reversed(list(enumerate(SPEC.observation_columns)))}  # another column order
    batch = pa.record_batch([pa.array(v) for v in cols.values()] + [pa.array(GROUPS)],
                            names=[*cols, "agent"]).replace_schema_metadata({"t": str(t)})  # fmt: skip
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, batch.schema) as w:
        w.write_batch(batch)
    return sink.getvalue().to_pybytes(), {"Content-Type": "application/vnd.apache.arrow.stream"}


def _arrow_reply(data: bytes) -> tuple[list[str], list[str]]:
    with pa.ipc.open_stream(pa.py_buffer(data)) as r:
        t = r.read_all()
    return t.column("policy").to_pylist(), t.column("arm").to_pylist()


def test_arms_on_every_wire_outcomes_joined_and_the_guard_stops_the_slice(nats_server, tmp_path: Path) -> None:
    operator, system, intruder = Signer.generate(), Signer.generate(), Signer.generate()
    reg = registry_v1_v2(tmp_path, operator)
    rng = np.random.default_rng(0)
    base = dict(zip(GROUPS, rng.uniform(0.1, 0.3, len(GROUPS)), strict=True))
    obs = rng.uniform(0.0, 1.0, (len(GROUPS), OBS_DIM))

    async def main() -> None:
        op, cloud = nats_bus(nats_server.url, "operator"), nats_bus(nats_server.url, "cloud")
        # the system reports outcomes as "system/s1", signed (a second client: it only publishes)
        reporter = nats_bus(nats_server.url, "system", MessageAuth(Keyring(), {"system/s1": system}))
        forger = nats_bus(nats_server.url, "forger", MessageAuth(Keyring(), {"system/s1": intruder}))
        for b in (op, cloud, reporter, forger):
            await b.connect()
        collector = CanaryLogCollector()
        await collector.subscribe(cloud)
        nc = await nats.connect(nats_server.url)  # a plain NATS client asks for decisions
        rt = EdgeRuntime(SITE, reg, TrustStore([operator.public_key]), bus=nats_server.url,
                         kpi_guard=None, poll_interval=60, cache_dir=tmp_path / "cache",
                         reporters=Keyring({"system/s1": system.public_key}))  # fmt: skip
        async with rt:
            await op.publish_durable(command_subject(), sign_start(_start(reg, "run1"), operator))
            assert await wait_for(lambda: rt.canary is not None and rt.canary.active)
            canary = rt.canary
            assert canary is not None
            seen_arms: dict[str, set[str]] = {"json": set(), "arrow": set()}
            for t in range(14):
                fmt = "json" if t % 2 == 0 else "arrow"
                body, headers = (_json_request if fmt == "json" else _arrow_request)(obs, t)
                msg = await nc.request(f"edgetwin.decision.{SITE}", body, headers=headers, timeout=10)
                if fmt == "json":
                    doc = json.loads(msg.data)
                    policies, arms = doc["policies"], doc["arms"]
                else:
                    policies, arms = _arrow_reply(msg.data)
                seen_arms[fmt].update(arms)
                for p, a in zip(policies, arms, strict=True):
                    assert p == ("v2" if a == "candidate" else "v1")  # each row answered by its arm
                # the real system: the candidate's action truly regresses the KPI
                kpi = [base[g] + (0.4 if p == "v2" else 0.0) + rng.normal(0, 0.01) for g, p in zip(GROUPS, policies, strict=True)]
                rows = pd.DataFrame({"agent": GROUPS, KPI: kpi, "episode": "day1"})
                if t == 3:  # a forged report (a key that is not the system's) is refused, not joined
                    await forger.publish_durable(outcome_subject(SITE), outcome_envelope(SITE, t, rows, "system/s1"))
                await reporter.publish_durable(outcome_subject(SITE), outcome_envelope(SITE, t, rows, "system/s1"))
                assert await wait_for(lambda n=t + 1: canary.ticks == n or not canary.active)
                if not canary.active:
                    break
            assert canary.stop_reason == "guard", canary.stop_reason
            assert seen_arms["json"] >= {"fleet"} and seen_arms["arrow"] >= {"candidate", "control"}
            assert rt.stats.reports_rejected["canary_outcome:unauthenticated"] == 1
            # the slice is back on the current policy, and a request naming no groups is counted
            d = rt.decide_for(obs, GROUPS)
            assert set(d.policy) == {"v1"}
            log = read_spool(canary.dir)
            assert len(log) == len(GROUPS) * canary.ticks and set(log["policy"]) == {"v1", "v2"}
            assert {"propensity", "arm", *SPEC.observation_columns, *SPEC.action_columns} <= set(log.columns)
            assert (log.loc[log["arm"] == "candidate", "policy"] == "v2").all()
            assert log.groupby("t").size().tolist() == [len(GROUPS)] * canary.ticks
            # every segment reached the cloud through JetStream, once, as <run>-<seq>
            assert await wait_for(lambda: collector.rows(SITE, "run1") == len(log))
            assert collector.seqs(SITE, "run1") == list(range(1, canary.ticks + 1))
        await nc.close()
        for b in (op, cloud, reporter, forger):
            await b.close()

    asyncio.run(asyncio.wait_for(main(), timeout=180))
