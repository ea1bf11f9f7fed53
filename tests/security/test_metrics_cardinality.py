"""Issue 45 item 8: ``/metrics`` cardinality. Only the KPIs the spec declares (or the guard watches)
become ``edgetwin_kpi`` series, and ``kpi_report`` messages are authenticated: unsigned or
wrongly signed ones are rejected and counted, and mint no series."""

from __future__ import annotations

import asyncio
from pathlib import Path

from test_runtime import SPEC, ConstantPolicy, publish  # tests/ (its conftest.py puts it on sys.path)

from edgetwin.edge.bus import InMemoryBus, MemoryBroker
from edgetwin.edge.kpi_watch import KPIGuard, KPIMargin
from edgetwin.edge.message_auth import Keyring
from edgetwin.edge.metrics import instrument
from edgetwin.edge.registry import FileRegistry
from edgetwin.edge.runtime import EdgeRuntime, kpi_report, kpi_subject, signed_frame
from edgetwin.edge.signing import Signer, TrustStore

SITE = "s1"


def _kpi_series(page: str) -> int:
    return sum(1 for line in page.splitlines() if line.startswith("edgetwin_kpi{"))


def test_unsigned_reports_and_undeclared_kpis_mint_no_series(tmp_path: Path) -> None:
    signer, sensor, intruder = Signer.generate(), Signer.generate(), Signer.generate()
    reg = FileRegistry(tmp_path / "registry")
    publish(reg, tmp_path, ConstantPolicy(SPEC, [0.5, 1.0, 0.5]), "v1", signer)
    reg.set_current(f"site/{SITE}", "v1", expected=None)
    guard = KPIGuard(margins=(KPIMargin("kpi.slo_violation", max_regression=0.5),), window=50, grace=0, patience=5)
    declared = set(SPEC.names("kpi"))

    async def main() -> None:
        broker = MemoryBroker()
        bus, client = InMemoryBus(broker, name="rt"), InMemoryBus(broker, name="client")
        async with bus, client:
            rt = EdgeRuntime(SITE, reg, TrustStore([signer.public_key]), bus=bus, kpi_guard=guard, poll_interval=60,
                             reporters=Keyring({"sensor": sensor.public_key}))  # fmt: skip
            metrics = instrument(rt)
            async with rt:
                before = _kpi_series(metrics.exposition().decode())
                # 300 unsigned reports, each with a new KPI name: rejected, counted, no series
                for i in range(300):
                    await client.publish(kpi_subject(SITE), kpi_report(SITE, {f"kpi.x{i}": 1.0}, sender="sensor"))
                # signed by a key that is not the sensor's: rejected too
                env = kpi_report(SITE, {"kpi.evil": 1.0}, sender="sensor")
                await client.publish_raw(kpi_subject(SITE), signed_frame(env, intruder))
                deadline = asyncio.get_running_loop().time() + 20
                while rt.stats.reports_rejected["kpi_report:unauthenticated"] < 301:
                    assert asyncio.get_running_loop().time() < deadline
                    await asyncio.sleep(0.01)
                assert rt.stats.kpi_reports == 0
                assert _kpi_series(metrics.exposition().decode()) == before
                # a signed report: its declared KPIs become series, its 200 invented names do not
                kpis = {**{f"kpi.y{i}": 1.0 for i in range(200)}, "kpi.slo_violation": 0.1}
                await client.publish_raw(kpi_subject(SITE), signed_frame(kpi_report(SITE, kpis, sender="sensor"), sensor))
                while rt.stats.kpi_reports < 1:
                    assert asyncio.get_running_loop().time() < deadline
                    await asyncio.sleep(0.01)
                # the Python API obeys the same rule
                rt.report_kpis({"kpi.z": 3.0, "kpi.slo_violation": 0.2})
                page = metrics.exposition().decode()
                names = {line.split('kpi="')[1].split('"')[0] for line in page.splitlines() if line.startswith("edgetwin_kpi{")}
                assert names == {"kpi.slo_violation"} and names <= declared
                assert rt.stats.kpis_undeclared == 201
                assert 'edgetwin_reports_rejected_total{kind="kpi_report",reason="unauthenticated",site="s1"} 301.0' in page

    asyncio.run(asyncio.wait_for(main(), timeout=60))
