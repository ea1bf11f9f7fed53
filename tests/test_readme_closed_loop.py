"""README's closed-loop sentence says what docs/benchmarks/closed_loop/results_production.json says."""

from __future__ import annotations

import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _verdicts_right(r: dict) -> tuple[int, int]:
    return sum(v["canary_decided"] for v in r.values()), sum(v["canary_agreeing"] for v in r.values())


def test_the_readme_closed_loop_numbers_are_the_scale_runs() -> None:
    """The headline (today's code: the day term, fleet control, the stopped-day rule) and the one before it."""
    readme = " ".join((ROOT / "README.md").read_text().split())
    res = json.loads((ROOT / "docs/benchmarks/closed_loop/results_production.json").read_text())
    now = res["by_fleet_size"]
    assert all("stopped-day rule" in v["design"] and "fleet as control" in v["design"] for v in now.values())
    assert sorted(res["day_term_by_fleet_size"]["rerun"]) == ["100", "1000", "5000"]  # every size on the rule's code
    pct = {k: 100 * v["canary_verdict_rate"] for k, v in now.items()}
    ci = {k: [100 * x for x in v["canary_verdict_rate_ci"]] for k, v in now.items()}
    assert (f"the canaries decide {pct['100']:.1f} % [{ci['100'][0]:.1f} %, {ci['100'][1]:.1f} %] of the open pairs at "
            f"100 service groups, {pct['1000']:.1f} % [{ci['1000'][0]:.1f} %, {ci['1000'][1]:.1f} %] at 1,000 and "
            f"{pct['5000']:.1f} % [{ci['5000'][0]:.1f} %, {ci['5000'][1]:.1f} %] at 5,000") in readme  # fmt: skip
    decided, right = _verdicts_right(now)
    assert f"and {right} of those {decided} verdicts are right" in readme
    v5 = now["5000"]
    assert f"(at 5,000 groups {v5['canary_agreeing']} of {v5['canary_decided']}," in readme
    bound = res["before_day_bound"]["by_fleet_size"]  # the day-term run, the headline before the one-day bound
    bpct = {k: 100 * v["canary_verdict_rate"] for k, v in bound.items()}
    blo, bhi = (100 * x for x in bound["1000"]["canary_verdict_rate_ci"])
    b5lo, b5hi = (100 * x for x in bound["5000"]["canary_verdict_rate_ci"])
    assert (f"The run before the bound (the day term, the verdict's relative change by the delta method) decided "
            f"{bpct['100']:.1f} %, {bpct['1000']:.1f} % [{blo:.1f} %, {bhi:.1f} %] and {bpct['5000']:.1f} % [{b5lo:.1f} %, "
            "{b5hi:.1f} %], {1} of those {0} verdicts right".format(*_verdicts_right(bound), b5hi=b5hi)) in readme  # fmt: skip
    before_rule = res["before_guard_days"]["by_fleet_size"]["5000"]  # "3 of the 5 wrong verdicts at 5,000 groups"
    assert before_rule["canary_decided"] - before_rule["canary_agreeing"] == 5
    assert all(v["twin_alone"]["verdict_rate"]["k"] == 0 for v in now.values()) and "the twin alone decides none" in readme
    old = res["before_day_term"]["by_fleet_size"]
    assert old["5000"]["design"].startswith("one day")  # "one canary day at 5,000"
    opct = {k: 100 * v["canary_verdict_rate"] for k, v in old.items()}
    lo, hi = (100 * x for x in old["1000"]["canary_verdict_rate_ci"])
    assert (f"they decided {opct['100']:.1f} %, {opct['1000']:.1f} % [{lo:.1f} %, {hi:.1f} %] and {opct['5000']:.1f} %, "
            "{1} of those {0} verdicts right".format(*_verdicts_right(old))) in readme  # fmt: skip
    cand = old["1000"]["candidate_verdicts"]
    assert cand["agreement"]["k"] == cand["verdict_rate"]["k"]
    assert f"made for {cand['verdict_rate']['k']} of the {cand['verdict_rate']['n']} candidates at 1,000 groups, all right" in readme
    one_day = 100 * res["one_day"]["by_fleet_size"]["1000"]["canary_verdict_rate"]
    assert f"one canary day decided {one_day:.1f} % at 1,000" in readme


def test_the_readme_extension_numbers_are_the_extended_run() -> None:
    readme = " ".join((ROOT / "README.md").read_text().split())
    ext = json.loads((ROOT / "docs/benchmarks/closed_loop/results_production.json").read_text())["extended"]
    looks = ", ".join(str(d) for d in ext["looks"][:-1]) + f" and {ext['looks'][-1]}"
    assert f"for up to {ext['max_days']} canary days" in readme and f"looks at days {looks}" in readme
    r = ext["by_fleet_size"]["1000"]
    why = r["why_open"]
    n_open, floor = sum(w["open"] for w in why), sum(w["floor"] for w in why)
    assert f"on {floor} of the {n_open} open pairs, which no number of canary days decides" in readme
    # "not the day-to-day spread": the day term alone blocks at most a pair or two after 16 days
    assert sum(w["days_16"] for w in why) <= 0.05 * n_open


def test_the_readme_switchback_numbers_are_the_benchmarks() -> None:
    readme = " ".join((ROOT / "README.md").read_text().split())
    doc = (ROOT / "docs/benchmarks/switchback/README.md").read_text()
    assert "--switchback-site" in readme
    for claim in ("+11.2", "-5.2", "+10.8"):  # the page's numbers behind the README's rounded ones
        assert claim in doc.replace("−", "-"), claim
    assert "SLO violations at +11 % on its site where a group split of the same budget said -5 % against the fleet's +11 %" in readme


def test_the_readme_switchback_wire_numbers_are_the_wire_run() -> None:
    """The README's account of a switchback through the wire is docs/benchmarks/switchback/wire.json's."""
    import json
    import re

    readme = " ".join((ROOT / "README.md").read_text().split())
    wire = json.loads((ROOT / "docs/benchmarks/switchback/wire.json").read_text())
    said = re.search(r"equal the direct run's on (\d+ of \d+) days", readme)
    assert said, "the README no longer states the wire run's agreement"
    served = re.search(r"on (\d+ of \d+) days; the largest KPI difference between the wire's log and the direct run is 0 ",
                       wire["findings"][0])  # fmt: skip
    assert served and served.group(1) == said.group(1)
    assert "canary verdict --design switchback" in readme


def test_the_readme_fleet_control_numbers_are_its_run() -> None:
    """The README's fleet-as-control sentence is `extended_fleet_control`'s 1,000-group run and the levers' switchback count."""
    readme = " ".join((ROOT / "README.md").read_text().split())
    res = json.loads((ROOT / "docs/benchmarks/closed_loop/results_production.json").read_text())
    fc = res["extended_fleet_control"]["by_fleet_size"]["1000"]
    lo, hi = (100 * x for x in fc["canary_verdict_rate_ci"])
    assert (f"decides {100 * fc['canary_verdict_rate']:.1f} % [{lo:.1f} %, {hi:.1f} %] at 1,000 groups, and "
            f"{fc['canary_agreeing']} of those {fc['canary_decided']} verdicts are right") in readme  # fmt: skip
    assert fc["confident_agreement"] < 0.97 and "fewer right than the 97 % asked, so the default stays" in readme
    lev = res["levers"]
    assert f"fits the 10 % x one-day budget for {lev['switchback_fits']} of the {len(lev['switchback'])} candidates" in readme


def test_the_readme_reseeded_reruns_and_saturation_are_their_runs() -> None:
    """The README's rerun sentence is `extended_reseeded` / `extended_fleet_control_reseeded` at 1,000 groups, and its
    saturation ratio and widths are the `saturation` simulation's A/A medians."""
    readme = " ".join((ROOT / "README.md").read_text().split())
    res = json.loads((ROOT / "docs/benchmarks/closed_loop/results_production.json").read_text())
    runs = (("extended_reseeded", "the default loop decides {rate} at 1,000 groups, {right} of those {n} verdicts right"),
            ("extended_fleet_control_reseeded", "the fleet-as-control loop {rate} again, {right} of {n} right"))
    for key, sentence in runs:
        r = res[key]["by_fleet_size"]["1000"]
        lo, hi = (100 * x for x in r["canary_verdict_rate_ci"])
        rate = f"{100 * r['canary_verdict_rate']:.1f} % [{lo:.1f} %, {hi:.1f} %]"
        said = sentence.format(rate=rate, right=r["canary_agreeing"], n=r["canary_decided"])
        assert said in readme, (key, said)
    sat = res["saturation"]
    loop_w, sat_w = 100 * sat["twin"]["aa"]["median_width"], 100 * sat["saturation"]["aa"]["median_width"]
    assert sat_w > loop_w
    assert f"would be {sat_w / loop_w:.1f}x wider" in readme
    assert f"median width {sat_w:.1f} against {loop_w:.1f} points" in readme


def test_the_readme_verdict_bound_is_the_bound_run() -> None:
    """The README's account of what bounds the verdict rate is `verdict_bound` (`closed_loop.py --bound`): the day
    spreads per KPI over both runs (the reward, near 0, left out), the pairs within a day's spread, the reachable share, the
    half-width 60 % asks against the median, and the rates within reach; and the 100-group reseeded rerun."""
    readme = " ".join((ROOT / "README.md").read_text().split())
    res = json.loads((ROOT / "docs/benchmarks/closed_loop/results_production.json").read_text())
    vb = res["verdict_bound"]["runs"]
    sl, fc = vb["extended_reseeded"], vb["extended_fleet_control_reseeded"]
    kpis = [v for run in (sl, fc) for k, v in run["by_kpi"].items() if k != "reward"]
    twin = [100 * v["twin_day_sd"] for v in kpis]
    emu = [100 * v["day_sd"] for v in kpis]
    assert f"other days ({min(twin):.1f}-{max(twin):.1f} % per KPI)" in readme
    assert f"spread the fleet-wide effect by {min(emu):.1f}-{max(emu):.1f} % per KPI" in readme
    within = sl["by_class"]["within_day_spread"]["pairs"]
    assert f"{within} of the {sl['pairs']} open pairs at 1,000 groups lie within one day's spread" in readme
    assert (f"only {100 * sl['reachable']:.1f} % (fleet control {100 * fc['reachable']:.1f} %) are decidable by the "
            "16-day design") in readme
    assert (f"60 % asks a 16-day half-width below {100 * sl['h_needed']:.1f} % where the median is "
            f"{100 * sl['median_h16']:.1f} %") in readme
    d_sl, d_fc = sl["by_class"]["decidable"], fc["by_class"]["decidable"]
    assert d_sl["right"] == d_sl["decided"] and d_fc["right"] == d_fc["decided"]  # "all right"
    assert (f"the loop decides {100 * d_sl['rate']:.1f} % (fleet control {100 * d_fc['rate']:.1f} %), all right"
            in readme)
    r100 = res["extended_reseeded"]["by_fleet_size"]["100"]
    lo, hi = (100 * x for x in r100["canary_verdict_rate_ci"])
    assert (f"at 100 groups the default decides {100 * r100['canary_verdict_rate']:.1f} % [{lo:.1f} %, {hi:.1f} %], "
            f"{r100['canary_agreeing']} of {r100['canary_decided']} right") in readme


def test_the_readme_canary_verdict_sentence_is_the_rule_it_calls() -> None:
    """The README says `edgetwin canary verdict` judges a stopped canary by the loop's rule through
    `edgetwin.loop.day_verdict.stopped_verdict`, with `--status`; the behaviour itself (exit 3 on a short
    log, exit 1 on a guard stop the status names) is tests/test_cli_canary_verdict.py's."""
    import inspect

    from edgetwin.loop import evidence

    readme = " ".join((ROOT / "README.md").read_text().split())
    assert "`edgetwin canary verdict` judges a collected canary log by the same rule" in readme
    assert "(`edgetwin.loop.day_verdict.stopped_verdict`)" in readme
    assert "a log short of the plan's ticks leaves every KPI open (exit 3)" in readme
    assert "refuses on the guard's KPI and leaves the others open (exit 1)" in readme
    assert "stopped_verdict(" in inspect.getsource(evidence.judge_stopped)
    from edgetwin.loop import switchback

    assert "judges a switchback a stop cut short the same way, never on the blocks it ran" in readme
    assert "judge_stopped(" in inspect.getsource(switchback.judge_switchback)  # behaviour: test_switchback_stopped_day.py
    assert "--status status.json" in readme
