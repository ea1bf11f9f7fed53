"""The what-if-gate benchmark chooses its interval construction on one half of the candidates and
reports coverage on the other half (choosing on the reported rows would report the best of several);
its per-declared-KPI block (issue 44) summarises the rows and lists every uncovered change."""

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


def _row(policy: str, covered: bool, width: float = 0.1) -> dict:
    return {"policy": policy, "kpi": "return", "covered": covered, "agree": True, "verdict": "ok",
            "interval": [0.0, width], "twin_change_w": 0.0, "real_regress": False}


def test_the_halves_are_disjoint_cover_every_candidate_and_follow_the_seed() -> None:
    wg = _module()
    names = [f"p{i}" for i in range(9)]
    a, b = wg.split_policies(names, seed=0)
    assert set(a).isdisjoint(b) and sorted(a + b) == sorted(names) and len(a) == 4
    assert wg.split_policies(list(reversed(names)), seed=0) == (a, b)
    assert wg.split_policies(names, seed=1) != (a, b)


def test_the_choice_sees_only_its_half_and_the_report_only_the_other() -> None:
    wg = _module()
    names = [f"p{i}" for i in range(8)]
    choose, report = wg.split_policies(names, seed=0)
    # "narrow" covers the choice half 9 times in 10-ish, "wide" always; on the report half the opposite
    by = {
        "bootstrap": [_row(n, False) for n in names],
        "narrow": [_row(n, n in choose and n != choose[0]) for n in names],
        "wide": [_row(n, n in report, 0.5) for n in names],
    }
    c = wg.choose_method(by, choose, report)
    assert c["chosen"] == "narrow"  # 75 % on its half is nearer 90 % than wide's 0 %
    assert c["held_out"]["coverage_90"] == 0.0 and c["held_out"]["pairs"] == len(report)
    assert c["held_out_by_method"]["wide"]["coverage_90"] == 1.0
    # rewriting the report half's rows changes the reported numbers, never the choice
    by["narrow"] = [r if r["policy"] in choose else _row(r["policy"], True) for r in by["narrow"]]
    c2 = wg.choose_method(by, choose, report)
    assert c2["chosen"] == "narrow" and c2["held_out"]["coverage_90"] == 1.0


def _declared_row(policy: str, kpi: str, twin: float, real: float, lo: float, hi: float) -> dict:
    return {"policy": policy, "kpi": kpi, "twin_change": twin, "real_change": real, "interval": [lo, hi],
            "covered": lo <= real <= hi, "out_of_support": 0.01, "verdict": "ok"}


def test_declared_kpis_are_summarised_and_every_miss_is_a_finding() -> None:
    wg = _module()
    rows = [_declared_row("a", "kpi.revenue", -0.10, 0.20, -0.2, 0.0),  # missed by 30 points
            _declared_row("b", "kpi.revenue", 0.05, 0.06, 0.0, 0.1),
            _declared_row("a", "kpi.energy_j", 0.10, 0.12, 0.0, 0.2),
            _declared_row("a", "return", 0.5, -0.5, 0.4, 0.6)]  # not declared: left out
    d = wg.declared_kpi_summary(rows, ["kpi.revenue", "kpi.energy_j"])
    assert d["n"] == 3 and d["coverage"] == pytest.approx(2 / 3)
    assert d["per_kpi"]["kpi.revenue"]["mean_signed_error_points"] == pytest.approx((-30 - 1) / 2)
    assert [(f["policy"], f["kpi"]) for f in d["findings"]] == [("a", "kpi.revenue")]
    text = "\n".join(wg._declared_lines({"logging": "random", "declared_kpis": d}))
    assert "| a | kpi.revenue | +20.0 % | -10.0 % [-20.0, +0.0]" in text and "Coverage 67 % of 3" in text
    assert wg._declared_lines({"logging": "random"}) == []
