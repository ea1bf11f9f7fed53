"""Only declared KPIs become /metrics series (issue 45, item 8).

20,000 ``kpi_report`` messages with invented KPI names made 20,001 series (the page grew from 4.8 KB
to 3.4 MB, for the process's life). A name the runtime's spec or KPI watch does not declare is now
counted in one counter and never becomes a series.
"""

from __future__ import annotations

from pathlib import Path

from test_runtime import SPEC, ConstantPolicy, promote, publish

from edgetwin.edge.kpi_watch import KPIGuard, KPIMargin
from edgetwin.edge.metrics import instrument
from edgetwin.edge.registry import FileRegistry
from edgetwin.edge.runtime import EdgeRuntime
from edgetwin.edge.signing import Signer, TrustStore


def test_invented_kpi_names_make_no_series(tmp_path: Path) -> None:
    signer = Signer.generate()
    reg = FileRegistry(tmp_path / "registry")
    publish(reg, tmp_path, ConstantPolicy(SPEC, [0.5, 1.0, 0.3]), "v1", signer)
    promote(reg, "v1")
    guard = KPIGuard(margins=(KPIMargin("kpi.x", max_regression=0.1),), window=3, grace=0, patience=1, baseline="previous")
    rt = EdgeRuntime("s1", reg, TrustStore([signer.public_key]), kpi_guard=guard, poll_interval=60)
    metrics = instrument(rt)
    with rt.running_in_thread():
        rt.report_kpis({"kpi.x": 1.0})
        before = len(metrics.exposition())
        for i in range(2_000):
            rt.report_kpis({"kpi.x": 1.0, f"kpi.invented_{i}": float(i)})
        page = metrics.exposition().decode()
    series = [ln for ln in page.splitlines() if ln.startswith("edgetwin_kpi{")]
    assert len(series) == 1 and 'kpi="kpi.x"' in series[0]
    assert "invented" not in page
    assert 'edgetwin_kpi_undeclared_total{site="s1"} 2000.0' in page
    assert len(page) < before + 2_000  # bounded: the counter's value grows, not the page
