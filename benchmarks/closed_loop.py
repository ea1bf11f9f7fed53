"""When the twin cannot tell, ask the edge: twin alone vs canary alone vs twin + canary, against the cluster.

Issue 34's closed-loop benchmark. The emulated cluster plays the real system; the candidates are the
what-if gate benchmark's set (`whatif_gate.candidates` plus its PPO policy trained in the twin,
imported, not copied); the *current* policy serving the fleet is the logging policy
(``--logging random``: uniformly random actions; ``production``: the SLO-aware heuristic with 10 %
Gaussian exploration noise, `whatif_gate.logging_policy`). For every candidate and every day
(``fleet_seed``: the day's population and noise), three arms decide each guarded (policy, KPI) pair
as *regresses* / *no regression* / *abstain*:

* **twin alone** -- today's gate (`edgetwin.policies.gate.run_gate` on the day's fleet log under the
  current policy, calibrated on that log's own actions, as ``edgetwin promote`` does by default);
* **twin + canary** -- the loop (`edgetwin.loop.rounds.canary_loop`) from that same decision: up
  to 3 rounds, each a canary on <= 10 % of the service groups for <= 1 day through an edge runtime
  (`edgetwin.loop.fleet.canary_on_cluster`), judged by the prediction-powered verdict,
  the twin updated from each round's rows (`Twin.update`);
* **canary alone** -- the same canaries (slices and hours; for a candidate the twin alone decided, so
  that the loop ran none, one canary of the loop's first-round size on a seeded random slice) judged
  Kayenta-style with no twin (`kayenta_verdict`): per KPI, the per-tick value of each arm (the
  arm's mean over its groups, every tick after the pre-ticks) compared by Mann-Whitney U
  (`scipy.stats.mannwhitneyu`), two one-sided tests at 5 % against the candidate shifted by the
  margin (5 % of the control's mean): *regresses* when it is significantly worse than the margin
  allows, *no regression* when significantly within it, *Inconclusive* (abstain) otherwise or with
  fewer than 50 points per arm (Kayenta's minimum).

**Truth:** each candidate on the whole cluster for the same day (same seed: same population and
noise) against the current policy on it; a pair *regresses* when the KPI's relative change is
worse than the 5 % margin.

Per arm: ``verdict_rate`` (1 - abstention over pairs), ``confident_agreement`` (share of decided
pairs that agree with the truth), ``canary_agent_steps`` (the candidate arm's agent-steps after the
pre-ticks, over every candidate and day), ``rounds_over_budget`` (canaries whose realised loss,
`edgetwin.loop.rounds`'s measure, exceeded the operator's per-KPI loss budget), and
``post_update_regression_rate`` (seed 003: of the candidates the arm promotes, every guarded pair
*no regression*, the share that regress on the truth). **canary_steps_ratio**: canary alone is
rerun on slices of growing size (``SWEEP``: share of the groups x hours, one canary per candidate
and day on a seeded random slice) to find the agent-steps at which its verdict rate reaches twin +
canary's with a confident agreement at least twin + canary's; the agent-steps between two sweep
points are interpolated linearly in verdict rate against log agent-steps (`steps_to_reach`). When
no sweep point reaches it, the ratio is reported as "not reached" with its lower bound (the largest
sweep point's agent-steps over twin + canary's).

    python benchmarks/closed_loop.py --logging random|production [--quick] [--seed 0] [--work DIR] [--no-write]
    python benchmarks/closed_loop.py --coverage [--seeds 3] [--runs 200] [--days 20] [--fleet-sizes 100 1000 5000]
    python benchmarks/closed_loop.py --loss-diagnosis --logging L --quick --seed 0 --work DIR   (_closed_loop_budget)
    python benchmarks/closed_loop.py --day-truth --seed S --truth-days 20 --work DIR; ... --bound   (_closed_loop_bound)
    python benchmarks/closed_loop.py --day-diagnosis --seed S --work DIR   (_closed_loop_dayterm)
    python benchmarks/closed_loop.py --day-coverage --designs-fleet 1000 --days 20 --runs 200 --day-sd 0.05 --canary-days 1 4 8
    python benchmarks/closed_loop.py --day-term-page [--day-term-fc DIR] [--day-term-sl DIR] [--day-term-base DIR]
    python benchmarks/closed_loop.py --fleet-size-page [day_bound]   (_closed_loop_fleetsize[_bound]: after --scale-merge ... --merge-as day_term / day_bound)
    python benchmarks/closed_loop.py --planbase-rerun DIR   (_closed_loop_rerun_planbase: after --scale --fleet-sizes 100 ... --work DIR)

``--coverage`` (about a minute of CPU): the coverage experiment of issue 48 (`coverage_experiment`,
`design_comparison`): canaries simulated on the emulator's per-group outcomes, no twin fitted, into
``results_production.json``'s ``coverage_experiment``, ``simulated_by_fleet_size`` and ``designs``.

``--quick`` (<= ~30 min on a loaded 2-core machine): 60 service groups (a canary of 10 % is 6
groups, 3 per arm), 3 training days, a 3-member twin, PPO 5k steps, one day per candidate,
Twin.update 2 epochs x 300 steps, one sweep point fewer. The full configuration: 100 groups (10 per
canary, 5 per arm), 6 training days, 5 members, PPO 10k steps, 2 days per candidate, update 5 epochs
x 1000 steps.
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import os
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from _docs import write_section
from whatif_gate import LOGGING_TEXT, candidates, fit_or_load, logging_policy, train_ppo

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "docs" / "benchmarks" / "closed_loop"
SECTION = "## Closed loop: twin alone vs canary alone vs twin + canary"
ARMS = ("twin_alone", "canary_alone", "twin_canary")
ARM_TEXT = {"twin_alone": "twin alone (today's gate)", "canary_alone": "canary alone (Kayenta-style)",
            "twin_canary": "twin + canary (the loop)"}  # fmt: skip
TARGETS = {"verdict_rate": 0.90, "confident_agreement": 0.97, "canary_steps_ratio": 2.0, "rounds_over_budget": 0}
MARGIN = 0.05
#: hand-written subsections of the page that a rerun keeps
KEEP = ("### What the numbers say",)
#: Kayenta's minimum number of data points per metric (per arm) before it judges
KAYENTA_MIN_POINTS = 50
KAYENTA_ALPHA = 0.05
#: the operator's budget per round: share of the groups, hours, and the largest fleet-wide relative
#: worsening of each KPI the canary may cause (`PlanBudget.max_loss`). Only quantities of one sign
#: are capped: a relative worsening of `reward` or `return` (the operator's weighted multi-objective,
#: which takes both signs, fleet mean near 0) has no meaning and `plan_canary` refuses it; the
#: composite is capped through the declared KPIs it is made of (here its two heaviest weights:
#: SLO violations and offload; revenue, task time, energy and carbon have the guard's margins only).
MAX_SHARE, MAX_HOURS = 0.10, 24.0
MAX_LOSS_SHARE = 0.02
MAX_LOSS = {"kpi.slo_violation": MAX_LOSS_SHARE, "response.offload_ratio": MAX_LOSS_SHARE}
#: canary alone's sweep: (share of the groups in the slice, hours)
SWEEP = ((0.04, 13.0), (0.10, 13.0), (0.10, 23.0), (0.20, 23.0), (0.40, 23.0), (1.00, 23.0))
#: where `plan_canary` says no canary fits the budget (the loop then stays where the twin was)
PLAN_FLAGS = ("--max-loss", "--max-share", "--hours", "plan")
SWEEP_QUICK = ((0.04, 13.0), (0.10, 13.0), (0.10, 23.0), (0.30, 23.0), (1.00, 23.0))


# ------------------------------------------------------------------------------------ verdicts
def kpi_column(kdef: Any) -> str | None:
    """The per-step log column whose per-group mean measures ``kdef`` (None: a quantile, a ratio or a
    weighted mean, which neither a per-group PPI nor a per-tick arm mean estimates)."""
    if kdef.stat in ("mean", "sum") and kdef.weight is None:
        return str(kdef.column)
    return None


def tick_points(log: Any, column: str, candidate: str, pre_ticks: int) -> tuple[np.ndarray, np.ndarray]:
    """Per tick after the pre-ticks, each arm's mean of ``column`` over its groups: Kayenta's data
    points (one per metric sample of the canary and of the baseline server groups).

    Returns ``(candidate_points, control_points)``, each ``(ticks,)``."""
    rows = log[log["t"] >= pre_ticks]
    is_c = rows["policy"].astype(str) == candidate
    c = rows[is_c].groupby("t")[column].mean().to_numpy(np.float64)
    b = rows[~is_c].groupby("t")[column].mean().to_numpy(np.float64)
    return c, b


def kayenta_verdict(cand: np.ndarray, ctrl: np.ndarray, better: str, margin: float = MARGIN,
                    alpha: float = KAYENTA_ALPHA, min_points: int = KAYENTA_MIN_POINTS) -> str:
    """``regress`` / ``ok`` / ``straddle`` (Inconclusive) for one KPI, from Mann-Whitney U alone.

    The candidate's points are compared with the control's shifted by the margin (``margin`` times
    the control's mean, towards worse): ``regress`` when the candidate is significantly worse than
    that (one-sided, ``alpha``), ``ok`` when significantly better than it (the other side), else
    Inconclusive; fewer than ``min_points`` finite points on either arm is Inconclusive too.
    Kayenta's classifier (Mann-Whitney with an allowed effect size) made three-way like the gate."""
    from scipy.stats import mannwhitneyu

    cand, ctrl = cand[np.isfinite(cand)], ctrl[np.isfinite(ctrl)]
    if len(cand) < min_points or len(ctrl) < min_points:
        return "straddle"
    worse = 1.0 if better == "lower" else -1.0
    edge = ctrl + worse * margin * abs(float(np.mean(ctrl)))  # the control at the margin's edge
    # "greater" for a lower-is-better KPI: the candidate's values exceed the edge's = worse than allowed
    worse_side, better_side = ("greater", "less") if better == "lower" else ("less", "greater")
    if mannwhitneyu(cand, edge, alternative=worse_side).pvalue < alpha:
        return "regress"
    if mannwhitneyu(cand, edge, alternative=better_side).pvalue < alpha:
        return "ok"
    return "straddle"


def score(pairs: list[dict[str, Any]], arm: str) -> dict[str, float | None]:
    """Verdict rate and confident agreement of ``arm``'s verdicts over ``pairs``."""
    dec = [p for p in pairs if p[arm] in ("ok", "regress")]
    agree = [(p[arm] == "regress") == p["truth_regress"] for p in dec]
    return {"verdict_rate": len(dec) / len(pairs) if pairs else None,
            "confident_agreement": (sum(agree) / len(agree)) if agree else None,
            "decided": len(dec), "pairs": len(pairs)}  # fmt: skip


def promotion_regress_rate(pairs: list[dict[str, Any]], arm: str) -> tuple[float | None, int]:
    """Seed 003's post-update regression rate: of the (candidate, day)s ``arm`` promotes (every guarded
    pair ``ok``), the share with a pair that regresses on the truth; and how many it promoted."""
    by: dict[tuple[str, int], list[dict[str, Any]]] = {}
    for p in pairs:
        by.setdefault((p["policy"], p["day"]), []).append(p)
    promoted = [ps for ps in by.values() if all(p[arm] == "ok" for p in ps)]
    if not promoted:
        return None, 0
    return sum(any(p["truth_regress"] for p in ps) for ps in promoted) / len(promoted), len(promoted)


def steps_to_reach(points: list[dict[str, Any]], rate: float, agreement: float | None) -> dict[str, Any]:
    """The agent-steps at which canary alone's sweep reaches verdict rate ``rate`` with a confident
    agreement >= ``agreement``: the first sweep point (by agent-steps) that does, interpolated
    linearly in verdict rate against log agent-steps from the point before it when that point's
    rate is lower (else, or when it is the smallest point, that point itself: an upper bound).
    None and ``"not reached"`` when none does."""
    pts = sorted(points, key=lambda p: p["canary_agent_steps"])
    prev = None
    for p in pts:
        ok_agree = agreement is None or (p["confident_agreement"] is not None and p["confident_agreement"] >= agreement - 1e-12)
        if p["verdict_rate"] is not None and p["verdict_rate"] >= rate - 1e-12 and ok_agree:
            if prev is None:
                return {"steps": float(p["canary_agent_steps"]),
                        "how": f"at the smallest sweep point ({p['label']}): an upper bound, nothing below to interpolate from"}
            if prev["verdict_rate"] is None or p["verdict_rate"] <= prev["verdict_rate"] or prev["canary_agent_steps"] <= 0:
                return {"steps": float(p["canary_agent_steps"]),
                        "how": f"at the first sweep point that reaches both ({p['label']}); the smaller ones fall short of "
                               "the agreement, so no interpolation"}
            f = (rate - prev["verdict_rate"]) / (p["verdict_rate"] - prev["verdict_rate"])
            f = min(max(f, 0.0), 1.0)
            ls = math.log(prev["canary_agent_steps"]) + f * (math.log(p["canary_agent_steps"]) - math.log(prev["canary_agent_steps"]))
            return {"steps": float(math.exp(ls)), "how": f"interpolated between {prev['label']} and {p['label']}"}
        prev = p
    return {"steps": None, "how": "not reached", "max_steps": float(pts[-1]["canary_agent_steps"]) if pts else 0.0}


# ------------------------------------------------------------------------------------ the runs
def truth_kpis(log: Any, twin: Any, kdefs: list[Any], spec: Any) -> dict[str, float]:
    from edgetwin.twin.whatif import logged_episode_kpis, logged_episodes

    vals = logged_episode_kpis(logged_episodes(log, twin), kdefs, spec)
    return {k: float(np.mean(v)) for k, v in vals.items()}


def random_slice_config(fleet_agents: list[str], share: float, hours: float, margins: tuple[Any, ...],
                        seed: int, spec: Any, levels: dict[str, float]) -> Any:
    """A canary of ``share`` of the fleet's groups (seeded random, at least 4) for ``hours``, half on
    the candidate, arms balanced as the loop balances them (`balanced`); no loss budget at the edge
    (its loss measured against the fleet's ``levels`` as the loop's plans measure theirs)."""
    from edgetwin.edge.canary import CanaryConfig
    from edgetwin.loop.plan import CanaryPlan, PlanSlice
    from edgetwin.loop.rounds import balanced

    n = max(4, int(math.floor(share * len(fleet_agents) + 1e-9)))
    rng = np.random.default_rng([seed, 0x5EE9])
    agents = tuple(sorted(str(a) for a in rng.choice(np.array(fleet_agents, dtype=object), n, replace=False)))
    plan = CanaryPlan("candidate", "current", PlanSlice(agents, (), (), 0.5, seed), hours, margins, [], n,
                      len(fleet_agents), n / len(fleet_agents), {}, False, [], seed, loss_levels=dict(levels))  # fmt: skip
    return CanaryConfig.from_plan(balanced(plan), "candidate", spec=spec), balanced(plan)


def kayenta_pairs(logs: list[Any], cols: dict[str, tuple[str, str]], pre_ticks: int) -> dict[str, str]:
    """Canary alone's verdict per gate KPI from the canaries' logs (their points pooled)."""
    out = {}
    for kpi, (col, better) in cols.items():
        c = np.concatenate([tick_points(lg, col, "candidate", pre_ticks)[0] for lg in logs])
        b = np.concatenate([tick_points(lg, col, "candidate", pre_ticks)[1] for lg in logs])
        out[kpi] = kayenta_verdict(c, b, better)
    return out


def run_logging(args: argparse.Namespace) -> dict[str, Any]:
    from edgetwin.contract.errors import InputError
    from edgetwin.contract.margins import KPIMargin
    from edgetwin.emulator.cluster import ClusterConfig, cluster_spec
    from edgetwin.emulator.logs import generate_logs
    from edgetwin.loop.fleet import canary_on_cluster
    from edgetwin.loop.plan import PlanBudget
    from edgetwin.loop.ppi import replay_spec
    from edgetwin.loop.rounds import canary_loop
    from edgetwin.policies.gate import run_gate

    quick = args.quick
    n_agents = args.agents or (60 if quick else 100)
    members = 3 if quick else 5
    train_days = 3 if quick else 6
    ppo_steps = 5_000 if quick else 10_000
    n_days = 1 if quick else 2
    update_options = {"epochs": 2, "max_steps": 300} if quick else {"epochs": 5, "max_steps": 1000}
    sweep = SWEEP_QUICK if quick else SWEEP
    cfg = ClusterConfig(n_agents=n_agents, steps=96)
    spec = cluster_spec(cfg)
    work = args.work / f"{args.logging}-n{n_agents}-d{train_days}-s{args.seed}"
    work.mkdir(parents=True, exist_ok=True)
    timings: dict[str, float] = {}
    t0 = time.perf_counter()
    train, _ = generate_logs(cfg, episodes=train_days, policy=logging_policy(args.logging, spec, args.seed), seed=args.seed)
    twin = fit_or_load(work, args.logging, members, train, spec)
    timings["fit"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    pols = candidates(spec, twin, args.logging, args.seed)
    pols["PPO trained in the twin"] = train_ppo(twin, work, ppo_steps, args.seed)
    if args.max_candidates:
        pols = dict(list(pols.items())[: args.max_candidates])
    timings["train_ppo"] = time.perf_counter() - t0
    current = logging_policy(args.logging, spec, args.seed + 500)  # the policy serving the fleet today
    budget = PlanBudget(max_share=MAX_SHARE, hours=MAX_HOURS, max_loss=dict(MAX_LOSS))

    pairs: list[dict[str, Any]] = []
    per_candidate: list[dict[str, Any]] = []
    sweep_pairs: dict[str, list[dict[str, Any]]] = {slice_label(n_agents, s, h): [] for s, h in sweep}
    sweep_steps, sweep_over = dict.fromkeys(sweep_pairs, 0), dict.fromkeys(sweep_pairs, 0)
    t_loop = t_alone = t_sweep = 0.0
    for d in range(n_days):
        fleet_seed = args.seed + 7 + d
        fleet_log, _ = generate_logs(cfg, 1, copy.deepcopy(current), seed=fleet_seed)
        fleet_agents = sorted(fleet_log["agent"].astype(str).unique())
        levels = {c: float(fleet_log[c].mean()) for c in ("response.offload_ratio", "kpi.slo_violation", "reward",
                                                          "kpi.revenue") if c in fleet_log.columns}  # fmt: skip
        for name, pol in pols.items():
            t_c = time.perf_counter()
            print(f"[{args.logging}] day {d} candidate {name!r}", flush=True)
            # the policies as the twin runs them, each replay from the same state (`replay_spec`): a
            # sampling policy (random, or the heuristic's exploration noise) draws from its own
            # stream, so one object shared by every replay would hand each replay the draws the
            # earlier ones left (identical calls would answer differently)
            cand_spec = replay_spec(name, pol)
            base_spec = replay_spec("current", current)
            decision = run_gate(twin, cand_spec, base_spec, log=fleet_log, episodes=1, seed=args.seed)
            nominal = {c.kpi: c for c in decision.checks if c.scenario == "nominal"}
            kdefs = {k.name: k for k in decision.result.kpis if k.name in nominal}
            # truth: the candidate on the whole cluster, the same day
            real_log, _ = generate_logs(cfg, 1, copy.deepcopy(pol), seed=fleet_seed)
            real_c = truth_kpis(real_log, twin, list(kdefs.values()), spec)
            real_b = truth_kpis(fleet_log, twin, list(kdefs.values()), spec)
            # the loop, from the same decision; its canaries captured for canary alone
            canaries: list[tuple[Any, Any]] = []
            loop_error = None
            try:
                res = canary_loop(
                    twin, fleet_log, copy.deepcopy(pol), copy.deepcopy(current), cfg, candidate_spec=cand_spec,
                    baseline_spec=base_spec, budget=budget, max_rounds=3, seed=args.seed, fleet_seed=fleet_seed,
                    old_logs=[train], update_options=update_options, decision=decision, log=lambda s: None,
                    on_canary=lambda r, plan, cres, got=canaries: got.append((plan, cres)),
                    fleet_control=args.fleet_control,
                )  # fmt: skip
            except InputError as e:  # no first round within the budget: the loop abstains where the twin did
                if e.where not in PLAN_FLAGS:
                    raise
                res, loop_error = None, str(e)
            t_loop += time.perf_counter() - t_c
            t_c = time.perf_counter()
            cols = {k: (kpi_column(kd), kd.better) for k, kd in kdefs.items() if kpi_column(kd) is not None}
            margins = tuple(KPIMargin(c, MARGIN, 0.0, b == "higher") for c, b in dict(cols.values()).items())
            better_col = {c: b for c, b in cols.values()}
            # canary alone on the same canaries; a canary of the loop's first-round size when it ran none
            alone_logs, alone_steps, alone_over = [], 0, 0
            if canaries:
                # the loop publishes its candidate under its own registry version: the canary-alone measures
                # below read the candidate arm's rows by the benchmark's own name for it
                alone_logs += [cres.log.assign(policy=cres.log["policy"].astype(str).replace(cres.candidate, "candidate"))
                               for _plan, cres in canaries]  # fmt: skip
            else:
                ccfg, cplan = random_slice_config(fleet_agents, MAX_SHARE, MAX_HOURS - 1.0, margins,
                                                  args.seed * 1000 + d, spec, levels)  # fmt: skip
                cres = canary_on_cluster(cfg, copy.deepcopy(current), copy.deepcopy(pol), ccfg, seed=fleet_seed,
                                         episode=f"alone-{args.seed}-{d}")  # fmt: skip
                alone_logs.append(cres.log)
                alone_over += int(_over_max_loss(cres.log, cplan, ccfg.pre_ticks, better_col, cols, ccfg.ticks))
            for lg in alone_logs:
                alone_steps += int(((lg["policy"].astype(str) == "candidate") & (lg["t"] >= 4)).sum())
            if canaries:
                alone_over += sum(int(_over_max_loss(cres.log, plan, 4, better_col, cols)) for plan, cres in canaries)
            alone = kayenta_pairs(alone_logs, cols, 4)
            t_alone += time.perf_counter() - t_c
            tc, round_states = loop_round_states(res, canaries, nominal, cols)
            loop_steps = res.agent_steps if res is not None else 0
            # the same measure and budget as canary alone's (the loop's own `over_budget` checks the plan's
            # deciding KPIs only; it is kept per round below)
            loop_over = sum(int(_over_max_loss(cres.log, plan, 4, better_col, cols)) for plan, cres in canaries)
            for k, c in nominal.items():
                rb, rc = real_b[k], real_c[k]
                change = (rc - rb) / abs(rb) if rb else float("nan")
                sign = -1.0 if c.better == "higher" else 1.0
                pairs.append({
                    "policy": name, "day": d, "kpi": k, "better": c.better, "truth_change": change,
                    "truth_regress": bool(sign * change > MARGIN), "twin_alone": c.verdict,
                    "canary_alone": alone.get(k, "straddle"), "twin_canary": tc[k],
                    "twin_canary_by_round": [s[k] for s in round_states], "twin_interval": list(c.interval),
                    "out_of_support": c.out_of_support,
                })  # fmt: skip
            per_candidate.append(candidate_summary(name, d, decision, res, loop_error, loop_steps, loop_over,
                                                   alone_steps, alone_over))
            print(f"    twin alone {decision.verdict}; loop {per_candidate[-1]['twin_canary']} after "
                  f"{len(per_candidate[-1]['rounds'])} round(s), {loop_steps} steps; canary alone "
                  f"{sorted(set(alone.values()))}; {per_candidate[-1]['reason'][:300]}", flush=True)  # fmt: skip
            # canary alone's sweep: one canary per configuration on a seeded random slice
            t_c = time.perf_counter()
            for i, (share, hours) in enumerate(sweep):
                label = slice_label(n_agents, share, hours)
                ccfg, cplan = random_slice_config(fleet_agents, share, hours, margins, args.seed * 1000 + 100 * d + i + 1,
                                                  spec, levels)  # fmt: skip
                cres = canary_on_cluster(cfg, copy.deepcopy(current), copy.deepcopy(pol), ccfg, seed=fleet_seed,
                                         episode=f"sweep-{args.seed}-{d}-{i}")  # fmt: skip
                v = kayenta_pairs([cres.log], cols, ccfg.pre_ticks)
                sweep_steps[label] += int(((cres.log["policy"].astype(str) == "candidate") & (cres.log["t"] >= ccfg.pre_ticks)).sum())
                sweep_over[label] += int(_over_max_loss(cres.log, cplan, ccfg.pre_ticks, better_col, cols, ccfg.ticks))
                for p in pairs[-len(nominal):]:
                    sweep_pairs[label].append({**p, "canary_alone": v.get(p["kpi"], "straddle")})
            t_sweep += time.perf_counter() - t_c
    timings.update({"loop": t_loop, "canary_alone": t_alone, "sweep": t_sweep})

    arms, curve, sweep_points, reach, ratio = summarize_arms(pairs, per_candidate, sweep_pairs, sweep_steps, sweep_over)
    return {
        "logging": args.logging, "quick": bool(quick), "seed": args.seed,
        "config": {"agents": n_agents, "members": members, "train_days": train_days, "ppo_steps": ppo_steps,
                   "days": n_days, "candidates": list(pols), "update": update_options, "max_rounds": 3,
                   "max_share": MAX_SHARE, "max_hours": MAX_HOURS, "max_loss": MAX_LOSS, "margin": MARGIN,
                   "fleet_control": bool(args.fleet_control),
                   "kayenta_min_points": KAYENTA_MIN_POINTS, "kayenta_alpha": KAYENTA_ALPHA,
                   "sweep": [list(x) for x in sweep], "machine_cores": os.cpu_count()},
        **arms, "canary_steps_ratio": ratio, "canary_steps_reach": reach, "twin_canary_curve": curve,
        "canary_alone_sweep": sweep_points, "per_candidate": per_candidate, "pairs": pairs, "seconds": timings,
    }  # fmt: skip


def slice_label(n_agents: int, share: float, hours: float) -> str:
    """A canary-alone sweep point's label: its groups (``share`` of ``n_agents``, at least 4) × hours."""
    return f"{max(4, int(math.floor(share * n_agents + 1e-9)))} groups × {hours:g} h"


def candidate_summary(name: str, day: int, decision: Any, res: Any, loop_error: str | None, loop_steps: int,
                      loop_over: int, alone_steps: int, alone_over: int) -> dict[str, Any]:
    """One (candidate, day) of `run_logging`: the twin alone's and the loop's verdicts, the loop's
    rounds, and each arm's canary agent-steps and rounds over budget."""
    return {
        "policy": name, "day": day, "twin_alone": decision.verdict,
        "twin_canary": res.verdict if res is not None else "abstain",
        "reason": res.reason if res is not None else f"no canary: {loop_error}",
        "rounds": [{"round": rd.round, "n_groups": rd.plan["n_groups"], "hours": rd.plan["hours"],
                    "stop": rd.stop_reason, "agent_steps": rd.candidate_agent_steps, "verdict": rd.verdict,
                    "realised_loss": rd.realised_loss, "over_budget": rd.over_budget,
                    "twin_updated": rd.twin_updated} for rd in (res.rounds if res is not None else [])],
        "twin_canary_agent_steps": loop_steps, "twin_canary_rounds_over_budget": loop_over,
        "canary_alone_agent_steps": alone_steps, "canary_alone_rounds_over_budget": alone_over,
    }  # fmt: skip


def loop_round_states(res: Any, canaries: list[tuple[Any, Any]], nominal: dict[str, Any],
                      cols: dict[str, tuple[str, str]]) -> tuple[dict[str, str], list[dict[str, str]]]:
    """The loop's per-pair verdicts after its last round and after each round: each round's
    prediction-powered checks by column; a guard-stopped round refuses at once (the stopping KPI
    regresses, the rest as the twin said); a KPI no canary judged keeps the twin alone's verdict."""
    round_states: list[dict[str, str]] = []
    if res is not None:
        for rd in res.rounds:
            by_col = {c["kpi"]: c["verdict"] for c in rd.checks}
            if rd.stop_reason == "guard":
                by_col = {_guard_kpi(canaries, rd.round): "regress"}
            state = {}
            for k, c in nominal.items():
                col = cols.get(k, (None,))[0]
                state[k] = by_col.get(col, c.verdict) if col is not None and col in by_col else c.verdict
            round_states.append(state)
    tc = {k: round_states[-1][k] if round_states else c.verdict for k, c in nominal.items()}
    return tc, round_states


def summarize_arms(pairs: list[dict[str, Any]], per_candidate: list[dict[str, Any]],
                   sweep_pairs: dict[str, list[dict[str, Any]]], sweep_steps: dict[str, int],
                   sweep_over: dict[str, int]) -> tuple[dict[str, Any], list[dict[str, Any]], list[dict[str, Any]],
                                                        dict[str, Any], float | None]:
    """`run_logging`'s scores: per arm (`score`, agent-steps, rounds over budget, post-update
    regression rate), twin + canary after each round, canary alone's sweep points, and the agent-steps
    at which the sweep reaches twin + canary (`steps_to_reach`) with its ratio."""
    arms: dict[str, Any] = {}
    steps = {"twin_alone": 0, "twin_canary": sum(c["twin_canary_agent_steps"] for c in per_candidate),
             "canary_alone": sum(c["canary_alone_agent_steps"] for c in per_candidate)}  # fmt: skip
    over = {"twin_alone": 0, "twin_canary": sum(c["twin_canary_rounds_over_budget"] for c in per_candidate),
            "canary_alone": sum(c["canary_alone_rounds_over_budget"] for c in per_candidate)}  # fmt: skip
    rounds = {"twin_alone": 0, "twin_canary": sum(len(c["rounds"]) for c in per_candidate),
              "canary_alone": sum(max(1, len(c["rounds"])) for c in per_candidate)}  # fmt: skip
    for arm in ARMS:
        s = score(pairs, arm)
        rate, promoted = promotion_regress_rate(pairs, arm)
        arms[arm] = {**s, "canary_agent_steps": steps[arm], "rounds_over_budget": over[arm], "canary_rounds": rounds[arm],
                     "post_update_regression_rate": rate, "promoted": promoted}  # fmt: skip
    # twin + canary after each round (a loop stopped after r rounds), for the plot
    curve = []
    max_r = max((len(p["twin_canary_by_round"]) for p in pairs), default=0)
    for r in range(max_r + 1):
        tmp = [{**p, "x": (p["twin_canary_by_round"][min(r, len(p["twin_canary_by_round"])) - 1]
                           if r and p["twin_canary_by_round"] else p["twin_alone"])} for p in pairs]  # fmt: skip
        st = sum(sum(rd["agent_steps"] for rd in c["rounds"][:r]) for c in per_candidate)
        curve.append({"rounds": r, "canary_agent_steps": st, **score(tmp, "x")})
    sweep_points = []
    for label, ps in sweep_pairs.items():
        sweep_points.append({"label": label, "canary_agent_steps": sweep_steps[label],
                             "rounds_over_budget": sweep_over[label], **score(ps, "canary_alone")})  # fmt: skip
    tcs = arms["twin_canary"]
    reach = steps_to_reach(sweep_points, tcs["verdict_rate"] or 0.0, tcs["confident_agreement"])
    if reach["steps"] is not None and tcs["canary_agent_steps"] > 0:
        ratio: float | None = reach["steps"] / tcs["canary_agent_steps"]
    else:
        ratio = None
    reach["lower_bound"] = (reach.get("max_steps", 0.0) / tcs["canary_agent_steps"]
                            if reach["steps"] is None and tcs["canary_agent_steps"] > 0 else None)  # fmt: skip
    return arms, curve, sweep_points, reach, ratio


def _guard_kpi(canaries: list[tuple[Any, Any]], round_no: int) -> str | None:
    plan, cres = canaries[round_no - 1]
    return getattr(cres.guard_stop, "kpi", None)


def _over_max_loss(log: Any, plan: Any, pre_ticks: int, better_col: dict[str, str],
                   cols: dict[str, tuple[str, str]], planned_ticks: int | None = None) -> bool:
    """Whether a canary's realised loss (`edgetwin.loop.rounds._realised_loss`, the measure
    the loop's rounds and the edge's loss-budget stop use) exceeded `MAX_LOSS` on any guarded KPI."""
    from dataclasses import replace

    from edgetwin.contract.margins import KPIMargin
    from edgetwin.loop.rounds import _realised_loss

    every = tuple(KPIMargin(c, MARGIN, 0.0, b == "higher") for c, b in better_col.items())  # every guarded column
    loss, _ = _realised_loss(log, replace(plan, margins=every), pre_ticks, planned_ticks)
    return any(loss.get(col, 0.0) > MAX_LOSS[k] for k, (col, _b) in cols.items() if k in MAX_LOSS)


# ------------------------------------------------------------------------------------ output
def _pct(x: Any) -> str:
    return "n/a" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{100 * x:.1f} %"


def guarded_kpis(by_logging: dict[str, Any]) -> str:
    """The KPIs the runs' pairs guard, per logging where the runs differ (a run from before the
    gate guarded more KPIs holds fewer)."""
    kpis = {n: sorted({str(p["kpi"]) for p in d["pairs"]}) for n, d in by_logging.items()}
    if len({tuple(v) for v in kpis.values()}) == 1:
        return ", ".join(next(iter(kpis.values())))
    return "; ".join(f"{n}: {', '.join(v)}" for n, v in kpis.items())


def section(by_logging: dict[str, Any]) -> str:
    any_run = next(iter(by_logging.values()))
    c = any_run["config"]
    quick = any_run["quick"]
    lines = [
        SECTION, "",
        f"Command: `python benchmarks/closed_loop.py --logging {{random,production}}{' --quick' if quick else ''} "
        f"--seed {any_run['seed']}` (one run per logging; machine: {c['machine_cores']} CPU cores shared with other "
        "jobs, torch threads 1, `nice -n 5`). "
        f"Configuration{' (quick)' if quick else ''}: {c['agents']} service groups, 96 ticks (15 min) a day; twin "
        f"MAIL-MMSG with {c['members']} members fitted on {c['train_days']} days of the logging policy (the what-if "
        f"gate benchmark's settings); candidates: the what-if gate benchmark's {len(c['candidates'])} "
        f"(`whatif_gate.candidates`, PPO {c['ppo_steps']} steps in the twin); {c['days']} day(s) per candidate; "
        f"budget per round: ≤ {100 * c['max_share']:g} % of the groups (half on the candidate), ≤ 1 day "
        f"(23 h after 4 pre-ticks), fleet-wide realised loss ≤ {100 * MAX_LOSS_SHARE:g} % per capped KPI; "
        f"≤ {c['max_rounds']} rounds, `Twin.update` {c['update']['epochs']} epochs × {c['update']['max_steps']} "
        f"steps between rounds; margin {100 * c['margin']:g} %. Canary alone: Mann-Whitney U per KPI on per-tick "
        f"arm means, two one-sided tests at {c['kayenta_alpha']:g}, Inconclusive below {c['kayenta_min_points']} "
        "points (`kayenta_verdict`); where the loop ran canaries it judges those same canaries, else one canary of "
        "the loop's first-round size; its own canaries (that one and the sweep's) run with the runtime's guard but "
        "no loss-budget stop (Kayenta has none), their loss measured against the same budget. Truth: each "
        "candidate on the whole cluster for the same day.",
        "",
        "Wall time of the last runs (on the shared machine, beside other jobs): "
        + ", ".join(f"{n} {d['seconds']['total'] / 60:.1f} min (twin fit or load {d['seconds']['fit']:.0f} s, loop "
                    f"{d['seconds']['loop'] / 60:.1f} min, canary alone's sweep {d['seconds']['sweep'] / 60:.1f} min)"
                    for n, d in by_logging.items())
        + "; the twin and the PPO candidate are cached in `--work` (a cold run fits them: ~3 min more when loaded).",
        "",
        f"Guarded pairs: the gate's default guards, every KPI with a direction ({guarded_kpis(by_logging)}; "
        f"{100 * c['margin']:g} % margin); the loss budget caps {', '.join(c['max_loss'])} (relative to the fleet's "
        "level)" + ("" if {"reward", "return"} & set(c["max_loss"]) else
                    ": only KPIs of one positive sign, because a relative worsening has a meaning only against a "
                    "level of one sign, and the reward and return (the operator's weighted multi-objective, which "
                    "takes both signs with a fleet mean near zero) do not have one; `plan_canary` refuses a "
                    "relative cap on them (`edgetwin.loop.plan.check_loss_budget_signs`); the composite's parts are "
                    "capped instead where the budget names them (SLO violations and offload, its two heaviest "
                    "weights), the others (revenue, task time, energy, carbon) guarded by the canary's margins "
                    "without a loss cap, as before") + ". The what-if gate benchmark's quantile and ratio KPIs (p95 task time, energy and carbon per demand, "
        "the demand-weighted SLO rate) are not in this benchmark: neither the prediction-powered verdict (a "
        "difference of per-group means) nor a per-tick arm mean estimates a quantile or a ratio.",
        "",
        "| logs | arm | pairs | verdict rate (target ≥ 90 %) | confident agreement (≥ 97 %) | canary agent-steps "
        "| canary rounds | rounds over budget (0) | post-update regression rate (promoted) |",
        "|---|---|---:|---:|---:|---:|---:|---:|---|",
    ]  # fmt: skip
    for name, d in by_logging.items():
        for arm in ARMS:
            a = d[arm]
            lines.append(
                f"| {name} | {ARM_TEXT[arm]} | {a['pairs']} | {_pct(a['verdict_rate'])} | {_pct(a['confident_agreement'])} "
                f"| {a['canary_agent_steps']:,} | {a['canary_rounds']} | {a['rounds_over_budget']} | "
                f"{_pct(a['post_update_regression_rate'])} ({a['promoted']}) |"
            )
    lines += [
        "",
        "canary_steps_ratio (canary alone's agent-steps to reach twin + canary's verdict rate at least at its "
        "confident agreement, over twin + canary's; target ≥ 2×):",
        "",
        "| logs | twin + canary: rate / agreement / agent-steps | canary alone reaches it at | ratio | how |",
        "|---|---|---|---:|---|",
    ]
    for name, d in by_logging.items():
        t, r = d["twin_canary"], d["canary_steps_reach"]
        at = "not reached" if r["steps"] is None else f"{r['steps']:,.0f} agent-steps"
        q = d.get("quick_canary_steps_ratio", d["canary_steps_ratio"])  # the scale run's headline replaces the key
        # a loop that decided nothing sets no rate to reach: any canary "reaches" 0 %, so no ratio
        ratio = ("n/a (the loop decided nothing)" if not t["decided"]
                 else f"≥ {r['lower_bound']:.1f}× (not reached)" if r.get("lower_bound") is not None
                 else "n/a" if q is None else f"{q:.2f}×")  # fmt: skip
        how = r["how"] + (f" (largest sweep point {r['max_steps']:,.0f})" if r["steps"] is None else "")
        lines.append(f"| {name} | {_pct(t['verdict_rate'])} / {_pct(t['confident_agreement'])} / "
                     f"{t['canary_agent_steps']:,} | {at} | {ratio} | {how} |")  # fmt: skip
    lines += ["", "Canary alone's sweep (one canary per candidate and day on a seeded random slice):", "",
              "| logs | slice (groups, half on the candidate × hours) | agent-steps | verdict rate | confident agreement | canaries over budget |",
              "|---|---|---:|---:|---:|---:|"]  # fmt: skip
    for name, d in by_logging.items():
        for p in d["canary_alone_sweep"]:
            lines.append(f"| {name} | {p['label']} | {p['canary_agent_steps']:,} | {_pct(p['verdict_rate'])} | "
                         f"{_pct(p['confident_agreement'])} | {p['rounds_over_budget']} |")  # fmt: skip
    lines += ["", "Per candidate (twin alone → the loop's verdict; rounds: groups × hours, agent-steps, "
              "stop, verdict):", "", "| logs | candidate | twin alone | twin + canary | rounds | reason |",
              "|---|---|---|---|---|---|"]  # fmt: skip
    for name, d in by_logging.items():
        for pc in d["per_candidate"]:
            rs = "; ".join(f"{r['n_groups']}×{r['hours']:g} h, {r['agent_steps']} steps, {r['stop']}, {r['verdict']}"
                           + (f", over budget {r['over_budget']}" if r["over_budget"] else "") for r in pc["rounds"]) or "—"
            lines.append(f"| {name} | {pc['policy']} | {pc['twin_alone']} | {pc['twin_canary']} | {rs} | "
                         f"{pc['reason'][:200].replace('|', '/')} |")  # fmt: skip
    lines += [
        "",
        "Beside industry: Kayenta judges a canary by Mann-Whitney per metric with at least 50 data points per "
        "metric and a 3 h default lifetime; Argo Rollouts' analysis ends Successful / Failed / Inconclusive; "
        "Flagger moves traffic in 5 % steps checked every 60 s. Active offline policy selection (Konyushkova et "
        "al. 2021) picks among 50 candidates with ~2 real episodes each using OPE as its prior; seed 003 names "
        "the post-update regression rate but reports no number. None reports a verdict rate against a "
        "ground truth, so there is no published number to put beside ours.",
        "",
        *[f"![verdict rate vs canary agent-steps, {n}](benchmarks/closed_loop/verdict_vs_steps_{n}.png)"
          for n in by_logging],
        "",
    ]  # fmt: skip
    return "\n".join(lines)


def plot(d: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5.4, 3.8))
    ta = d["twin_alone"]
    ax.plot([1], [ta["verdict_rate"]], "ks", ms=8, label="twin alone (0 canary steps, drawn at 1)")
    cv = d["twin_canary_curve"]
    ax.plot([max(1, p["canary_agent_steps"]) for p in cv], [p["verdict_rate"] for p in cv], "-o", c="C0",
            label="twin + canary (after 0-3 rounds)")  # fmt: skip
    sw = sorted(d["canary_alone_sweep"], key=lambda p: p["canary_agent_steps"])
    ax.plot([p["canary_agent_steps"] for p in sw], [p["verdict_rate"] for p in sw], "-^", c="C3",
            label="canary alone (sweep of slice × hours)")  # fmt: skip
    # each point's confident agreement: a verdict rate is worth what its agreement is
    for p in [*sw, *({**q, "canary_agent_steps": max(1, q["canary_agent_steps"])} for q in cv)]:
        if p["confident_agreement"] is not None:
            ax.annotate(f"{100 * p['confident_agreement']:.0f}%", (p["canary_agent_steps"], p["verdict_rate"]),
                        textcoords="offset points", xytext=(3, 4), fontsize=6)  # fmt: skip
    ca = d["canary_alone"]
    ax.plot([max(1, ca["canary_agent_steps"])], [ca["verdict_rate"]], "v", c="C3", ms=9, mfc="none",
            label="canary alone on the loop's canaries")  # fmt: skip
    ax.axhline(TARGETS["verdict_rate"], ls=":", c="grey", lw=1)
    ax.set_xscale("log")
    ax.set_ylim(-0.02, 1.02)
    ax.set_xlabel("canary agent-steps (candidate arm, all candidates)")
    ax.set_ylabel("verdict rate (1 - abstention); labels: agreement")
    ax.set_title(f"closed loop, logs: {d['logging']}{' (quick)' if d['quick'] else ''}", fontsize=9)
    ax.legend(fontsize=7, loc="lower right")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)


def merged_results(cur: dict[str, Any], d: dict[str, Any]) -> dict[str, Any]:
    """A results file ``cur`` with the quick run ``d`` merged in: the quick run replaces the keys it
    writes and every other key stays (the coverage, scale, extended, levers and saturation runs'
    keys, which the at-a-glance table cites; a list of keys to keep went stale as runs were added
    and would have dropped them). Where a scale run wrote the headline ``canary_steps_ratio``, it
    keeps that key and the quick run's ratio goes to ``quick_canary_steps_ratio``."""
    new = {**cur, **d}
    if "by_fleet_size" in cur:
        new["quick_canary_steps_ratio"], new["canary_steps_ratio"] = d["canary_steps_ratio"], cur["canary_steps_ratio"]
    return new


def write_outputs(d: dict[str, Any] | None, no_write: bool) -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    if d is not None:
        path = OUT / f"results_{d['logging']}.json"
        cur = json.loads(path.read_text()) if path.is_file() else {}
        path.write_text(json.dumps(merged_results(cur, d), indent=1, default=float))
    by_logging = {n: json.loads((OUT / f"results_{n}.json").read_text()) for n in LOGGING_TEXT
                  if (OUT / f"results_{n}.json").is_file()}  # fmt: skip
    for n, r in by_logging.items():
        if d is None or n == d["logging"]:
            plot(r, OUT / f"verdict_vs_steps_{n}.png")
    keys = ("verdict_rate", "confident_agreement", "canary_agent_steps", "rounds_over_budget",
            "post_update_regression_rate", "canary_rounds", "promoted", "pairs", "decided")  # fmt: skip
    summary = {n: {**{arm: {k: r[arm][k] for k in keys} for arm in ARMS},
                   "canary_steps_ratio": r.get("quick_canary_steps_ratio", r["canary_steps_ratio"]),
                   "canary_steps_reach": r["canary_steps_reach"],
                   "quick": r["quick"], "seed": r["seed"], "config": r["config"]}
               for n, r in by_logging.items()}  # fmt: skip
    (OUT / "results.json").write_text(json.dumps({**summary, "targets": TARGETS}, indent=1, default=float))
    if not no_write and by_logging:
        write_section(SECTION, section(by_logging), keep=KEEP)


# ------------------------------------------------------------------------------- coverage experiment
#: candidate types of the coverage experiment: the true relative change of the SLO-violation rate
#: (lower is better) against the 5 % margin
COVERAGE_TYPES = {"aa": 0.0, "at_margin": MARGIN, "regressing": 3 * MARGIN, "better": -3 * MARGIN}
COVERAGE_SECTION = "## Coverage of the verdict's interval at the loop's arm sizes"


def _emulated_days(n_agents: int, days: int, seed: int, col: str = "kpi.slo_violation") -> list[dict[str, Any]]:
    """Per day of the emulated cluster (``ClusterConfig(n_agents, 96 steps)``, the SLO-aware heuristic
    as the current policy, a fresh population and noise per day): each group's mean of ``col`` over
    ticks >= 4 (``y``) and over the 4 pre-ticks (``x``)."""
    from edgetwin.emulator.cluster import ClusterConfig
    from edgetwin.emulator.logs import generate_logs

    out = []
    for d in range(days):
        log, _ = generate_logs(ClusterConfig(n_agents=n_agents, steps=96), 1, "heuristic", seed=seed * 10_000 + d)
        g = log.groupby("agent")
        post = log[log["t"] >= 4].groupby("agent")[col].mean()
        pre = log[log["t"] < 4].groupby("agent")[col].mean().reindex(post.index)
        del g
        site = log[log["t"] == 0].groupby("agent")["site"].first().reindex(post.index)
        out.append({"y": post.to_numpy(float), "x": pre.to_numpy(float), "site": site.to_numpy(str)})
    return out


def coverage_experiment(
    days_data: list[dict[str, Any]], runs: int, seed: int, share: float = 0.10, treat: float = 0.4,
    twin_error: float = 0.2, twin_bias: float = -0.05, day_sd: float = 0.02, group_sd: float = 0.10,
    cuped: bool = True, control: str = "slice", assign: str = "random", types: tuple[str, ...] = tuple(COVERAGE_TYPES),
    slope: str = "pooled",
) -> dict[str, dict[str, Any]]:
    """``runs`` canaries per candidate type, simulated on the emulator's per-group outcomes without
    fitting twins (cheap on a shared 2-core machine; what it checks is the verdict's interval
    construction at the loop's arm sizes, not the twin).

    Each day's groups keep their emulated SLO-violation rates under the current policy (``y``;
    heterogeneity and day-to-day variation are the emulator's). A candidate of type ``δ``
    (`COVERAGE_TYPES`) changes group ``g`` on day ``d`` to ``y·(1 + δ + u_d + v_g)`` (``u_d`` ~
    N(0, ``day_sd``): the effect moves from day to day; ``v_g`` ~ N(0, ``group_sd``): groups differ
    in their response). The *truth* is the fleet-wide relative change over all the days (``≥ 20``)
    of the whole cluster. The "twin" predicts each group's level with a log-normal error of
    ``twin_error`` and the effect with a bias of ``twin_bias`` (an optimistic twin: the dangerous
    one). A canary: a random day, a random ``share`` of the groups, ``treat`` of them on the candidate
    (the demo's 4 vs 6 of 100), no interference; the estimate is
    `edgetwin.loop.ppi.ppi_mean_difference` with the day-to-day variance from the twin's replay
    of 6 other days, judged by `ppi_verdict` against a 5 % margin at 90 %.

    The design (`design_comparison`, all within the same candidate arm, share and hours):
    ``cuped`` (the pre-period adjustment); ``control`` ``"slice"`` (the slice's other groups) or
    ``"fleet"`` (every group not on the candidate, valid as the candidate arm is a uniformly random
    draw); ``assign`` ``"random"``, ``"stratified"`` (the slice sorted by the pre-period into two
    halves, the candidate arm drawn equally from each, before randomizing) or ``"matched"`` (the
    candidate arm's size in pairs, `_matched_arms`, analysed as pairs: ``paired=True``); ``slope``
    the CUPED slope, ``"pooled"`` or ``"per_arm"`` (`ppi_mean_difference`'s ``cuped``).
    """
    from scipy.stats import binomtest

    from edgetwin.contract.margins import KPIMargin
    from edgetwin.loop.ppi import LEVEL, ppi_mean_difference, ppi_verdict

    rng = np.random.default_rng([seed, 48])
    margin = [KPIMargin("kpi.slo_violation", MARGIN)]
    out: dict[str, dict[str, Any]] = {}
    n_days = len(days_data)
    for name, delta in COVERAGE_TYPES.items():
        if name not in types:
            continue
        u = rng.normal(0.0, day_sd, n_days) if delta != 0.0 else np.zeros(n_days)
        worlds = []
        for d, dd in enumerate(days_data):
            y = dd["y"]
            v = rng.normal(0.0, group_sd, len(y)) if delta != 0.0 else np.zeros(len(y))
            yc = y * (1.0 + delta + u[d] + v)
            fb = y * np.exp(rng.normal(0.0, twin_error, len(y)))
            fc = fb * (1.0 + delta + twin_bias)
            worlds.append((y, yc, fb, fc, dd["x"]))
        truth = float(sum(w[1].sum() for w in worlds) / sum(w[0].sum() for w in worlds) - 1.0)
        covered = promoted = refused = 0
        widths = []
        for _ in range(runs):
            d = int(rng.integers(n_days))
            y, yc, fb, fc, x = worlds[d]
            n = len(y)
            k = max(4, int(round(share * n)))
            sl = rng.choice(n, k, replace=False)
            n_c = max(2, int(round(treat * k)))
            if assign == "stratified":  # two pre-period strata, the candidate arm drawn equally from each
                srt = sl[np.argsort(x[sl], kind="stable")]
                lo_h, hi_h = srt[: k // 2], srt[k // 2:]
                pick = np.concatenate([rng.permutation(lo_h)[: n_c // 2], rng.permutation(hi_h)[: n_c - n_c // 2]])
                cand, ctrl = pick, np.setdiff1d(sl, pick)
            elif assign == "matched":  # n_c pairs by the twin's predicted effect and the pre-period, one of each on the candidate
                cand, ctrl = _matched_arms(sl[: 2 * n_c], fc - fb, x, rng)
            else:
                cand, ctrl = sl[:n_c], sl[n_c:]
            if control == "fleet":
                ctrl = np.setdiff1d(np.arange(n), cand)
            others = [worlds[j] for j in rng.choice([j for j in range(n_days) if j != d], 6, replace=False)]
            dv = float(np.var([np.mean(w[3] - w[2]) for w in others], ddof=1))
            bv = float(np.var([np.mean(w[2]) for w in others], ddof=1))
            e = ppi_mean_difference(fc, fb, yc[cand], fc[cand], y[ctrl], fb[ctrl], LEVEL,
                                    x_cand=x[cand] if cuped else None, x_ctrl=x[ctrl] if cuped else None,
                                    day_var=(dv, bv), day_df=5.0, paired=assign == "matched", cuped=slope)  # fmt: skip
            e.update(n_fleet=float(n), n_candidate=float(len(cand)), n_control=float(len(ctrl)))
            verdict, checks = ppi_verdict({"kpi.slo_violation": e}, margin)
            lo, hi = checks[0].interval
            covered += lo <= truth <= hi
            promoted += verdict == "promote"
            refused += verdict == "refuse"
            widths.append(hi - lo)
        false_prom = promoted if truth > MARGIN else 0
        out[name] = {
            "runs": runs, "level": LEVEL, "truth": truth, "coverage": covered / runs,
            "coverage_ci": list(binomtest(covered, runs).proportion_ci(0.95, "exact")),
            "promoted": promoted / runs, "refused": refused / runs, "median_width": float(np.median(widths)),
            "false_promote_upper": (float(binomtest(false_prom, runs).proportion_ci(0.95, "exact").high)
                                    if truth > MARGIN else None),
            "arm_sizes": [int(max(2, round(treat * max(4, round(share * len(days_data[0]["y"])))))),
                          int(max(4, round(share * len(days_data[0]["y"])))
                              - max(2, round(treat * max(4, round(share * len(days_data[0]["y"])))))),],
        }  # fmt: skip
    return out


def _matched_arms(sl: np.ndarray, effect: np.ndarray, x: np.ndarray, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """The slice ``sl`` in matched pairs (`edgetwin.loop.plan.matched_pairs`: by the twin's predicted
    effect and the pre-period), one group of each pair on the candidate by a fair coin: the arms,
    pair by pair."""
    from edgetwin.loop.plan import matched_pairs

    ids = [str(int(i)) for i in sl]
    pairs = matched_pairs(ids, {i: float(effect[int(i)]) for i in ids}, {i: float(x[int(i)]) for i in ids})
    flip = rng.random(len(pairs)) < 0.5
    cand = np.array([int(b if f else a) for (a, b), f in zip(pairs, flip, strict=True)])
    ctrl = np.array([int(a if f else b) for (a, b), f in zip(pairs, flip, strict=True)])
    return cand, ctrl


#: the designs `design_comparison` measures, all with the same 4 candidate groups (the loss: the
#: candidate arm's groups x hours) for one day; the matched-pair slice is 8 groups (4 pairs)
DESIGNS = {
    "random, no CUPED": {"cuped": False},
    "random + CUPED (default)": {},
    "stratified by pre-period + CUPED": {"assign": "stratified"},
    "matched pairs (twin's effect + pre-period) + CUPED, paired analysis": {"assign": "matched"},
    "fleet control + CUPED": {"control": "fleet"},
    "random + CUPED slope per arm": {"slope": "per_arm"},
    "fleet control + CUPED slope per arm": {"control": "fleet", "slope": "per_arm"},
}


def design_comparison(days_data: list[dict[str, Any]], runs: int, seed: int, treat: float = 0.4) -> dict[str, dict[str, Any]]:
    """Within one budget (the candidate arm's groups x hours, so the same expected loss), what
    narrows the verdict's interval: median width, coverage and decided share per design
    (`DESIGNS`) for the A/A and the truly regressing candidates, on the same simulated canaries as
    `coverage_experiment` (same seed: the same days, slices and twins); ``treat``: the candidate's share
    of the 10 % slice (0.4: the demo's 4 of 10 groups; the scale loop's half: 0.5)."""
    out = {}
    for label, kw in DESIGNS.items():
        r = coverage_experiment(days_data, runs, seed, types=("aa", "regressing"), treat=treat, **kw)
        out[label] = {t: {"median_width": v["median_width"], "coverage": v["coverage"],
                          "decided": v["promoted"] + v["refused"]} for t, v in r.items()}  # fmt: skip
    return out


def pool_coverage(per_seed: list[dict[str, dict[str, Any]]]) -> dict[str, dict[str, Any]]:
    """The seeds' coverage experiments pooled per type, with Clopper-Pearson (95 %) intervals."""
    from scipy.stats import binomtest

    out = {}
    for name in COVERAGE_TYPES:
        rs = [p[name] for p in per_seed]
        runs = sum(r["runs"] for r in rs)
        cov = int(round(sum(r["coverage"] * r["runs"] for r in rs)))
        prom = int(round(sum(r["promoted"] * r["runs"] for r in rs)))
        regress = all(r["truth"] > MARGIN for r in rs)
        out[name] = {
            "runs": runs, "level": rs[0]["level"], "truths": [r["truth"] for r in rs], "coverage": cov / runs,
            "coverage_ci": list(binomtest(cov, runs).proportion_ci(0.95, "exact")), "promoted": prom / runs,
            "refused": sum(r["refused"] * r["runs"] for r in rs) / runs,
            "false_promote_upper": float(binomtest(prom, runs).proportion_ci(0.95, "exact").high) if regress else None,
            "median_width": float(np.median([r["median_width"] for r in rs])), "arm_sizes": rs[0]["arm_sizes"],
        }  # fmt: skip
    return out


def run_coverage(args: argparse.Namespace) -> dict[str, Any]:
    """The coverage experiment over ``--seeds`` (each its own emulated days), and the simulated
    verdict rate at 100 / 1,000 / 5,000 groups (``--fleet-sizes``) at a fixed 10 % share."""
    seeds = list(range(args.seed, args.seed + args.seeds))
    t0 = time.perf_counter()
    days0 = _emulated_days(100, args.days, seeds[0])
    per_seed = [coverage_experiment(days0 if s == seeds[0] else _emulated_days(100, args.days, s), args.runs, s)
                for s in seeds]  # fmt: skip
    designs = design_comparison(days0, args.runs, seeds[0])
    by_size: dict[str, Any] = {}
    for n in args.fleet_sizes:
        res = [coverage_experiment(_emulated_days(n, args.days, s), max(50, args.runs // 4), s) for s in seeds[:1]]
        p = pool_coverage(res)
        by_size[str(n)] = {t: {"decided": p[t]["promoted"] + p[t]["refused"], "promoted": p[t]["promoted"],
                               "coverage": p[t]["coverage"], "runs": p[t]["runs"], "arm_sizes": p[t]["arm_sizes"]}
                           for t in COVERAGE_TYPES}  # fmt: skip
    return {"seeds": seeds, "days": args.days, "coverage_experiment": pool_coverage(per_seed),
            "coverage_per_seed": per_seed, "simulated_by_fleet_size": by_size, "designs": designs,
            "seconds": time.perf_counter() - t0}  # fmt: skip


def design_note(designs: dict[str, dict[str, Any]]) -> str:
    """What the design table says about matched pairs against the random default, from its numbers."""
    mp = next((v for k, v in designs.items() if k.startswith("matched pairs")), None)
    rnd = designs.get("random + CUPED (default)")
    if mp is None or rnd is None:
        return ""
    parts = [f"{t}: {100 * mp[t]['median_width']:.0f} pp vs {100 * rnd[t]['median_width']:.0f} pp "
             f"({'narrower' if mp[t]['median_width'] < rnd[t]['median_width'] else 'wider'})" for t in ("aa", "regressing")]
    return ("Matched pairs against the random default, median width: " + "; ".join(parts) + ". Pairing pays where "
            "the groups' responses are alike (the pairs then predict each other); where the candidate's effect varies "
            "by group the pairs stop predicting each other and 4 pairs leave 3 degrees of freedom, so the paired "
            "interval is wider. No design wins everywhere: `plan_canary(design=\"auto\")` weighs both per canary by "
            "the interval the twin expects, and the plan records both widths (`CanaryPlan.expected_width`).")


def coverage_section(doc: dict[str, Any]) -> str:
    ce = doc["coverage_experiment"]
    lines = [COVERAGE_SECTION, "",
             f"`python benchmarks/closed_loop.py --coverage --seeds {len(doc['seeds'])} --runs "
             f"{ce['aa']['runs'] // len(doc['seeds'])} --days {doc['days']}` (seeds {doc['seeds']}; {doc['days']} emulated "
             "days of 100 groups per seed). Canaries simulated on the emulator's per-group SLO-violation rates "
             "without fitting twins (`coverage_experiment`: a candidate's effect imposed with day-to-day and "
             "group-to-group variation, a twin 20 % wrong per group and 5 points optimistic on the effect); each "
             f"canary at the demo's arm sizes ({ce['aa']['arm_sizes'][0]} candidate vs {ce['aa']['arm_sizes'][1]} "
             "control groups of 100), judged by the loop's PPI verdict (t reference, day-to-day variance) against "
             "a 5 % margin. Truth: the whole cluster's change over every day. What it does not check: the real "
             "twin's interference and bias (the closed loop above does, on fewer canaries).", "",
             "| candidate | runs | truth | coverage of 90 % [95 % CP] | promoted | refused | false-promote CP upper | median width |",
             "|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for t, r in ce.items():
        fp = "—" if r["false_promote_upper"] is None else f"{100 * r['false_promote_upper']:.1f} %"
        truth = ", ".join(f"{100 * x:+.1f} %" for x in r["truths"])
        lines.append(f"| {t} | {r['runs']} | {truth} | {100 * r['coverage']:.1f} % [{100 * r['coverage_ci'][0]:.1f}, "
                     f"{100 * r['coverage_ci'][1]:.1f}] | {100 * r['promoted']:.1f} % | {100 * r['refused']:.1f} % | {fp} | "
                     f"{100 * r['median_width']:.0f} pp |")  # fmt: skip
    lines += ["", "Simulated share of canaries decided (promote or refuse) at a fixed 10 % share, by fleet size "
              "(one seed, same construction; not the closed loop's `by_fleet_size`, which this run did not measure):", "",
              "| groups | arms | " + " | ".join(COVERAGE_TYPES) + " |", "|---|---|" + "---|" * len(COVERAGE_TYPES)]
    for n, r in doc["simulated_by_fleet_size"].items():
        arms = r["aa"]["arm_sizes"]
        lines.append(f"| {n} | {arms[0]} vs {arms[1]} | " + " | ".join(f"{100 * r[t]['decided']:.0f} %" for t in COVERAGE_TYPES) + " |")
    if doc.get("designs"):
        lines += ["", "What narrows the interval within the same budget (the same 4 candidate groups x 1 day; seed "
                  f"{doc['seeds'][0]}, {ce['aa']['runs'] // len(doc['seeds'])} canaries per design and type, `design_comparison`):", ""]
        lines += design_rows(doc["designs"], 0) + ["", design_note(doc["designs"])]
    for n, r in (doc.get("designs_by_fleet_size") or {}).items():
        lines += ["", f"The same designs at {int(n):,} groups (the scale loop's arms: {r['arm_sizes'][0]} candidate groups, "
                  f"{r['arm_sizes'][1]} in the slice's control half, {int(n) - r['arm_sizes'][0]} with the fleet as control; "
                  f"seed {r['seed']}, {r['runs']} canaries per design and type, {r['days']} emulated days; "
                  f"`python benchmarks/closed_loop.py --designs-only --designs-fleet {n} --seed {r['seed']} --runs {r['runs']} "
                  f"--days {r['days']}`):", ""]  # fmt: skip
        lines += design_rows(r["designs"], 1)
    before = doc.get("before_interval_division")
    if before:
        lines += ["", "The verdict's relative change is read by interval division (the effect's interval over every "
                  "baseline level the baseline's own interval allows, `edgetwin.contract.relative_change`); the runs "
                  f"above with the delta method it replaced (`before_interval_division`, at {before['commit']}; same "
                  "commands and seeds):", "",
                  "| candidate | coverage of 90 %: delta method → interval division | promoted | refused | "
                  "false-promote CP upper | median width |", "|---|---|---|---|---|---|"]  # fmt: skip
        for t, r in ce.items():
            b = before["coverage_experiment"][t]
            fp = "—" if r["false_promote_upper"] is None else (f"{100 * b['false_promote_upper']:.1f} % → "
                                                               f"{100 * r['false_promote_upper']:.1f} %")  # fmt: skip
            lines.append(f"| {t} | {100 * b['coverage']:.1f} % → {100 * r['coverage']:.1f} % | {100 * b['promoted']:.1f} % → "
                         f"{100 * r['promoted']:.1f} % | {100 * b['refused']:.1f} % → {100 * r['refused']:.1f} % | {fp} | "
                         f"{100 * b['median_width']:.0f} → {100 * r['median_width']:.0f} pp |")  # fmt: skip
        aa_b, aa_n = before["coverage_experiment"]["aa"]["coverage"], ce["aa"]["coverage"]
        lines += ["", "The delta method evaluated the baseline's share of the error at the estimate's ratio, which is "
                  f"0 for the A/A candidate: its A/A coverage read {100 * aa_b:.1f} % at a stated 90 % (interval "
                  f"division: {100 * aa_n:.1f} %), while on draws with a known truth it fell short where the effect is "
                  "large and the baseline noisy (tests/test_relative_change.py): that shortfall, not these numbers, "
                  "is why it was replaced."]  # fmt: skip
    return "\n".join(lines) + "\n"


def design_rows(designs: dict[str, Any], digits: int) -> list[str]:
    """The design table (`design_comparison`'s result), widths in points at ``digits`` decimals."""
    lines = ["| design | median width (A/A) | coverage (A/A) | decided (A/A) | median width (regressing) | coverage (regressing) | decided (regressing) |",
             "|---|---|---|---|---|---|---|"]  # fmt: skip
    for label, r in designs.items():
        a, g = r["aa"], r["regressing"]
        lines.append(f"| {label} | {100 * a['median_width']:.{digits}f} pp | {100 * a['coverage']:.1f} % | {100 * a['decided']:.0f} % | "
                     f"{100 * g['median_width']:.{digits}f} pp | {100 * g['coverage']:.1f} % | {100 * g['decided']:.0f} % |")  # fmt: skip
    return lines


def write_coverage_section(cur: dict[str, Any]) -> None:
    """The coverage section from ``results_production.json``'s stored coverage experiment."""
    doc = {k: cur[k] for k in ("coverage_experiment", "simulated_by_fleet_size", "designs")}
    doc["designs_by_fleet_size"] = cur.get("designs_by_fleet_size", {})
    doc["before_interval_division"] = cur.get("before_interval_division")
    write_section(COVERAGE_SECTION, coverage_section({**doc, "seeds": cur["coverage_seeds"], "days": cur["coverage_days"]}),
                  doc=OUT / "README.md")  # fmt: skip


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    ap.add_argument("--logging", choices=sorted(LOGGING_TEXT), default="production")
    ap.add_argument("--quick", action="store_true", help="60 groups, 3-member twin, 3 training days, one day per candidate (see the docstring)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--agents", type=int, default=0, help="service groups (default 100; 60 with --quick)")
    ap.add_argument("--max-candidates", type=int, default=0, help="only the first N candidates (0: all; for smoke runs)")
    ap.add_argument("--skip-candidates", type=int, default=0,
                    help="--scale: leave out the first N of those candidates (a second process for the rest, its own --work)")
    ap.add_argument("--work", type=Path, default=Path("/tmp/edgetwin-closed-loop"))
    ap.add_argument("--no-write", action="store_true", help="write no results or page (smoke runs)")
    ap.add_argument("--fleet-control", action="store_true",
                    help="the loop judges each canary against every group not on the candidate (canary_loop(fleet_control=True)); "
                         "measure with --no-write: the page holds the default's run")
    ap.add_argument("--cuped", choices=("pooled", "per_arm"), default="pooled",
                    help="--scale: the verdict's pre-period slope (canary_loop(cuped=...)); per_arm: Lin 2013's, for --fleet-control's unequal arms")
    ap.add_argument("--docs-only", action="store_true", help="rewrite the page from the results_<logging>.json files")
    ap.add_argument("--coverage", action="store_true",
                    help="only the coverage experiment (coverage_experiment) into results_production.json and its section")
    ap.add_argument("--designs-only", action="store_true",
                    help="only the coverage experiment's design table (design_comparison) for --seed, --runs, --days")
    ap.add_argument("--designs-fleet", type=int, default=100,
                    help="--designs-only: fleet size (100: the demo's arms, 4 of 10 on the candidate; else half of 10 %% on it)")
    ap.add_argument("--saturation", action="store_true",
                    help="simulate the randomized-saturation canary against the twin's interference term at "
                         "--designs-fleet groups (_closed_loop_saturation) into results_production.json's saturation")
    ap.add_argument("--seeds", type=int, default=3, help="--coverage: seeds")
    ap.add_argument("--runs", type=int, default=200, help="--coverage: canaries per candidate type and seed")
    ap.add_argument("--days", type=int, default=20, help="--coverage: emulated days per seed (the truth's)")
    ap.add_argument("--fleet-sizes", type=int, nargs="*", default=[100, 1000, 5000], help="--coverage, --scale: fleet sizes")
    ap.add_argument("--scale", action="store_true",
                    help="the closed loop at --fleet-sizes for --seed (_closed_loop_scale.run_seed) into --work/scale-s<seed>.json")
    ap.add_argument("--scale-merge", type=int, nargs="*", default=None, metavar="SEED",
                    help="pool --work/scale-s<SEED>.json into results_production.json and the page")
    ap.add_argument("--merge-as", default="", metavar="NAME",
                    help="--scale-merge of a --fleet-control run: results key extended_fleet_control_NAME, its own seed "
                         "files and page section, beside the stored run (e.g. reseeded: the rerun after the replay-stream fix)")
    ap.add_argument("--scale-more", type=Path, nargs="*", default=[], metavar="DIR",
                    help="--scale-merge: more work directories whose scale-s<SEED>.json add fleet sizes the first lacks")
    ap.add_argument("--truth-days", type=int, default=20, help="--scale: days of the whole cluster per policy (the truth)")
    ap.add_argument("--max-days", type=int, default=1,
                    help="--scale: extend a candidate that is not hurting up to this many canary days (1: one day, 3 rounds)")
    ap.add_argument("--reuse", type=Path, default=None, metavar="DIR",
                    help="--scale: take the truth and canary-alone sweep from DIR/seed<S>.json of an earlier run")
    ap.add_argument("--reuse-loop", type=Path, default=None, metavar="DIR",
                    help="--scale: take from DIR/extended_seed<S>.json the loop of every candidate whose canary the "
                         "guard did not stop (the only path a guard-stop change touches); rerun the others")
    ap.add_argument("--fresh-sizes", type=int, nargs="*", default=[], metavar="N",
                    help="--scale with --reuse-loop: fleet sizes at which every candidate's loop runs again")
    ap.add_argument("--loss-diagnosis", action="store_true",
                    help="with --quick: per candidate, the smallest canary's worst-case loss against each capped KPI's "
                         "budget (_closed_loop_budget) into results_<logging>.json's loss_budget_diagnosis")
    ap.add_argument("--day-truth", action="store_true",
                    help="recompute the 1,000-group scale truth of --seed day by day (--truth-days days, twin cached in "
                         "--work) into scale/day_truth_seed<S>.json (_closed_loop_bound)")
    ap.add_argument("--bound", action="store_true",
                    help="classify the reseeded extended runs' open pairs by their distance from the margin against the "
                         "day-to-day spread and the 16-day design's half-width (_closed_loop_bound) into verdict_bound")
    ap.add_argument("--day-diagnosis", action="store_true",
                    help="the twin's replayed day spread against the logs' and the emulator's for --seed on the cached "
                         "1,000-group twin in --work (_closed_loop_dayterm) into scale/day_term_seed<S>.json")
    ap.add_argument("--day-coverage", action="store_true",
                    help="coverage of the multi-day truth with the effect moving from day to day (--day-sd), canaries on "
                         "--canary-days days of a --designs-fleet fleet (_closed_loop_dayterm.day_coverage)")
    ap.add_argument("--planbase-rerun", type=Path, default=None, metavar="DIR",
                    help="the 100-group loop rerun after planbase15 (_closed_loop_rerun_planbase): DIR's scale-s<S>.json "
                         "against the stored day_bound run, into results_production.json and the page")
    ap.add_argument("--fleet-size-page", nargs="?", const="day_term", default=None, choices=("day_term", "day_bound"),
                    help="the verdict rate by fleet size: the --merge-as day_term (default) or day_bound run's seed files "
                         "into results_production.json's <run>_by_fleet_size and its page section (_closed_loop_fleetsize, "
                         "_closed_loop_fleetsize_bound: day_bound also moves the headline by_fleet_size to that run)")
    ap.add_argument("--day-term-page", action="store_true",
                    help="the day-term section: the diagnosis, --day-coverage and the 1,000-group reruns (--day-term-fc/-sl "
                         "work directories, copied into scale/day_term_<run>_seed<S>.json) against the stored runs")
    ap.add_argument("--day-term-fc", type=Path, default=None, metavar="DIR", help="--day-term-page: the fleet-control rerun's --work")
    ap.add_argument("--day-term-base", type=Path, default=None, metavar="DIR",
                    help="--day-term-page: the fleet-control loop rerun on the code before the day-term change (its --work)")
    ap.add_argument("--day-term-sl", type=Path, default=None, metavar="DIR", help="--day-term-page: the slice-control rerun's --work")
    ap.add_argument("--day-sd", type=float, default=0.05, help="--day-coverage: sd of the effect's day shock (relative)")
    ap.add_argument("--canary-days", type=int, nargs="*", default=[1, 4], help="--day-coverage: canary days per run")
    ap.add_argument("--levers", action="store_true",
                    help="what narrows the interval: every lever on the loop's first-day canaries at 1,000 groups for --seed "
                         "(_closed_loop_levers.run_levers) into --work/levers-s<seed>.json")
    ap.add_argument("--levers-merge", type=int, nargs="*", default=None, metavar="SEED",
                    help="pool --work/levers-s<SEED>.json into results_production.json's levers and the page")
    ap.add_argument("--levers-rejudge", type=int, nargs="*", default=None, metavar="SEED",
                    help="judge the stored scale/levers/levers_seed<SEED>.json's days a stop cut short by the loop's "
                         "stopped-day rule (the ones before kept under scale/levers/before_stopped_day and "
                         "results_production.json's levers_before_stopped_day), pool them and render the section")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    if args.loss_diagnosis:
        from _closed_loop_budget import loss_budget_diagnosis

        diag = loss_budget_diagnosis(args)
        path = OUT / f"results_{args.logging}.json"
        cur = json.loads(path.read_text())
        cur["loss_budget_diagnosis"] = diag
        path.write_text(json.dumps(cur, indent=1, default=float))
        return
    if args.day_truth:
        from _closed_loop_bound import run_day_truth_cli

        run_day_truth_cli(args.seed, args.truth_days, args.work, OUT)
        return
    if args.planbase_rerun is not None:
        from _closed_loop_rerun_planbase import write_page as write_rerun

        got = write_rerun(args.planbase_rerun, OUT)
        print(json.dumps({k: got[k] for k in ("seeds", "changed")} | {"loops_same": sum(x["same_verdicts"] for x in got["loops"])}))
        return
    if args.fleet_size_page:
        if args.fleet_size_page == "day_bound":
            from _closed_loop_fleetsize_bound import write_page as write_fleet_sizes
        else:
            from _closed_loop_fleetsize import write_page as write_fleet_sizes

        print(json.dumps({n: {k: v[k] for k in ("canary_verdict_rate", "confident_agreement", "agreement_ci")}
                          for n, v in write_fleet_sizes(OUT)["by_fleet_size"].items()}, indent=1, default=float))  # fmt: skip
        return
    if args.day_term_page:
        from _closed_loop_dayterm import copy_runs, write_page

        copy_runs(args.day_term_fc, args.day_term_sl, OUT, [0, 1, 2], args.day_term_base)
        print(json.dumps(write_page(OUT, [0, 1, 2]), indent=1, default=float))
        return
    if args.day_coverage:
        from _closed_loop_dayterm import run_day_coverage

        doc = run_day_coverage(args.designs_fleet, args.days, args.runs, args.seed, args.day_sd, list(args.canary_days))
        if not args.no_write:
            path = OUT / "results_production.json"
            cur = json.loads(path.read_text())
            cur["day_term_coverage"] = doc
            path.write_text(json.dumps(cur, indent=1, default=float))
        print(json.dumps(doc, indent=1, default=float))
        return
    if args.day_diagnosis:
        from _closed_loop_dayterm import diagnose

        doc = diagnose(args.seed, args.work)
        if not args.no_write:
            (OUT / "scale" / f"day_term_seed{args.seed}.json").write_text(json.dumps(doc, indent=1, default=float))
        print(json.dumps(doc, indent=1, default=float))
        return
    if args.bound:
        from _closed_loop_bound import run_bound_cli

        res = run_bound_cli(OUT)
        print(json.dumps({k: {a: b for a, b in r.items() if a != "pairs_detail"} for k, r in res["runs"].items()},
                         indent=1, default=float))  # fmt: skip
        return
    if args.levers or args.levers_merge is not None or args.levers_rejudge is not None:
        from _closed_loop_levers import run_lever_cli

        run_lever_cli(args, OUT)
        return
    if args.scale or args.scale_merge is not None:
        from _closed_loop_scale import run_scale

        run_scale(args, OUT)
        return
    if args.coverage:
        doc = run_coverage(args)
        print(json.dumps(doc["coverage_experiment"], indent=1, default=float))
        if not args.no_write:
            path = OUT / "results_production.json"
            cur = json.loads(path.read_text()) if path.exists() else {}
            cur.update({k: doc[k] for k in ("coverage_experiment", "simulated_by_fleet_size", "designs")},
                       coverage_seeds=doc["seeds"], coverage_days=doc["days"])  # fmt: skip
            path.write_text(json.dumps(cur, indent=1, default=float))
            write_coverage_section(cur)  # with the stored designs at other fleet sizes and the run before
        return
    if args.saturation:
        from _closed_loop_saturation import KEEP as SAT_KEEP
        from _closed_loop_saturation import SECTION as SAT_SECTION
        from _closed_loop_saturation import (
            members_interference_sd,
            saturation_comparison,
            saturation_section,
            site_share_of_residual,
            update_narrowing,
        )

        n = int(args.designs_fleet)
        isd = members_interference_sd(OUT / "scale" / "levers")
        days = _emulated_days(n, args.days, args.seed)
        res = saturation_comparison(days, args.runs, args.seed, interference_sd=isd)
        res["site_share"] = site_share_of_residual(days)
        res["update_narrowing"] = update_narrowing(OUT / "scale", n)
        print(json.dumps(res, indent=1, default=float))
        if not args.no_write:
            path = OUT / "results_production.json"
            cur = json.loads(path.read_text())
            cur["saturation"] = res
            path.write_text(json.dumps(cur, indent=1, default=float))
            cmd = (f"python benchmarks/closed_loop.py --saturation --designs-fleet {n} --seed {args.seed} "
                   f"--runs {args.runs} --days {args.days}")
            write_section(SAT_SECTION, saturation_section(res, cmd), doc=OUT / "README.md", keep=SAT_KEEP)
        return
    if args.designs_only:  # the design table alone (seed --seed, --runs canaries per design and type)
        path = OUT / "results_production.json"
        cur = json.loads(path.read_text())
        if args.designs_fleet == 100:
            cur["designs"] = design_comparison(_emulated_days(100, args.days, args.seed), args.runs, args.seed)
            shown = cur["designs"]
        else:  # the scale loop's arms: half of the 10 % slice on the candidate
            n = int(args.designs_fleet)
            k = max(4, int(round(0.10 * n)))
            shown = design_comparison(_emulated_days(n, args.days, args.seed), args.runs, args.seed, treat=0.5)
            cur.setdefault("designs_by_fleet_size", {})[str(n)] = {
                "seed": args.seed, "runs": args.runs, "days": args.days, "arm_sizes": [k // 2, k - k // 2], "designs": shown}
        path.write_text(json.dumps(cur, indent=1, default=float))
        write_coverage_section(cur)
        print(json.dumps(shown, indent=1))
        return
    if args.docs_only:
        write_outputs(None, False)
        write_coverage_section(json.loads((OUT / "results_production.json").read_text()))
        return
    t0 = time.perf_counter()
    d = run_logging(args)
    d["seconds"]["total"] = time.perf_counter() - t0
    print(json.dumps({a: d[a] for a in ARMS} | {"canary_steps_ratio": d["canary_steps_ratio"],
                                                "seconds": d["seconds"]}, indent=1, default=float))  # fmt: skip
    if args.no_write:
        return
    write_outputs(d, False)


if __name__ == "__main__":
    sys.exit(main())
