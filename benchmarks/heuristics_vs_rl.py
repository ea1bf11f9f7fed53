"""Seed 001-style comparison: a twin-trained multi-objective policy vs heuristics and plain DRL.

On the emulated cluster (0 days of drift), compare: PPO trained in the twin with the WA3C
multi-objective reward (QoS, energy, priority, fairness, dismissal; weights 0.25/0.2/0.25/0.15/0.15,
seed 001 eq. 1), PPO and A2C trained in the same twin on the spec's reward (`REWARD_WEIGHTS`: the
operator's multi-objective over revenue, offload, SLO violations, task time, energy and carbon), and
the heuristics Round-Robin, SJF, LJF, Tetris (best fit), Random, least-loaded and lowest-carbon.
Reported: latency (mean and p95 task completion time), energy per request, dismissal rate (the
cluster sheds no tasks, so the share of tasks over their SLO stands in for it), Jain fairness of SLO
attainment across service groups, and the WA3C reward measured on the cluster's columns.

Run:  python benchmarks/heuristics_vs_rl.py [--quick] [--work DIR] [--no-write]
Writes the `## Seed 001-style comparison: heuristics vs DRL` section of docs/benchmarks/heuristics_vs_rl/README.md and
docs/benchmarks/heuristics_vs_rl.png.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch
from _docs import write_section
from _policy_bench import FIG, KPIS, cluster_system, cluster_view, dump, fit_twin, machine
from _scale_args import add_scale_args, scale_kwargs

from edgetwin.policies.evaluate import evaluate_policy, plot_results
from edgetwin.policies.export import load_policy
from edgetwin.policies.heuristics import HEURISTICS, UniformRandom
from edgetwin.policies.rewards import MultiObjectiveReward, RewardColumns
from edgetwin.policies.train import train_policy

SECTION = "## Seed 001-style comparison: heuristics vs DRL"
#: seed 001 Fig. 5 at the highest load (2.8): latency (units), energy (kWh), dismissal rate.
PAPER = {
    "WA3C": (22, 38, 0.09), "round_robin": (32, 44, 0.08), "sjf": (32, 44, 0.08), "ljf": (58, 48, 0.10),
    "best_fit": (45, 48, 0.09), "random": (38, 48, 0.09),
}


def wa3c_reward(energy_scale_j: float) -> MultiObjectiveReward:
    cols = RewardColumns(
        latency="kpi.task_time_ms", latency_max="profile.latency_slo_ms", latency_ratio_cap=3.0,
        energy="kpi.energy_j", energy_scale_j=energy_scale_j, priority="profile.priority", priority_max=3.0,
        utilisation="kpi.utilisation", dismissed="kpi.slo_violation",
    )
    return MultiObjectiveReward(cols, mode="balanced")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--work", type=Path, default=Path("/tmp/edgetwin-policy-bench"))
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--no-write", action="store_true")
    add_scale_args(ap)
    args = ap.parse_args()
    torch.set_num_threads(1)
    agents, steps, episodes, rounds = (60, 20_000, 3, 2) if args.quick else (100, 150_000, 5, 4)
    t0 = time.perf_counter()
    twin = fit_twin(args.work, agents, days=1, seed=args.seed, rounds=rounds, scale=scale_kwargs(args))
    system = cluster_system("0d", agents)
    spec = system.spec
    # energy normaliser: the median energy of one agent-step under the logging policy
    probe = evaluate_policy(UniformRandom(spec, 1), cluster_system("0d", agents, steps=4), 1, 99, KPIS)
    scale = probe.mean["energy_j"] / (agents * 4)
    reward = wa3c_reward(scale)

    policies: dict[str, object] = {"random": UniformRandom(spec, args.seed)}
    view = cluster_view()
    for name in ("round_robin", "sjf", "ljf", "best_fit", "least_loaded", "lowest_carbon"):
        policies[name] = HEURISTICS[name](spec, view)
    trained = {"WA3C-reward PPO (twin)": ("ppo", reward, 0.4), "WA3C-reward PPO, λ = 0 (twin)": ("ppo", reward, 0.0),
               "PPO, plain reward (twin)": ("ppo", None, 0.4), "A2C, plain reward (twin)": ("a2c", None, 0.4)}
    for label, (algo, rew, lam) in trained.items():
        tag = f"hvr-{algo}-{'wa3c' if rew is not None else 'plain'}-{steps}-l{lam}"
        res = train_policy(twin, algo, steps=steps, seed=args.seed, out=args.work / tag, checkpoint_every=0,
                           resume=False, twin_opts={"n_agents": 64}, reward=rew, action_norm_lambda=lam,
                           progress=True)
        policies[label] = load_policy(res.path)
    results = {}
    for name, pol in policies.items():
        results[name] = evaluate_policy(pol, system, episodes, args.seed, KPIS, reward=reward, name=name)
        m = results[name].mean
        print(f"{name:28s} reward {m['return']:8.3f} latency {m['completion_time_mean']:9.1f} ms energy/req "
              f"{m['energy_j_per_request']:.3f} J viol {m['slo_violation_rate']:.4f} jain {m['fairness_jain']:.3f}")
    minutes = (time.perf_counter() - t0) / 60

    label_of = {"round_robin": "Round-Robin", "sjf": "SJF", "ljf": "LJF", "best_fit": "Tetris (best fit)",
                "random": "Random", "least_loaded": "least-loaded", "lowest_carbon": "lowest-carbon"}
    lines = ["| policy | WA3C reward / episode | latency mean (ms) | latency p95 (ms) | energy (J/request) | "
             "dismissal ≈ SLO violation rate | Jain fairness | offload ratio | paper: latency / energy (kWh) / dismissal |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---|"]
    for name, r in results.items():
        m, c = r.mean, r.ci95
        paper_key = "WA3C" if name.startswith("WA3C") else name
        paper = " / ".join(str(v) for v in PAPER[paper_key]) if paper_key in PAPER else "—"
        lines.append(
            f"| {label_of.get(name, name)} | {m['return']:.2f} ± {c['return']:.2f} | {m['completion_time_mean']:.0f} | "
            f"{m['completion_time_p95']:.0f} | {m['energy_j_per_request']:.3f} | {m['slo_violation_rate']:.4f} | "
            f"{m['fairness_jain']:.3f} | {m['offload_ratio']:.3f} | {paper} |"
        )
    best_h = max((n for n in results if n in label_of), key=lambda n: results[n].mean["return"])
    ours = results["WA3C-reward PPO (twin)"].mean["return"]
    text = "\n".join([
        SECTION, "",
        f"Command: `python benchmarks/heuristics_vs_rl.py{' --quick' if args.quick else ''}` ({minutes:.0f} min). "
        f"Machine: {machine()}.", "",
        f"Emulated cluster, 0 days of drift, {agents} service groups x 96 ticks, {episodes} episodes (± = 95 % "
        f"interval). The three DRL policies were trained only in a twin of one day of random-policy logs "
        f"({steps:,} steps each, action-norm regulariser λ = 0.4 unless marked λ = 0). The reward column is seed 001's multi-objective reward computed on the "
        "cluster's own columns (latency / SLO capped at 3x, energy normalised by the logging policy's median "
        "per agent-step, priority 1-3 scaled to [0, 1]). The paper's columns are its Fig. 5 values at the "
        "highest load, in its own units (a different simulator), for orientation only.", "",
        *lines, "",
        f"The WA3C-reward policy's reward {'beats' if ours > results[best_h].mean['return'] else 'does not beat'} "
        f"the best heuristic ({label_of[best_h]}, {results[best_h].mean['return']:.2f}).",
        "", "![KPIs](benchmarks/heuristics_vs_rl.png)",
    ])
    print(text)
    dump(FIG / "heuristics_vs_rl" / "results.json", {k: v.to_dict() for k, v in results.items()})
    plot_results(list(results.values()), FIG / "heuristics_vs_rl.png",
                 kpis=["return", "completion_time_mean", "energy_j_per_request", "slo_violation_rate",
                       "fairness_jain", "offload_ratio"], title="emulated cluster, 0 d")
    if not args.no_write:
        write_section(SECTION, text)


if __name__ == "__main__":
    main()
