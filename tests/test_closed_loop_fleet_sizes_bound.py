"""The closed-loop page's verdict rate by fleet size on the one-day bound (benchmarks/_closed_loop_fleetsize_bound.py,
issue 48, session 14): the headline ``by_fleet_size`` moves to it with the headline it replaces kept, the day-term run is
marked superseded, the section is the JSON (regenerated and compared), the JSON is its seed files (recounted), and the
pairs that moved against the day-term run are those its seed files differ on."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from test_closed_loop_fleet_sizes import OUT, ROOT, _results, _section


@pytest.fixture(scope="module")
def fb() -> Iterator[Any]:
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import _closed_loop_fleetsize_bound

    yield _closed_loop_fleetsize_bound
    sys.path.remove(str(ROOT / "benchmarks"))


def test_replace_headline_keeps_the_old_one_once_and_marks_the_day_term_run(fb: Any) -> None:
    steps = {k: 7.0 for k in fb.prior.STEPS_KEYS}
    cur: dict[str, Any] = {fb.RUN_KEY: {"by_fleet_size": {"100": {"r": 1, "per_candidate_rounds": []}, "5000": {"r": 2}},
                                        **steps},
                           "by_fleet_size": {"100": {"r": 0, "design": "old"}, "5000": {"r": 0, "design": "old"}},
                           fb.prior.KEY: {"by_fleet_size": {}}, **{k: 3.0 for k in fb.prior.STEPS_KEYS}}  # fmt: skip
    assert fb.replace_headline(cur)
    assert cur["by_fleet_size"] == {"100": {"r": 1, "design": fb.DESIGN}, "5000": {"r": 2, "design": fb.DESIGN}}
    assert cur[fb.BEFORE_KEY]["by_fleet_size"]["100"]["design"] == "old"
    assert all(cur[k] == 7.0 and cur[fb.BEFORE_KEY][k] == 3.0 for k in fb.prior.STEPS_KEYS)
    assert cur[fb.prior.KEY][fb.prior.SUPERSEDED] == fb.KEY
    assert fb.replace_headline(cur) and cur[fb.BEFORE_KEY]["by_fleet_size"]["100"]["design"] == "old"  # kept once
    short = {fb.RUN_KEY: {"by_fleet_size": {"100": {}}}, "by_fleet_size": {"100": {}, "1000": {}}}
    assert not fb.replace_headline(short) and fb.BEFORE_KEY not in short  # a size missing: nothing moves


def test_changed_pairs_are_the_seed_files_differences(fb: Any, tmp_path: Path) -> None:
    def pair(policy: str, kpi: str, verdict: str, truth: float) -> dict[str, Any]:
        return {"policy": policy, "kpi": kpi, "twin_canary": verdict, "truth_change": truth}

    old = {"seed": 2, "by_fleet_size": {"100": {"pairs": [pair("a", "slo", "ok", 0.01), pair("a", "carbon", "straddle", 0.0),
                                                          pair("b", "slo", "regress", 0.2)], "per_candidate": []}}}  # fmt: skip
    (tmp_path / fb.prior.SEED_FILE.format(s=2)).write_text(json.dumps(old))
    new = {"seed": 2, "by_fleet_size": {"100": {"pairs": [pair("a", "slo", "straddle", 0.01), pair("a", "carbon", "abstain", 0.0),
                                                          pair("b", "slo", "regress", 0.2)], "per_candidate": []}}}  # fmt: skip
    assert fb.changed_pairs({"100": [new]}, tmp_path) == {"100": ["seed 2: a slo ok → straddle (truth +1.0 %)"]}


def test_the_section_is_the_json(fb: Any) -> None:
    from _docs import relink

    cur = _results()
    if fb.KEY not in cur:
        pytest.skip("no day_bound_by_fleet_size yet")
    want = relink(fb.section(cur[fb.KEY]), OUT / "README.md")
    assert _section(fb.SECTION).startswith(want.strip())


def test_the_json_is_its_seed_files_and_the_headline(fb: Any) -> None:
    """``day_bound_by_fleet_size`` recounted from the merged run's seed files, and the headline ``by_fleet_size`` (the
    issue's fields) its entries."""
    cur = _results()
    if fb.KEY not in cur:
        pytest.skip("no day_bound_by_fleet_size yet")
    again = json.loads(json.dumps(fb.fleet_sizes(cur, OUT / "scale")))
    again["headline_replaced"] = cur[fb.KEY]["headline_replaced"]
    assert again == cur[fb.KEY]
    if not cur[fb.KEY]["headline_replaced"]:  # a size the headline holds is missing: the headline is the day-term run's
        assert not set(cur["by_fleet_size"]) <= set(cur[fb.RUN_KEY]["by_fleet_size"])
        assert all(v["design"] == fb.prior.DESIGN for v in cur["by_fleet_size"].values())
        assert fb.BEFORE_KEY not in cur and fb.prior.SUPERSEDED not in cur[fb.prior.KEY]
        return
    assert sorted(cur["by_fleet_size"], key=int) == ["100", "1000", "5000"]
    for n, v in cur["by_fleet_size"].items():
        mine = cur[fb.KEY]["by_fleet_size"][n]
        assert (v["canary_decided"], v["open_after_twin"], v["canary_agreeing"]) == \
            (mine["canary_decided"], mine["open_after_twin"], mine["canary_agreeing"])
        assert v["design"] == fb.DESIGN and v["twin_canary_agent_steps"] == mine["agent_steps"]
        assert cur[fb.BEFORE_KEY]["by_fleet_size"][n]["design"] == fb.prior.DESIGN  # the day-term headline, kept
    assert cur[fb.prior.KEY][fb.prior.SUPERSEDED] == fb.KEY


def _loops(n: str) -> list[dict[str, Any]]:
    return [pc for s in (0, 1, 2) for pc in json.loads((OUT / "scale" / f"extended_fc_day_bound_seed{s}.json").read_text())
            ["by_fleet_size"][n]["per_candidate"]]  # fmt: skip


def test_the_analysis_and_the_readme_quote_the_json(fb: Any) -> None:
    """The hand-written "What the fleet sizes say (one-day bound)" and README's 100-group sentence: the counts, the
    coverage before and after, the pairs that moved, the canary days and the loops' ends, from the JSON and seed files."""
    cur = _results()
    if fb.KEY not in cur:
        pytest.skip("no day_bound_by_fleet_size yet")
    sec = _section(fb.SECTION)
    text = " ".join(sec[sec.index(fb.KEEP[0]):].split())
    by = cur[fb.KEY]["by_fleet_size"]
    a, t = by["100"], by["100"]["day_term"]
    d, g, c = a["decided"], a["agreement"], a["coverage"]
    lo, hi = (100 * x for x in d["ci"])
    assert f"**{d['k']} of {d['n']} ({100 * d['rate']:.1f} % [{lo:.1f}, {hi:.1f}]), {g['k']} of {g['n']} right**" in text
    assert (d["k"], d["n"]) == (t["decided"]["k"], t["decided"]["n"])  # "where the day-term run had it"
    moved = a["changed"]
    new = [m for m in moved if "straddle →" in m]
    gone = [m for m in moved if m.endswith(")") and "→ straddle" in m]
    assert f"({len(moved)} moved: {len(new)} decided anew, both right, {len(gone)} no longer decided)" in text
    assert len(new) == 2 and len(new) + len(gone) == len(moved)
    for m in new:  # "both right": an ok with a truth inside the 5 % margin, a regress with one beyond it
        truth = float(m.rsplit("(truth ", 1)[1].rstrip(" %)"))
        assert ("→ ok" in m and truth < 5.0) or ("→ regress" in m and abs(truth) > 5.0), m
    tc = t["coverage"]
    assert f"covers the 20-day truth on {c['k']} of {c['n']} open pairs against {tc['k']} of {tc['n']} before" in text
    b, bt = by["1000"], by["1000"]["day_term"]
    assert (f"At 1,000 groups it decides {b['decided']['k']} of {b['decided']['n']} against {bt['decided']['k']} "
            f"({b['agreement']['k']} of {b['agreement']['n']} right against {bt['agreement']['k']} of "
            f"{bt['agreement']['n']})") in text  # fmt: skip
    assert f"ran {a['rounds']} canary days against {b['rounds']} at 1,000" in text
    full = {n: sum(len(pc["rounds"]) == 16 for pc in _loops(n)) for n in ("100", "1000")}
    guard = {n: sum(pc["rounds"][-1].get("stop") == "guard" for pc in _loops(n)) for n in ("100", "1000")}
    assert (f"{full['100']} of the 12 candidates' loops ran all 16 days at 100 groups against {full['1000']} of 12 at 1,000, "
            f"where the guard ended {guard['1000']} loops ({guard['100']} at 100)") in text  # fmt: skip
    readme = " ".join((ROOT / "README.md").read_text().split())
    assert (f"Rerun at 100 groups on the same code, they decide {100 * d['rate']:.1f} % [{lo:.1f} %, {hi:.1f} %], "
            f"{g['k']} of those {g['n']} verdicts right, as the day-term run did but on other pairs, and the last look's "
            f"interval covers the 20-day truth on {c['k']} of the {c['n']} open pairs ({tc['k']} of {tc['n']} before); "
            "at 5,000 groups, ") in readme  # fmt: skip
    f, tf = by["5000"]["coverage"], by["5000"]["day_term"]["coverage"]
    assert f"at 5,000 groups, {f['k']} of the {f['n']} ({tf['k']} of {tf['n']} before), below the 90 % the looks state" in readme
    assert f["rate"] < 0.9
    _the_5000_sentences_quote_the_json(cur, by, text, fb.KEY)


def _misses(n: str) -> list[str]:
    """The open pairs whose last look's finite interval misses the 20-day truth (`loop_scores`' coverage), as
    "seed policy column"."""
    import math

    from _closed_loop_scale import DECIDED

    out = []
    for s in (0, 1, 2):
        e = json.loads((OUT / "scale" / f"extended_fc_day_bound_seed{s}.json").read_text())["by_fleet_size"][n]
        last = {pc["policy"]: (pc["rounds"][-1] if pc["rounds"] else {}) for pc in e["per_candidate"]}
        for p in e["pairs"]:
            why = (last.get(p["policy"]) or {}).get("why", {}).get(p["column"])
            if p["twin_alone"] in DECIDED or not (why and why.get("interval")):
                continue
            lo, hi = (float(x) for x in why["interval"])
            if math.isfinite(lo) and math.isfinite(hi) and not lo <= p["truth_change"] <= hi:
                out.append(f"{s} {p['policy']} {p['column']}")
    return out


def _the_5000_sentences_quote_the_json(cur: dict[str, Any], by: dict[str, Any], text: str, key: str) -> None:
    """The 5,000-group sentences of "What the fleet sizes say (one-day bound)": counts against the day-term run, the
    moved pairs, the wrong verdicts (and that they are the day-term run's own), the stopped loop, coverage and its misses,
    the guard's first-day stops, and the headline now this run's at every size."""
    c, t = by["5000"], by["5000"]["day_term"]
    d, g = c["decided"], c["agreement"]
    lo, hi = (100 * x for x in d["ci"])
    assert (f"**{d['k']} of {d['n']} ({100 * d['rate']:.1f} % [{lo:.1f}, {hi:.1f}]), {g['k']} of {g['n']} right**, against "
            f"{t['decided']['k']} of {t['decided']['n']} and {t['agreement']['k']} of {t['agreement']['n']} in the day-term "
            "run") in text  # fmt: skip
    moved = c["changed"]
    new = [m for m in moved if "straddle →" in m]
    gone = [m for m in moved if "→ straddle" in m]
    assert f"({len(moved)} moved: {len(new)} decided anew, both right, {len(gone)} no longer decided)" in text
    assert len(new) == 2 and len(new) + len(gone) == len(moved)
    for m in new:  # "both right": not among that seed's wrong verdicts
        seed, pair = m.removeprefix("seed ").split(": ", 1)
        assert not any(w.startswith(pair.split(" straddle →")[0] + " ") for w in c["per_seed"][seed]["wrong"]), m
    assert sorted(c["wrong"]) == sorted(t["wrong"]) == ["slo-aware heuristic kpi.carbon_g ok (truth +5.8 %)",
                                                        "slo-aware heuristic kpi.energy_j ok (truth +5.2 %)"]
    assert "an *ok* on carbon (truth +5.8 %) and on energy (truth +5.2 %) for seed 1's SLO-aware candidate" in text
    assert c["per_seed"]["1"]["wrong"] and not c["per_seed"]["0"]["wrong"] and not c["per_seed"]["2"]["wrong"]
    slo1 = next(pc for pc in _loops_of("5000", 1) if pc["policy"] == "slo-aware heuristic")
    assert len(slo1["rounds"]) == 8 and slo1["reason"].startswith("stopped at day 8 of 16")
    assert "whose loop stopped at day 8 of 16 for futility" in text
    cv, tc = c["coverage"], t["coverage"]
    assert f"covers the 20-day truth on {cv['k']} of {cv['n']} open pairs against {tc['k']} of {tc['n']} before" in text
    assert cv["ci"][0] < 0.9 < cv["ci"][1] and cv["rate"] < 0.9  # "below the 90 % ... its interval reaches it"
    misses = _misses("5000")
    assert len(misses) == cv["n"] - cv["k"] == 3
    assert sorted(m for m in misses if m.startswith("1 slo-aware heuristic kpi.")) == [
        "1 slo-aware heuristic kpi.carbon_g", "1 slo-aware heuristic kpi.energy_j"]  # "two of the three misses"
    guard = [pc["rounds"][-1].get("stop") == "guard" and len(pc["rounds"]) == 1
             for s in (0, 1, 2) for pc in _loops_of("5000", s) if pc["policy"] == "least-loaded, cheap"]
    assert guard == [True, True, True] and "stopped the least-loaded candidate on its first day at every seed" in text
    assert cur[key]["headline_replaced"]
    pct = [f"{100 * cur['by_fleet_size'][n]['canary_verdict_rate']:.1f} %" for n in ("100", "1000", "5000")]
    assert (f"the canaries decide {pct[0][:-2]} %, {pct[1][:-2]} % and {pct[2][:-2]} % of the open pairs at 100, 1,000 and "
            "5,000 groups") in text  # fmt: skip


def _loops_of(n: str, s: int) -> list[dict[str, Any]]:
    return json.loads((OUT / "scale" / f"extended_fc_day_bound_seed{s}.json").read_text())["by_fleet_size"][n]["per_candidate"]
