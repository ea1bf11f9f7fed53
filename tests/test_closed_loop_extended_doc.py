"""The closed-loop page's hand-written analysis of the extended canaries says what
docs/benchmarks/closed_loop/results_production.json's ``extended`` key says (static, fast)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs/benchmarks/closed_loop/README.md"


def _text() -> str:
    page = PAGE.read_text()
    return " ".join(page[page.index("### What the extension says"):].split())


def _ext() -> dict[str, Any]:
    return json.loads((ROOT / "docs/benchmarks/closed_loop/results_production.json").read_text())["extended"]


def test_the_extension_analysis_numbers_are_the_runs() -> None:
    ext = _ext()
    b = ext["by_fleet_size"]["1000"]
    text = _text()
    lo, hi = (100 * x for x in b["canary_verdict_rate_ci"])
    assert (f"decided {b['canary_decided']} of the {b['open_after_twin']} pairs the twin alone left open "
            f"({100 * b['canary_verdict_rate']:.1f} % [{lo:.1f}, {hi:.1f}]") in text  # fmt: skip
    days = b["by_day"]
    assert days[-1]["day"] == ext["max_days"] == 16 and [d["day"] for d in days] == ext["looks"]
    curve = ", ".join(f"{100 * d['verdict_rate']['rate']:.1f} % after {'day ' if i == 0 else ''}{d['day']}"
                      for i, d in enumerate(days))  # fmt: skip
    assert curve in text
    assert b["canary_agreeing"] == b["canary_decided"] and f"All {b['canary_decided']} agree" in text
    assert f"lower bound {100 * b['agreement_ci'][0]:.1f} %" in text
    cand = b["candidate_verdicts"]
    assert cand["agreement"]["k"] == cand["verdict_rate"]["k"]
    assert f"{cand['verdict_rate']['k']} of {cand['verdict_rate']['n']}, all right" in text
    assert f"{b['twin_canary_agent_steps']:,} candidate agent-steps" in text
    assert f"{ext['canary_steps_ratio_lower_bound']:.2f}× the loop's" in text and ext["canary_steps_ratio"] is None
    small = ext["by_fleet_size"]["100"]
    assert f"{small['canary_decided']} of {small['open_after_twin']} = {100 * small['canary_verdict_rate']:.1f} %" in text
    # every loop taken from the earlier run is one whose rerun path this change does not touch, and the
    # loops rerun afresh gave what the earlier run had
    assert not ext["reuse_check"]["differing"] and len(ext["reuse_check"]["identical"]) >= 1
    assert f"{len(ext['reuse_check']['identical'])} loops rerun afresh gave identical verdicts" in text


def test_why_the_pairs_stay_open_is_the_table_s() -> None:
    ext = _ext()
    text = _text()
    why = {n: ext["by_fleet_size"][n]["why_open"] for n in ("100", "1000")}
    big = why["1000"]
    with_terms = sum(w["with_terms"] for w in big)
    own = sum(w["dominant"]["own"] for w in big)
    floor = sum(w["floor"] for w in big)
    assert f"it dominates {own} of the {with_terms} open pairs with terms" in text
    assert f"alone it reaches the gap on {floor} of the {with_terms}" in text
    sd = sorted(w["median"]["day_one_sd"] for w in big if w["with_terms"])
    assert f"one day's spread of the fleet-wide change is {100 * sd[0]:.1f}-{100 * sd[-1]:.1f} % of the baseline" in text
    assert max(sd) < 0.05  # at 1,000 groups the day-to-day spread is far inside the 5 % margin
    small = why["100"]
    assert (f"reaches the gap after 16 days on {sum(w['days_16'] for w in small)} of the "
            f"{sum(w['with_terms'] for w in small)} open pairs with terms") in text  # fmt: skip


def test_both_arms_of_the_steps_comparison_on_the_same_canaries() -> None:
    same = _ext()["by_fleet_size"]["1000"]["steps"]["same_canaries"]
    ca, lp = same["canary_alone"], same["loop"]
    assert ca["agent_steps"] == lp["agent_steps"]  # counted alike: the same canaries
    text = _text()
    assert (f"canary alone decides {ca['verdict_rate']['k']} of {same['pairs']} pairs but {ca['agreement']['k']} of "
            f"those right ({100 * ca['agreement']['rate']:.1f} %), the loop {lp['verdict_rate']['k']} at "
            f"{100 * lp['agreement']['rate']:.0f} %") in text  # fmt: skip
