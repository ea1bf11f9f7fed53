"""The closed-loop page's hand-written analysis of the extended canaries says what
docs/benchmarks/closed_loop/results_production.json's ``extended`` key says (static, fast)."""

from __future__ import annotations

import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs/benchmarks/closed_loop/README.md"


def _text() -> str:
    page = PAGE.read_text()
    return " ".join(page[page.index("### What the extension says"):].split())


def test_the_extension_analysis_numbers_are_the_runs() -> None:
    ext = json.loads((ROOT / "docs/benchmarks/closed_loop/results_production.json").read_text())["extended"]
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
    assert f"{cand['verdict_rate']['k']} of {cand['verdict_rate']['n']} candidates promoted or refused" in text
    assert f"{b['twin_canary_agent_steps']:,} candidate agent-steps" in text
    assert f"{ext['canary_steps_ratio_lower_bound']:.2f}× the loop's" in text and ext["canary_steps_ratio"] is None
