"""The closed-loop page's "What the fleet control says" quotes results_production.json's
``extended_fleet_control`` (the 1,000-group extended loop with the rest of the fleet as control)."""

from __future__ import annotations

import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_the_fleet_control_analysis_numbers_are_the_run() -> None:
    res = json.loads((ROOT / "docs/benchmarks/closed_loop/results_production.json").read_text())
    fc, old = res["extended_fleet_control"]["by_fleet_size"]["1000"], res["extended"]["by_fleet_size"]["1000"]
    page = (ROOT / "docs/benchmarks/closed_loop/README.md").read_text()
    text = " ".join(page[page.index("### What the fleet control says"):].split())

    def ci(b: dict, key: str) -> str:
        return f"[{100 * b[key][0]:.1f}, {100 * b[key][1]:.1f}]"

    assert (f"decided {fc['canary_decided']} of the {fc['open_after_twin']} pairs the twin alone left open at 1,000 "
            f"groups ({100 * fc['canary_verdict_rate']:.1f} % {ci(fc, 'canary_verdict_rate_ci')}") in text
    assert f"above: {old['canary_decided']}, {100 * old['canary_verdict_rate']:.1f} % {ci(old, 'canary_verdict_rate_ci')}" in text
    assert f"({fc['twin_canary_agent_steps']:,} against {old['twin_canary_agent_steps']:,})" in text
    assert (f"{fc['canary_agreeing']} of the {fc['canary_decided']} agree with the truth "
            f"({100 * fc['confident_agreement']:.1f} % {ci(fc, 'agreement_ci')}") in text
    assert fc["canary_decided"] - fc["canary_agreeing"] == 2 and "The two wrong" in text
    curve = ", ".join(f"{100 * d['verdict_rate']['rate']:.1f} % after {'day ' if i == 0 else ''}{d['day']}"
                      for i, d in enumerate(fc["by_day"]))
    assert curve in text
    cand = fc["candidate_verdicts"]
    assert f"{cand['verdict_rate']['k']} of {cand['verdict_rate']['n']}, all right" in text
    assert cand["agreement"]["k"] == cand["verdict_rate"]["k"]
    n_open = sum(w["open"] for w in fc["why_open"])
    assert n_open == fc["open_after_twin"] - fc["canary_decided"]
    assert f"{n_open} pairs stay open" in text and f"on {sum(w['floor'] for w in fc['why_open'])} of the {n_open}" in text
    assert sum(w["dominant"]["own"] for w in fc["why_open"]) > n_open / 2  # "the group split still dominates most"
    assert sum(w["days_16"] for w in fc["why_open"]) == 0 and "the day-to-day term blocks none" in text
    lev = page[page.index("### What the levers say"):page.index("## Extended canaries with the rest of the fleet")]
    head = res["day_term_by_fleet_size"]["by_fleet_size"]["1000"]  # the same loop with the day term and stopped-day rule
    assert (f"the day term and the same stopped-day rule reaches {100 * head['canary_verdict_rate']:.1f} % "
            f"({head['canary_decided']} of {head['open_after_twin']}) after 16 days") in " ".join(lev.split())
    assert (f"the {100 * fc['canary_verdict_rate']:.1f} % of the next section was measured before the stopped-day rule "
            "and the day term") in " ".join(lev.split())
    # the headline before the day term (quoted by README.md) stays the slice-control loop's
    assert res.get("before_day_term", res)["by_fleet_size"]["1000"]["canary_verdict_rate"] == old["canary_verdict_rate"]


def test_canary_doc_quotes_the_fleet_control_run() -> None:
    res = json.loads((ROOT / "docs/benchmarks/closed_loop/results_production.json").read_text())
    fc = res["extended_fleet_control"]["by_fleet_size"]["1000"]
    text = " ".join((ROOT / "docs/canary.md").read_text().split())
    assert (f"{100 * fc['canary_verdict_rate']:.1f} % of the open pairs decided, {fc['canary_agreeing']} of "
            f"{fc['canary_decided']} right") in text
