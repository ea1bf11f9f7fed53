"""README's sentence on the planner's expected interval: it is the verdict's own interval division on the expected
change and baseline level, unbounded where the baseline level's expected interval reaches 0; and the sentence that the
closed-loop headline ran on the code before that change names the code its JSON names."""

from __future__ import annotations

import json
import math
from pathlib import Path

from edgetwin.loop.plan_expected import expected_interval
from edgetwin.loop.ppi import finish_estimate, t_quantile, welch_df

ROOT = Path(__file__).resolve().parents[1]
README = " ".join((ROOT / "README.md").read_text().split())


def test_the_expected_interval_is_the_verdicts_division() -> None:
    assert ("`plan_canary(design=\"auto\")`: the verdict's own interval division on the expected change and the expected "
            "baseline level, so an expected interval is unbounded where the baseline level's expected interval reaches 0, "
            "as the verdict's would be; both carry the twin's interference term, which no number of canary days shrinks, "
            "and the interval is the hull of the estimates with and without the twin's interference, as the verdict's is)"
            ) in README  # fmt: skip
    terms = [(4.0, 20.0), (9.0, 30.0)]  # (variance in KPI units², df): the change's
    point, base = -0.1, 50.0
    lo, hi = expected_interval(point, base, terms, 1.0, 0.9)
    want = finish_estimate(point * base, 13.0, base, 1.0, 0.9, welch_df(terms))
    assert math.isclose(lo, want["rel_lo"], rel_tol=1e-9) and math.isclose(hi, want["rel_hi"], rel_tol=1e-9)
    # the baseline's error widens it beyond the old point ± q·se/base ...
    q = t_quantile(0.9, welch_df(terms))
    assert hi - lo > 2 * q * math.sqrt(13.0) / base
    # ... and a baseline whose expected interval reaches 0 leaves it unbounded
    lo0, hi0 = expected_interval(point, base, terms, (base / 1.0) ** 2, 0.9)
    assert math.isinf(lo0) or math.isinf(hi0)


def test_the_headline_ran_before_the_plan_change() -> None:
    """"Every size ran on the code before the plan's expected interval carried the baseline level's own error": the
    headline's code names ea1dcfd / ffc40e1, both before the merge that brought `edgetwin.loop.plan_expected`."""
    assert ("Every size ran on the code before the plan's expected interval carried the baseline level's own error "
            "(the canary plan, below); with that change a first day's plan may split a 10-group slice by coin flips where it "
            "paired it.") in README
    res = json.loads((ROOT / "docs/benchmarks/closed_loop/results_production.json").read_text())
    for v in res["by_fleet_size"].values():
        assert "ea1dcfd" in v["design"] and "ffc40e1" in v["design"] and "plan_expected" not in v["design"]


def test_the_interference_term_and_the_hull_as_the_readme_says() -> None:
    """"both carry the twin's interference term, which no number of canary days shrinks, and the interval is the hull":
    a term widens the interval, 16 days of it are still wider than 16 days without, and a shift of the no-interference
    estimate past the transporting one's end moves the hull's end."""
    from edgetwin.loop.plan_expected import NO_INTERFERENCE, Interference, verdict_interval

    args = (-0.1, 50.0, (1.0, 30.0), [(4.0, 20.0)], (0.0, 0.0, 0.0), (0.5, 1.0, 0.0), 0.9)
    for days in (1, 16):
        lo0, hi0 = verdict_interval(days, *args)
        lo1, hi1 = verdict_interval(days, *args, interference=Interference(var=9.0, base_var=0.0, df=4.0))
        assert lo1 < lo0 and hi1 > hi0
    wide = verdict_interval(16, *args, interference=Interference(var=9.0, base_var=0.0, df=4.0))
    assert wide[1] - wide[0] > 2 * 3.0 / 50.0 * 0.9  # the shared term alone (sd 3 over a level of 50), undivided
    lo2, hi2 = verdict_interval(1, *args, interference=Interference(var=1e-9, base_var=0.0, df=4.0, shift=-10.0))
    lo3, hi3 = verdict_interval(1, *args, interference=NO_INTERFERENCE)
    assert hi2 > hi3 + 0.1  # the no-interference estimate's change at point·base + 10: the hull reaches it


def test_the_canary_round_page_says_its_plan_predates_both_terms() -> None:
    """docs/canary.md's canary_round paragraph says its stored run predates the plan's baseline-error and interference
    terms: its recorded plan has neither the twin's point (recorded since planbase15) nor the interference fields
    (`PlannedKPI.interference_shift` / ``interference_sd``, since interf16), which today's plan writes."""
    from edgetwin.loop.plan import PlannedKPI

    doc = " ".join((ROOT / "docs/canary.md").read_text().split())
    assert ("before the plan's expected interval carried the baseline level's error and the twin's interference term, so "
            "its plan's numbers are that code's") in doc
    res = json.loads((ROOT / "docs/benchmarks/canary_round/results.json").read_text())
    kpis = [k for r in res["rounds"] for k in r["plan"]["kpis"]]
    assert kpis and not any({"point", "interference_shift", "interference_sd"} & set(k) for k in kpis)
    assert {"point", "interference_shift", "interference_sd"} <= set(PlannedKPI.__dataclass_fields__)
