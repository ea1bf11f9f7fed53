"""The levers experiment's counting (benchmarks/_closed_loop_levers.py, issue 48): per lever, the day-1
verdicts on the pairs the twin alone left open, scored against the 20-day truth with Clopper-Pearson
intervals; the terms medians over the pairs the loop's own estimate left open; the section renders them."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def lev() -> Iterator[Any]:
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import _closed_loop_levers

    yield _closed_loop_levers
    sys.path.remove(str(ROOT / "benchmarks"))


def _v(verdict: str, own: float, interference: float, gap: float) -> dict[str, Any]:
    return {"verdict": verdict, "by": "interval", "change": 0.0, "interval": [0.0, 0.0], "half": own + interference,
            "gap": gap, "df": 30.0, "own": own, "interference": interference, "shared": interference, "day": 0.0}


def _docs(lev: Any) -> tuple[list[dict[str, Any]], dict[int, dict[str, Any]]]:
    keys = [lv[0] for lv in lev.LEVERS]
    # two open pairs of one candidate: the loop decides neither, the fleet control decides both (one wrongly)
    levers = {k: {"a": _v("straddle", 0.2, 0.1, 0.05), "b": _v("straddle", 0.1, 0.01, 0.05)} for k in keys}
    levers["fleet_control"] = {"a": _v("ok", 0.05, 0.01, 0.1), "b": _v("regress", 0.05, 0.01, 0.1)}
    doc = {"seed": 0, "n": 1000, "level": 0.98, "candidates": {"c": {
        "levers": levers, "extended_day1": {"a": "straddle", "b": "straddle"}, "seconds": 60.0,
        "switchback": {"fits": False, "why": "buys 0 blocks"}}}}
    ext = {"by_fleet_size": {"1000": {"pairs": [
        {"policy": "c", "column": "a", "twin_alone": "straddle", "truth_regress": False, "truth_change": 0.01},
        {"policy": "c", "column": "b", "twin_alone": "straddle", "truth_regress": False, "truth_change": 0.02},
        {"policy": "c", "column": "z", "twin_alone": "ok", "truth_regress": False, "truth_change": 0.0},
    ]}}}
    return [doc], {0: ext}


def test_merge_scores_each_lever_on_the_pairs_the_twin_left_open(lev: Any) -> None:
    docs, ext = _docs(lev)
    res = lev.merge_levers(docs, ext)
    assert res["pairs_open_after_twin"] == 2  # the twin alone's decided pair is not the canaries'
    loop, fleet = res["by_lever"]["loop"], res["by_lever"]["fleet_control"]
    assert loop["verdict_rate"]["k"] == 0 and fleet["verdict_rate"]["k"] == 2
    assert fleet["agreement"]["k"] == 1 and len(fleet["wrong"]) == 1 and "regress" in fleet["wrong"][0]
    lo, hi = fleet["agreement"]["ci"]
    assert lo < 0.5 < hi
    # terms over the pairs the loop left open (both): the interference reaches the gap on pair a only
    assert loop["on_loop_open"]["pairs"] == 2 and loop["on_loop_open"]["interference_reaches_gap"] == 1
    assert res["loop_reproduces_extended_day1"] == {"pairs": 2, "same_verdict": 2, "stopped_pairs_left_out": 0}
    assert res["switchback"][0]["fits"] is False


def test_a_first_day_a_stop_cut_short_is_judged_by_the_loops_rule(lev: Any) -> None:
    """Issue 48: the levers judge a guard-stopped first day as the loop does (`_stop_rule` calls
    `edgetwin.loop.day_verdict.stopped_verdict`): the guard's KPI *regress* by the guard, every other
    KPI open — here "b", which its 8 ticks called *regress* and the 20-day truth calls unchanged; the
    stored run's verdicts are kept (`rejudge_stored`); the pooled counts leave its widths out."""
    docs, ext = _docs(lev)
    c = docs[0]["candidates"]["c"]
    c.update(stop="guard", guard_kpi="a", ticks_ran=8, plan={"hours": 23.0})
    c["levers"]["fleet_control"]["b"] = _v("regress", 0.05, 0.01, 0.1)  # wrong on the ticks it ran
    ext[0]["by_fleet_size"]["1000"]["pairs"][0].update(truth_regress=True, truth_change=0.2)  # "a" truly regresses
    before = lev.merge_levers(docs, ext)["by_lever"]["fleet_control"]
    assert before["verdict_rate"]["k"] == 2 and len(before["wrong"]) == 2  # "a" ok and "b" regress, both wrong
    doc = lev.rejudge_stored(docs[0])
    for key, lv in c["levers"].items():
        assert lv["a"]["verdict"] == "regress" and lv["a"]["by"] == "guard", key
        assert lv["b"]["verdict"] == "open" and lv["b"]["by"] == "stop", key
    assert lv["b"]["half"] == 0.11  # its estimate on the ticks it ran, kept for the record
    assert c["levers"]["fleet_control"]["b"]["on_ticks"] == "regress" and c["ticks_planned"] == 92
    assert c["before_stopped_day"]["fleet_control"] == {"a": "ok", "b": "regress"}
    res = lev.merge_levers([doc], ext)
    fc = res["by_lever"]["fleet_control"]
    assert fc["verdict_rate"]["k"] == 1 and fc["wrong"] == [] and fc["open_by_stop"] == 1
    assert res["by_lever"]["loop"]["on_loop_open"]["pairs"] == 0  # "b" open by the stop: no width of a day
    assert res["loop_reproduces_extended_day1"] == {"pairs": 1, "same_verdict": 0, "stopped_pairs_left_out": 1}
    assert lev.rejudge_stored(doc) == doc  # once: the verdicts before are not overwritten
    text = lev.levers_section(res, ["cmd"])
    assert "judged by the loop's stopped-day rule (`edgetwin.loop.day_verdict.stopped_verdict`)" in text
    assert "(1 pairs per lever" in text


def test_section_shows_every_lever_and_the_switchback(lev: Any) -> None:
    docs, ext = _docs(lev)
    res = lev.merge_levers(docs, ext)
    text = lev.levers_section(res, ["python benchmarks/closed_loop.py --levers --seed 0"])
    assert text.startswith(lev.SECTION)
    for key in res["by_lever"]:
        assert f"| {lev.LEVER_TEXT[key]} |" in text
    assert "2/2 = 100.0 %" in text and "1/2 = 50.0 %" in text
    assert "fits for 0 of 1 candidates" in text and "- does not fit: buys 0 blocks (seed 0 c)" in text


def test_canary_doc_fleet_control_numbers_are_the_1000_group_design_table() -> None:
    """docs/canary.md's widths and coverages of the fleet as control at 1,000 groups are the stored
    design table's (results_production.json ``designs_by_fleet_size``)."""
    import json

    res = json.loads((ROOT / "docs/benchmarks/closed_loop/results_production.json").read_text())
    d = res["designs_by_fleet_size"]["1000"]["designs"]
    text = " ".join((ROOT / "docs/canary.md").read_text().split())
    rnd, fc, arm = (d[k]["aa"] for k in ("random + CUPED (default)", "fleet control + CUPED",
                                          "fleet control + CUPED slope per arm"))
    assert (f"from {100 * rnd['median_width']:.1f} to {100 * fc['median_width']:.1f} points "
            f"({100 * arm['median_width']:.1f} with per-arm slopes)") in text
    covs = [100 * d[k][t]["coverage"] for k in ("fleet control + CUPED", "fleet control + CUPED slope per arm")
            for t in ("aa", "regressing")]
    assert f"at {min(covs):.1f}-{max(covs):.1f} % coverage of 90 %" in text
    assert fc["median_width"] < rnd["median_width"]


def test_the_levers_analysis_numbers_are_the_runs() -> None:
    """The closed-loop page's "What the levers say" quotes results_production.json's ``levers``."""
    import json

    lev = json.loads((ROOT / "docs/benchmarks/closed_loop/results_production.json").read_text())["levers"]
    page = (ROOT / "docs/benchmarks/closed_loop/README.md").read_text()
    text = " ".join(page[page.index("### What the levers say"):].split())
    b = lev["by_lever"]

    def pct(key: str) -> str:
        return f"{100 * b[key]['verdict_rate']['rate']:.1f} %"

    n = lev["pairs_open_after_twin"]
    assert (f"from {b['loop']['verdict_rate']['k']} to {b['fleet_control']['verdict_rate']['k']} of {n} "
            f"({pct('loop')} → {pct('fleet_control')})") in text
    fa = b["fleet_control_per_arm"]
    lo, hi = (100 * x for x in fa["verdict_rate"]["ci"])
    assert f"to {fa['verdict_rate']['k']} ({pct('fleet_control_per_arm')} [{lo:.1f}, {hi:.1f}]), {fa['agreement']['k']} of the" in text
    lo_open, fa_open = b["loop"]["on_loop_open"], fa["on_loop_open"]
    assert (f"from {100 * lo_open['median_half']:.1f} % to {100 * fa_open['median_half']:.1f} % of the baseline, its "
            f"group-split term from {100 * lo_open['median_own']:.1f} % to {100 * fa_open['median_own']:.1f} %") in text
    sp = b["slice_per_arm"]
    assert f"it decides {sp['verdict_rate']['k']} but only {sp['agreement']['k']} right ({100 * sp['agreement']['rate']:.1f} %" in text
    m3, m5 = b["members5_first3"], b["members5"]
    assert (f"from {100 * m3['on_loop_open']['median_interference']:.1f} % to {100 * m5['on_loop_open']['median_interference']:.1f} %"
            f" of the baseline, the pairs on which it alone reaches the gap from {m3['on_loop_open']['interference_reaches_gap']} "
            f"to {m5['on_loop_open']['interference_reaches_gap']} of {m5['on_loop_open']['pairs']}, and the day-1 verdicts "
            f"from {m3['verdict_rate']['k']} to {m5['verdict_rate']['k']}") in text  # fmt: skip
    assert m5["on_loop_open"]["median_interference"] > m3["on_loop_open"]["median_interference"]
    assert lev["switchback_fits"] == 0 and f"no block at all for any of the {len(lev['switchback'])} candidates" in text
    assert f"on {lo_open['interference_reaches_gap']} of the {lo_open['pairs']} pairs the loop's day 1 left open" in text


def test_the_levers_stopped_day_bullet_is_the_runs() -> None:
    """"What the levers say"'s stopped-day bullet quotes results_production.json: the stopped first
    days (the stored seed files), the open pairs per lever and the rows before the rule."""
    import json

    res = json.loads((ROOT / "docs/benchmarks/closed_loop/results_production.json").read_text())
    lev, before = res["levers"]["by_lever"], res["levers_before_stopped_day"]["by_lever"]
    page = (ROOT / "docs/benchmarks/closed_loop/README.md").read_text()
    text = " ".join(page[page.index("### What the levers say"):].split())
    stopped = []
    for s in (0, 1, 2):
        doc = json.loads((ROOT / f"docs/benchmarks/closed_loop/scale/levers/levers_seed{s}.json").read_text())
        stopped += [(s, n, c["ticks_ran"]) for n, c in doc["candidates"].items() if c["stop"] != "completed"]
        assert all(c["ticks_ran"] < c["ticks_planned"] for c in doc["candidates"].values() if c["stop"] != "completed")
    assert "five of the twelve first-day canaries" in text and len(stopped) == 5
    assert {lv["open_by_stop"] for lv in lev.values()} == {30} and "(30 pairs per lever)" in text
    b = {k: (v["verdict_rate"]["k"], v["agreement"]["k"]) for k, v in before.items()}
    assert (f"the loop's row decided {b['loop'][0]} of 84 ({b['loop'][1]} right), the fleet control with per-arm slopes "
            f"{b['fleet_control_per_arm'][0]} ({b['fleet_control_per_arm'][1]} right), the slice's per-arm slopes "
            f"{b['slice_per_arm'][0]} ({b['slice_per_arm'][1]} right), 5 members with the fleet and per-arm slopes "
            f"{b['members5_fleet_per_arm'][0]} ({b['members5_fleet_per_arm'][1]} right)") in text
    removed = [before[k]["verdict_rate"]["k"] - lev[k]["verdict_rate"]["k"] for k in lev]
    assert f"The rule removed {min(removed)} to {max(removed)} verdicts per row" in text
    assert sum(len(before[k]["wrong"]) - len(lev[k]["wrong"]) for k in lev) == 2
