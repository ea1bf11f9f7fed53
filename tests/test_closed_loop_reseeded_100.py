"""The 100-group rerun of the extended loop after the replay-stream fix (results_production.json's
``extended_reseeded.by_fleet_size["100"]``): the page's bullet and the at-a-glance line quote it, beside the
stored 100-group run (``by_fleet_size["100"]``) and the 1,000-group rerun."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs/benchmarks/closed_loop"


def _pct(x: float) -> str:
    return f"{100 * x:.1f} %"


def _ci(ci: list[float]) -> str:
    return f"[{100 * ci[0]:.1f}, {100 * ci[1]:.1f}]"


def _changed() -> list[tuple[int, str, str, str, str, Any]]:
    out = []
    for s in (0, 1, 2):
        a, b = (json.loads((DOCS / f"scale/{n}{s}.json").read_text())["by_fleet_size"]["100"]["pairs"]
                for n in ("extended_seed", "extended_reseeded_seed"))  # fmt: skip
        va = {(p["policy"], p["column"]): p["twin_canary"] for p in a}
        out += [(s, p["policy"], p["column"], va[(p["policy"], p["column"])], p["twin_canary"], p["truth_regress"])
                for p in b if va[(p["policy"], p["column"])] != p["twin_canary"]]  # fmt: skip
    return out


def test_the_100_group_rerun_is_quoted_on_the_page_and_at_a_glance() -> None:
    res = json.loads((DOCS / "results_production.json").read_text())
    new, old = res["extended_reseeded"]["by_fleet_size"]["100"], res.get("before_day_term", res)["by_fleet_size"]["100"]
    big = res["extended_reseeded"]["by_fleet_size"]["1000"]
    page = (DOCS / "README.md").read_text()
    start = page.index("- **At 100 groups, rerun the same way")
    text = " ".join(page[start:page.index("\n## ", start)].split())
    assert new["seeds"] == old["seeds"] == [0, 1, 2] and new["pairs"] == old["pairs"] == 84
    assert (f"{new['canary_decided']} of {new['pairs']} open pairs decided ({_pct(new['canary_verdict_rate'])} "
            f"{_ci(new['canary_verdict_rate_ci'])}; stored: {old['canary_decided']}, {_pct(old['canary_verdict_rate'])})") in text
    assert new["canary_agreeing"] == new["canary_decided"]  # "all ... right"
    assert f"all {new['canary_agreeing']} right ({_pct(new['confident_agreement'])} {_ci(new['agreement_ci'])}; " \
        f"stored: {old['canary_agreeing']} of {old['canary_decided']})" in text
    days = new["by_day"]
    assert f"{_pct(days[0]['verdict_rate']['rate'])} after day 1" in text and len(days) == 5
    assert f"{new['twin_canary_agent_steps']:,} canary agent-steps (stored {old['twin_canary_agent_steps']:,})" in text
    cv, ocv = new["candidate_verdicts"], old["candidate_verdicts"]
    assert f"{cv['verdict_rate']['k']} of 12, all right (stored {ocv['verdict_rate']['k']} of 12)" in text
    assert cv["agreement"]["k"] == cv["verdict_rate"]["k"]
    changed = _changed()
    assert "Three pairs changed verdict, all seed 2" in text and len(changed) == 3 and {c[0] for c in changed} == {2}
    assert (2, "slo-aware heuristic", "kpi.energy_j", "ok", "straddle", True) in changed  # the wrong *ok* dropped
    assert f"({_pct(new['canary_verdict_rate'])} at 100 groups, {_pct(big['canary_verdict_rate'])} at 1,000)" in text
    readme = (ROOT / "docs/benchmarks/README.md").read_text().splitlines()
    (line,) = [x for x in readme if "extended_reseeded.by_fleet_size.100.canary_verdict_rate" in x]
    assert f"{new['canary_agreeing']} of {new['canary_decided']} verdicts right" in line
    lo, hi = new["agreement_ci"]
    assert f"[{100 * lo:.1f} %, {100 * hi:.0f} %]" in line and hi == 1.0
    assert f"the {_pct(old['canary_verdict_rate'])} above" in line and f"{len(changed)} pairs changed verdict" in line
    assert f"1,000 groups rerun: {_pct(big['canary_verdict_rate'])})" in line
