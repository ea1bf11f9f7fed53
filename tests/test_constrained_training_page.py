"""benchmarks/constrained_training.py's page (issue 44): every run's table says what the cluster
measured, marks a regression beyond the margin, and keeps every configuration's run."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "benchmarks"


def _run(seed: int, revenue: float, regressed: bool) -> dict:
    def c(change: float, better: str, margin: float, reg: bool = False) -> dict:
        return {"change": change, "interval": [change - 0.05, change + 0.05], "better": better, "margin": margin,
                "regressed": reg, "may_regress": reg}

    ch = {n: {"kpi.revenue": c(revenue, "higher", 0.02, regressed and n == "PPO"), "kpi.energy_j": c(-0.1, "lower", 0.05)}
          for n in ("PPO", "PPO-Lagrangian")}
    return {"args": {"seed": str(seed), "steps": "1000", "episodes": "2", "dual_lr": "0.5"}, "cluster_change": ch,
            "twin_change": {n: {"kpi.revenue": revenue, "kpi.energy_j": -0.1} for n in ch},
            "multipliers": {"PPO": None, "PPO-Lagrangian": [{"column": "kpi.revenue", "lambda": 1.5, "last_violation": 0.01}]},
            "seconds": 60.0}


def test_each_run_gets_a_table_and_a_regression_is_bold() -> None:
    sys.path.insert(0, str(BENCH))
    try:
        ct = pytest.importorskip("constrained_training")
    finally:
        sys.path.remove(str(BENCH))
    text = ct.section({"a": _run(0, -0.2, True), "b": _run(1, 0.1, False)})
    assert text.startswith(ct.SECTION) and text.count("| KPI | direction, margin |") == 2
    assert "| kpi.revenue | higher, 2 % | **-20.0 % [-25.0, -15.0]** |" in text
    assert "Regressed beyond the margin on the cluster: PPO: kpi.revenue; PPO-Lagrangian: none." in text
    assert "kpi.revenue 1.50 (last mean violation +0.010)" in text
