"""Why the quick closed loop runs no canary under today's reward: the loss budget against the twin's worst case.

`benchmarks/closed_loop.py --loss-diagnosis --logging production --quick --seed 0 --work DIR` (the twin
and PPO candidate cached in ``DIR`` by the quick run) recomputes, per candidate, what `plan_canary`
checks before it admits a canary: the gate's worst-case relative worsening of every KPI the
operator's loss budget caps (`closed_loop.MAX_LOSS`, the upper end of the check's worsening
interval), and the fleet-wide loss the *smallest* canary the planner can run (4 groups, 2 on the
candidate: `edgetwin.loop.plan._expected_option`'s ``n_c``) would risk, as a share of the cap.
A share above 1 on any capped KPI rules the smallest canary out, and so every canary. Beside it,
each capped KPI's fleet level and its spread over the groups on the canary's day: a relative cap
on a KPI whose fleet mean is near zero against a wide spread over groups (the operator's
multi-objective reward since bd3f855) is one no worst case fits. Written to
``results_production.json``'s ``loss_budget_diagnosis``; nothing is tuned by it.
"""

from __future__ import annotations

import copy
import sys
from typing import Any

#: the smallest canary the planner considers: 4 groups, half on the candidate
MIN_GROUPS, MIN_CANDIDATE_GROUPS = 4, 2


def loss_budget_diagnosis(args: Any) -> dict[str, Any]:
    """Per candidate and capped KPI: ``worst`` (relative worsening, the check's worsening interval's
    upper end), ``share`` (the smallest canary's fleet loss over the cap); ``blocked_by``: the KPIs
    whose share exceeds 1. ``levels`` / ``group_sd``: each capped column's fleet mean and its sd over
    the groups' day means on the fleet's day (the log the gate and the plan read)."""
    from closed_loop import MAX_LOSS
    from whatif_gate import candidates, fit_or_load, logging_policy, train_ppo

    from edgetwin.emulator.cluster import ClusterConfig, cluster_spec
    from edgetwin.emulator.logs import generate_logs
    from edgetwin.loop.ppi import replay_spec
    from edgetwin.policies.gate import run_gate

    if not args.quick:
        print("--loss-diagnosis: only the quick configuration (--quick) is diagnosed", file=sys.stderr)
        raise SystemExit(2)
    n_agents = args.agents or 60
    cfg = ClusterConfig(n_agents=n_agents, steps=96)
    spec = cluster_spec(cfg)
    work = args.work / f"{args.logging}-n{n_agents}-d3-s{args.seed}"
    train, _ = generate_logs(cfg, episodes=3, policy=logging_policy(args.logging, spec, args.seed), seed=args.seed)
    twin = fit_or_load(work, args.logging, 3, train, spec)
    pols = candidates(spec, twin, args.logging, args.seed)
    pols["PPO trained in the twin"] = train_ppo(twin, work, 5_000, args.seed)
    current = logging_policy(args.logging, spec, args.seed + 500)
    fleet_log, _ = generate_logs(cfg, 1, copy.deepcopy(current), seed=args.seed + 7)  # day 0's fleet (run_logging's)
    cols = [c for c in MAX_LOSS if c in fleet_log.columns]
    by_group = fleet_log.groupby("agent")[cols].mean()
    out: dict[str, Any] = {
        "command": f"python benchmarks/closed_loop.py --loss-diagnosis --logging {args.logging} --quick --seed {args.seed}",
        "fleet_groups": n_agents, "min_candidate_groups": MIN_CANDIDATE_GROUPS, "caps": dict(MAX_LOSS),
        "levels": {c: float(fleet_log[c].mean()) for c in cols},
        "group_sd": {c: float(by_group[c].std(ddof=1)) for c in cols}, "candidates": {},
    }  # fmt: skip
    for name, pol in pols.items():
        d = run_gate(twin, replay_spec(name, pol), replay_spec("current", current), log=fleet_log, episodes=1,
                     seed=args.seed)  # fmt: skip
        got = {}
        for c in d.checks:
            if c.scenario != "nominal" or c.kpi not in MAX_LOSS:
                continue
            worst = float(c.worsening_interval[1]) if c.worsening_interval else float("inf")
            share = max(0.0, worst) * MIN_CANDIDATE_GROUPS / n_agents / MAX_LOSS[c.kpi]
            got[c.kpi] = {"worst": worst, "share": share}
        out["candidates"][name] = {"kpis": got, "blocked_by": sorted(k for k, v in got.items() if v["share"] > 1.0)}
        print(name, out["candidates"][name]["blocked_by"], flush=True)
    return out
