"""Issue 48: canary rounds pooled with weights fixed by the design, not by their estimated variances.

On a skewed KPI a round's estimate and its estimated variance move together (a draw that misses the
far-out groups is low *and* looks precise), so inverse-variance weights favour the low draws and the
pooled interval misses; weights fixed before the outcomes (`edgetwin.loop.ppi.design_weights`: every
day alike, a day's rounds by planned exposure) keep it. Simulated here with a known truth, and the
closed-loop page's numbers for the stored reward days checked against the JSON the benchmark wrote."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]


def _skewed(rng: np.random.Generator, n: int) -> np.ndarray:
    """``(n,)`` per-group outcomes: N(0, 1) plus 30 on 3 % of the groups (mean 0.9; a 40-group draw
    holds none of them 30 % of the time)."""
    return rng.normal(0.0, 1.0, n) + 30.0 * (rng.random(n) < 0.03)


def _eight_days(rng: np.random.Generator, shift: float) -> list[dict[str, float]]:
    """One canary round on each of 8 days: 40 candidate groups against 400 control groups, both drawn
    from the same skewed population, the candidate's shifted by ``shift`` (the true difference)."""
    from edgetwin.loop.ppi import ppi_mean_difference

    rounds = []
    for d in range(8):
        yc, yb = _skewed(rng, 40) + shift, _skewed(rng, 400)
        e = ppi_mean_difference(np.zeros(5), np.zeros(5), yc, np.zeros(40), yb, np.zeros(400), 0.90)
        e["day"] = float(d)
        rounds.append(e)
    return rounds


@pytest.mark.parametrize("shift", [0.0, 0.5])
def test_design_weights_cover_where_outcome_dependent_weights_do_not(shift: float) -> None:
    """300 runs of 8 days, the truth ``shift``: the loop's pooled 90 % interval of the difference
    covers it (>= 86 %: 90 % less 3 binomial standard errors at 300 runs) and its estimate is
    unbiased; inverse-variance weights (the pooling before issue 48) cover far less, biased low."""
    from edgetwin.loop.ppi import combine_estimates, t_quantile

    rng = np.random.default_rng(48)
    runs = [_eight_days(rng, shift) for _ in range(300)]

    def covered(c: dict[str, float]) -> bool:
        half = t_quantile(0.90, c["df"]) * c["diff_se"]
        return bool(c["diff"] - half <= shift <= c["diff"] + half)

    pooled = [combine_estimates(r, 0.90) for r in runs]
    cov = float(np.mean([covered(c) for c in pooled]))
    bias = float(np.mean([c["diff"] for c in pooled])) - shift
    assert cov >= 0.86, f"the loop's pooling covered {cov:.3f}"
    assert abs(bias) < 0.15  # the sd of a pooled diff is about 0.6 here: a run's mean over 300 within 3 sd of it
    iv = [combine_estimates(r, 0.90, weighting="inverse_variance") for r in runs]
    assert float(np.mean([covered(c) for c in iv])) < 0.70
    assert float(np.mean([c["diff"] for c in iv])) - shift < -0.3


def test_the_weights_do_not_depend_on_the_outcomes() -> None:
    """Making one round's estimated variance 100x smaller (its estimate unchanged) leaves the pooled
    estimate where it was; the weights are the days' (each 1/D), within a day by planned exposure."""
    from edgetwin.loop.ppi import EXPOSURE, combine_estimates, design_weights, finish_estimate

    def rnd(day: int, diff: float, var: float, exposure: float | None = None) -> dict[str, float]:
        e = finish_estimate(diff, var, 1.0, 1e-6, 0.9, df=30.0)
        e.update(day=float(day), twin_diff=diff / 2, twin_rel=0.0)
        if exposure is not None:
            e[EXPOSURE] = exposure
        return e

    base = [rnd(0, 0.1, 0.04), rnd(1, -0.2, 0.04), rnd(2, 0.3, 0.04)]
    sharp = [rnd(0, 0.1, 0.04), rnd(1, -0.2, 0.0004), rnd(2, 0.3, 0.04)]
    a, b = combine_estimates(base), combine_estimates(sharp)
    assert a["diff"] == pytest.approx(b["diff"], rel=1e-12) == pytest.approx(0.2 / 3, rel=1e-12)
    assert a["twin_diff"] == pytest.approx(0.1 / 3, rel=1e-12)  # the twin's difference pooled alike
    # two rounds on day 0 (planned 300 and 100 agent-steps) and one on day 1: 3/8, 1/8, 1/2
    w = design_weights([rnd(0, 0.0, 0.01, 300.0), rnd(0, 0.0, 0.01, 100.0), rnd(1, 0.0, 0.01, 50.0)])
    assert w == pytest.approx([0.375, 0.125, 0.5], rel=1e-12)


def test_the_loop_stamps_each_round_with_its_planned_agent_steps(monkeypatch: pytest.MonkeyPatch) -> None:
    """`edgetwin.loop.rounds._round_estimates` sets ``exposure`` from the plan's agent-steps (known
    before the round's outcomes), the weight `design_weights` reads, beside the round's day."""
    from types import SimpleNamespace

    from edgetwin.loop import rounds
    from edgetwin.loop.ppi import EXPOSURE

    monkeypatch.setattr(rounds, "canary_verdict", lambda *a, **k: {"kpi.x": {"diff": 0.1}, "reward": {"diff": -0.2}})
    plan = SimpleNamespace(agent_steps=4 * 24 * 5)
    got = rounds._round_estimates(None, None, SimpleNamespace(log=None, fleet_log=None, stop_reason="completed"),  # type: ignore[arg-type]
                                  plan, None, None, "v", {}, 4, 96, 0, None, False, 3.0)  # type: ignore[arg-type]
    assert {k: (e[EXPOSURE], e["day"]) for k, e in got.items()} == {"kpi.x": (480.0, 3.0), "reward": (480.0, 3.0)}


def test_the_page_quotes_the_heavy_tail_pooling() -> None:
    """The closed-loop page's "CUPED's slope and heavy tails" section quotes the design pooling's
    re-randomization coverage and the 8-day look as the JSON has them."""
    page = (ROOT / "docs/benchmarks/closed_loop/README.md").read_text()
    sec = " ".join(page.split("## CUPED's slope and heavy tails", 1)[1].split("\n## ", 1)[0].split())
    res = json.loads((ROOT / "docs/benchmarks/closed_loop/scale/reward48_seed2.json").read_text())
    pa = res["pooled_aa"]
    want = (f"{100 * pa['design']:.1f} % with the design weights the loop now uses (mean z {pa['mean_z_design']:.2f}; "
            f"median width {pa['median_width_design']:.3f} against {pa['median_width_inverse_variance']:.3f})")
    assert want.replace("z -", "z −") in sec
    p8 = res["pooled_design"][-1]
    lo, hi = p8["diff_interval"]
    assert p8["days"] == 8 and lo <= p8["truth_diff_of_these_days"] <= hi
    assert f"{p8['diff']:.3f} [{lo:.3f}, {hi:.3f}] at 98 %".replace("-", "−") in sec
    # "the look no longer refuses": both ends of the verdict's hull straddle no change
    assert p8["rel_interval"][0] < 0 < p8["rel_interval"][1] and p8["local_rel_interval"][0] < 0 < p8["local_rel_interval"][1]
    assert res["pooled"][-1]["rel_interval"][1] < 0  # the inverse-variance look (the stored run's) refused


def test_the_page_quotes_the_pooled_day_coverage() -> None:
    """The page's before/after of the multi-day coverage runs is the stored JSON's, and every candidate
    type's pooled interval (4 and 8 canary days) keeps >= 87 % coverage with the design weights."""
    page = (ROOT / "docs/benchmarks/closed_loop/README.md").read_text()
    sec = " ".join(page.split("## CUPED's slope and heavy tails", 1)[1].split("\n## ", 1)[0].split())
    doc = json.loads((ROOT / "docs/benchmarks/closed_loop/scale/pool48_day_coverage.json").read_text())
    for cd in ("4", "8"):
        for t, v in doc["pooled"][cd].items():
            b, a = v["before"], v["after"]
            assert a["cov"] >= 0.87, (cd, t)
            assert (f"{t} {100 * b['cov']:.1f} % → {100 * a['cov']:.1f} % (width {100 * b['width']:.1f} → "
                    f"{100 * a['width']:.1f} pp") in sec
            runs = [doc["runs"]["after"][s]["by_canary_days"][cd][t] for s in ("0", "1", "2")]
            assert a["cov"] == pytest.approx(np.mean([r["coverage"] for r in runs]), abs=1e-9)
    one = doc["pooled"]["1"]
    assert all(v["before"]["cov"] == v["after"]["cov"] for v in one.values())  # one day pools nothing
    assert f"A/A {100 * one['aa']['after']['cov']:.1f} %)" in sec


def test_canary_md_says_so() -> None:
    """docs/canary.md's pooling sentence: the weights are the design's, and its numbers are the JSON's."""
    doc = " ".join((ROOT / "docs/canary.md").read_text().split())
    pa = json.loads((ROOT / "docs/benchmarks/closed_loop/scale/reward48_seed2.json").read_text())["pooled_aa"]
    assert "every canary day weighs alike and a day's rounds split its weight by their planned agent-steps (`design_weights`" in doc
    assert (f"re-randomized: {100 * pa['inverse_variance']:.1f} % coverage of a stated 90 %, {100 * pa['design']:.1f} % "
            "with the design weights") in doc
