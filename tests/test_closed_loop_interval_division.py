"""The closed-loop page's interval-division rerun at 1,000 groups: its hand-written numbers are the stored run's
(results_production.json's ``extended_fleet_control_interval_division``) and the stored day-term run's."""

from __future__ import annotations

import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PAGE = (ROOT / "docs" / "benchmarks" / "closed_loop" / "README.md").read_text()
RES = json.loads((ROOT / "docs" / "benchmarks" / "closed_loop" / "results_production.json").read_text())


def _sub() -> str:
    text = PAGE.split("### What the fleet control says (interval_division)", 1)[1]
    return " ".join(text.split("\n## ", 1)[0].split())


def test_the_subsection_quotes_the_rerun_and_the_run_before() -> None:
    new = RES["extended_fleet_control_interval_division"]["by_fleet_size"]["1000"]
    old = RES["day_term_by_fleet_size"]["by_fleet_size"]["1000"]
    sub = _sub()
    assert f"**{new['canary_decided']} of {new['open_after_twin']} open pairs decided" in sub
    assert f"{new['canary_agreeing']} of {new['canary_decided']} right" in sub
    assert f"the delta method's run: {old['canary_decided']} of {old['open_after_twin']}, {old['canary_agreeing']} of " \
           f"{old['canary_decided']} right" in sub
    old_steps = RES["extended_fleet_control_day_term"]["by_fleet_size"]["1000"]["twin_canary_agent_steps"]
    assert f"{new['twin_canary_agent_steps']:,} canary agent-steps against {old_steps:,}" in sub
    assert f"{old_steps:,} canary agent-steps)" in sub


def test_the_pairs_it_names_moved_and_no_other() -> None:
    """Every pair whose verdict differs between the two runs' seed files is one the subsection names."""
    moved = []
    for s in (0, 1, 2):
        d = {}
        for name in ("extended_fc_day_term_seed", "extended_fc_interval_division_seed"):
            doc = json.loads((ROOT / "docs" / "benchmarks" / "closed_loop" / "scale" / f"{name}{s}.json").read_text())
            d[name] = {(p["policy"], p["kpi"]): p["twin_canary"] for p in doc["by_fleet_size"]["1000"]["pairs"]}
        a, b = d["extended_fc_day_term_seed"], d["extended_fc_interval_division_seed"]
        moved += [(s, k, a[k], b[k]) for k in a if a[k] != b[k]]
    assert len(moved) == 7, moved
    kpis = {(s, k[1]) for s, k, _, _ in moved}
    assert kpis == {(0, "kpi.slo_violation"), (1, "kpi.carbon_g"), (1, "kpi.energy_j"), (2, "kpi.carbon_g"),
                    (2, "kpi.task_time_ms"), (2, "reward"), (2, "response.offload_ratio")}  # fmt: skip


def test_the_readme_quotes_the_rerun() -> None:
    new = RES["extended_fleet_control_interval_division"]["by_fleet_size"]["1000"]
    readme = " ".join((ROOT / "README.md").read_text().split())
    lo, hi = new["canary_verdict_rate_ci"]
    assert (f"rerun at 1,000 groups with interval division, the canaries decide {100 * new['canary_verdict_rate']:.1f} % "
            f"[{100 * lo:.1f} %, {100 * hi:.1f} %] of the open pairs, {new['canary_agreeing']} of those "
            f"{new['canary_decided']} verdicts right") in readme  # fmt: skip
