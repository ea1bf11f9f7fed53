"""A command-started canary on the in-process bus: a runtime that dies mid-run is resumed by the
next one started on the same cache directory, with no tick lost or doubled."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from test_runtime import OBS_DIM, SPEC, ConstantPolicy, publish

from edgetwin.edge.bus import InMemoryBus, MemoryBroker
from edgetwin.edge.canary import read_spool
from edgetwin.edge.canary_command import (
    CanaryStart,
    command_subject,
    outcome_envelope,
    outcome_subject,
    sign_start,
)
from edgetwin.edge.canary_slice import CanarySlice
from edgetwin.edge.kpi_watch import KPIMargin
from edgetwin.edge.registry import FileRegistry
from edgetwin.edge.runtime import EdgeRuntime
from edgetwin.edge.signing import Signer, TrustStore

SITE = "s1"
GROUPS = [f"g{i}" for i in range(8)]


def registry_v1_v2(tmp: Path, signer: Signer) -> FileRegistry:
    """A registry with two constant policies, v1 current at site s1 and v2 the candidate."""
    reg = FileRegistry(tmp / "registry")
    publish(reg, tmp, ConstantPolicy(SPEC, [0.0, 0.05, 1.0]), "v1", signer)
    publish(reg, tmp, ConstantPolicy(SPEC, [1.0, 0.05, 0.0]), "v2", signer)
    reg.set_current(f"site/{SITE}", "v1", expected=None)
    return reg


async def _until(cond: Any, timeout: float = 20.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not cond():
        assert asyncio.get_running_loop().time() < deadline, "timed out"
        await asyncio.sleep(0.01)


def test_a_runtime_that_died_mid_run_is_resumed_without_losing_or_doubling_a_tick(tmp_path: Path) -> None:
    op_key = Signer.generate()
    reg = registry_v1_v2(tmp_path, op_key)
    cmd = CanaryStart(run="run7", candidate="v2", sha256=reg.manifest("v2").sha256, current="v1",
                      slice=CanarySlice(sites=(SITE,), seed=1), hours=2.0,
                      margins=(KPIMargin("kpi.slo_violation", max_regression=0.5),), pre_ticks=1)  # fmt: skip
    obs = np.zeros((len(GROUPS), OBS_DIM))
    broker = MemoryBroker()

    def runtime(bus: InMemoryBus) -> EdgeRuntime:
        return EdgeRuntime(SITE, reg, TrustStore([op_key.public_key]), bus=bus, kpi_guard=None, poll_interval=60,
                           cache_dir=tmp_path / "cache")  # fmt: skip

    async def tick(rt: EdgeRuntime, system: InMemoryBus, t: int) -> None:
        d = rt.decide_for(obs, GROUPS, t=t)
        rows = pd.DataFrame({"agent": GROUPS, "kpi.slo_violation": np.where(d.policy == "v2", 0.2, 0.2)})
        await system.publish_durable(outcome_subject(SITE), outcome_envelope(SITE, t, rows, "system"))

    async def first() -> None:
        async with InMemoryBus(broker, name="rt") as bus, InMemoryBus(broker, name="op") as op:
            rt = runtime(bus)
            async with rt:
                await op.publish_durable(command_subject(), sign_start(cmd, op_key))
                await _until(lambda: rt.canary is not None and rt.canary.active)
                for t in range(3):
                    await tick(rt, op, t)
                    await _until(lambda n=t + 1: rt.canary.ticks == n)  # type: ignore[union-attr]

    asyncio.run(first())
    run_dir = tmp_path / "cache" / "canary" / "run7"
    # A graceful stop ends the run ("runtime"); a killed process leaves its spool without that mark,
    # which is the state a crash leaves: the next runtime must resume from it.
    (run_dir / "stopped.json").unlink()

    async def second() -> None:
        async with InMemoryBus(broker, name="rt2") as bus, InMemoryBus(broker, name="op2") as op:
            rt = runtime(bus)
            async with rt:
                c = rt.canary
                assert c is not None and c.active and c.run_id == "run7" and c.ticks == 3
                assert rt.stats.canary_accepted == 0  # resumed from the spool, not re-run from the command
                await op.publish_durable(outcome_subject(SITE), outcome_envelope(SITE, 2, pd.DataFrame(
                    {"agent": GROUPS, "kpi.slo_violation": 0.2}), "system"))  # a re-sent tick: not doubled
                for t in range(3, 5):
                    await tick(rt, op, t)
                    await _until(lambda n=t + 1: c.ticks == n)
                assert rt.stats.reports_rejected["canary_outcome:duplicate"] == 1
                log = read_spool(run_dir)
                assert sorted(log["t"].unique().tolist()) == [0, 1, 2, 3, 4]
                assert log.groupby("t").size().tolist() == [len(GROUPS)] * 5
                assert set(log.loc[log["t"] == 0, "arm"]) == {"fleet"}  # the pre-period
                assert set(log.loc[log["t"] >= 1, "policy"]) == {"v1", "v2"}

    asyncio.run(second())


def test_replayed_finished_runs_stops_of_unknown_runs_and_a_wrong_current_are_refused(tmp_path: Path) -> None:
    from edgetwin.edge.canary_command import CanaryStop, sign_stop

    op_key = Signer.generate()
    reg = registry_v1_v2(tmp_path, op_key)

    def start(run: str, **kw: Any) -> Any:
        args: dict[str, Any] = dict(run=run, candidate="v2", sha256=reg.manifest("v2").sha256, current="v1",
                                    slice=CanarySlice(sites=(SITE,)), hours=1.0, margins=(KPIMargin("kpi.slo_violation"),))
        return sign_start(CanaryStart(**{**args, **kw}), op_key)

    async def main() -> None:
        broker = MemoryBroker()
        async with InMemoryBus(broker, name="rt") as bus, InMemoryBus(broker, name="op") as op:
            rt = EdgeRuntime(SITE, reg, TrustStore([op_key.public_key]), bus=bus, kpi_guard=None, poll_interval=60,
                             cache_dir=tmp_path / "cache")  # fmt: skip
            async with rt:
                for env in (start("a"), sign_stop(CanaryStop("a"), op_key), start("a"),  # a replay of a finished run
                            sign_stop(CanaryStop("zzz"), op_key), start("b", current="v0"),
                            start("c", sites=("elsewhere",))):  # not addressed to this site: ignored
                    await op.publish_durable(command_subject(), env)
                await _until(lambda: sum(rt.stats.canary_refused.values()) == 3)
                assert dict(rt.stats.canary_refused) == {"finished": 1, "unknown_run": 1, "not_current": 1}
                assert rt.stats.canary_accepted == 1 and rt.canary is not None and rt.canary.run_id == "a"
                assert rt.canary.stop_reason == "operator" and rt.version == "v1"

    asyncio.run(main())
