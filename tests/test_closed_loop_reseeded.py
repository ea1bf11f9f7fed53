"""The closed-loop page's "What the fleet control says (reseeded)" quotes results_production.json's
``extended_fleet_control_reseeded`` (the fleet-control extended loop rerun after the replay-stream fix)
beside the stored ``extended_fleet_control``."""

from __future__ import annotations

import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _curve_and_candidates(b: dict, text: str) -> None:
    """The page quotes the run's rate by day and its candidates promoted or refused, all right."""
    assert ", ".join(f"{100 * d['verdict_rate']['rate']:.1f} % after {'day ' if i == 0 else ''}{d['day']}"
                     for i, d in enumerate(b["by_day"])) in text
    cand = b["candidate_verdicts"]
    assert f"{cand['verdict_rate']['k']} of {cand['verdict_rate']['n']}" in text and ", all right" in text
    assert cand["agreement"]["k"] == cand["verdict_rate"]["k"]


def _changed(stored: str, rerun: str) -> int:
    """(candidate, KPI) pairs whose loop verdict differs between the stored seed files and the rerun's."""
    changed = 0
    for s in (0, 1, 2):
        a, b = (json.loads((ROOT / f"docs/benchmarks/closed_loop/scale/{n}{s}.json").read_text())["by_fleet_size"]["1000"]["pairs"]
                for n in (stored, rerun))  # fmt: skip
        va = {(p["policy"], p["column"]): p["twin_canary"] for p in a}
        changed += sum(va[(p["policy"], p["column"])] != p["twin_canary"] for p in b)
    return changed


def test_the_reseeded_fleet_control_analysis_quotes_its_run() -> None:
    res = json.loads((ROOT / "docs/benchmarks/closed_loop/results_production.json").read_text())
    new, old = (res[k]["by_fleet_size"]["1000"] for k in ("extended_fleet_control_reseeded", "extended_fleet_control"))
    page = (ROOT / "docs/benchmarks/closed_loop/README.md").read_text()
    start = page.index("### What the fleet control says (reseeded)")
    text = " ".join(page[start:page.find("\n## ", start) if "\n## " in page[start:] else None].split())

    def rate(b: dict) -> str:
        lo, hi = (100 * x for x in b["canary_verdict_rate_ci"])
        return f"{100 * b['canary_verdict_rate']:.1f} % [{lo:.1f}, {hi:.1f}]"

    assert f"decided {new['canary_decided']} of the {new['open_after_twin']} open pairs ({rate(new)}; the stored run: " \
           f"{old['canary_decided']}, {rate(old)}" in text
    lo, hi = (100 * x for x in new["agreement_ci"])
    assert f"{new['canary_agreeing']} of the {new['canary_decided']} right ({100 * new['confident_agreement']:.1f} % [{lo:.1f}, {hi:.1f}]" in text
    _curve_and_candidates(new, text)
    assert f"{new['twin_canary_agent_steps']:,} canary agent-steps ({old['twin_canary_agent_steps']:,} stored)" in text
    assert new["canary_decided"] - new["canary_agreeing"] == 2
    # "Four pairs changed verdict": counted from the two runs' per-pair verdicts
    changed = _changed("extended_fc_seed", "extended_fc_reseeded_seed")
    assert changed == 4 and "Four pairs changed verdict" in text
    st = new["steps"]
    assert st["ratio"] is None and f"not reached (≥ {st['lower_bound']:.2f}×)" in text
    same = st["same_canaries"]["canary_alone"]
    assert f"decides {same['verdict_rate']['k']} of 84 but only {same['agreement']['k']} of those right " \
           f"({100 * same['agreement']['rate']:.1f} %)" in text


def test_the_reseeded_slice_control_analysis_quotes_its_run() -> None:
    res = json.loads((ROOT / "docs/benchmarks/closed_loop/results_production.json").read_text())
    new, old = (res[k]["by_fleet_size"]["1000"] for k in ("extended_reseeded", "extended"))
    page = (ROOT / "docs/benchmarks/closed_loop/README.md").read_text()
    start = page.index("### What the extension says (reseeded)")
    end = page.find("\n## ", start)
    text = " ".join(page[start:end if end > 0 else None].split())

    def ci(b: dict, key: str) -> str:
        return f"[{100 * b[key][0]:.1f}, {100 * b[key][1]:.1f}]"

    assert (f"{new['canary_decided']} of {new['open_after_twin']} open pairs decided ({100 * new['canary_verdict_rate']:.1f} % "
            f"{ci(new, 'canary_verdict_rate_ci')}; the stored run, whose replays shared one stream: {old['canary_decided']}, "
            f"{100 * old['canary_verdict_rate']:.1f} % {ci(old, 'canary_verdict_rate_ci')}") in text
    assert (f"{new['canary_agreeing']} of the {new['canary_decided']} right ({100 * new['confident_agreement']:.1f} % "
            f"{ci(new, 'agreement_ci')}; stored: {old['canary_agreeing']} of {old['canary_decided']})") in text
    _curve_and_candidates(new, text)
    assert f"{new['twin_canary_agent_steps']:,} canary agent-steps (stored: {old['twin_canary_agent_steps']:,}" in text
    changed = _changed("extended_seed", "extended_reseeded_seed")
    assert changed == 5 and "Five pairs changed verdict" in text
    st = new["steps"]
    assert st["ratio"] is None and f"not reached (≥ {st['lower_bound']:.2f}×)" in text
    # the headline README.md quotes (before the day term) stays the stored run's
    assert res.get("before_day_term", res)["by_fleet_size"]["1000"]["canary_verdict_rate"] == old["canary_verdict_rate"]
