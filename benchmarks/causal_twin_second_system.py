"""Causal twin on a second system: the same table as causal_twin.py, on a system nobody tuned for.

The "real system" is `edgetwin.emulator.admission`: tenants' requests behind an admission controller
on gateways that share their capacity with a hidden background load. Its code, columns (admit /
premium actions, request rates, latency, backlog) and dynamics (a fluid request queue) are not the
emulated cluster's, and its logging controller decides from a forecast of the hidden load that the
logs do not keep, so its actions are confounded with a state the twin cannot see. Logs (issue 36):

* ``a``: production-like, the forecast-driven controller + 10 % noise;
* ``b``: two regimes, the controller for 2/3 of the days, then a controller on the logged state only
  (`ReactiveAdmission`), both + 10 % noise;
* ``c1``..``c3``: ``a`` plus 1, 2, 3 days on which 10 % of the tenants are assigned at random to one
  of two arms (uniform random actions, or a regime-switching policy).

On each, today's twin (`Twin.fit(response_model="mail")`) and the causal one
(`response_model="causal"`) score 10 policies on the logged observation
(`edgetwin.emulator.admission.reference_policies`, none of which logged a row) against the system on
the same evaluation days, in generated-population and replay modes: Spearman rho, mean relative
error, normalised absolute error, regret@1, the share of real values inside the twin's 90 % interval
and its median width (causal_twin.py's `score`). The interval is calibrated as in causal_twin.py: the
member x episode bootstrap widened by the twin's cross-fitted error on the logged policies' own values
(`edgetwin.twin.policy_calibration`, leave-one-day-out); ``coverage_90_plain`` / ``median_width_plain``
are the bare bootstrap's, ``cal. level`` the level the calibration days support. The truth's own
noise floor: the same scores between the real values on the evaluation days and on as many other days.

Run:  python benchmarks/causal_twin_second_system.py            (60 tenants x 48 ticks, log a 6 days,
                                                                  10 eval days, 5 members)
      python benchmarks/causal_twin_second_system.py --quick    (40 tenants x 24 ticks, log a 3 days,
                                                                  3 eval days, 2 members, small fits)
Writes docs/benchmarks/causal_twin/results_second_system.json and its section of
docs/benchmarks/causal_twin/README.md.
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

import numpy as np
import pandas as pd
from _docs import BENCH_DOCS, write_section
from causal_twin import _cal_cell, calibration_of, one_thread, policy_rows, score
from twin_fidelity import _scores

from edgetwin.emulator.admission import (
    AdmissionConfig,
    admission_spec,
    benchmark_regimes,
    evaluate,
    generate_admission_logs,
    reference_policies,
)
from edgetwin.twin.twin import Twin

OUT = BENCH_DOCS / "causal_twin"
RESULTS = OUT / "results_second_system.json"
HEADING = "## Second system: admission control behind a hidden load"
LOGS = ("a", "b", "c1", "c2", "c3")
MODELS = {"today": "mail", "causal": "causal"}
METRICS = ("spearman", "mean_rel_error", "norm_abs_error", "regret_at_1", "coverage_90", "median_width",
           "coverage_90_plain", "median_width_plain")


def noise_floor(real: dict[str, pd.DataFrame], again: dict[str, pd.DataFrame]) -> dict[str, float]:
    """The truth against itself on other days: what no twin can be asked to beat."""
    a = np.array([real[k]["reward"].mean() for k in real])
    b = np.array([again[k]["reward"].mean() for k in real])
    sc = _scores(a, b)
    return {"spearman": sc["spearman"], "mean_rel_error": sc["rel_err"], "norm_abs_error": sc["norm_abs_error"],
            "regret_at_1": sc["regret_at_1"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="smoke-sized configuration (see the module docstring)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--logs", default=",".join(LOGS), help="which logs, comma-separated (a,b,c1,c2,c3)")
    ap.add_argument("--page-only", action="store_true", help="rewrite the section from the JSON and stop")
    args = ap.parse_args()
    one_thread()
    if args.page_only:
        write_section(HEADING, page(json.loads(RESULTS.read_text())), OUT / "README.md", keep=("### Reading",))
        return
    logs = args.logs.split(",")
    bad = [x for x in logs if x not in LOGS]
    if bad:
        ap.error(f"--logs: unknown {bad}; expected among {','.join(LOGS)}")
    if args.quick:
        cfg, days, eval_days, members = AdmissionConfig(n_tenants=40, steps=24), 3, 3, 2
        hyper: dict[str, Any] = {"rounds": 2, "bc_epochs": 2, "bc_max_steps": 200}
        pop_steps = 200
    else:
        cfg, days, eval_days, members = AdmissionConfig(n_tenants=60, steps=48), 6, 10, 5
        hyper, pop_steps = {}, 500
    t0 = time.perf_counter()
    spec = admission_spec(cfg)
    policies = reference_policies(spec)
    real = evaluate(policies, cfg, eval_days, seed=args.seed + 500)
    again = evaluate(policies, cfg, eval_days, seed=args.seed + 900)
    doc: dict[str, Any] = {
        "config": {"quick": args.quick, "seed": args.seed, "n_tenants": cfg.n_tenants, "n_sites": cfg.n_sites,
                   "steps": cfg.steps, "log_a_days": days, "eval_days": eval_days, "members": members,
                   "hyper": hyper, "population_steps": pop_steps, "minutes": 0.0},
        "truth": {k: float(v["reward"].mean()) for k, v in real.items()},
        "truth_other_days": {k: float(v["reward"].mean()) for k, v in again.items()},
        "noise_floor": noise_floor(real, again),
        "results": {}, "policies": {},
    }
    print("truth", json.dumps(doc["truth"]), "noise floor", json.dumps(doc["noise_floor"]), flush=True)
    for lname in logs:
        train, _ = generate_admission_logs(cfg, regimes=benchmark_regimes(lname, days), seed=args.seed)
        doc["results"][lname] = {}
        for mname, model in MODELS.items():
            t_fit = time.perf_counter()
            twin = Twin.fit(train, spec, seed=args.seed, members=members, progress=False, response_model=model,
                            population_hyper={"steps": pop_steps}, **hyper)
            fit_s = time.perf_counter() - t_fit

            def refit(rows: pd.DataFrame, model: str = model) -> Twin:
                return Twin.fit(rows, spec, seed=args.seed, members=members, progress=False, response_model=model,
                                population_model="empirical", **hyper)  # the replays never sample a population

            cal, cal_doc = calibration_of(train, refit, args.seed)
            rank = policy_rows(twin, policies, real, seed=args.seed, eval_days=eval_days, n_agents=cfg.n_tenants,
                               steps=cfg.steps, calibration=cal)
            res: dict[str, Any] = {mode: score(rank, mode) for mode in ("generated", "replay")}
            res["calibration"] = cal_doc
            res["fit_seconds"] = fit_s
            res["overlap"] = twin.meta["overlap"]
            doc["results"][lname][mname] = res
            doc["policies"][f"{lname}/{mname}"] = rank.to_dict("records")
            doc["config"]["minutes"] = (time.perf_counter() - t0) / 60
            print(lname, mname, json.dumps(res, default=str), flush=True)
            write(doc)  # after every fit: a partial run is kept
    print(json.dumps(doc["results"], indent=1, default=str))


def write(doc: dict[str, Any]) -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(doc, indent=1, default=str))
    write_section(HEADING, page(doc), OUT / "README.md", keep=("### Reading",))


def page(doc: dict[str, Any]) -> str:
    """The section from the JSON (also for a partial run: the logs it reached)."""
    c = doc["config"]
    cmd = "python benchmarks/causal_twin_second_system.py" + (" --quick" if c["quick"] else "") + (
        f" --seed {c['seed']}" if c["seed"] else "")
    intro = __doc__.split("\n\n", 1)[1].split("Run:")[0].strip()
    L = [HEADING, "", intro, "",
         f"This run: `{cmd}` ({c['n_tenants']} tenants on {c['n_sites']} gateways x {c['steps']} ticks, log a "
         f"{c['log_a_days']} days, {c['eval_days']} evaluation days per policy, {c['members']} members, hyper "
         f"{c['hyper']}, population steps {c['population_steps']}; {c['minutes']:.0f} min on 2 shared cores). "
         "Full run (not run here): `python benchmarks/causal_twin_second_system.py`.", ""]
    nf = doc["noise_floor"]
    L += ["The truth's noise floor (the real values on the evaluation days against the same policies on as many "
          f"other days): spearman {nf['spearman']:.2f}, mean_rel_error {nf['mean_rel_error']:.2f}, norm_abs_error "
          f"{nf['norm_abs_error']:.2f}, regret_at_1 {nf['regret_at_1']:.2f}. Real values: "
          + ", ".join(f"{k} {v:.3f}" for k, v in sorted(doc["truth"].items(), key=lambda kv: -kv[1])) + ".", ""]
    for mode in ("generated", "replay"):
        L += [f"### {mode} mode (second system)", "",
              "| logs | model | " + " | ".join(METRICS) + " | cal. level | overlap (verdict, ESS) |",
              "|---|---|" + "---|" * len(METRICS) + "---|---|"]
        for lname, per in doc["results"].items():
            for mname, r in per.items():
                o = r["overlap"]
                L.append(f"| {lname} | {mname} | " + " | ".join(
                    f"{r[mode][k]:.2f}" if k in r[mode] else "—" for k in METRICS)
                         + f" | {_cal_cell(r)} | {o['verdict']}, {o['ess_share']:.0%} |")
        L.append("")
    return "\n".join(L)


if __name__ == "__main__":
    main()
