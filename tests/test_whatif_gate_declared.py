"""The what-if-gate benchmark's per-declared-KPI block (issue 44): coverage, errors and every
uncovered (candidate, KPI) change as a finding, computed from the rows."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "benchmarks"


def _module():  # noqa: ANN202
    sys.path.insert(0, str(BENCH))
    try:
        import whatif_gate
    finally:
        sys.path.remove(str(BENCH))
    return whatif_gate


def _row(policy: str, kpi: str, twin: float, real: float, lo: float, hi: float) -> dict:
    return {"policy": policy, "kpi": kpi, "twin_change": twin, "real_change": real, "interval": [lo, hi],
            "covered": lo <= real <= hi, "out_of_support": 0.01, "verdict": "ok"}


def test_declared_kpis_are_summarised_and_every_miss_is_a_finding() -> None:
    wg = _module()
    rows = [_row("a", "kpi.revenue", -0.10, 0.20, -0.2, 0.0),  # missed by 30 points
            _row("b", "kpi.revenue", 0.05, 0.06, 0.0, 0.1),
            _row("a", "kpi.energy_j", 0.10, 0.12, 0.0, 0.2),
            _row("a", "return", 0.5, -0.5, 0.4, 0.6)]  # not declared: left out
    d = wg.declared_kpi_summary(rows, ["kpi.revenue", "kpi.energy_j"])
    assert d["n"] == 3 and d["coverage"] == pytest.approx(2 / 3)
    assert d["per_kpi"]["kpi.revenue"]["mean_signed_error_points"] == pytest.approx((-30 - 1) / 2)
    assert [(f["policy"], f["kpi"]) for f in d["findings"]] == [("a", "kpi.revenue")]
    text = "\n".join(wg._declared_lines({"logging": "random", "declared_kpis": d}))
    assert "| a | kpi.revenue | +20.0 % | -10.0 % [-20.0, +0.0]" in text and "Coverage 67 % of 3" in text
    assert wg._declared_lines({"logging": "random"}) == []
