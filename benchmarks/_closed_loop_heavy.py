"""Why seed 2's 1,000-group loop refused the slo-aware heuristic on ``reward`` (issue 48): the
prediction-powered difference on a heavy-tailed, two-signed KPI at the loop's arm sizes.

The run: ``python benchmarks/closed_loop.py --scale --seed 2 --fleet-sizes 1000 --max-candidates 1
--truth-days 20 --max-days 16 --reuse docs/benchmarks/closed_loop/scale --fleet-control --cuped
per_arm`` (the benchmark's run, its first candidate) with `edgetwin.loop.ppi._rectified` wrapped to
record every canary day's inputs to the verdict's ``reward`` estimate (the twin's fleet predictions,
both arms' measurements, predictions and pre-period means, the day and interference terms), and the
whole cluster's reward on each canary day's seed under each policy (the day's truth,
`closed_loop.truth_kpis`), into ``docs/benchmarks/closed_loop/scale/reward48_seed2_days.{npz,json}``
(day 0 on the fleet seed 2007, day d on 2200 + d). The rerun reproduced the stored verdict (refuse
after 8 days, the same estimates).

`diagnose` reads those files only (seconds of CPU): each day's estimate with the code in place
against that day's truth, the looks' pooled intervals (`combine_estimates` at `look_level`, with the
inverse-variance weights the stored run used and with the design weights the loop now uses), and an
A/A re-randomization per day (49 of the day's 951 control groups drawn as the candidate arm, every
group on the current policy, so the truth is 0) of the per-arm CUPED interval with the jackknife
variance (`edgetwin.loop.cuped_jackknife`) and with the plug-in variance of the adjusted residuals
it replaced. Written to ``docs/benchmarks/closed_loop/scale/reward48_seed2.json``; the closed-loop
page's section "CUPED's slope and heavy tails" quotes it (tests/test_reward48_heavy_page.py,
tests/test_pool48_design_weights.py: the design-weighted pooling, ``pooled_design`` and ``pooled_aa``'s
``design``).

    python benchmarks/_closed_loop_heavy.py            # diagnose (the default)
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "docs/benchmarks/closed_loop/scale/reward48_seed2_days"
OUT = ROOT / "docs/benchmarks/closed_loop/scale/reward48_seed2.json"
#: the candidate arm's size on the loop's days (fleet control: the other 951 groups are the control)
N_CAND = 49
AA_DRAWS = 400
#: the coverage experiment's A/A row before the jackknife (results_production.json at commit 9e3e8a6, the
#: plug-in variance; `python benchmarks/closed_loop.py --coverage --seeds 3 --runs 200 --days 20`), kept
#: beside this diagnosis for the page's before/after sentence
COVERAGE_BEFORE = {"commit": "9e3e8a6", "aa_coverage": 0.8816666666666667, "aa_median_width": 0.930956314378936}
POOL_REPS = 300


def load_days() -> list[dict[str, Any]]:
    """The captured days: per day the meta (seed, the estimate's extra terms, the day's truth) and arrays."""
    meta = json.loads(DATA.with_suffix(".json").read_text())
    arrs = np.load(DATA.with_suffix(".npz"))
    return [{**m, **{k.split("_", 1)[1]: arrs[k] for k in arrs.files if k.startswith(f"d{m['day']}_")}} for m in meta]


def day_estimate(d: dict[str, Any]) -> dict[str, float]:
    """One day's ``reward`` estimate as the loop made it (transport, with the no-interference one as ``local:*``)."""
    from edgetwin.loop.ppi import _LOCAL_KEYS, LOCAL, ppi_mean_difference

    def one(pre: str, tv: tuple[float, float]) -> dict[str, float]:
        return ppi_mean_difference(d[f"{pre}fc"], d[f"{pre}fb"], d["yc"], d[f"{pre}pc"], d["yb"], d[f"{pre}pb"], 0.90,
                                   x_cand=d["xc"], x_ctrl=d["xb"], transport_var=tv, transport_df=d["transport_df"],
                                   day_var=(d["day_term"][0], d["day_term"][1]), day_df=d["day_term"][2],
                                   cuped=d["cuped"])  # fmt: skip

    e = one("", (d["transport_var"][0], d["transport_var"][1]))
    loc = one("local_", (0.0, 0.0))
    e.update({f"{LOCAL}{k}": loc[k] for k in _LOCAL_KEYS})
    e["day"] = e[f"{LOCAL}day"] = float(d["day"])
    return e


def aa_coverage(d: dict[str, Any], rng: np.random.Generator, draws: int = AA_DRAWS) -> dict[str, float]:
    """The day's control groups re-randomized: coverage of the 90 % interval of the difference (truth 0)
    with the jackknife variance and with the plug-in one, and the spread of ``diff / se`` for each."""
    from edgetwin.loop.cuped_jackknife import cuped_adjusted
    from edgetwin.loop.ppi import t_quantile, welch_df

    y, p, x = d["yb"], d["pb"], d["xb"]
    z: dict[str, list[float]] = {"jackknife": [], "plug_in": []}
    cov = {"jackknife": 0, "plug_in": 0}
    for _ in range(draws):
        perm = rng.permutation(len(y))
        ic, ib = perm[:N_CAND], perm[N_CAND:]
        a = cuped_adjusted(y[ic] - p[ic], x[ic], y[ib] - p[ib], x[ib], per_arm=True)
        diff = float(a.rc.mean() - a.rb.mean())
        plug = (float(np.var(a.rc, ddof=1)) / len(a.rc), float(np.var(a.rb, ddof=1)) / len(a.rb))
        for name, (vc, vb) in (("jackknife", (a.var_c, a.var_b)), ("plug_in", plug)):
            z[name].append(diff / math.sqrt(vc + vb))
            cov[name] += abs(z[name][-1]) <= t_quantile(0.90, welch_df([(vc, len(ic) - 2), (vb, len(ib) - 2)]))
    return {"jackknife": cov["jackknife"] / draws, "plug_in": cov["plug_in"] / draws,
            "z_sd_jackknife": float(np.std(z["jackknife"])), "z_sd_plug_in": float(np.std(z["plug_in"])),
            "draws": draws}  # fmt: skip


def pooled_aa(days: list[dict[str, Any]], rng: np.random.Generator, reps: int = POOL_REPS) -> dict[str, Any]:
    """The 8 days re-randomized together (each day 49 of its control groups drawn as the candidate arm,
    the truth 0): coverage of the pooled 90 % interval of the difference by `combine_estimates` with
    inverse-variance weights (``weighting="inverse_variance"``, the loop's before issue 48), by
    `combine_estimates` as the loop now pools (``design``: weights fixed by the design, every day
    alike, with the rounds' between-day term), and by equal day weights computed here (each day's
    variance fixed by its design, not by its draw, no between-day term), with the mean and sd of
    ``diff / se`` for each and the design pooling's median interval width (beside the
    inverse-variance one's)."""
    from edgetwin.loop.ppi import combine_estimates, ppi_mean_difference, t_quantile, welch_df

    z_iv, z_eq, z_de, cov_iv, cov_eq, cov_de = [], [], [], 0, 0, 0
    w_iv, w_de = [], []
    zero = np.zeros(10)
    for _ in range(reps):
        ests = []
        for d in days:
            y, p, x = d["yb"], d["pb"], d["xb"]
            perm = rng.permutation(len(y))
            ic, ib = perm[:N_CAND], perm[N_CAND:]
            e = ppi_mean_difference(zero, zero, y[ic], p[ic], y[ib], p[ib], 0.90, x_cand=x[ic], x_ctrl=x[ib], cuped="per_arm")
            e["day"] = float(d["day"])
            ests.append(e)
        c = combine_estimates(ests, 0.90, weighting="inverse_variance")
        z_iv.append(c["diff"] / c["diff_se"])
        cov_iv += abs(z_iv[-1]) <= t_quantile(0.90, c["df"])
        w_iv.append(2 * t_quantile(0.90, c["df"]) * c["diff_se"])
        de = combine_estimates(ests, 0.90)
        z_de.append(de["diff"] / de["diff_se"])
        cov_de += abs(z_de[-1]) <= t_quantile(0.90, de["df"])
        w_de.append(2 * t_quantile(0.90, de["df"]) * de["diff_se"])
        k = len(ests)
        m, v = float(np.mean([e["diff"] for e in ests])), float(np.sum([e["diff_se"] ** 2 for e in ests])) / k**2
        z_eq.append(m / math.sqrt(v))
        cov_eq += abs(z_eq[-1]) <= t_quantile(0.90, welch_df([(e["diff_se"] ** 2 / k**2, e["df"]) for e in ests]))
    return {"reps": reps, "days": len(days), "inverse_variance": cov_iv / reps, "equal_weights": cov_eq / reps,
            "mean_z_inverse_variance": float(np.mean(z_iv)), "mean_z_equal_weights": float(np.mean(z_eq)),
            "sd_z_inverse_variance": float(np.std(z_iv)), "sd_z_equal_weights": float(np.std(z_eq)),
            "design": cov_de / reps, "mean_z_design": float(np.mean(z_de)), "sd_z_design": float(np.std(z_de)),
            "median_width_design": float(np.median(w_de)), "median_width_inverse_variance": float(np.median(w_iv))}  # fmt: skip


def diagnose() -> dict[str, Any]:
    """The per-day estimates, the looks' pooled intervals and the A/A coverage (module docstring)."""
    from edgetwin.loop.cuped_jackknife import cuped_adjusted
    from edgetwin.loop.ppi import LEVEL, LOCAL, combine_estimates, look_days, look_level, t_quantile

    days = load_days()
    rng = np.random.default_rng(48)
    ests = [day_estimate(d) for d in days]
    per_day = []
    for d, e in zip(days, ests, strict=True):
        truth = d["truth_candidate"] - d["truth_current"]
        # the control arm's rectifier after the day's per-arm slope: the population a candidate arm is drawn from
        adjusted = cuped_adjusted(d["yc"] - d["pc"], d["xc"], d["yb"] - d["pb"], d["xb"], per_arm=True)
        per_day.append({"day": d["day"], "day_seed": d["day_seed"], "diff": e["diff"], "diff_se": e["diff_se"],
                        "base": e["base"], "truth_diff": truth, "truth_base": d["truth_current"],
                        "z": (e["diff"] - truth) / e["diff_se"],
                        "adjusted_rectifier_skew_control_arm": float(_skew(adjusted.rb)),
                        "pre_period_correlation": [float(np.corrcoef(d["yc"], d["xc"])[0, 1]),
                                                   float(np.corrcoef(d["yb"], d["xb"])[0, 1])],
                        "aa": aa_coverage(d, rng), "transport_check": d.get("transport_check")})  # fmt: skip
    looks = len(look_days(16))
    pooled: dict[str, list[dict[str, Any]]] = {"inverse_variance": [], "design": []}
    for k, weighting in ((k, w) for w in pooled for k in (1, 2, 4, 8)):
        c = combine_estimates(ests[:k], look_level(LEVEL, looks), weighting=weighting)
        q = t_quantile(c["level"], c["df"])
        pooled[weighting].append({"days": k, "diff": c["diff"], "diff_se": c["diff_se"], "df": c["df"], "level": c["level"],
                       "diff_interval": [c["diff"] - q * c["diff_se"], c["diff"] + q * c["diff_se"]],
                       "rel": c["rel"], "rel_interval": [c["rel_lo"], c["rel_hi"]],
                       "local_rel_interval": [c[f"{LOCAL}rel_lo"], c[f"{LOCAL}rel_hi"]], "base": c["base"],
                       "truth_diff_of_these_days": float(np.mean([p["truth_diff"] for p in per_day[:k]])),
                       "truth_base_of_these_days": float(np.mean([p["truth_base"] for p in per_day[:k]]))})  # fmt: skip
    zs = np.array([p["z"] for p in per_day])
    w = np.array([1.0 / p["diff_se"] ** 2 for p in per_day])
    return {"command": "python benchmarks/_closed_loop_heavy.py", "candidate": "slo-aware heuristic", "seed": 2,
            "fleet": 1000, "n_candidate": N_CAND, "per_day": per_day,
            # "pooled": the looks as the stored loop rerun computed them (inverse-variance weights, before
            # issue 48); "pooled_design": the same looks as the loop now pools them
            "pooled": pooled["inverse_variance"], "pooled_design": pooled["design"],
            "z_sum_over_sqrt_days": float(zs.sum() / math.sqrt(len(zs))),
            "days_below_truth": int(np.sum(zs < 0)), "days": len(zs),
            "unweighted_mean_diff": float(np.mean([p["diff"] for p in per_day])),
            "weighted_mean_diff": float(np.sum(w * np.array([p["diff"] for p in per_day])) / w.sum()),
            "pooled_aa": pooled_aa(days, rng), "coverage_experiment_before": COVERAGE_BEFORE,
            "aa_min": {"jackknife": min(p["aa"]["jackknife"] for p in per_day),
                       "plug_in": min(p["aa"]["plug_in"] for p in per_day)},
            "aa_max": {"jackknife": max(p["aa"]["jackknife"] for p in per_day),
                       "plug_in": max(p["aa"]["plug_in"] for p in per_day)}}  # fmt: skip


def _skew(a: np.ndarray) -> float:
    """Sample skewness (third standardized moment) of ``a``."""
    a = np.asarray(a, dtype=np.float64)
    s = float(np.std(a))
    return float(np.mean((a - a.mean()) ** 3) / s**3) if s > 0 else 0.0


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    res = diagnose()
    OUT.write_text(json.dumps(res, indent=1))
    for p in res["per_day"]:
        print(f"day {p['day']}: diff {p['diff']:+.3f} (se {p['diff_se']:.3f}) truth {p['truth_diff']:+.3f} z {p['z']:+.2f}; "
              f"A/A 90 %: jackknife {p['aa']['jackknife']:.3f}, plug-in {p['aa']['plug_in']:.3f}")
    for key in ("pooled", "pooled_design"):
        for p in res[key]:
            lo, hi = p["diff_interval"]
            print(f"{key} look {p['days']} days: diff {p['diff']:+.3f} [{lo:+.3f}, {hi:+.3f}] at {p['level']:.0%}; "
                  f"rel {100 * p['rel']:+.1f} % [{100 * p['rel_interval'][0]:+.1f}, {100 * p['rel_interval'][1]:+.1f}] "
                  f"(no-interference [{100 * p['local_rel_interval'][0]:+.1f}, {100 * p['local_rel_interval'][1]:+.1f}]); "
                  f"these days' truth {p['truth_diff_of_these_days']:+.3f}")
    print("pooled A/A over the days:", res["pooled_aa"])
    print(f"wrote {OUT}")
