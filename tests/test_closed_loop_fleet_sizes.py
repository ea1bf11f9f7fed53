"""The closed-loop page's verdict rate by fleet size with the day term (benchmarks/_closed_loop_fleetsize.py,
issue 48): the section is the JSON's (regenerated and compared), the JSON is its seed files' (recounted),
the at-a-glance rows quote it, and the counting itself is checked on a small synthetic run."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "docs" / "benchmarks" / "closed_loop"


@pytest.fixture(scope="module")
def fs() -> Iterator[Any]:
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import _closed_loop_fleetsize

    yield _closed_loop_fleetsize
    sys.path.remove(str(ROOT / "benchmarks"))


def _results() -> dict[str, Any]:
    return json.loads((OUT / "results_production.json").read_text())


def _section(heading: str) -> str:
    text = (OUT / "README.md").read_text()
    start = text.index(heading)
    nxt = text.find("\n## ", start + 1)
    return text[start: nxt + 1 if nxt != -1 else len(text)]


def _pair(policy: str, kpi: str, verdict: str, truth: float, regress: bool, twin: str = "straddle") -> dict[str, Any]:
    return {"policy": policy, "kpi": kpi, "column": kpi, "twin_alone": twin, "twin_canary": verdict,
            "truth_change": truth, "truth_regress": regress}  # fmt: skip


def _doc(seed: int, n: str, pairs: list[dict[str, Any]], policies: list[str]) -> dict[str, Any]:
    why = {p["column"]: {"interval": [-0.1, 0.1]} for p in pairs}
    per = [{"policy": a, "rounds": [{"why": why}] * 2, "twin_canary_agent_steps": 100} for a in policies]
    return {"seed": seed, "by_fleet_size": {n: {"complete": True, "pairs": pairs, "per_candidate": per}}}


def test_size_entry_counts_open_pairs_agreement_coverage_and_candidates(fs: Any) -> None:
    docs = [_doc(0, "5000", [_pair("a", "k1", "ok", 0.01, False), _pair("a", "k2", "ok", 0.2, True),
                             _pair("b", "k1", "abstain", 0.5, True), _pair("b", "k2", "ok", 0.0, False, twin="ok")],
                 ["a", "b"]),
            _doc(1, "5000", [_pair("a", "k1", "regress", 0.3, True)], ["a"])]  # fmt: skip
    e = fs.size_entry(docs, "5000")
    assert (e["canary_decided"], e["open_after_twin"]) == (3, 4)  # the twin alone decided b/k2
    assert (e["canary_agreeing"], e["agreement"]["n"]) == (2, 3)
    assert e["wrong"] == ["a k2 ok (truth +20.0 %)"]
    assert (e["coverage"]["k"], e["coverage"]["n"]) == (1, 4)  # only seed 0's a/k1 (truth 0.01) is inside [-0.1, 0.1]
    assert e["rounds"] == 6 and e["agent_steps"] == 300
    assert e["candidates_per_seed"] == {"0": 2, "1": 1} and e["seeds"] == [0, 1]
    only = fs.size_entry(docs, "5000", {"b"})
    assert (only["canary_decided"], only["open_after_twin"]) == (0, 1) and only["confident_agreement"] is None


def test_rerun_check_says_what_ran_afresh_what_was_reused_and_what_changed(fs: Any, tmp_path: Path) -> None:
    """The stopped-day rerun's bookkeeping: a reused loop, a stopped loop run afresh (its verdicts
    changed), a never-stopped loop run afresh (identical, or not), against the stored seed file."""
    def summ(policy: str, stops: list[str], steps: int = 100, **kw: Any) -> dict[str, Any]:
        return {"policy": policy, "rounds": [{"stop": x} for x in stops], "twin_canary_agent_steps": steps, **kw}

    old = {"seed": 1, "by_fleet_size": {"5000": {
        "pairs": [_pair("g", "k1", "regress", 0.3, True), _pair("g", "k2", "regress", -0.1, False),
                  _pair("a", "k1", "ok", 0.0, False), _pair("b", "k1", "ok", 0.0, False), _pair("r", "k1", "ok", 0.0, False)],
        "per_candidate": [summ("g", ["guard"]), summ("a", ["completed"]), summ("b", ["completed"] * 2),
                          summ("r", ["completed"])]}}}  # fmt: skip
    (tmp_path / fs.SEED_FILE.format(s=1)).write_text(json.dumps(old))
    new = {"seed": 1, "by_fleet_size": {"5000": {
        "pairs": [_pair("g", "k1", "regress", 0.3, True), _pair("g", "k2", "abstain", -0.1, False),
                  _pair("a", "k1", "ok", 0.0, False), _pair("b", "k1", "ok", 0.0, False), _pair("r", "k1", "ok", 0.0, False)],
        "per_candidate": [summ("g", ["guard"], 40), summ("a", ["completed"]), summ("b", ["completed"] * 2, 120),
                          summ("r", ["completed"], loop_reused=True)]}}}  # fmt: skip
    got = fs.rerun_check({"5000": [new]}, tmp_path)["5000"]
    assert got["reused"] == ["seed 1: r"] and got["rerun_stopped"] == ["seed 1: g"]
    assert got["identical"] == ["seed 1: a"] and got["differing"] == ["seed 1: b"]  # b's agent-steps differ
    assert got["changed"] == ["seed 1: g k2 regress → abstain (truth -10.0 %)"]


def test_the_run_before_the_stopped_day_rule_is_kept_once(fs: Any) -> None:
    cur = {fs.KEY: {"by_fleet_size": {"5000": {"code": fs.BEFORE_CODE, "decided": 1}}}, "by_fleet_size": {"5000": 2}}
    assert fs.keep_before(cur) and cur[fs.BEFORE_KEY][fs.KEY]["by_fleet_size"]["5000"]["decided"] == 1
    assert cur[fs.BEFORE_KEY]["by_fleet_size"] == {"5000": 2} and cur[fs.BEFORE_KEY]["code"] == fs.BEFORE_CODE
    cur[fs.KEY] = {"by_fleet_size": {"5000": {"code": fs.CODE, "decided": 3}}}
    assert not fs.keep_before(cur) and cur[fs.BEFORE_KEY][fs.KEY]["by_fleet_size"]["5000"]["decided"] == 1
    fresh = {fs.KEY: {"by_fleet_size": {"5000": {"code": fs.CODE}}}}
    assert not fs.keep_before(fresh) and fs.BEFORE_KEY not in fresh  # a run on this code replaces nothing


def test_a_superseded_run_leaves_the_headline_alone(fs: Any) -> None:
    """Once a later run replaced the headline (`SUPERSEDED`), rerunning this run's page keeps the later headline and
    says so in the section."""
    entry = {"canary_verdict_rate": 0.5}
    cur = {fs.RUN_KEY: {"by_fleet_size": {"100": entry}, **{k: 1.0 for k in fs.STEPS_KEYS}}, "by_fleet_size": {"100": {"design": "later"}},
           fs.KEY: {fs.SUPERSEDED: "day_bound_by_fleet_size", "headline_replaced": True}}  # fmt: skip
    assert fs.replace_headline(cur) and cur["by_fleet_size"] == {"100": {"design": "later"}}
    assert "replaced it" in fs._headline_text(cur[fs.KEY]) and "the headline is this run's" not in fs._headline_text(cur[fs.KEY])
    del cur[fs.KEY][fs.SUPERSEDED]
    cur["before_day_term"] = {"by_fleet_size": {"100": {}}}
    assert fs.replace_headline(cur) and cur["by_fleet_size"]["100"]["design"] == fs.DESIGN  # without it, it moves


def test_the_section_is_the_json(fs: Any) -> None:
    """Every number of the section is `day_term_by_fleet_size`'s: regenerating it gives the page's text."""
    from _docs import relink

    cur = _results()
    if fs.KEY not in cur:
        pytest.skip("no day_term_by_fleet_size yet")
    want = relink(fs.section(cur[fs.KEY]), OUT / "README.md")
    got = _section(fs.SECTION)
    assert got.startswith(want.strip())


def test_the_json_is_its_seed_files(fs: Any) -> None:
    """``day_term_by_fleet_size`` recounted from the merged run's seed files and the headline: the same."""
    cur = _results()
    if fs.KEY not in cur:
        pytest.skip("no day_term_by_fleet_size yet")
    again = json.loads(json.dumps(fs.fleet_sizes(cur, OUT / "scale")))
    again["headline_replaced"] = cur[fs.KEY]["headline_replaced"]  # `write_page`'s, after the count
    if fs.SUPERSEDED in cur[fs.KEY]:  # marked by the later run that moved the headline (its `replace_headline`)
        again[fs.SUPERSEDED] = cur[fs.KEY][fs.SUPERSEDED]
    assert again == cur[fs.KEY]
    for n, v in cur[fs.KEY]["by_fleet_size"].items():
        run = cur[fs.RUN_KEY]["by_fleet_size"][n]  # the merge's own count of the same pairs
        assert (v["canary_decided"], v["open_after_twin"], v["canary_agreeing"]) == \
            (run["canary_decided"], run["open_after_twin"], run["canary_agreeing"])
        assert v["agent_steps"] == run["twin_canary_agent_steps"] and v["code"] == fs.CODE
        before = fs.before_headline(cur)[n]
        assert v["before_day_term"]["canary_verdict_rate"] == before["canary_verdict_rate"]
    later = cur[fs.KEY].get(fs.SUPERSEDED)
    if later:  # a later run replaced the headline this run had set: what it replaced is this run's
        assert cur[fs.KEY]["headline_replaced"] and later in cur
        for n, v in cur["before_day_bound"]["by_fleet_size"].items():
            assert v["canary_verdict_rate"] == cur[fs.KEY]["by_fleet_size"][n]["canary_verdict_rate"]
            assert v["design"] == fs.DESIGN
    elif cur[fs.KEY]["headline_replaced"]:  # the fields are this run's, the old ones kept
        for n, v in cur["by_fleet_size"].items():
            assert v["canary_verdict_rate"] == cur[fs.KEY]["by_fleet_size"][n]["canary_verdict_rate"]
            assert v["design"] == fs.DESIGN
        assert set(cur["before_day_term"]["by_fleet_size"]) <= set(cur["by_fleet_size"])
        for k in fs.STEPS_KEYS:
            assert cur[k] == cur[fs.RUN_KEY][k] and k in cur["before_day_term"]


def test_the_analysis_quotes_the_json(fs: Any) -> None:
    """The hand-written "What the fleet sizes say" quotes each size's rate, agreement and coverage."""
    cur = _results()
    if fs.KEY not in cur:
        pytest.skip("no day_term_by_fleet_size yet")
    sec = _section(fs.SECTION)
    assert fs.KEEP[0] in sec
    text = " ".join(sec[sec.index(fs.KEEP[0]):].split())
    for n, v in cur[fs.KEY]["by_fleet_size"].items():
        d, a, c = v["decided"], v["agreement"], v["coverage"]
        lo, hi = (100 * x for x in d["ci"])
        assert f"{int(n):,} groups: {d['k']} of {d['n']} ({100 * d['rate']:.1f} % [{lo:.1f}, {hi:.1f}])" in text, n
        assert f"{a['k']} of {a['n']} right" in text, n
        assert f"covering the 20-day truth on {c['k']} of {c['n']}" in text, n
    same = cur[fs.KEY]["same_candidates"]["by_fleet_size"]
    assert ", ".join(f"{100 * v['decided']['rate']:.1f} %" for v in same.values()) + " decided" in \
        text.replace(", and ", ", ").replace(" and ", ", ")
    run = cur[fs.RUN_KEY]["by_fleet_size"]
    dom = {n: (sum(w["dominant"]["own"] for w in run[n]["why_open"]), sum(w["with_terms"] for w in run[n]["why_open"]))
           for n in ("1000", "5000")}  # fmt: skip
    assert (f"the group split dominates {dom['5000'][0]} of {dom['5000'][1]} at 5,000 groups against {dom['1000'][0]} "
            f"of {dom['1000'][1]} at 1,000") in text
    wrong = {s: v["wrong"] for s, v in cur[fs.KEY]["by_fleet_size"]["5000"]["per_seed"].items() if v["wrong"]}
    words = {1: "one", 2: "two", 3: "three", 4: "four", 5: "five"}
    n_wrong = sum(len(w) for w in wrong.values())
    assert f"{words.get(n_wrong, n_wrong)} wrong verdicts" in text
    if len(wrong) == 1:
        assert f"all seed {next(iter(wrong))} at 5,000 groups" in text
    for n, v in cur[fs.KEY]["by_fleet_size"].items():  # the run before the stopped-day rule, as quoted
        b = v.get(fs.BEFORE_KEY)
        if b is not None:
            assert f"{b['decided']['k']} of {b['decided']['n']} decided and {b['agreement']['k']} of " \
                   f"{b['agreement']['n']} right before the rule" in text, n


def test_the_at_a_glance_rows_quote_it(fs: Any) -> None:
    """The Closed loop rows citing ``day_term_by_fleet_size`` give its numbers (the value column is also
    checked by tests/test_benchmark_docs.py; here the counts in the row's text)."""
    cur = _results()
    if fs.KEY not in cur:
        pytest.skip("no day_term_by_fleet_size yet")
    rows = [r for r in (ROOT / "docs" / "benchmarks" / "README.md").read_text().splitlines()
            if f"results_production.json:{fs.KEY}." in r]  # fmt: skip
    assert rows, "no at-a-glance row cites day_term_by_fleet_size"
    for r in rows:
        field = r.split(f"results_production.json:{fs.KEY}.")[1].split("`")[0].split()[0]
        n = field.split(".")[1]
        v = cur[fs.KEY]["by_fleet_size"][n]
        d, a = v["decided"], v["agreement"]
        assert f"{d['k']} of {d['n']}" in r and f"{a['k']} of {a['n']}" in r, r[:120]


def test_the_steps_ratio_row_quotes_the_new_headline(fs: Any) -> None:
    """The at-a-glance line citing ``canary_steps_ratio_lower_bound`` (the headline's, whichever run set it)
    quotes the loop's agent-steps, canary alone's largest sweep point and its count on the loop's own canaries."""
    cur = _results()
    if not cur.get(fs.KEY, {}).get("headline_replaced"):
        pytest.skip("the headline is not a fleet-size run's")
    rows = [r for r in (ROOT / "docs" / "benchmarks" / "README.md").read_text().splitlines()
            if r.endswith("`closed_loop/results_production.json:canary_steps_ratio_lower_bound` |")]  # fmt: skip
    (row,) = rows
    st = cur["by_fleet_size"][str(cur["canary_steps_ratio_fleet_size"])]["steps"]
    top, same = st["sweep"][-1], st["same_canaries"]["canary_alone"]
    assert st["ratio"] is None and cur["canary_steps_ratio"] is None and "not reached" in row
    assert f"over the loop's {st['twin_canary_steps']:,}" in row
    assert f"{top['canary_agent_steps']:,} agent-steps, {100 * top['confident_agreement']:.1f} % right" in row
    assert f"it decides {same['verdict_rate']['k']} of 84, {same['agreement']['k']} of them right" in row
