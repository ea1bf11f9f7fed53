"""The 1,000-group fleet-control loop rerun on the one-day day-term bound (issue 48, session 13): the page's
hand-written subsection and the README quote the stored run (results_production.json's
``extended_fleet_control_day_bound``), and every pair whose verdict moved against the interval-division run is one
the subsection names."""

from __future__ import annotations

import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PAGE = (ROOT / "docs" / "benchmarks" / "closed_loop" / "README.md").read_text()
RES = json.loads((ROOT / "docs" / "benchmarks" / "closed_loop" / "results_production.json").read_text())
SCALE = ROOT / "docs" / "benchmarks" / "closed_loop" / "scale"


def _sub() -> str:
    text = PAGE.split("### What the fleet control says (day_bound)", 1)[1]
    return " ".join(text.split("\n## ", 1)[0].split())


def _verdicts(prefix: str) -> dict[tuple[int, str, str], str]:
    out = {}
    for s in (0, 1, 2):
        doc = json.loads((SCALE / f"{prefix}{s}.json").read_text())
        out.update({(s, p["policy"], p["kpi"]): p["twin_canary"] for p in doc["by_fleet_size"]["1000"]["pairs"]})
    return out


def test_the_subsection_quotes_the_rerun_and_the_run_before() -> None:
    new = RES["extended_fleet_control_day_bound"]["by_fleet_size"]["1000"]
    old = RES["extended_fleet_control_interval_division"]["by_fleet_size"]["1000"]
    sub = _sub()
    assert f"**{new['canary_decided']} of {new['open_after_twin']} open pairs decided" in sub
    assert f"{new['canary_agreeing']} of {new['canary_decided']} right" in sub
    assert f"the interval-division run: {old['canary_decided']} of {old['open_after_twin']}, " \
           f"{old['canary_agreeing']} of {old['canary_decided']} right" in sub
    assert f"{new['twin_canary_agent_steps']:,} canary agent-steps against {old['twin_canary_agent_steps']:,}" in sub


def test_the_pairs_it_names_are_the_pairs_that_moved() -> None:
    """Every pair whose verdict differs between the two runs' seed files is named in the subsection (by seed,
    candidate and KPI), and the subsection's count of moved pairs is theirs."""
    a, b = _verdicts("extended_fc_interval_division_seed"), _verdicts("extended_fc_day_bound_seed")
    moved = sorted(k for k in a if a[k] != b[k])
    sub = _sub()
    assert f"{len(moved)} pairs moved" in sub
    for s, policy, kpi in moved:
        assert f"seed {s}, {policy}, `{kpi}`: {a[(s, policy, kpi)]} -> {b[(s, policy, kpi)]}" in sub, (s, policy, kpi)


def test_the_readme_quotes_the_rerun() -> None:
    new = RES["extended_fleet_control_day_bound"]["by_fleet_size"]["1000"]
    readme = " ".join((ROOT / "README.md").read_text().split())
    lo, hi = new["canary_verdict_rate_ci"]
    assert (f"Rerun at 1,000 groups with the one-day bound, the fleet-as-control canaries decide "
            f"{100 * new['canary_verdict_rate']:.1f} % [{100 * lo:.1f} %, {100 * hi:.1f} %] of the open pairs, "
            f"{new['canary_agreeing']} of those {new['canary_decided']} verdicts right") in readme  # fmt: skip


def test_the_readme_bound_is_the_function_it_names() -> None:
    """The README's formula for the one-day bound is what `unrevealed_day_bound` computes."""
    from edgetwin.loop.day_bound import unrevealed_day_bound

    readme = " ".join((ROOT / "README.md").read_text().split())
    assert "var(level) x (1 + (c/b)^2)" in readme and "`edgetwin.loop.day_bound.unrevealed_day_bound`" in readme
    level_var, b, change = 0.04, 2.0, 1.0  # c = b + change = 3
    assert abs(unrevealed_day_bound(level_var, b, change) - level_var * (1 + (3.0 / 2.0) ** 2)) < 1e-12
