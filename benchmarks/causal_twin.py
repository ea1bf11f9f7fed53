"""Causal twin: does a response model invariant to the logging policy rank unseen policies better?

The "real system" is the emulated cluster. Logs (issue 36):

* ``a``: production-like, the SLO-aware heuristic + 10 % noise, 6 days;
* ``b``: two regimes, the SLO-aware heuristic + 10 % noise for 4 days, then a least-loaded
  heuristic (`edgetwin.policies.heuristics.LeastLoaded`) + 10 % noise for 2 days;
* ``c1``..``c3``: ``a`` plus 1, 2, 3 days on which 10 % of the service groups are assigned at
  random to one of two arms (uniform random actions, or a regime-switching policy).

On each, three twins: today's (`Twin.fit(response_model="mail")`, MAIL-MMSG), the causal one
(`response_model="causal"`, `edgetwin.imitation.causal`) and, as the second baseline the issue
keeps, one-step MLP regression (`response_model="supervised"`). Each twin scores 12 platform policies, none
of which wrote a row of any log, against the cluster on the same evaluation days: generated-
population mode (`Twin.rollout`) and replay mode (`logged_rollout` on the evaluation days' own
populations), with Spearman rho, mean relative error, normalised absolute error and regret@1
(`twin_fidelity._scores`), the share of the 12 real values inside the twin's 90 % interval
and the intervals' median width (in reward units). The interval is the bootstrap one over ensemble
members x episodes widened by the twin's cross-fitted error on the policy values the log itself
holds (`edgetwin.twin.policy_calibration`), leave-one-day-out: for each day of the log, a twin with
the same response model fitted on the other days replays that day with its logged actions, and its
value of every logged policy (the regime, each randomized arm) on the held-out day is scored against
the logged one; the split-conformal quantile of the per-day largest relative error widens the interval by
``q · |value|``. ``coverage_90_plain`` / ``median_width_plain`` are the bare bootstrap interval's;
``cal. level`` is the level the number of calibration days supports (3 days: 75 %, 9 needed for
90 %; `edgetwin.twin.intervals.attained_level`).

The evaluation is noise-aware: every policy's real value and every twin's estimate is kept per
evaluation day; the rho and error numbers carry 90 % bootstrap intervals over the evaluation days
(the same days drawn for every policy, as the real days share their seeds), and the page states the
truth's own noise floor (rho and relative error between two disjoint halves of the real days), the
best any twin can show at that size.

Run:  python benchmarks/causal_twin.py            (full: 100 agents x 96 ticks, 10 eval days, 5 members)
      python benchmarks/causal_twin.py --mid      (50 agents x 24 ticks, log a 6 days, 6 eval days,
                                                   2 members, small MAIL fits: feasible on 2 cores)
      python benchmarks/causal_twin.py --quick    (30 agents x 24 ticks, 2 eval days, 2 members,
                                                   small fits; a smoke-sized measurement)
      --models today,causal,supervised            which twins (default all three; a rerun of some
                                                   models keeps the others' results of the same config)
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
from edgetwin.twin.intervals import Calibration, interval
from edgetwin.twin.policy_calibration import cross_fitted_policy_values, policy_value_calibration
from edgetwin.twin.twin import Twin

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "docs" / "benchmarks" / "causal_twin"
LOGS = ("a", "b", "c1", "c2", "c3")
MODELS = {"today": "mail", "causal": "causal", "supervised": "supervised"}
#: name -> (cluster config kwargs, log a days, eval days, members, Twin.fit hyper, population steps)
CONFIGS: dict[str, tuple[dict[str, int], int, int, int, dict[str, Any], int]] = {
    "quick": ({"n_agents": 30, "steps": 24}, 3, 2, 2, {"rounds": 2, "bc_epochs": 2, "bc_max_steps": 200}, 200),
    "mid": ({"n_agents": 50, "steps": 24}, 6, 6, 2, {"rounds": 2, "bc_epochs": 3, "bc_max_steps": 300}, 300),
    "full": ({"n_agents": 100, "steps": 96}, 6, 10, 5, {}, 500),
}
N_BOOT = 1000
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


def run_interval(df: pd.DataFrame, calibration: Calibration | None = None) -> tuple[float, float]:
    """90 % interval of a policy's mean reward from the twin's runs (episode x member): the bootstrap
    one, widened by ``calibration`` (`edgetwin.twin.intervals.interval`) when given."""
    per_run = df.groupby("episode")["reward"].mean().to_numpy(np.float64)
    lo, hi = interval(per_run[None, :], calibration, "reward")
    return float(lo), float(hi)


def calibration_of(train: pd.DataFrame, fit: Any, seed: int) -> tuple[Calibration, dict[str, Any]]:
    """The twin's value calibration on ``train`` (`edgetwin.twin.policy_calibration`, leave-one-day-out:
    ``fit(rows)`` refits the same response model on the other days, with the empirical population model:
    the replays start from the logged populations and never sample one) and its summary for results.json.
    One day out rather than two folds: a twin of half of a 3-day log errs far more than the twin of
    all 3 days whose intervals are calibrated."""
    t0 = time.perf_counter()
    units = cross_fitted_policy_values(fit, train, folds=int(train["episode"].nunique()), seed=seed)
    cal = policy_value_calibration(units)
    return cal, {"q": cal.quantile["reward"], "n_independent": cal.n_independent["reward"],
                 "attained_level": cal.attained("reward"), "source": cal.source, "seconds": time.perf_counter() - t0,
                 "units": units.to_dict("records")}


def per_day(df: pd.DataFrame) -> list[float]:
    """A rollout's or log's mean reward per day, in episode order (a twin's members averaged:
    episodes ``<day>-m<member>`` / ``twin-<seed>-<day>-m<member>`` count as one day)."""
    day = df["episode"].astype(str).str.replace(r"-m\d+$", "", regex=True)
    means = df.groupby(day, sort=False)["reward"].mean()
    return [float(v) for v in means.to_numpy(np.float64)]


def policy_rows(twin: Any, policies: dict[str, Any], real: dict[str, pd.DataFrame], seed: int, eval_days: int,
                n_agents: int, steps: int, calibration: Calibration | None = None) -> pd.DataFrame:
    """One row per policy: its real mean reward and the twin's in generated-population and replay
    modes, each with its interval (``<mode>_low/high``: calibrated by ``calibration``;
    ``<mode>_plain_low/high``: the bare member x episode bootstrap) and its per-day values (policy
    ``i`` rolled out with seed ``seed + 500 + i`` in both modes). Shared with the second-system
    benchmark."""
    rows = []
    for i, (pname, pol) in enumerate(policies.items()):
        gen = twin.rollout(pol, episodes=eval_days, seed=seed + 500 + i, n_agents=n_agents, steps=steps,
                           all_members=True)
        rep = logged_rollout(twin, pol, real[pname], seed=seed + 500 + i, all_members=True)
        g_lo, g_hi = run_interval(gen, calibration)
        r_lo, r_hi = run_interval(rep, calibration)
        g0_lo, g0_hi = run_interval(gen)
        r0_lo, r0_hi = run_interval(rep)
        rows.append({"policy": pname, "real": float(real[pname]["reward"].mean()),
                     "generated": float(gen["reward"].mean()), "generated_low": g_lo, "generated_high": g_hi,
                     "generated_plain_low": g0_lo, "generated_plain_high": g0_hi,
                     "replay": float(rep["reward"].mean()), "replay_low": r_lo, "replay_high": r_hi,
                     "replay_plain_low": r0_lo, "replay_plain_high": r0_hi,
                     "real_days": per_day(real[pname]), "generated_days": per_day(gen), "replay_days": per_day(rep)})
    return pd.DataFrame(rows)


def score(rank: pd.DataFrame, col: str) -> dict[str, float]:
    """The issue's six numbers for one evaluator column of ``rank`` (one row per policy)."""
    real, est = rank["real"].to_numpy(np.float64), rank[col].to_numpy(np.float64)
    sc = _scores(real, est)
    out = {
        "spearman": sc["spearman"],
        "mean_rel_error": sc["rel_err"],
        "norm_abs_error": sc["norm_abs_error"],
        "regret_at_1": sc["regret_at_1"],
    }
    for kind in ("", "_plain"):
        if f"{col}{kind}_low" not in rank.columns:
            continue
        lo, hi = rank[f"{col}{kind}_low"].to_numpy(np.float64), rank[f"{col}{kind}_high"].to_numpy(np.float64)
        out[f"coverage_90{kind}"] = float(((real >= lo) & (real <= hi)).mean())
        out[f"median_width{kind}"] = float(np.median(hi - lo))
    return out


def day_bootstrap(real_days: np.ndarray, est_days: np.ndarray | None, n_boot: int = N_BOOT, seed: int = 0) -> dict[str, list[float]]:
    """90 % intervals of rho, mean relative error and regret@1 over the evaluation days.

    ``real_days (P, D)``: each policy's real mean reward per evaluation day; ``est_days (P, D')``: a
    twin's per-day estimates (None: the truth against itself, see `noise_floor`). Each draw resamples
    D day indices (the same for every policy: the real days of all policies share their seeds) and
    recomputes the scores from the resampled means, so the interval says how much of a score is the
    evaluation's own noise at this many days.
    """
    rng = np.random.default_rng(seed)
    keys = ("spearman", "rel_err", "regret_at_1")
    draws: dict[str, list[float]] = {k: [] for k in keys}
    for _ in range(n_boot):
        real = real_days[:, rng.integers(real_days.shape[1], size=real_days.shape[1])].mean(1)
        if est_days is None:
            continue
        est = est_days[:, rng.integers(est_days.shape[1], size=est_days.shape[1])].mean(1)
        sc = _scores(real, est)
        for k in keys:
            draws[k].append(sc[k])
    return {("mean_rel_error" if k == "rel_err" else k) + "_ci90": [float(np.quantile(v, 0.05)), float(np.quantile(v, 0.95))]
            for k, v in draws.items()}


def noise_floor(real_days: np.ndarray, n_split: int = 200, seed: int = 0) -> dict[str, float]:
    """How well the truth agrees with itself: rho and mean relative error between the means of two
    disjoint halves of the evaluation days (random halves, the same for all policies; median and 5 %
    quantile of rho over ``n_split`` splits). No twin's score, measured against one full set of days,
    is expected to be much better than this at this many days (with half the days each side it is
    a conservative floor)."""
    p, d = real_days.shape
    if d < 2:
        return {"spearman_median": float("nan"), "spearman_q05": float("nan"), "mean_rel_error_median": float("nan"),
                "day_sd_over_policy_spread": float("nan")}
    rng = np.random.default_rng(seed)
    rhos, errs = [], []
    for _ in range(n_split):
        perm = rng.permutation(d)
        a, b = real_days[:, perm[: d // 2]].mean(1), real_days[:, perm[d // 2:]].mean(1)
        sc = _scores(a, b)
        rhos.append(sc["spearman"])
        errs.append(sc["rel_err"])
    spread = float(real_days.mean(1).std())
    return {"spearman_median": float(np.median(rhos)), "spearman_q05": float(np.quantile(rhos, 0.05)),
            "mean_rel_error_median": float(np.median(errs)),
            "day_sd_over_policy_spread": float(real_days.std(1, ddof=1).mean() / max(spread, 1e-12))}


def config(args: argparse.Namespace) -> tuple[str, ClusterConfig, int, int, int, dict[str, Any], int]:
    name = "quick" if args.quick else "mid" if args.mid else "full"
    kw, days, eval_days, members, hyper, pop_steps = CONFIGS[name]
    return name, ClusterConfig(**kw), days, eval_days, members, dict(hyper), pop_steps


def one_thread() -> None:
    """torch and the BLAS pools on one thread: the fits here are small, and on a shared 2-core
    machine two threads made a 12 s fit take 540 s (the runs on the pages were made so, with
    OMP_NUM_THREADS=1)."""
    import torch
    from threadpoolctl import threadpool_limits

    torch.set_num_threads(1)
    threadpool_limits(1)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    size = ap.add_mutually_exclusive_group()
    size.add_argument("--quick", action="store_true", help="smoke-sized configuration (see the module docstring)")
    size.add_argument("--mid", action="store_true", help="between --quick and full (see the module docstring)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--logs", default=",".join(LOGS), help="which logs, comma-separated (a,b,c1,c2,c3)")
    ap.add_argument("--models", default=",".join(MODELS), help=f"which twins, comma-separated ({','.join(MODELS)})")
    ap.add_argument("--page-only", action="store_true", help="rewrite README.md from results.json and stop")
    ap.add_argument("--out", type=Path, default=OUT, help="directory of results.json and README.md (default: the docs page)")
    args = ap.parse_args()
    one_thread()
    if args.page_only:
        (args.out / "README.md").write_text(page(json.loads((args.out / "results.json").read_text())))
        return
    bad = [m for m in args.models.split(",") if m not in MODELS] + [g for g in args.logs.split(",") if g not in LOGS]
    if bad:
        raise SystemExit(f"--models/--logs: unknown {bad}; models {list(MODELS)}, logs {list(LOGS)}")
    cname, cfg, days, eval_days, members, hyper, pop_steps = config(args)
    t0 = time.perf_counter()
    spec = cluster_spec(cfg)
    policies = evaluation_policies(spec)
    real: dict[str, pd.DataFrame] = {}
    for name, pol in policies.items():
        real[name], _ = generate_logs(cfg, episodes=eval_days, policy=pol, seed=args.seed + 500)
    real_days = np.array([per_day(real[name]) for name in policies])
    doc = previous(args, cname)
    doc["noise_floor"] = noise_floor(real_days, seed=args.seed)
    for lname in args.logs.split(","):
        train, _ = generate_logs(cfg, regimes=log_regimes(lname, spec, args.seed, days), seed=args.seed)
        for mname in args.models.split(","):
            t_fit = time.perf_counter()
            twin = Twin.fit(train, spec, seed=args.seed, members=members, progress=False, response_model=MODELS[mname],
                            population_hyper={"steps": pop_steps}, **hyper)
            fit_s = time.perf_counter() - t_fit

            def refit(rows: pd.DataFrame, model: str = MODELS[mname]) -> Twin:
                return Twin.fit(rows, spec, seed=args.seed, members=members, progress=False, response_model=model,
                                population_model="empirical", **hyper)  # the replays never sample a population

            cal, cal_doc = calibration_of(train, refit, args.seed)
            rank = policy_rows(twin, policies, real, seed=args.seed, eval_days=eval_days, n_agents=cfg.n_agents,
                               steps=cfg.steps, calibration=cal)
            res: dict[str, Any] = {"calibration": cal_doc}
            for mode in ("generated", "replay"):
                res[mode] = score(rank, mode)
                res[mode].update(day_bootstrap(real_days, np.array(rank[f"{mode}_days"].tolist()), seed=args.seed))
            res["fit_seconds"] = fit_s
            res["overlap"] = twin.meta["overlap"]
            res["response_model"] = twin.meta["response_model"]
            # the invariance weight each member's client models chose by cross-fitting (causal only)
            res["invariance_chosen"] = [float(c.chosen) for m in twin.members for c in m.clients.values() if hasattr(c, "chosen")]
            doc["results"].setdefault(lname, {})[mname] = res
            doc["policies"][f"{lname}/{mname}"] = rank.to_dict("records")
            print(lname, mname, json.dumps(res, default=str), flush=True)
            write(doc, t0, args.out)  # after every fit: a partial run is kept
    print(json.dumps(doc["results"], indent=1, default=str))


def previous(args: argparse.Namespace, cname: str) -> dict[str, Any]:
    """results.json of an earlier run of the same configuration and seed (its other logs and models
    are kept: a rerun of one model does not discard the rest), else a fresh document."""
    _, cfg, days, eval_days, members, hyper, pop_steps = config(args)
    conf = {"name": cname, "quick": args.quick, "seed": args.seed, "n_agents": cfg.n_agents, "steps": cfg.steps,
            "log_a_days": days, "eval_days": eval_days, "members": members, "hyper": hyper,
            "population_steps": pop_steps, "minutes": 0.0}
    path = args.out / "results.json"
    if path.is_file():
        old = json.loads(path.read_text())
        if {k: v for k, v in old.get("config", {}).items() if k != "minutes"} == {k: v for k, v in conf.items() if k != "minutes"}:
            old["config"]["minutes_before"] = old["config"].get("minutes_before", 0.0) + old["config"]["minutes"]
            return old
    return {"config": conf, "targets": TARGETS, "results": {}, "policies": {}}


def write(doc: dict[str, Any], t0: float, out: Path = OUT) -> None:
    out.mkdir(parents=True, exist_ok=True)
    doc["config"]["minutes"] = (time.perf_counter() - t0) / 60
    doc["results"] = {k: doc["results"][k] for k in LOGS if k in doc["results"]}
    (out / "results.json").write_text(json.dumps(doc, indent=1, default=str))
    (out / "README.md").write_text(page(doc))


METRICS = ("spearman", "mean_rel_error", "norm_abs_error", "regret_at_1", "coverage_90", "median_width",
           "coverage_90_plain", "median_width_plain")


def _cell(r: dict[str, Any], k: str) -> str:
    if k not in r:  # a run before the calibrated intervals: only the plain ones
        return "—"
    ci = r.get(f"{k}_ci90")
    return f"{r[k]:.2f}" + (f" [{ci[0]:.2f}, {ci[1]:.2f}]" if ci else "")


def _cal_cell(r: dict[str, Any]) -> str:
    """The calibration's relative widening, the level its days support and how many days."""
    c = r.get("calibration")
    return "—" if not c else f"q {c['q']:.2f}, {c['attained_level']:.0%} ({c['n_independent']} days)"


def page(doc: dict[str, Any]) -> str:
    """The benchmark's page from its results.json (also for a partial run: the logs it reached)."""
    c = doc["config"]
    name = c.get("name", "quick" if c["quick"] else "full")
    cmd = "python benchmarks/causal_twin.py" + ("" if name == "full" else f" --{name}") + (f" --seed {c['seed']}" if c["seed"] else "")
    minutes = c["minutes"] + c.get("minutes_before", 0.0)
    L = ["# Causal twin (issue 36)", "", __doc__.split("\n\n", 1)[1].split("Run:")[0].strip(), "",
         f"This run: `{cmd}` ({c['n_agents']} agents x {c['steps']} ticks, log a {c['log_a_days']} days, "
         f"{c['eval_days']} evaluation days per policy, {c['members']} members, hyper {c['hyper']}; "
         f"{minutes:.0f} min on 2 shared cores).", "",
         "Full run (not run here: hours on this machine): `python benchmarks/causal_twin.py`.", "",
         f"Targets: {doc['targets']}.", ""]
    nf = doc.get("noise_floor")
    if nf:
        L += [f"Noise floor of the evaluation (the truth against itself, two disjoint halves of the {c['eval_days']} "
              f"real days): rho {nf['spearman_median']:.2f} (5 % quantile {nf['spearman_q05']:.2f}), mean relative "
              f"error {nf['mean_rel_error_median']:.1%}; a policy's day-to-day sd is {nf['day_sd_over_policy_spread']:.2f}x "
              "the spread of the 12 policies' means. Brackets: 90 % bootstrap intervals over the evaluation days.", ""]
    for mode in ("generated", "replay"):
        L += [f"## {mode} mode", "", "| logs | model | " + " | ".join(METRICS) + " | cal. level | overlap (verdict, ESS) |",
              "|---|---|" + "---|" * len(METRICS) + "---|---|"]
        for lname, per in doc["results"].items():
            for mname, r in per.items():
                o = r["overlap"]
                L.append(f"| {lname} | {mname} | " + " | ".join(_cell(r[mode], k) for k in METRICS)
                         + f" | {_cal_cell(r)} | {o['verdict']}, {o['ess_share']:.0%} |")
        L.append("")
    reading = doc.get("reading")
    if reading:
        L += ["## Reading", "", reading.strip(), ""]
    return "\n".join(L) + "\n"


if __name__ == "__main__":
    main()
