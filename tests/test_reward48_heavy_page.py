"""The closed-loop page's section "CUPED's slope and heavy tails" against the JSON it is written from
(docs/benchmarks/closed_loop/scale/reward48_seed2.json, benchmarks/_closed_loop_heavy.py), the stored
seed-2 run it explains, and the code it describes."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
from scipy import stats

ROOT = Path(__file__).resolve().parents[1]
PAGE = (ROOT / "docs/benchmarks/closed_loop/README.md").read_text()
SEC = " ".join(PAGE.split("## CUPED's slope and heavy tails: why seed 2's reward refusal missed", 1)[1].split())
SCALE = ROOT / "docs/benchmarks/closed_loop/scale"
RES = json.loads((SCALE / "reward48_seed2.json").read_text())
STORED = json.loads((SCALE / "extended_fc_interval_division_seed2.json").read_text())["by_fleet_size"]["1000"]
COV = json.loads((ROOT / "docs/benchmarks/closed_loop/results_production.json").read_text())["coverage_experiment"]


def pct(x: float) -> str:
    return f"{100 * x:.1f} %"


def test_the_stored_refusal_as_quoted() -> None:
    why = STORED["per_candidate"][0]["rounds"][7]["why"]["reward"]
    t = why["terms"]
    diff = why["change"] * abs(t["base"])
    se = math.sqrt(t["own"] + t["shared"] + t["day"])
    q = float(stats.t.ppf(0.5 + t["level"] / 2, t["df"]))
    assert f"was {diff:.4f} reward per agent-step" in SEC.replace("−", "-")
    assert f"({100 * why['change']:.1f} % of the baseline level {t['base']:.3f})".replace("-", "−") in SEC
    assert f"[{diff - q * se:.3f}, {diff + q * se:.3f}]".replace("-", "−") in SEC
    truth = STORED["truth"]
    t20 = truth["slo-aware heuristic"]["reward"] - truth["current"]["reward"]
    assert f"(the 20 truth days: +{t20:.3f})" in SEC
    assert f"by {(t20 - diff) / se:.1f} of its standard errors ({se:.4f})" in SEC
    assert f"(one day's variance {t['day_one_rounds']:.4f})" in SEC


def test_the_days_as_quoted() -> None:
    days = RES["per_day"]
    p8 = RES["pooled"][-1]
    assert p8["days"] == 8 and f"+{p8['truth_diff_of_these_days']:.3f} on average" in SEC
    below = sum(d["z"] < 0 for d in days)
    assert f"({below} of {len(days)}; Σz/√8 = {RES['z_sum_over_sqrt_days']:.2f})".replace("-", "−") in SEC
    assert RES["days_below_truth"] == below == 7
    tc = {d["day"]: d["transport_check"] for d in days if d["transport_check"]}
    assert sorted(tc) == [1, 2, 4, 5]
    canary = ", ".join(f"{v['cand_arm_canary_minus_allcur']:+.3f}" for v in tc.values()).replace("-", "−")
    full = ", ".join(f"{v['cand_arm_allcand_minus_allcur']:+.3f}" for v in tc.values()).replace("-", "−")
    assert f"gained {canary} in the canary" in SEC and f"gained {full} with the whole cluster switched" in SEC
    assert max(abs(v["ctrl_arm_canary_minus_allcur"]) for v in tc.values()) <= 0.024 + 5e-4
    lo, lo_local = p8["rel_interval"][1], p8["local_rel_interval"][1]
    assert f"({pct(lo)} and {pct(lo_local)} upper ends)".replace("-", "−") in SEC
    assert f"averaged {p8['truth_base_of_these_days']:.3f}".replace("-", "−") in SEC
    d3 = days[3]
    assert d3["day_seed"] == 2203 and f"seed 2203, {d3['truth_base']:.2f}".replace("-", "−") in SEC
    truth_days = json.loads((SCALE / "day_truth_seed2.json").read_text())["values"]["current"]["reward"]
    assert f"average {np.mean(truth_days):.3f}".replace("-", "−") in SEC
    assert f"run from {min(truth_days):.2f} to +{max(truth_days):.2f}".replace("-", "−") in SEC
    cur = np.array(truth_days)
    cand = np.array(json.loads((SCALE / "day_truth_seed2.json").read_text())["values"]["slo-aware heuristic"]["reward"])
    true_var = float(np.var(cand - cur, ddof=1))
    day_one = STORED["per_candidate"][0]["rounds"][7]["why"]["reward"]["terms"]["day_one_rounds"]
    assert 0.5 < day_one / true_var < 2.0  # "the size of the days' true spread"


def test_the_coverage_numbers_as_quoted() -> None:
    lo_p, hi_p = RES["aa_min"]["plug_in"], RES["aa_max"]["plug_in"]
    lo_j, hi_j = RES["aa_min"]["jackknife"], RES["aa_max"]["jackknife"]
    assert f"covered {100 * lo_p:.1f}-{100 * hi_p:.1f} % at a stated 90 %" in SEC
    assert f"covers {100 * lo_j:.1f}-{100 * hi_j:.1f} %" in SEC
    corr = [c for d in RES["per_day"] for c in d["pre_period_correlation"]]
    assert f"(correlation {min(corr):.2f}-{max(corr):.3f} over the days' arms)" in SEC
    before = RES["coverage_experiment_before"]
    aa = COV["aa"]
    assert f"moved from {pct(before['aa_coverage'])} to {pct(aa['coverage'])} A/A coverage" in SEC
    assert f"median width from {100 * before['aa_median_width']:.0f} to {100 * aa['median_width']:.0f} pp" in SEC
    skew_up = sum(d["adjusted_rectifier_skew_control_arm"] > 0 for d in RES["per_day"])
    assert f"skewed upwards on {skew_up} of 8 days" in SEC and skew_up == 7
    p8 = RES["pooled"][-1]
    lo, hi = p8["diff_interval"]
    assert f"{p8['diff']:.3f} [{lo:.3f}, {hi:.3f}] at 98 %".replace("-", "−") in SEC and hi < 0
    pa = RES["pooled_aa"]
    assert f"covered {pct(pa['inverse_variance'])} with inverse-variance weights (mean z {pa['mean_z_inverse_variance']:.2f})".replace(
        "z -", "z −") in SEC
    assert f"{pct(pa['equal_weights'])} with equal day weights (mean z {pa['mean_z_equal_weights']:.2f})".replace("z -", "z −") in SEC


@pytest.mark.parametrize("cuped", ["per_arm", "pooled"])
def test_the_verdict_uses_the_jackknife(cuped: str) -> None:
    """"the jackknife variance that replaced it": ppi_mean_difference's arms' terms are cuped_adjusted's."""
    from edgetwin.loop.cuped_jackknife import cuped_adjusted
    from edgetwin.loop.ppi import MIN_PER_ARM, ppi_mean_difference

    rng = np.random.default_rng(1)
    xc, xb = rng.normal(size=30), rng.normal(size=60)
    yc, yb = xc + rng.normal(size=30), xb + rng.normal(size=60)
    out = ppi_mean_difference(np.zeros(5), np.zeros(5), yc, np.zeros(30), yb, np.zeros(60), x_cand=xc, x_ctrl=xb, cuped=cuped)
    a = cuped_adjusted(yc, xc, yb, xb, per_arm=cuped == "per_arm" and MIN_PER_ARM <= 30)
    assert out["diff_var_own"] == pytest.approx(a.var_c + a.var_b, rel=1e-12)
    assert out["base_var_own"] == pytest.approx(a.var_base, rel=1e-12)


def test_canary_md_says_so() -> None:
    doc = " ".join((ROOT / "docs/canary.md").read_text().split())
    assert "the arms' variance is the jackknife's, which counts the fitted slope's own error, `edgetwin.loop.cuped_jackknife`" in doc
    lo, hi = RES["aa_min"]["plug_in"], RES["aa_max"]["plug_in"]
    assert f"covered {100 * lo:.1f}-{100 * hi:.1f} % of A/A draws at a stated 90 %" in doc



def test_the_rerun_on_the_jackknife_as_quoted() -> None:
    doc = json.loads((SCALE / "reward48_rerun_seed2.json").read_text())
    c = doc["by_fleet_size"]["1000"]["per_candidate"][0]
    assert doc["fleet_control"] and doc["cuped"] == "per_arm" and c["policy"] == "slo-aware heuristic"
    last = c["rounds"][-1]
    w = last["why"]["reward"]
    assert len(c["rounds"]) == 8 and last["verdict"] == "refuse" and last["checks"]["reward"] == "regress"
    assert w["interval"][0] == -math.inf
    quoted = (f"refuse after 8 days, reward {100 * w['change']:.1f} % [−inf, {100 * w['interval'][1]:.1f} %] over a "
              f"baseline level of {w['terms']['base']:.3f})").replace("-", "−")
    assert quoted in SEC
    # the same 8-day look the diagnosis recomputes from the recorded days
    p8 = RES["pooled"][-1]
    assert w["change"] == pytest.approx(p8["rel"], rel=1e-6) and w["terms"]["base"] == pytest.approx(p8["base"], rel=1e-6)
