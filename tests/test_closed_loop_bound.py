"""What bounds the loop's verdict rate (benchmarks/_closed_loop_bound.py, issue 48): the classes of the open
pairs by the definition fixed before the numbers, the 16-day projection of the verdict's half-width, what the
60 % target asks of it; and the quick run's merge into a results file that other runs also write."""

from __future__ import annotations

import math
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def bound() -> Iterator[Any]:
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import _closed_loop_bound

    yield _closed_loop_bound
    sys.path.remove(str(ROOT / "benchmarks"))


@pytest.fixture(scope="module")
def cl() -> Iterator[Any]:
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import closed_loop

    yield closed_loop
    sys.path.remove(str(ROOT / "benchmarks"))


def test_the_classes_follow_the_definition(bound: Any) -> None:
    assert bound.classify(0.01, 0.02, 0.5) == "within_day_spread"  # inside a day's spread, whatever h16
    assert bound.classify(0.01, 0.02, None) == "within_day_spread"
    assert bound.classify(0.10, 0.02, 0.20) == "beyond_16_days"
    assert bound.classify(0.10, 0.02, 0.05) == "decidable"
    assert bound.classify(0.10, 0.02, None) == "no_terms"


def test_h16_pools_the_group_split_over_16_days_and_keeps_the_shared_term(bound: Any) -> None:
    from edgetwin.loop.ppi import t_quantile

    t = {"own": 4.0, "shared": 1.0, "day_one": 0.5, "days": 2.0, "df": 30.0, "level": 0.98, "base": 10.0}
    q = t_quantile(0.98, 30.0)
    assert math.isclose(bound.h16_of(t), q * math.sqrt(4.0 * 2 / 16 + 1.0 + 0.5 / 16) / 10.0)
    # at 16 days already, only the day term's 1/16 applies to the one-day variance
    t16 = {**t, "days": 16.0}
    assert math.isclose(bound.h16_of(t16), q * math.sqrt(4.0 + 1.0 + 0.5 / 16) / 10.0)
    # the shared term alone is a floor no number of days goes below
    assert bound.h16_of({**t, "own": 0.0, "day_one": 0.0}, days=10_000) == pytest.approx(q * 1.0 / 10.0)
    assert bound.h16_of(None) is None and bound.h16_of({**t, "base": 0.0}) is None


def test_what_the_target_asks_is_the_gap_60_percent_of_the_pairs_exceed(bound: Any) -> None:
    gaps = [0.5, 0.4, 0.3, 0.2, 0.1]
    h = bound.needed(gaps, 0.6)  # 3 of 5 must exceed it: below the third largest
    assert h == 0.3 and sum(g >= h for g in gaps) == 3 and sum(g > 0.2 for g in gaps) >= 3
    assert bound.needed([1.0] * 10, 0.6) == 1.0
    assert math.isnan(bound.needed([], 0.6))


def test_daily_changes_average_to_the_multi_day_truth(bound: Any) -> None:
    values = {"current": {"k": [1.0, 2.0, 3.0]}, "cand": {"k": [1.5, 2.0, 3.3]}}
    ch = bound.daily_changes(values, "cand", "k")
    assert ch.shape == (3,)
    truth = (sum(values["cand"]["k"]) - sum(values["current"]["k"])) / sum(values["current"]["k"])
    assert math.isclose(float(ch.mean()), truth)


def _doc(seed: int, truth_change: float, verdict: str, terms: dict[str, float] | None) -> dict[str, Any]:
    pair = {"policy": "p", "kpi": "k", "column": "c", "better": "lower", "allowed_change": 0.05,
            "twin_alone": "abstain", "twin_canary": verdict, "truth_change": truth_change,
            "truth_regress": truth_change > 0.05}  # fmt: skip
    rounds = [{"look": True, "why": {"c": {"terms": terms}}}] if terms else [{"look": True, "why": {}}]
    return {"seed": seed, "by_fleet_size": {"1000": {"pairs": [pair], "per_candidate": [{"policy": "p", "rounds": rounds}]}}}


def test_verdict_bound_counts_decided_pairs_per_class_and_refuses_a_foreign_day_truth(bound: Any) -> None:
    terms = {"own": 0.0, "shared": 0.0, "day_one": 0.0, "days": 1.0, "df": 30.0, "level": 0.98, "base": 1.0}
    day = {0: {"values": {"current": {"k": [1.0, 1.0]}, "p": {"k": [1.2, 1.2]}}},  # +20 %, no spread: decidable
           1: {"values": {"current": {"k": [1.0, 1.0]}, "p": {"k": [0.9, 1.22]}}}}  # +6 %, sd 22.6 %: within a day
    docs = [_doc(0, 0.2, "regress", terms), _doc(1, 0.06, "abstain", terms)]
    res = bound.verdict_bound({"r": docs}, day)["runs"]["r"]
    assert res["pairs"] == 2 and res["decided"] == 1
    assert res["by_class"]["decidable"]["decided"] == 1 and res["by_class"]["decidable"]["right"] == 1
    assert res["by_class"]["within_day_spread"]["pairs"] == 1 and res["by_class"]["within_day_spread"]["decided"] == 0
    assert res["by_class"]["decidable"]["ci"][1] == 1.0
    with pytest.raises(ValueError, match="not the stored truth"):
        bound.verdict_bound({"r": [_doc(0, 0.3, "regress", terms)]}, day)
    with pytest.raises(ValueError, match="no day truth for seed 2"):
        bound.verdict_bound({"r": [_doc(2, 0.2, "regress", terms)]}, day)


def test_the_quick_run_merges_into_a_results_file_and_keeps_every_other_run(cl: Any) -> None:
    cur = {"twin_canary": {"verdict_rate": 0.1}, "canary_steps_ratio": None, "by_fleet_size": {"1000": {}},
           "extended_reseeded": {"x": 1}, "saturation": {"y": 2}, "some_future_run": [3]}  # fmt: skip
    quick = {"twin_canary": {"verdict_rate": 0.4}, "canary_steps_ratio": 2.5, "logging": "production"}
    new = cl.merged_results(cur, quick)
    assert new["twin_canary"] == {"verdict_rate": 0.4} and new["logging"] == "production"
    assert new["extended_reseeded"] == {"x": 1} and new["saturation"] == {"y": 2} and new["some_future_run"] == [3]
    assert new["canary_steps_ratio"] is None and new["quick_canary_steps_ratio"] == 2.5  # the scale headline stays
    alone = cl.merged_results({}, quick)  # no scale run in the file: the quick ratio is the file's own
    assert alone["canary_steps_ratio"] == 2.5 and "quick_canary_steps_ratio" not in alone


def _stored() -> dict[str, Any]:
    import json

    return json.loads((ROOT / "docs/benchmarks/closed_loop/results_production.json").read_text())["verdict_bound"]


def test_the_stored_bound_is_what_the_stored_runs_and_day_truths_give(bound: Any) -> None:
    """Recomputed from the scale runs' per-seed JSONs and the per-day truths: the same classes, counts and
    what the target asks; each seed's day truth averages to the stored 20-day truth."""
    import json

    scale = ROOT / "docs/benchmarks/closed_loop/scale"
    days = {s: json.loads((scale / f"day_truth_seed{s}.json").read_text()) for s in (0, 1, 2)}
    for s, d in days.items():
        assert d["days"] == 20 and d["fleet"] == 1000
        assert all(c["kpis"] >= 7 and c["max_rel_gap"] < 1e-9 for c in d["check"].values()), (s, d["check"])
    runs = {key: [json.loads((scale / f"{stem}_seed{s}.json").read_text()) for s in (0, 1, 2)]
            for key, stem in bound.RUNS.items()}  # fmt: skip
    again = bound.verdict_bound(runs, days)
    stored = _stored()
    for key, r in again["runs"].items():
        s = stored["runs"][key]
        assert r["pairs"] == s["pairs"] == 84 and r["decided"] == s["decided"]
        for c in bound.CLASSES:
            assert {k: r["by_class"][c][k] for k in ("pairs", "decided", "right")} == \
                {k: s["by_class"][c][k] for k in ("pairs", "decided", "right")}, (key, c)
        for k in ("h_needed", "f_needed", "median_gap", "median_h16", "median_day_sd", "reachable"):
            assert r[k] == pytest.approx(s[k], rel=1e-9), (key, k)
    # the loop's own scores: the decided pairs are the run's canary_verdict_rate's
    res = json.loads((ROOT / "docs/benchmarks/closed_loop/results_production.json").read_text())
    for key in bound.RUNS:
        assert stored["runs"][key]["decided"] == res[key]["by_fleet_size"]["1000"]["canary_decided"]


def test_the_page_shows_the_stored_bound(bound: Any) -> None:
    page = (ROOT / "docs/benchmarks/closed_loop/README.md").read_text()
    assert bound.bound_section(_stored()).strip() in page


def test_what_the_bound_says_quotes_the_stored_bound(bound: Any) -> None:
    """Every number of the hand-written subsection is the stored `verdict_bound`'s."""
    page = (ROOT / "docs/benchmarks/closed_loop/README.md").read_text()
    start = page.index("### What the bound says")
    end = page.find("\n## ", start)
    text = " ".join(page[start:end if end > 0 else None].split())
    st = _stored()
    sl, fc = (st["runs"][k] for k in ("extended_reseeded", "extended_fleet_control_reseeded"))
    cls = [r["by_class"] for r in (sl, fc)]

    def pct(x: float) -> str:
        return f"{100 * x:.1f} %"

    def rate(c: dict[str, Any]) -> str:
        return f"{c['decided']}/{c['pairs']} = {pct(c['rate'])} [{100 * c['ci'][0]:.1f}, {100 * c['ci'][1]:.1f}]"

    assert f"Of the {sl['pairs']} open pairs, {cls[0]['within_day_spread']['pairs']} lie within one day's" in text
    assert cls[0]["within_day_spread"]["pairs"] == cls[1]["within_day_spread"]["pairs"]  # same truths, same sd
    assert (f"{cls[0]['beyond_16_days']['pairs']} (slice control) / {cls[1]['beyond_16_days']['pairs']} (fleet control) "
            f"lie beyond") in text  # fmt: skip
    assert f"{cls[0]['decidable']['pairs']} / {cls[1]['decidable']['pairs']} are decidable" in text
    assert f"({pct(sl['reachable'])} / {pct(fc['reachable'])} of the open pairs)" in text
    assert f"half-width below {pct(sl['h_needed'])} of the baseline" in text and sl["h_needed"] == fc["h_needed"]
    assert f"median h16 is {pct(sl['median_h16'])} / {pct(fc['median_h16'])}" in text
    assert f"{rate(cls[0]['decidable'])} and {rate(cls[1]['decidable'])}" in text
    assert all(c["decidable"]["right"] == c["decidable"]["decided"] for c in cls)  # "all right"
    for c, who in zip(cls, ("slice-control loop decided", "fleet-control loop"), strict=True):
        out = [c[k] for k in ("within_day_spread", "beyond_16_days")]
        k, n = sum(o["decided"] for o in out), sum(o["pairs"] for o in out)
        wrong = k - sum(o["right"] for o in out)
        assert f"{who} {k} of {n} ({wrong} wrong" in text, who
    assert f"{cls[1]['within_day_spread']['decided']} of them within a day's spread" in text
    kpis = {k: v for k, v in sl["by_kpi"].items() if k != "reward"}
    twin = [v["twin_day_sd"] for r in (sl, fc) for k, v in r["by_kpi"].items() if k != "reward"]
    emu = [v["day_sd"] for v in kpis.values()]
    assert f"is {pct(min(twin))[:-2]}-{pct(max(twin))} of the baseline per KPI" in text
    assert f"spread the fleet-wide effect by {pct(min(emu))[:-2]}-{pct(max(emu))}" in text
    assert (f"carbon {pct(kpis['kpi.carbon_g']['day_sd'])}, task time {pct(kpis['kpi.task_time_ms']['day_sd'])}, "
            f"energy {pct(kpis['kpi.energy_j']['day_sd'])}") in text  # fmt: skip
    assert f"not sure either for {sl['label_uncertain']} of the {sl['pairs']} pairs" in text
    wrong = {k: [(p["seed"], p["policy"], p["column"], p["class"], round(p["gap"], 3))
                 for p in st["runs"][k]["pairs_detail"] if p["decided"] and not p["right"]] for k in st["runs"]}  # fmt: skip
    assert (0, "least-loaded, cheap", "kpi.carbon_g", "beyond_16_days", 0.146) in wrong["extended_reseeded"]
    assert "seed 0 least-loaded, cheap's carbon *regress*, truth −9.6 %, beyond the 16-day design" in text
    assert (1, "slo-aware heuristic", "kpi.carbon_g", "within_day_spread", 0.001) in wrong["extended_fleet_control_reseeded"]
    assert "seed 1 SLO-aware heuristic's carbon *ok*, 0.1 % from the margin: wrong" in text


def test_the_at_a_glance_line_quotes_the_stored_bound() -> None:
    readme = (ROOT / "docs/benchmarks/README.md").read_text().splitlines()
    (line,) = [x for x in readme if "verdict_bound.runs.extended_reseeded.reachable" in x]
    st = _stored()
    sl, fc = (st["runs"][k] for k in ("extended_reseeded", "extended_fleet_control_reseeded"))

    def pct(x: float) -> str:
        return f"{100 * x:.1f} %"

    assert f"share of the {sl['pairs']} open pairs" in line and f"fleet control {pct(fc['reachable'])})" in line
    assert (f"decides {pct(sl['by_class']['decidable']['rate'])} of these (fleet control "
            f"{pct(fc['by_class']['decidable']['rate'])}), all right") in line  # fmt: skip
    assert all(r["by_class"]["decidable"]["right"] == r["by_class"]["decidable"]["decided"] for r in (sl, fc))
    assert f"half-width below {pct(sl['h_needed'])} where the median is {pct(sl['median_h16'])}" in line
    twin = [v["twin_day_sd"] for r in (sl, fc) for k, v in r["by_kpi"].items() if k != "reward"]
    emu = [v["day_sd"] for k, v in sl["by_kpi"].items() if k != "reward"]
    assert f"by {100 * min(emu):.1f}-{pct(max(emu))} per KPI" in line and f"carries {100 * min(twin):.1f}-{pct(max(twin))})" in line


def test_missing_inputs_are_one_line_errors_with_exit_2(bound: Any, tmp_path: Path, capsys: Any) -> None:
    with pytest.raises(SystemExit) as e:
        bound.run_bound_cli(tmp_path)  # no results_production.json, no day truths
    assert e.value.code == 2 and capsys.readouterr().err.startswith("--bound: ")
    with pytest.raises(SystemExit) as e:
        bound.run_day_truth_cli(7, 20, tmp_path / "work", tmp_path)  # no scale/seed7.json: refused before any run
    err = capsys.readouterr().err
    assert e.value.code == 2 and "--day-truth --seed 7" in err and "seed7.json" in err and err.endswith("\n") and err.count("\n") == 1


def test_the_headline_line_qualifies_its_day_to_day_clause_with_the_bound() -> None:
    """The 1,000-group headline line says the open pairs are not held by the day term the verdict carries; it
    quotes that term beside the emulator's own day-to-day spread (`verdict_bound`)."""
    readme = (ROOT / "docs/benchmarks/README.md").read_text().splitlines()
    (line,) = [x for x in readme if "`closed_loop/results_production.json:before_day_term.by_fleet_size.1000.canary_verdict_rate × 100`"
               in x]  # the headline before the day term (issue 48's rerun moved it)
    st = _stored()["runs"]
    twin = [v["twin_day_sd"] for r in st.values() for k, v in r["by_kpi"].items() if k != "reward"]
    emu = [v["day_sd"] for k, v in st["extended_reseeded"]["by_kpi"].items() if k != "reward"]
    assert (f"the day-to-day term the verdict carries, {100 * min(twin):.1f}-{100 * max(twin):.1f} % per KPI where the "
            f"emulator's days spread the effect by {100 * min(emu):.1f}-{100 * max(emu):.1f} %") in line  # fmt: skip
