"""Site-level switchbacks vs group-split canaries of the same budget on the emulated cluster.

For each condition (the default cluster, whose edge sites congest under load, and one with ample
edge capacity) and each candidate (A/A: the current random policy with other draws; a regressing
one: everything at the edge with half the capacity; an edge hog, everything at the edge with 1.5
times the capacity at 30 % of the list price, which helps the groups that run it while the others
do not and congests the edge sites when everyone does: interference), ``--runs`` independent days, each run twice on the same
world (seeded alike):

- **switchback**: edge-waw (about a quarter of the groups; its own cloud region, so it shares no
  resource with the other sites) alternates in 10 blocks of 2 h after a 1 h pre-period, paired
  (`edgetwin.loop.switchback`), the first 4 ticks of each block burned in (the emulator's carryover
  decays to about 15 % of the effect in 4 ticks: `tests/test_switchback.py`); 90 % t interval
  (4 degrees of freedom).
- **group split**: a uniformly random quarter of all groups, half of them (complete randomization)
  on the candidate, over the same 20 h; Welch t interval on the groups' means with the pre-period
  as covariate (CUPED; the canary alone, no twin). Same budget: share × hours = 25 % × 20 h.

Truths: each day's own (the same day, seeded alike, with every group on the candidate, then on the
current policy: over the same 20 h, on edge-waw for the switchback and the whole fleet for the group
split) and the multi-day one (``--truth-days`` days of each). Coverage is reported with
Clopper-Pearson 95 % intervals. Writes docs/benchmarks/switchback/README.md and results.json.

    python benchmarks/switchback.py [--runs 200] [--truth-days 20] [--agents 200] [--seed 0] [--quick]

``--wire N`` instead runs the switchback through the operator's wire (`wire_day`): a signed
``canary start --design switchback`` command, a running `EdgeRuntime` (what ``edgetwin serve``
runs) following the blocks, the emulated cluster as the operator's own system asking it for
decisions and reporting outcomes over the bus (`edgetwin.loop.fleet.drive_cluster_over_bus`), the
log collected from the bus (`edgetwin.loop.collect.collect_canary`) and judged by
`estimate_switchback`, on N days; beside it the same day stepped directly with `SwitchbackPolicy`
(what `run_switchback_on_cluster` does); writes docs/benchmarks/switchback/wire.md and wire.json.

    python benchmarks/switchback.py --wire 3 [--agents 200] [--seed 0]
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

import numpy as np

OUT = Path(__file__).resolve().parents[1] / "docs" / "benchmarks" / "switchback"
SITE = "edge-waw"
KPIS = ("kpi.slo_violation", "kpi.task_time_ms")
PRE, BLOCK, CARRY, BLOCKS = 4, 8, 4, 10  # ticks
START, STOP = PRE, PRE + BLOCK * BLOCKS  # the judged window of both designs: ticks 4..83 (20 h)
SHARE = 0.25
MARGIN = 0.05
LEVEL = 0.90
CONDITIONS = {"congested": 0.45, "ample capacity": 0.05}  # ClusterConfig.target_util


class Constant:
    """One action for every row."""

    def __init__(self, action: list[float]) -> None:
        self.action = np.asarray(action, dtype=np.float64)

    def act(self, obs: np.ndarray) -> np.ndarray:
        return np.tile(self.action, (len(obs), 1))


class Fixed:
    """A fixed set of rows on the candidate from tick ``start`` of the day on (a group split after
    its pre-period, or everyone / no one all day)."""

    def __init__(self, current: Any, candidate: Any, mask: np.ndarray, start: int = 0) -> None:
        self.current, self.candidate, self.mask = current, candidate, np.asarray(mask, dtype=bool)
        self.start, self.tick = int(start), 0

    def arm_mask(self, tick: int) -> np.ndarray:
        return self.mask & (tick % 96 >= self.start)

    def act(self, obs: np.ndarray) -> np.ndarray:
        a, b = self.current.act(obs), self.candidate.act(obs)
        mask = self.arm_mask(self.tick)
        self.tick += 1
        return np.where(mask[:, None], b, a)


def candidates(spec: Any, r: int) -> dict[str, tuple[Any, Any]]:
    """name -> (current, candidate) for run ``r`` (fresh objects: the random policies keep state)."""
    from edgetwin.contract.policy import RandomPolicy

    return {
        "A/A": (RandomPolicy(spec, seed=r), RandomPolicy(spec, seed=50_000 + r)),
        "regressing": (RandomPolicy(spec, seed=r), Constant([1.0, 0.5, 0.5])),
        "edge-hog": (RandomPolicy(spec, seed=r), Constant([1.0, 1.5, 0.3])),
    }


def _rel(c: float, b: float) -> float:
    return float(c / abs(b) - np.sign(b)) if b else float("nan")


def _means(log: Any, site: str | None) -> dict[str, float]:
    at = log[(log["t"] >= START) & (log["t"] < STOP)]
    if site is not None:
        at = at[at["site"] == site]
    return {k: float(at[k].mean()) for k in KPIS}


def day_truth(cfg: Any, pair: tuple[Any, Any], seed: int) -> dict[str, dict[str, float]]:
    """The day's truth: the same world with every group on the candidate, then on the current."""
    from edgetwin.loop.switchback import run_on_cluster

    cur, cand = pair
    on = run_on_cluster(cfg, lambda c, d: Fixed(cur, cand, np.ones(c.n, bool)), days=1, seed=seed)
    off = run_on_cluster(cfg, lambda c, d: Fixed(cur, cand, np.zeros(c.n, bool)), days=1, seed=seed)
    out = {}
    for where, site in (("site", SITE), ("fleet", None)):
        c, b = _means(on, site), _means(off, site)
        out[where] = {k: _rel(c[k], b[k]) for k in KPIS}
    return out


def group_split(cfg: Any, pair: tuple[Any, Any], seed: int) -> dict[str, dict[str, float]]:
    """A quarter of the groups, half on the candidate; Welch t on group means with CUPED."""
    from edgetwin.loop.ppi import finish_estimate, welch_df
    from edgetwin.loop.switchback import run_on_cluster

    rng = np.random.default_rng([seed, 0x6A])
    drawn: dict[str, set[str]] = {}

    def make(c: Any, d: int) -> Fixed:
        chosen = rng.choice(c.n, size=int(round(SHARE * c.n)), replace=False)
        mask = np.zeros(c.n, bool)
        mask[rng.permutation(chosen)[: len(chosen) // 2]] = True
        drawn["cand"] = {str(a) for a in c.agent_ids[mask]}
        drawn["ctrl"] = {str(a) for a in c.agent_ids[chosen]} - drawn["cand"]
        return Fixed(pair[0], pair[1], mask, start=PRE)  # the pre-period on the current policy

    log = run_on_cluster(cfg, make, days=1, seed=seed)
    win = log[(log["t"] >= START) & (log["t"] < STOP)].groupby("agent")[list(KPIS)].mean()
    pre = log[log["t"] < PRE].groupby("agent")[list(KPIS)].mean()
    cand, ctrl = sorted(drawn["cand"]), sorted(drawn["ctrl"])
    sel = cand + ctrl
    out = {}
    for k in KPIS:
        y, x = win[k], pre[k]
        xc = x[sel] - x[sel].mean()
        yc_ = y[sel] - y[sel].mean()
        slope = float((xc * yc_).sum() / (xc * xc).sum()) if float((xc * xc).sum()) > 0 else 0.0
        adj = y - slope * (x - x[sel].mean())
        yc, yb = adj[cand].to_numpy(), adj[ctrl].to_numpy()
        vc, vb = float(np.var(yc, ddof=1)) / len(yc), float(np.var(yb, ddof=1)) / len(yb)
        df = welch_df([(vc, len(yc) - 1), (vb, len(yb) - 1)])
        t = finish_estimate(float(yc.mean() - yb.mean()), vc + vb, float(yb.mean()), vb, LEVEL, df=df)
        out[k] = {"change": t["rel"], "lo": t["rel_lo"], "hi": t["rel_hi"]}
    return out


def switchback(cfg: Any, pair: tuple[Any, Any], seed: int) -> dict[str, dict[str, float]]:
    from edgetwin.loop.switchback import SwitchbackPlan, estimate_switchback, run_switchback_on_cluster

    plan = SwitchbackPlan((SITE,), BLOCK, CARRY, BLOCKS, seed=seed, start_tick=PRE, episode_ticks=cfg.steps)
    log = run_switchback_on_cluster(cfg, pair[0], pair[1], plan, seed=seed)
    est = estimate_switchback(log, plan, list(KPIS))
    return {k: {"change": e.change, "lo": e.interval[0], "hi": e.interval[1]} for k, e in est.items()}


def multi_day_truth(cfg: Any, spec: Any, name: str, days: int, seed: int) -> dict[str, dict[str, float]]:
    """``days`` days of every group on the candidate and of every group on the current policy."""
    from edgetwin.loop.switchback import run_on_cluster

    if name == "A/A":
        return {w: dict.fromkeys(KPIS, 0.0) for w in ("site", "fleet")}
    cur, cand = candidates(spec, seed)[name]
    on = run_on_cluster(cfg, lambda c, d: Fixed(cur, cand, np.ones(c.n, bool)), days=days, seed=seed + 90_000)
    off = run_on_cluster(
        cfg, lambda c, d: Fixed(cur, cand, np.zeros(c.n, bool)), days=days, seed=seed + 90_000
    )
    return {
        w: {k: _rel(_means(on, s)[k], _means(off, s)[k]) for k in KPIS}
        for w, s in (("site", SITE), ("fleet", None))
    }


def _cp(k: int, n: int) -> list[float]:
    from scipy import stats

    ci = stats.binomtest(int(k), int(n)).proportion_ci(0.95, method="exact")
    return [round(float(ci.low), 4), round(float(ci.high), 4)]


def summarise(rows: list[dict[str, Any]], truth_multi: dict[str, dict[str, float]]) -> dict[str, Any]:
    """Per design and KPI: coverage of the day's truth and of the multi-day truth (CP 95 %), median
    width, mean estimate, and the shares of intervals wholly above / below the margin."""
    out: dict[str, Any] = {}
    n = len(rows)
    for design, where in (("switchback", "site"), ("group_split", "fleet")):
        out[design] = {}
        for k in KPIS:
            est = [r[design][k] for r in rows]
            day = [r["truth"][where][k] for r in rows]
            cov_day = sum(e["lo"] <= t <= e["hi"] for e, t in zip(est, day, strict=True))
            multi = truth_multi[where][k]
            cov_multi = sum(e["lo"] <= multi <= e["hi"] for e in est)
            fleet = truth_multi["fleet"][k]
            out[design][k] = {
                "runs": n, "level": LEVEL, "estimand": f"{'edge-waw' if where == 'site' else 'the fleet'}",
                "coverage_day": cov_day / n, "coverage_day_ci": _cp(cov_day, n),
                "coverage_multi_day": cov_multi / n, "coverage_multi_day_ci": _cp(cov_multi, n),
                "coverage_fleet_truth": sum(e["lo"] <= fleet <= e["hi"] for e in est) / n,
                "median_width": float(np.median([e["hi"] - e["lo"] for e in est])),
                "mean_change": float(np.mean([e["change"] for e in est])),
                "mean_day_truth": float(np.mean(day)), "multi_day_truth": multi, "fleet_truth": fleet,
                "regress_beyond_margin": sum(e["lo"] > MARGIN for e in est) / n,
                "within_margin": sum(e["hi"] <= MARGIN for e in est) / n,
            }  # fmt: skip
    return out


def page(res: dict[str, Any]) -> str:
    cfg = res["config"]
    lines = [
        "# Site-level switchbacks vs group-split canaries",
        "",
        f"`python benchmarks/switchback.py{' --quick' if cfg['quick'] else ''}{' --twin' if 'planned' in res else ''}` "
        f"on the emulated cluster ({cfg['agents']} groups, 96 ticks of 15 min a day), {cfg['runs']} runs (days) per "
        f"candidate and condition, multi-day truths over {cfg['truth_days']} days; {res['seconds']:.0f} s on this "
        "machine (2 shared cores) for the runs"
        + (f", {res['planned_seconds']:.0f} s for the twin's plans" if "planned_seconds" in res else "")
        + ". The design and its estimator: `edgetwin.loop.switchback` (Bojinov, Simchi-Levi and Zhao 2023). "
        "Budget of both designs: 25 % of the groups × 20 h.",
        "",
        "The paper's number: none for an edge cluster. Its claims are that the Horvitz-Thompson estimator is "
        "unbiased under its design for a carryover of known order and that its conservative variance gives "
        "intervals covering at least their level (a finite-population CLT as the blocks grow; exact randomization "
        "p-values at any size). Ours: coverage of that level at 10 blocks, on a t reference (4 df), below.",
        "",
        "- **switchback**: edge-waw (≈25 % of the groups, its own cloud region) alternates in 10 blocks of 2 h, "
        "paired, 4 ticks burned in per block; 90 % t interval (4 df). Estimand: edge-waw's effect.",
        "- **group split**: a random 25 % of the groups, half on the candidate, CUPED on the 1 h pre-period, "
        "Welch t; the canary alone (no twin). Estimand: the fleet's effect.",
        "",
        "Coverage is of each design's own estimand on the day it ran (*day*) and over the multi-day truth "
        "(*multi-day*), Clopper-Pearson 95 % intervals in brackets; *fleet* is the coverage of the fleet's "
        "multi-day truth (what a promotion is about). *> margin*: share of intervals wholly above +5 % "
        "(a refusal).",
        "",
        "| condition | candidate | KPI | design | truth day (mean) / multi-day / fleet | mean estimate | coverage day "
        "| coverage multi-day | coverage fleet | median width | > margin |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for cond, cands in res["results"].items():
        for name, designs in cands.items():
            for k in KPIS:
                for d in ("switchback", "group_split"):
                    s = designs[d][k]
                    lines.append(
                        f"| {cond} | {name} | {k} | {d.replace('_', ' ')} | {100 * s['mean_day_truth']:+.1f} % / "
                        f"{100 * s['multi_day_truth']:+.1f} % / {100 * s['fleet_truth']:+.1f} % | "
                        f"{100 * s['mean_change']:+.1f} % | {100 * s['coverage_day']:.1f} % "
                        f"[{100 * s['coverage_day_ci'][0]:.1f}, {100 * s['coverage_day_ci'][1]:.1f}] | "
                        f"{100 * s['coverage_multi_day']:.1f} % | {100 * s['coverage_fleet_truth']:.1f} % | "
                        f"{100 * s['median_width']:.1f} pts | {100 * s['regress_beyond_margin']:.1f} % |"
                    )
    if "planned" in res:
        lines += [
            "",
            "## The plan's expected width against the runs'",
            "",
            "`plan_switchback` in a 2-member twin fitted on 2 random-policy days of the congested cluster "
            "(`--twin`), the same switchback of edge-waw simulated 4 times in it: the width it expects beside "
            "the median width the runs above got (at 10 blocks; the plan buys its blocks from the same budget over "
            "edge-waw's share of the twin's recent log, so its count can differ), and the twin's own change and "
            "interference (the fleet's change under a full switch less a 25 % slice's), and the carryover the "
            "twin predicts (`twin_carryover`: ticks until a mid-day switch settles within 15 % of the steady effect; "
            "the runs burn in 4, the emulator's own).",
            "",
            "| candidate | KPI | blocks | expected width | realised median width | twin's change on edge-waw "
            "| twin's interference | twin's carryover |",
            "|---|---|---|---|---|---|---|---|",
        ]
        for name, per in res["planned"].items():
            for k, v in per.items():
                lines.append(
                    f"| {name} | {k} | {v['n_blocks']} | {100 * v['expected_width']:.1f} pts | "
                    f"{100 * v['realised_median_width']:.1f} pts | {100 * v['twin_change']:+.1f} % | "
                    f"{100 * v['twin_interference']:+.1f} pts | {v.get('twin_carryover_ticks', '—')} ticks |"
                )
    lines += ["", "## What it shows", "", *res["findings"], ""]
    return "\n".join(lines)


def headline(results: dict[str, Any]) -> dict[str, Any]:
    """The numbers the at-a-glance table reads (keys without dots): the switchback's lowest coverage
    of its day's truth over both conditions and KPIs for the A/A and the regressing candidate (with
    that cell's CP interval), its detection rate of the regressing one, and the median width of its
    A/A interval over the group split's, per condition, on SLO violations."""
    out: dict[str, Any] = {}
    for name, key in (("A/A", "aa"), ("regressing", "regressing")):
        cells = [(c, k) for c in results for k in KPIS]
        c, k = min(cells, key=lambda ck: results[ck[0]][name]["switchback"][ck[1]]["coverage_day"])
        cell = results[c][name]["switchback"][k]
        out[f"{key}_coverage_min"] = cell["coverage_day"]
        out[f"{key}_coverage_min_ci"] = cell["coverage_day_ci"]
        out[f"{key}_coverage_min_where"] = f"{c}, {k}"
    out["regressing_slo_refused"] = min(results[c]["regressing"]["switchback"][KPIS[0]]["regress_beyond_margin"]
                                        for c in results)  # fmt: skip
    for c in results:
        aa = results[c]["A/A"]
        tag = c.replace(" ", "_")
        out[f"aa_slo_width_ratio_{tag}"] = (
            aa["switchback"][KPIS[0]]["median_width"] / aa["group_split"][KPIS[0]]["median_width"]
        )
        hog = results[c]["edge-hog"]
        out[f"edge_hog_slo_group_split_fleet_coverage_{tag}"] = hog["group_split"][KPIS[0]][
            "coverage_fleet_truth"
        ]
        out[f"edge_hog_slo_switchback_fleet_coverage_{tag}"] = hog["switchback"][KPIS[0]][
            "coverage_fleet_truth"
        ]
    return out


def _finding(cond: str, name: str, k: str, sw: dict[str, Any], gs: dict[str, Any]) -> str:
    """One sentence about one condition, candidate and KPI, from the numbers."""
    if name == "A/A":
        wider = sw["median_width"] > gs["median_width"]
        return (
            f"- {cond}, A/A, {k}: the switchback's 90 % interval covers 0 in {100 * sw['coverage_day']:.1f} % of runs "
            f"(CP {sw['coverage_day_ci']}), the group split's in {100 * gs['coverage_day']:.1f} %; median widths "
            f"{100 * sw['median_width']:.1f} vs {100 * gs['median_width']:.1f} points "
            f"({'the switchback is wider: it loses' if wider else 'the switchback is narrower'})."
        )
    return (
        f"- {cond}, {name}, {k}: fleet truth {100 * gs['fleet_truth']:+.1f} %, edge-waw's "
        f"{100 * sw['multi_day_truth']:+.1f} %; the group split estimates {100 * gs['mean_change']:+.1f} % on average "
        f"and covers the fleet's multi-day truth in {100 * gs['coverage_fleet_truth']:.1f} % of runs; the switchback "
        f"estimates {100 * sw['mean_change']:+.1f} % and covers edge-waw's day in {100 * sw['coverage_day']:.1f} %, "
        f"the fleet's truth in {100 * sw['coverage_fleet_truth']:.1f} %."
    )


def findings(res: dict[str, Any]) -> list[str]:
    """Sentences computed from the numbers (no claim the numbers do not carry)."""
    out = [
        _finding(cond, name, k, cands[name]["switchback"][k], cands[name]["group_split"][k])
        for cond, cands in res["results"].items()
        for name in ("A/A", "edge-hog")
        for k in KPIS
    ]
    short = [
        f"{cond}, {name}, {k}: {100 * d['switchback'][k]['coverage_day']:.1f} % {d['switchback'][k]['coverage_day_ci']}"
        for cond, cands in res["results"].items()
        for name, d in cands.items()
        for k in KPIS
        if d["switchback"][k]["coverage_day"] < LEVEL - 0.03
    ]
    ample = [d for name, d in res["results"]["ample capacity"].items() if name != "A/A"]
    below = sum(d["switchback"][k]["coverage_fleet_truth"] < d["group_split"][k]["coverage_fleet_truth"]
                for d in ample for k in KPIS)  # fmt: skip
    out.append(
        "- Where the switchback covers its own day below the level − 3 pp: "
        + ("; ".join(short) if short else "nowhere")
        + f". With ample capacity (no congestion) its coverage of the fleet's truth is below the group split's in "
        f"{below} of {len(ample) * len(KPIS)} candidate × KPI cells: edge-waw's effect is not the fleet's."
    )
    if "planned" in res:
        carry = [v["twin_carryover_ticks"] for per in res["planned"].values() for v in per.values()]
        ratio = [
            v["expected_width"] / v["realised_median_width"]
            for per in res["planned"].values()
            for v in per.values()
        ]
        blocks = sorted({v["n_blocks"] for per in res["planned"].values() for v in per.values()})
        out.append(
            f"- The twin's plan expected {min(ratio):.2f}-{max(ratio):.2f}× the width the runs got (at "
            f"{'/'.join(str(b) for b in blocks)} blocks against the runs' {BLOCKS}), and predicted a carryover of {min(carry)}-{max(carry)} ticks where "
            f"the emulator's settles in about {CARRY}: a plan on the twin's own carryover burns in more and buys fewer "
            "blocks than this cluster needs."
        )
    out.append(
        "- A one-day canary of either design covers its own day; the multi-day truth only as far as the effect "
        "does not vary from day to day (the coverage multi-day column), and the switchback's sites only stand for "
        "the fleet where they are like it (the coverage fleet column): the verdict needs the twin to transport "
        "edge-waw's measurement to the fleet (not done here)."
    )
    return out


def planned_widths(agents: int, seed: int, results: dict[str, Any]) -> dict[str, Any]:
    """What `plan_switchback` expects against what the runs got, on the congested cluster: a
    2-member twin (``rounds=0, bc_epochs=2``, empirical population) fitted on 2 random-policy days,
    the plan of edge-waw's switchback (same blocks, burn-in and budget) simulated 4 times in it
    on a third day's log, per candidate and KPI: the expected width beside the runs' median."""
    import torch

    from edgetwin.contract.policy import RandomPolicy
    from edgetwin.emulator.cluster import ClusterConfig
    from edgetwin.emulator.logs import generate_logs
    from edgetwin.loop.plan import PlanBudget
    from edgetwin.loop.switchback import plan_switchback, twin_carryover
    from edgetwin.twin.twin import Twin
    from edgetwin.twin.whatif import PolicySpec, fixed_policy

    torch.set_num_threads(1)
    cfg = ClusterConfig(n_agents=agents, steps=96, target_util=CONDITIONS["congested"])
    train, spec = generate_logs(cfg, 2, "random", seed=seed)
    twin = Twin.fit(train, spec, seed=seed, members=2, progress=False, rounds=0, bc_epochs=2,
                    population_model="empirical")  # fmt: skip
    recent, _ = generate_logs(cfg, 1, "random", seed=seed + 7)
    base = PolicySpec("current", lambda sd, m, scen: RandomPolicy(spec, seed=sd))
    cands = {
        "A/A": PolicySpec("random-again", lambda sd, m, scen: RandomPolicy(spec, seed=sd + 1)),
        "regressing": fixed_policy("regressing", Constant([1.0, 0.5, 0.5])),
        "edge-hog": fixed_policy("edge-hog", Constant([1.0, 1.5, 0.3])),
    }
    out: dict[str, Any] = {}
    for name, cand in cands.items():
        plan = plan_switchback(None, twin, recent, cand, base, PlanBudget(max_share=SHARE, hours=(STOP - START) / 4),
                               sites=[SITE], kpis=list(KPIS), seed=seed, pre_ticks=PRE, block_ticks=BLOCK,
                               carryover_ticks=CARRY, sims=4)  # fmt: skip
        got = results["congested"][name]["switchback"]
        carry = twin_carryover(twin, recent, cand, base, list(KPIS), seed=seed)  # the twin's, beside our 4
        out[name] = {
            k: {"expected_width": plan.expected_width[k], "realised_median_width": got[k]["median_width"],
                "twin_change": plan.twin_change[k], "twin_interference": plan.twin_interference[k],
                "n_blocks": plan.n_blocks, "twin_carryover_ticks": carry}
            for k in KPIS
        }  # fmt: skip
    return out


# ------------------------------------------------------------------------------------ through the wire
#: deterministic policies (a runtime's and a direct run's calls then give the same actions): the
#: current policy and, per candidate, its action
WIRE_CURRENT = [0.5, 0.5, 0.5]
WIRE_CANDIDATES = {"A/A": [0.5, 0.5, 0.5], "regressing": [1.0, 0.5, 0.5], "edge-hog": [1.0, 1.5, 0.3]}


def wire_plan(cfg: Any, seed: int) -> Any:
    from edgetwin.loop.switchback import SwitchbackPlan

    return SwitchbackPlan((SITE,), BLOCK, CARRY, BLOCKS, seed=seed, start_tick=PRE, episode_ticks=cfg.steps,
                          tick_seconds=900.0)  # fmt: skip


def direct_day(cfg: Any, candidate: list[float], plan: Any, seed: int) -> Any:
    """The switchback's day stepped directly: `SwitchbackPolicy` on the cluster (what
    `run_switchback_on_cluster` does), on the day `drive_cluster_over_bus` plays for ``seed``."""
    import pandas as pd

    from edgetwin.emulator.cluster import KPI_NAMES, EdgeCluster
    from edgetwin.emulator.logs import episode_seed
    from edgetwin.loop.switchback import SwitchbackPolicy

    em = EdgeCluster(cfg)
    obs = em.reset(seed=episode_seed(seed, 0))
    sites = np.asarray(em.site_names, dtype=object)[em.home]
    pol = SwitchbackPolicy(Constant(WIRE_CURRENT), Constant(candidate), plan, sites)
    frames = []
    for t in range(int(plan.start_tick) + plan.ticks):
        arm = pol.arm_mask(t)
        obs, _r, _d, info = em.step(pol.act(obs))
        f = pd.DataFrame({"t": t, "tick": t, "agent": em.agent_ids, "site": sites,
                          "arm": np.where(arm, "candidate", np.where(np.isin(sites, plan.sites), "control", "fleet"))})
        for j, k in enumerate(KPI_NAMES):
            f[f"kpi.{k}"] = info["kpis"][:, j]
        frames.append(f)
    return pd.concat(frames, ignore_index=True)


def wire_day(cfg: Any, candidate: list[float], plan: Any, seed: int, root: Path, margin: float) -> dict[str, Any]:
    """One switchback day through the operator's wire, in one process over an in-process bus: a
    signed registry (``current`` and ``candidate`` exported), one runtime (site edge-waw) serving
    every cluster site (the rows name their own sites; only edge-waw's switch), ``start_from_plan(..., switchback=plan)`` signed and published,
    the cluster driving its day over the JSON decision wire and outcome reports, the log collected
    from the bus. ``margin``: the guard's relative margin on both KPIs (a wide one keeps the guard
    from stopping, to compare the full day). Returns the collected log, the system's own log, the
    stop reason and tick, and the wall time."""
    import asyncio
    import types
    import uuid

    from edgetwin.contract.margins import KPIMargin
    from edgetwin.edge.bus import make_bus
    from edgetwin.edge.registry import FileRegistry, metadata_from_policy_dir
    from edgetwin.edge.runtime import EdgeRuntime
    from edgetwin.edge.signing import Signer, TrustStore
    from edgetwin.emulator.cluster import EdgeCluster, cluster_spec
    from edgetwin.loop.collect import collect_canary
    from edgetwin.loop.commands import publish_start, start_from_plan
    from edgetwin.loop.fleet import drive_cluster_over_bus
    from edgetwin.policies.candidates import ConstantPolicy
    from edgetwin.policies.export import export_policy

    spec = cluster_spec(cfg)
    signer = Signer.generate()
    reg = FileRegistry(root / "registry")
    for v, action in (("current", WIRE_CURRENT), ("candidate", candidate)):
        d = export_policy(ConstantPolicy(spec, action), root / v, spec)
        reg.publish(d, {**metadata_from_policy_dir(d), "name": v, "version": v}, signer)
    reg.set_current(f"site/{SITE}", "current", expected=None)
    margins = types.SimpleNamespace(margins=tuple(KPIMargin(k, margin) for k in KPIS))
    run = f"sb-{uuid.uuid4().hex[:8]}"
    cmd = start_from_plan(margins, candidate="candidate", sha256=reg.manifest("candidate").sha256, run=run,
                          current="current", switchback=plan)  # fmt: skip
    url = f"memory://switchback-{uuid.uuid4().hex}"
    routes = {s: SITE for s in EdgeCluster(cfg).site_names}  # one runtime serves every cluster site
    out: dict[str, Any] = {}

    async def go() -> None:
        async with make_bus(url) as rt_bus, make_bus(url) as bus:
            rt = EdgeRuntime(SITE, reg, TrustStore([signer.public_key]), bus=rt_bus, kpi_guard=None,
                             poll_interval=3600.0, cache_dir=root / "runtime")  # fmt: skip
            async with rt:
                await publish_start(bus, cmd, signer)
                while rt.canary is None:
                    await asyncio.sleep(0.005)
                canary = rt.canary

                async def joined(t: int) -> bool:
                    while canary.active and canary.ticks < t + 1:
                        await asyncio.sleep(0.001)
                    if not canary.active and out.get("stopped_at") is None:
                        out["stopped_at"] = t
                    return True  # the day goes on (after a stop, on the current policy)

                out["day_log"] = await drive_cluster_over_bus(bus, cfg, routes, seed=seed, ticks=cmd.config().total_ticks,
                                                              on_tick=joined)  # fmt: skip
                while canary.unshipped():
                    await asyncio.sleep(0.005)
                out["stop_reason"] = canary.stop_reason
                res = await collect_canary(bus, run, root / "switchback.parquet", idle=0.05, timeout=120.0,
                                           expected={SITE: canary.seq})  # fmt: skip
                out["missing"] = res.missing

    t0 = time.perf_counter()
    asyncio.run(go())
    out["seconds"] = time.perf_counter() - t0
    import pandas as pd

    out["log"] = pd.read_parquet(root / "switchback.parquet")
    return out


def wire_runs(cfg: Any, days: int, seed: int) -> dict[str, Any]:
    """Per candidate and day: the wire's and the direct run's estimates, whether every (tick, group)
    was served the same arm and got the same KPIs, and the wall times; and for the regressing and
    edge-hog candidates the guard at a 5 % margin (where it stopped)."""
    import tempfile

    from edgetwin.loop.switchback import estimate_switchback

    out: dict[str, Any] = {}
    for name, action in WIRE_CANDIDATES.items():
        rows = []
        for r in range(days):
            s = seed * 1_000_000 + r
            plan = wire_plan(cfg, s)
            t0 = time.perf_counter()
            direct = direct_day(cfg, action, plan, s)
            t_direct = time.perf_counter() - t0
            with tempfile.TemporaryDirectory(prefix="sb-wire-") as tmp:
                wire = wire_day(cfg, action, plan, s, Path(tmp), margin=100.0)
            log = wire["log"]
            ours = log.sort_values(["t", "agent"]).reset_index(drop=True)
            theirs = direct[direct["site"] == SITE].sort_values(["t", "agent"]).reset_index(drop=True)
            same_rows = len(ours) == len(theirs) and bool((ours["agent"].astype(str) == theirs["agent"].astype(str)).all())
            served = ours["arm"].astype(str).replace({"fleet": "control"})  # pre-period rows: the current policy
            same_arm = same_rows and bool((served.to_numpy() == theirs["arm"].to_numpy()).all())
            kpi_gap = float(max(np.nanmax(np.abs(ours[k].to_numpy() - theirs[k].to_numpy())) for k in KPIS)) if same_rows else float("nan")
            ew, ed = estimate_switchback(log, plan, list(KPIS)), estimate_switchback(direct, plan, list(KPIS))
            row: dict[str, Any] = {
                "seed": s, "rows": len(log), "missing": wire["missing"], "stop_reason": wire["stop_reason"],
                "same_arms": same_arm, "max_kpi_gap": kpi_gap, "wire_seconds": wire["seconds"], "direct_seconds": t_direct,
                "wire": {k: {"change": e.change, "interval": e.interval} for k, e in ew.items()},
                "direct": {k: {"change": e.change, "interval": e.interval} for k, e in ed.items()},
            }  # fmt: skip
            if name != "A/A":
                with tempfile.TemporaryDirectory(prefix="sb-guard-") as tmp:
                    g = wire_day(cfg, action, plan, s, Path(tmp), margin=MARGIN)
                row["guard"] = {"stop_reason": g["stop_reason"], "stopped_at": g.get("stopped_at"),
                                "ticks": int(plan.start_tick) + plan.ticks}  # fmt: skip
            rows.append(row)
            print(name, r, f"wire {wire['seconds']:.1f}s direct {t_direct:.1f}s same arms {same_arm}", flush=True)
        out[name] = rows
    return out


def wire_page(res: dict[str, Any]) -> str:
    cfg = res["config"]
    lines = [
        "# A switchback through the operator's wire vs the same day stepped directly",
        "",
        f"`python benchmarks/switchback.py --wire {cfg['days']} --agents {cfg['agents']} --seed {cfg['seed']}` on the "
        f"emulated cluster ({cfg['agents']} groups, congested condition), {res['seconds']:.0f} s on this machine "
        "(2 shared cores, other sessions running). Edge-waw switches in 10 paired blocks of 2 h after a 1 h "
        "pre-period, 4 ticks burned in per block (the main page's design); current policy and candidates "
        f"are constant actions (current {WIRE_CURRENT}), so both paths act identically when they serve the same arm.",
        "",
        "- **wire**: `canary start --design switchback`'s command (`start_from_plan(..., switchback=plan)`, signed, "
        "published on the durable command subject of an in-process bus), an `EdgeRuntime` (what `edgetwin serve` runs) "
        "serving every cluster site, the cluster as the operator's own system (`drive_cluster_over_bus`: JSON decision "
        "requests naming each row's group, site and tick; outcome reports per tick), the log collected from the bus "
        "(`collect_canary`) and estimated by `estimate_switchback`. Guard margin 10000 % here (so that the full day "
        "is compared); the guard at the 5 % margin is the last column.",
        "- **direct**: the same day (`episode_seed(seed, 0)`) stepped with `SwitchbackPolicy`, as "
        "`run_switchback_on_cluster` does.",
        "",
        "| candidate | day seed | rows | same arm every (tick, group) | max KPI gap | SLO wire | SLO direct | "
        "task time wire | task time direct | wall wire / direct | guard at 5 % |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]

    def iv(e: dict[str, Any]) -> str:
        return f"{100 * e['change']:+.1f} % [{100 * e['interval'][0]:+.1f}, {100 * e['interval'][1]:+.1f}]"

    for name, rows in res["results"].items():
        for r in rows:
            g = r.get("guard")
            guard = "—" if g is None else (f"stopped at tick {g['stopped_at']} of {g['ticks']}" if g["stop_reason"] == "guard"
                                           else f"ran its {g['ticks']} ticks ({g['stop_reason']})")  # fmt: skip
            lines.append(
                f"| {name} | {r['seed']} | {r['rows']} | {'yes' if r['same_arms'] else 'NO'} | {r['max_kpi_gap']:.3g} | "
                f"{iv(r['wire']['kpi.slo_violation'])} | {iv(r['direct']['kpi.slo_violation'])} | "
                f"{iv(r['wire']['kpi.task_time_ms'])} | {iv(r['direct']['kpi.task_time_ms'])} | "
                f"{r['wire_seconds']:.1f} s / {r['direct_seconds']:.2f} s | {guard} |"
            )  # fmt: skip
    lines += ["", "## What it shows", ""] + [f"- {f}" for f in res["findings"]]
    return "\n".join(lines) + "\n"


def wire_findings(res: dict[str, Any]) -> list[str]:
    rows = [r for v in res["results"].values() for r in v]
    same = sum(r["same_arms"] for r in rows)
    gap = max(r["max_kpi_gap"] for r in rows)
    diff = max(abs(r["wire"][k]["change"] - r["direct"][k]["change"]) for r in rows for k in KPIS)
    ratio = float(np.median([r["wire_seconds"] / r["direct_seconds"] for r in rows]))
    guard = [r["guard"] for r in rows if "guard" in r]
    stopped = [g for g in guard if g["stop_reason"] == "guard"]
    out = [
        f"The sites served the plan's arm to every (tick, group) of edge-waw on {same} of {len(rows)} days; the largest "
        f"KPI difference between the wire's log and the direct run is {gap:.3g} and the largest difference of the "
        f"estimated relative changes {100 * diff:.3g} points: the wire run is the direct run.",
        f"What it costs: the wire's day takes a median {ratio:.0f}x the direct run's wall time (JSON requests, "
        "outcome reports, the join, the spool and the collection, in one process on this loaded machine).",
    ]
    if guard:
        out.append(f"At the 5 % margin the sites' guard stopped the whole site back to the current policy on "
                   f"{len(stopped)} of {len(guard)} regressing / edge-hog days"
                   + (f", at ticks {sorted(g['stopped_at'] for g in stopped)} of {guard[0]['ticks']}" if stopped else "")
                   + ".")  # fmt: skip
    return out


def main(argv: list[str] | None = None) -> dict[str, Any]:
    from edgetwin.emulator.cluster import ClusterConfig, cluster_spec

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=200)
    ap.add_argument("--truth-days", type=int, default=20)
    ap.add_argument("--agents", type=int, default=200)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--quick", action="store_true", help="40 runs, 6 truth days")
    ap.add_argument("--out", type=Path, default=OUT)
    ap.add_argument("--twin", action="store_true", help="also plan each switchback in a fitted twin")
    ap.add_argument(
        "--twin-only", action="store_true", help="add the twin's plans to an existing results.json"
    )
    ap.add_argument("--wire", type=int, default=0, metavar="DAYS",
                    help="run the switchback through the operator's wire on DAYS days instead (wire.md, wire.json)")
    a = ap.parse_args(argv)
    if a.wire:
        cfg = ClusterConfig(n_agents=a.agents, steps=96, target_util=CONDITIONS["congested"])
        t0 = time.perf_counter()
        res = {"config": {"days": a.wire, "agents": a.agents, "seed": a.seed}, "results": wire_runs(cfg, a.wire, a.seed)}
        res["seconds"] = time.perf_counter() - t0
        res["findings"] = wire_findings(res)
        a.out.mkdir(parents=True, exist_ok=True)
        (a.out / "wire.json").write_text(json.dumps(res, indent=1, default=float))
        (a.out / "wire.md").write_text(wire_page(res))
        print(f"wrote {a.out / 'wire.md'}")
        return res
    if a.twin_only:
        res = json.loads((a.out / "results.json").read_text())
        t1 = time.perf_counter()
        res["planned"] = planned_widths(res["config"]["agents"], res["config"]["seed"], res["results"])
        res["planned_seconds"] = time.perf_counter() - t1
        res["headline"] = headline(res["results"])
        res["findings"] = findings(res)
        (a.out / "results.json").write_text(json.dumps(res, indent=1, default=float))
        (a.out / "README.md").write_text(page(res))
        print(f"wrote {a.out / 'README.md'}")
        return dict(res)
    runs, tdays = (40, 6) if a.quick else (a.runs, a.truth_days)
    t0 = time.perf_counter()
    results: dict[str, Any] = {}
    for cond, util in CONDITIONS.items():
        cfg = ClusterConfig(n_agents=a.agents, steps=96, target_util=util)
        spec = cluster_spec(cfg)
        results[cond] = {}
        for name in candidates(spec, 0):
            rows = []
            for r in range(runs):
                s = a.seed * 1_000_000 + r
                row = {"truth": day_truth(cfg, candidates(spec, s)[name], s) if name != "A/A" else
                       {w: dict.fromkeys(KPIS, 0.0) for w in ("site", "fleet")}}  # fmt: skip
                row["switchback"] = switchback(cfg, candidates(spec, s)[name], s)
                row["group_split"] = group_split(cfg, candidates(spec, s)[name], s)
                rows.append(row)
            truth = multi_day_truth(cfg, spec, name, tdays, a.seed)
            results[cond][name] = summarise(rows, truth)
            print(cond, name, f"{time.perf_counter() - t0:.0f}s", flush=True)
    res: dict[str, Any] = {
        "config": {
            "runs": runs,
            "truth_days": tdays,
            "agents": a.agents,
            "seed": a.seed,
            "quick": a.quick,
            "site": SITE,
            "blocks": BLOCKS,
            "block_ticks": BLOCK,
            "carryover_ticks": CARRY,
            "share": SHARE,
            "hours": (STOP - START) / 4,
            "level": LEVEL,
            "margin": MARGIN,
        },  # fmt: skip
        "results": results,
    }
    res["seconds"] = time.perf_counter() - t0
    if a.twin:
        res["planned"] = planned_widths(a.agents, a.seed, results)
    res["headline"] = headline(results)
    res["findings"] = findings(res)
    a.out.mkdir(parents=True, exist_ok=True)
    (a.out / "results.json").write_text(json.dumps(res, indent=1, default=float))
    (a.out / "README.md").write_text(page(res))
    print(f"wrote {a.out / 'README.md'}")
    return res


if __name__ == "__main__":
    main()
