"""Outcomes read from Prometheus, joined to a site's decisions by group and tick (issue 43 item 3).

The system asks a running site (in-process bus, a command-started canary) for its decisions over
the JSON wire and reports nothing on the bus: its metrics go to Prometheus (`write_openmetrics_logs`,
what its exporters leave there). The operator's bridge imports the day so far each tick with
``edgetwin logs import prometheus`` (`import_prometheus`, here its offline ``--from-file`` path:
tests/test_prometheus.py shows it gives what a real server gives) and reports the new ticks
(`publish_outcomes`); the site joins them with its decisions into the canary log, collected from
the bus: every (group, tick) once, the site's versions, the system's outcomes."""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
import pandas as pd

from edgetwin.contract.margins import KPIMargin
from edgetwin.contract.prometheus.importer import import_prometheus
from edgetwin.edge.bus import make_bus
from edgetwin.edge.registry import FileRegistry, metadata_from_policy_dir
from edgetwin.edge.runtime import EdgeRuntime
from edgetwin.edge.signing import Signer, TrustStore
from edgetwin.emulator.cluster import ClusterConfig, EdgeCluster
from edgetwin.emulator.logs import write_openmetrics_logs
from edgetwin.loop.collect import collect_canary, publish_outcomes
from edgetwin.loop.commands import fleet_status, publish_start, start_from_plan
from edgetwin.loop.fleet import drive_cluster_over_bus
from edgetwin.loop.plan import CanaryPlan, PlanSlice
from edgetwin.policies.candidates import ConstantPolicy
from edgetwin.policies.export import export_policy

CLUSTER = ClusterConfig(n_agents=12, steps=12)
DAY0 = 1767225600  # 2026-01-01T00:00:00Z
KPIS = ["kpi.task_time_ms", "kpi.slo_violation"]


def _site(tmp_path: Path):  # type: ignore[no-untyped-def]
    """A site serving v1 on an in-process bus, the start of run prom-1 (v2 on half of the groups)."""
    spec = EdgeCluster(CLUSTER).spec
    signer = Signer.generate()
    reg = FileRegistry(tmp_path / "reg")
    for v, a in (("v1", [0.5, 0.5, 0.5]), ("v2", [0.45, 0.5, 0.5])):
        export_policy(ConstantPolicy(spec, a), tmp_path / v, spec)
        reg.publish(tmp_path / v, {**metadata_from_policy_dir(tmp_path / v), "name": v, "version": v}, signer)
    reg.set_current("global", "v1", expected=None)
    em = EdgeCluster(CLUSTER)
    em.reset(seed=0)
    agents = tuple(sorted(em.agent_ids.astype(str)))
    margins = (KPIMargin(KPIS[0], 0.5, 0.0, False), KPIMargin(KPIS[1], 0.5, 0.0, False))
    plan = CanaryPlan("v2", "v1", PlanSlice(agents, (), (), 0.5, 0), 2.0, margins, [], len(agents), len(agents), 1.0,
                      {}, True, ["test"])  # fmt: skip
    url = f"memory://prom-outcomes-{tmp_path.name}"  # a broker of its own
    rt = EdgeRuntime("edge", reg, TrustStore([signer.public_key]), bus=url, kpi_guard=None, poll_interval=3600.0,
                     cache_dir=tmp_path / "cache")  # fmt: skip
    cmd = start_from_plan(plan, candidate="v2", sha256=reg.manifest("v2").sha256, run="prom-1", current="v1",
                          pre_ticks=2)  # fmt: skip
    ticks = cmd.config().total_ticks  # 2 pre-ticks + 8 ticks of the candidate
    return spec, signer, url, rt, cmd, ticks


def test_a_site_without_outcomes_keeps_its_slice_on_the_current_policy(tmp_path: Path) -> None:
    """docs/canary.md: a site counts its canary's ticks by the ticks it joined; with no outcome
    report the pre-period never ends and every decision stays the current policy's."""
    _spec, signer, url, rt, cmd, ticks = _site(tmp_path)

    async def run() -> pd.DataFrame:
        async with make_bus(url) as bus:
            await publish_start(bus, cmd, signer)
            for _ in range(500):
                st = (await fleet_status(bus, ["edge"], "prom-1", timeout=10.0))["edge"]
                if getattr(st, "phase", "") == "pre":
                    break
                await asyncio.sleep(0.01)
            return await drive_cluster_over_bus(bus, CLUSTER, ["edge"], seed=0, ticks=ticks, report=False)

    with rt.running_in_thread():
        assert rt._loop is not None
        day = asyncio.run_coroutine_threadsafe(run(), rt._loop).result(120)
        assert rt.canary is not None and rt.canary.active and rt.canary.ticks == 0
    assert len(day) == ticks * CLUSTER.n_agents and set(day["policy"]) == {"v1"}


def test_outcomes_imported_from_prometheus_are_joined_with_the_site_s_decisions(tmp_path: Path) -> None:
    spec, signer, url, rt, cmd, ticks = _site(tmp_path)

    async def status(bus) -> object:  # type: ignore[no-untyped-def]
        return (await fleet_status(bus, ["edge"], "prom-1", timeout=10.0))["edge"]

    async def started(bus) -> None:  # type: ignore[no-untyped-def]
        await publish_start(bus, cmd, signer)
        for _ in range(500):
            if getattr(await status(bus), "phase", "") in ("pre", "running"):
                return
            await asyncio.sleep(0.01)
        raise AssertionError("the site did not start the run")

    async def run() -> tuple[pd.DataFrame, pd.DataFrame, object]:
        async with make_bus(url) as bus:
            await started(bus)

            exported: list[pd.DataFrame] = []
            published: set[int] = set()

            async def via_prometheus(site: str, t: int, rows: pd.DataFrame) -> None:
                # the system's exporters leave each tick's metrics in Prometheus (deterministic
                # policies: no propensity to export; the site keeps its own record of it) ...
                exported.append(rows.drop(columns="propensity"))
                if t == 0:
                    return  # one step of the day is not a log yet (the importer quarantines it)
                dump, mapping = write_openmetrics_logs(pd.concat(exported), spec, tmp_path / "day.om", start=DAY0)
                # ... and the operator's bridge imports the day so far (`edgetwin logs import
                # prometheus --start MIDNIGHT --end NOW`: its t is the tick of the day) and reports
                # the ticks not reported yet
                out = tmp_path / "imported.parquet"
                import_prometheus(mapping, out, start=DAY0, end=DAY0 + 900 * (t + 1), from_file=dump)
                imported = pd.read_parquet(out)
                assert set(imported["t"]) == set(range(t + 1)) and len(imported) == sum(map(len, exported))
                new = imported[~imported["t"].isin(published)]
                assert await publish_outcomes(bus, new, site, day="2026-01-01") == len(set(new["t"]))
                published.update(int(x) for x in new["t"])

            async def joined(t: int) -> bool:
                for _ in range(1000):
                    st = await status(bus)
                    if st.phase == "stopped" or st.ticks >= len(published):  # type: ignore[attr-defined]
                        return st.phase != "stopped"  # type: ignore[attr-defined]
                    await asyncio.sleep(0.01)
                raise AssertionError(f"tick {t} was not joined")

            day = await drive_cluster_over_bus(bus, CLUSTER, ["edge"], seed=0, ticks=ticks, reporter=via_prometheus,
                                               on_tick=joined)  # fmt: skip
            for _ in range(1000):
                st = await status(bus)
                if st.phase == "stopped" and st.shipped >= st.segments:  # type: ignore[attr-defined]
                    break
                await asyncio.sleep(0.01)
            res = await collect_canary(bus, "prom-1", tmp_path / "canary.parquet", idle=0.2, timeout=60,
                                       expected={"edge": st.shipped})  # type: ignore[attr-defined]
            assert not res.missing
            return day, pd.read_parquet(tmp_path / "canary.parquet"), st

    with rt.running_in_thread():
        assert rt._loop is not None
        day, log, st = asyncio.run_coroutine_threadsafe(run(), rt._loop).result(300)
    assert st.stop_reason == "completed" and st.ticks == ticks  # type: ignore[attr-defined]
    # every (group, tick) of the day once, decided by the site's versions, arms on the rows
    assert len(log) == len(day) and not log.duplicated(["agent", "t"]).any()
    assert set(log["policy"]) == {"v1", "v2"} and "candidate" not in set(log["policy"])
    assert set(log.loc[log["t"] < 2, "policy"]) == {"v1"} and set(log.loc[log["arm"] == "candidate", "policy"]) == {"v2"}
    # the outcomes are the system's for the same group and tick (through Prometheus and back)
    got = log.sort_values(["t", "agent"]).reset_index(drop=True)
    want = day.sort_values(["t", "agent"]).reset_index(drop=True)
    np.testing.assert_allclose(got[KPIS].to_numpy(float), want[KPIS].to_numpy(float), rtol=1e-9)
    assert (got["policy"].astype(str).to_numpy() == want["policy"].astype(str).to_numpy()).all()
