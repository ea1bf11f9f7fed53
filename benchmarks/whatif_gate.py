"""Does the twin's counterfactual replay call policy changes the way the real system does?

The promotion gate (seed 003 §3.2, §4.3: "a digital-twin replay validates aggregated models against
recent traces before rollout; if regressions are detected, the server triggers rollbacks") is only
as good as the twin's estimate of how a KPI changes when the policy changes. Here the emulated
cluster plays the real system:

1. log 4 days of the cluster under the random logging policy and fit a twin (BC response model);
2. log 2 more days ("recent traffic", other seeds);
3. for several policies, predict each KPI's relative change vs the logging policy by counterfactual
   replay of the recent days in the twin (`run_whatif`), and measure it by running the same days
   (same populations: same seeds) on the cluster with that policy;
4. report both, whether the sign agrees, and whether the gate's verdict (regression beyond 5 %)
   is the same in the twin and on the cluster. Also the replay's throughput (agent-steps/s).

The paper gives no number for this (it reports "post-update regression rate in the digital twin"
as a metric without a value), so the paper column says so.

    python benchmarks/whatif_gate.py [--agents 100] [--steps 96] [--quick]
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

import numpy as np
import torch

from edgetwin.emulator.cluster import ClusterConfig
from edgetwin.emulator.logs import SLOAwarePolicy, generate_logs
from edgetwin.policies.gate import DEFAULT_MARGIN
from edgetwin.policies.heuristics import LeastLoaded, SchedulingView, Target
from edgetwin.twin.twin import Twin
from edgetwin.twin.whatif import (
    builtin_policy,
    default_kpis,
    fixed_policy,
    load_kpis,
    logged_episode_kpis,
    logged_episodes,
    merge_kpis,
    run_whatif,
)

ROOT = Path(__file__).resolve().parents[1]
SECTION = "## What-if replay vs the emulated cluster (promotion gate)"


def policies(spec):  # noqa: ANN001, ANN201
    good = SchedulingView(
        "action.edge_share", (Target(1.0, "state.site_util"), Target(0.0, "state.cloud_util")),
        defaults={"action.capacity": 1.2, "action.price": 0.1},
    )  # fmt: skip
    bad = SchedulingView("action.edge_share", (Target(0.0, 0.5),), defaults={"action.capacity": 0.0, "action.price": 1.0})
    pricey = SchedulingView(
        "action.edge_share", (Target(1.0, "state.site_util"), Target(0.0, "state.cloud_util")),
        defaults={"action.capacity": 1.0, "action.price": 0.9},
    )  # fmt: skip
    return {
        "slo-aware heuristic": SLOAwarePolicy(spec),
        "least-loaded, cheap": LeastLoaded(spec, good),
        "least-loaded, pricey": LeastLoaded(spec, pricey),
        "cloud-only, no capacity": LeastLoaded(spec, bad),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--agents", type=int, default=100)
    ap.add_argument("--steps", type=int, default=96)
    ap.add_argument("--members", type=int, default=2)
    ap.add_argument("--quick", action="store_true", help="tiny sizes (smoke run)")
    ap.add_argument("--no-write", action="store_true", help="do not update docs/benchmarks.md")
    args = ap.parse_args()
    torch.set_num_threads(1)
    if args.quick:
        args.agents, args.steps, args.members = 40, 16, 1
    cfg = ClusterConfig(n_agents=args.agents, steps=args.steps)
    log, spec = generate_logs(cfg, episodes=4, policy="random", seed=0)
    t0 = time.perf_counter()
    twin = Twin.fit(
        log, spec, members=args.members, seed=0, progress=False, population_model="empirical", response_model="bc",
        bc_epochs=20,
    )  # fmt: skip
    fit_s = time.perf_counter() - t0
    recent, _ = generate_logs(cfg, episodes=2, policy="random", seed=7)
    lay = twin.layout
    kpis = merge_kpis(default_kpis(spec, lay.outputs), load_kpis(ROOT / "edgetwin" / "data" / "whatif" / "emulated_kpis.toml"))
    kpis = [k for k in kpis if k.better is not None]
    pols = policies(spec)

    # the twin's estimate: counterfactual replay of the recent days, paired with the logging policy
    specs = [builtin_policy("logged", twin)] + [fixed_policy(n, p) for n, p in pols.items()]
    t0 = time.perf_counter()
    res = run_whatif(twin, specs, [], baseline="logged", kpis=kpis, episodes=2, seeds=1, log=recent, progress=False)
    replay_s = time.perf_counter() - t0
    agent_steps = len(specs) * len(res.settings["members"]) * int(recent.groupby("episode").size().sum())

    # the truth: the same days on the cluster (same seeds: same populations and noise) per policy
    real_base = logged_episode_kpis(logged_episodes(recent, twin), kpis, spec)
    rows = []
    agree_sign = agree_gate = n = 0
    for name, pol in pols.items():
        real_log, _ = generate_logs(cfg, episodes=2, policy=pol, seed=7)
        real = logged_episode_kpis(logged_episodes(real_log, twin), kpis, spec)
        for k in kpis:
            c = res.compare("nominal", k.name, candidate=name)
            rb, rc = float(np.mean(real_base[k.name])), float(np.mean(real[k.name]))
            real_change = (rc - rb) / abs(rb) if rb else float("nan")
            sign = -1.0 if k.better == "higher" else 1.0
            twin_reg = sign * c["change"] > DEFAULT_MARGIN
            real_reg = sign * real_change > DEFAULT_MARGIN
            same_sign = np.sign(c["change"]) == np.sign(real_change)
            n += 1
            agree_sign += int(same_sign)
            agree_gate += int(twin_reg == real_reg)
            rows.append((name, k, c, real_change, twin_reg, real_reg, same_sign))

    lines = [
        SECTION,
        "",
        f"Command: `python benchmarks/whatif_gate.py{' --quick' if args.quick else ''}` "
        f"(machine: {os.cpu_count()} CPU cores, CPU only, shared with other jobs; torch threads 1). "
        f"Cluster: {args.agents} service groups, {args.steps} steps/day; twin: {args.members} member(s), BC response "
        f"model, fitted on 4 random-policy days in {fit_s:.0f} s; recent traffic: 2 other days.",
        "",
        "Relative change of each guarded KPI vs the logging (random) policy: the twin's counterfactual replay "
        "(95 % CI over members x days) beside the change measured on the cluster on the same days. "
        f"'regresses' = worse by more than the gate's default margin ({100 * DEFAULT_MARGIN:g} %).",
        "",
        "| policy | KPI | better | twin change [95 % CI] | cluster change | twin: regresses | cluster: regresses | paper |",
        "|---|---|---|---:|---:|---|---|---|",
    ]
    for name, k, c, real_change, twin_reg, real_reg, _ in rows:
        lines.append(
            f"| {name} | {k.name} | {k.better} | {100 * c['change']:+.1f}% [{100 * c['change_ci'][0]:+.1f}, "
            f"{100 * c['change_ci'][1]:+.1f}]{' ⚠' if c['flagged'] else ''} | {100 * real_change:+.1f}% | "
            f"{'yes' if twin_reg else 'no'} | {'yes' if real_reg else 'no'} | n/a |"
        )
    lines += [
        "",
        f"Sign of the change agrees on {agree_sign}/{n} (policy, KPI) pairs; the gate's verdict (regresses "
        f"beyond {100 * DEFAULT_MARGIN:g} % or not) agrees on {agree_gate}/{n}. ⚠: more than 5 % of the "
        "agent-steps behind the twin's number lie outside the training logs' support.",
        f"Replay throughput: {agent_steps / replay_s:,.0f} agent-steps/s "
        f"({agent_steps:,} agent-steps in {replay_s:.1f} s, {len(specs)} policies incl. the logged actions).",
        "The paper (seed 003) names twin-gated promotion and the post-update regression rate but reports no "
        "number for it, hence n/a.",
        "",
    ]
    table = "\n".join(lines)
    print(table)
    if not args.no_write:
        write_section(ROOT / "docs" / "benchmarks.md", table)


def write_section(path: Path, section: str) -> None:
    """Replace (or append) this benchmark's own ``## `` section of the shared file, in one write."""
    text = path.read_text() if path.is_file() else "# Benchmarks\n"
    lines = text.split("\n")
    start = next((i for i, line in enumerate(lines) if line.strip() == SECTION), None)
    if start is None:
        new = text.rstrip("\n") + "\n\n" + section.rstrip("\n") + "\n"
    else:
        end = next((j for j in range(start + 1, len(lines)) if lines[j].startswith("## ")), len(lines))
        new = "\n".join(lines[:start] + section.rstrip("\n").split("\n") + [""] + lines[end:])
    path.write_text(new)


if __name__ == "__main__":
    main()
