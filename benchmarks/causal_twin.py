"""Causal twin: does a response model invariant to the logging policy rank unseen policies better?

The "real system" is the emulated cluster. Logs (issue 36):

* ``a``: production-like, the SLO-aware heuristic + 10 % noise, 6 days;
* ``b``: two regimes, the SLO-aware heuristic + 10 % noise for 4 days, then a least-loaded
  heuristic (`edgetwin.policies.heuristics.LeastLoaded`) + 10 % noise for 2 days;
* ``c1``..``c3``: ``a`` plus 1, 2, 3 days on which 10 % of the service groups are assigned at
  random to one of two arms (uniform random actions, or a regime-switching policy).

On each, two twins: today's (`Twin.fit(response_model="mail")`, MAIL-MMSG) and the causal one
(`response_model="causal"`, `edgetwin.imitation.causal`). Each twin scores 12 platform policies, none
of which wrote a row of any log, against the cluster on the same evaluation days: generated-
population mode (`Twin.rollout`) and replay mode (`logged_rollout` on the evaluation days' own
populations), with Spearman rho, mean relative error, normalised absolute error and regret@1
(`twin_fidelity._scores`), the share of the 12 real values inside the twin's 90 % interval
(ensemble members x episodes, uncalibrated) and the intervals' median width.

Run:  python benchmarks/causal_twin.py            (full: 100 agents x 96 ticks, 10 eval days, 5 members)
      python benchmarks/causal_twin.py --quick    (30 agents x 24 ticks, 2 eval days, 2 members,
                                                   small fits; a smoke-sized measurement)
Writes docs/benchmarks/causal_twin/results.json and docs/benchmarks/causal_twin/README.md.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from twin_fidelity import _scores, constant

from edgetwin.contract.policy import NoisyPolicy, PlatformPolicy, RandomPolicy, RegimePolicy
from edgetwin.emulator.cluster import ClusterConfig, cluster_spec
from edgetwin.emulator.logs import Regime, SLOAwarePolicy, generate_logs
from edgetwin.policies.heuristics import GreedyLowestCarbon, LeastLoaded, SchedulingView, Target
from edgetwin.twin.fidelity import logged_rollout
from edgetwin.twin.intervals import interval
from edgetwin.twin.twin import Twin

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "docs" / "benchmarks" / "causal_twin"
LOGS = ("a", "b", "c1", "c2", "c3")
MODELS = {"today": "mail", "causal": "causal"}
#: issue 36's targets
TARGETS = "on c (<= 3 rounds): rho >= 0.95, mean rel. error <= 10 %, regret 0, coverage >= 85 %, width <= half today's; on b and c: error >= 50 % below today's; on a: no worse than today"


def cluster_view() -> SchedulingView:
    """Where the cluster's placement is (edge = 1, cloud = 0) and what loads each target."""
    return SchedulingView(
        placement="action.edge_share",
        targets=(Target(1.0, load="state.site_util", carbon="state.carbon_g_per_kwh"), Target(0.0, load="state.cloud_util", carbon=300.0)),
        defaults={"action.capacity": 1.0, "action.price": 0.5},
    )


def log_regimes(name: str, spec: Any, seed: int, days: int) -> list[Regime]:
    """The regimes of logs ``a``, ``b``, ``c1``..``c3`` (``days``: log a's length)."""
    prod = Regime("heuristic", days, noise=0.1)
    if name == "a":
        return [prod]
    if name == "b":
        first = max(1, round(days * 4 / 6))
        return [Regime("heuristic", first, noise=0.1), Regime(LeastLoaded(spec, cluster_view()), days - first, noise=0.1, name="least-loaded+noise0.1")]
    rounds = int(name[1])
    arms = {"arm-random": RandomPolicy(spec, seed + 11), "arm-regimes": RegimePolicy(spec, seed + 12)}
    return [prod, Regime("heuristic", rounds, noise=0.1, arms=arms, arm_share=0.1)]


def evaluation_policies(spec: Any) -> dict[str, PlatformPolicy]:
    """12 policies, none of which logged a row of any of the logs."""
    view = cluster_view()
    return {
        "heuristic (SLO-aware), no noise": SLOAwarePolicy(spec),
        "heuristic + noise 0.3": NoisyPolicy(SLOAwarePolicy(spec), spec, 0.3, 3),
        "least-loaded, no noise": LeastLoaded(spec, view),
        "lowest carbon": GreedyLowestCarbon(spec, view),
        "all edge, cap 1, price .5": constant(1.0, 1.0, 0.5),
        "all cloud, cap 1, price .5": constant(0.0, 1.0, 0.5),
        "half, cap 2, price .2": constant(0.5, 2.0, 0.2),
        "half, cap .3, price .9": constant(0.5, 0.3, 0.9),
        "edge, cap 1.5, price .1": constant(1.0, 1.5, 0.1),
        "half, cap 1, price 1": constant(0.5, 1.0, 1.0),
        "quarter, cap .6, price .4": constant(0.25, 0.6, 0.4),
        "three quarters, cap 1.2, price .7": constant(0.75, 1.2, 0.7),
    }


def run_interval(df: pd.DataFrame) -> tuple[float, float]:
    """90 % interval of a policy's mean reward from the twin's runs (episode x member), uncalibrated."""
    per_run = df.groupby("episode")["reward"].mean().to_numpy(np.float64)
    lo, hi = interval(per_run[None, :], None, "reward")
    return float(lo), float(hi)


def score(rank: pd.DataFrame, col: str) -> dict[str, float]:
    real, est = rank["real"].to_numpy(np.float64), rank[col].to_numpy(np.float64)
    sc = _scores(real, est)
    lo, hi = rank[f"{col}_low"].to_numpy(np.float64), rank[f"{col}_high"].to_numpy(np.float64)
    return {
        "spearman": sc["spearman"],
        "mean_rel_error": sc["rel_err"],
        "norm_abs_error": sc["norm_abs_error"],
        "regret_at_1": sc["regret_at_1"],
        "coverage_90": float(((real >= lo) & (real <= hi)).mean()),
        "median_width": float(np.median(hi - lo)),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="smoke-sized configuration (see the module docstring)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--logs", default=",".join(LOGS), help="which logs, comma-separated (a,b,c1,c2,c3)")
    ap.add_argument("--page-only", action="store_true", help="rewrite README.md from results.json and stop")
    args = ap.parse_args()
    if args.page_only:
        (OUT / "README.md").write_text(page(json.loads((OUT / "results.json").read_text())))
        return
    if args.quick:
        cfg, days, eval_days, members = ClusterConfig(n_agents=30, steps=24), 3, 2, 2
        hyper: dict[str, Any] = {"rounds": 2, "bc_epochs": 2, "bc_max_steps": 200}
    else:
        cfg, days, eval_days, members = ClusterConfig(n_agents=100, steps=96), 6, 10, 5
        hyper = {}
    t0 = time.perf_counter()
    spec = cluster_spec(cfg)
    policies = evaluation_policies(spec)
    real: dict[str, pd.DataFrame] = {}
    for name, pol in policies.items():
        real[name], _ = generate_logs(cfg, episodes=eval_days, policy=pol, seed=args.seed + 500)
    results: dict[str, Any] = {}
    tables: dict[str, pd.DataFrame] = {}
    for lname in args.logs.split(","):
        train, _ = generate_logs(cfg, regimes=log_regimes(lname, spec, args.seed, days), seed=args.seed)
        results[lname] = {}
        for mname, model in MODELS.items():
            t_fit = time.perf_counter()
            twin = Twin.fit(train, spec, seed=args.seed, members=members, progress=False, response_model=model,
                            population_hyper={"steps": 200 if args.quick else 500}, **hyper)
            fit_s = time.perf_counter() - t_fit
            rows = []
            for i, (pname, pol) in enumerate(policies.items()):
                gen = twin.rollout(pol, episodes=eval_days, seed=args.seed + 500 + i, n_agents=cfg.n_agents,
                                   steps=cfg.steps, all_members=True)
                rep = logged_rollout(twin, pol, real[pname], seed=args.seed + 500 + i, all_members=True)
                g_lo, g_hi = run_interval(gen)
                r_lo, r_hi = run_interval(rep)
                rows.append({"policy": pname, "real": float(real[pname]["reward"].mean()),
                             "generated": float(gen["reward"].mean()), "generated_low": g_lo, "generated_high": g_hi,
                             "replay": float(rep["reward"].mean()), "replay_low": r_lo, "replay_high": r_hi})
            rank = pd.DataFrame(rows)
            tables[f"{lname}/{mname}"] = rank
            results[lname][mname] = {mode: score(rank, mode) for mode in ("generated", "replay")}
            results[lname][mname]["fit_seconds"] = fit_s
            results[lname][mname]["overlap"] = twin.meta["overlap"]
            print(lname, mname, json.dumps(results[lname][mname], default=str), flush=True)
            write(args, cfg, days, eval_days, members, hyper, t0, results, tables)  # after every fit: a partial run is kept
    print(json.dumps(results, indent=1, default=str))


def write(args: argparse.Namespace, cfg: ClusterConfig, days: int, eval_days: int, members: int,
          hyper: dict[str, Any], t0: float, results: dict[str, Any], tables: dict[str, pd.DataFrame]) -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    doc = {"config": {"quick": args.quick, "seed": args.seed, "n_agents": cfg.n_agents, "steps": cfg.steps,
                      "log_a_days": days, "eval_days": eval_days, "members": members, "hyper": hyper,
                      "minutes": (time.perf_counter() - t0) / 60},
           "targets": TARGETS, "results": results,
           "policies": {k: v.to_dict("records") for k, v in tables.items()}}
    (OUT / "results.json").write_text(json.dumps(doc, indent=1, default=str))
    (OUT / "README.md").write_text(page(doc))


METRICS = ("spearman", "mean_rel_error", "norm_abs_error", "regret_at_1", "coverage_90", "median_width")


def page(doc: dict[str, Any]) -> str:
    """The benchmark's page from its results.json (also for a partial run: the logs it reached)."""
    c = doc["config"]
    cmd = "python benchmarks/causal_twin.py" + (" --quick" if c["quick"] else "") + (f" --seed {c['seed']}" if c["seed"] else "")
    L = ["# Causal twin (issue 36)", "", __doc__.split("\n\n", 1)[1].split("Run:")[0].strip(), "",
         f"This run: `{cmd}` ({c['n_agents']} agents x {c['steps']} ticks, log a {c['log_a_days']} days, "
         f"{c['eval_days']} evaluation days per policy, {c['members']} members, hyper {c['hyper']}; "
         f"{c['minutes']:.0f} min on 2 shared cores).", "",
         "Full run (not run here: hours on this machine): `python benchmarks/causal_twin.py`.", "",
         f"Targets: {doc['targets']}.", ""]
    for mode in ("generated", "replay"):
        L += [f"## {mode} mode", "", "| logs | model | " + " | ".join(METRICS) + " | overlap (verdict, ESS) |",
              "|---|---|" + "---|" * len(METRICS) + "---|"]
        for lname, per in doc["results"].items():
            for mname, r in per.items():
                o = r["overlap"]
                L.append(f"| {lname} | {mname} | " + " | ".join(f"{r[mode][k]:.2f}" for k in METRICS)
                         + f" | {o['verdict']}, {o['ess_share']:.0%} |")
        L.append("")
    return "\n".join(L) + "\n"


if __name__ == "__main__":
    main()
